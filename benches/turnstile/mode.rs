//! Whether a group's timed checks are allowed or denied: each group module
//! gives the two modes its own quotas (a trait of its own on `Mode`).

/// Whether the timed checks are allowed or denied.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Allowed,
    Denied,
}

impl Mode {
    /// The mode's part of a group name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Allowed => "allowed",
            Mode::Denied => "denied",
        }
    }
}
