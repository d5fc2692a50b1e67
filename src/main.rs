//! The turnstile command-line program (placeholder until the CLI lands).
fn main() {}
