//! One limit's part in a multi-limit check: its charge, and the rollback
//! that takes the charge out again when a later limit denies (the proof
//! that this is all or nothing, and "Which bucket" a rollback acts on, are
//! in the parent module).

use std::hash::Hash;

use crate::algorithms::Gcra;
use crate::cell::{Cell, Charge, Gone};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::keyed::KeyedLimiter;
use crate::striped::Striped;

/// Rollbacks that raced, by how, over the whole process: what the stress
/// tests read to know they reached the races they name
/// (`crate::__private::rollback_races`). Each is counted only on the race
/// itself, in per-thread stripes: a contended multi-limit denial races
/// often, and one shared counter would be one more contended line.
pub(crate) struct Races {
    /// The limit's state had moved since the charge (another admission or
    /// rollback landed in between).
    pub(crate) moved: Striped,
    /// The keyed bucket the charge landed on was dead (evicted, reset,
    /// cleared) or frozen by a migration: nothing was taken out.
    pub(crate) gone: Striped,
    /// A reset of the direct bucket came between the charge and the
    /// rollback: nothing was taken out.
    pub(crate) after_reset: Striped,
}

pub(crate) static RACES: Races = Races {
    moved: Striped::new(),
    gone: Striped::new(),
    after_reset: Striped::new(),
};

/// Takes the admission `charge` of cost `n`, made at the quota `gcra`, out
/// of `cell` if the cell still holds a live bucket: the one CAS loop of
/// every rollback. Returns whether the state had moved since the charge
/// (another admission or rollback landed in between, or the bucket is
/// gone), and what the cell answered.
fn take_out(
    cell: &Cell,
    gcra: &Gcra,
    charge: &Charge,
    clock: &impl Clock,
    n: u64,
) -> (bool, Result<Option<u64>, Gone>) {
    let raced = std::cell::Cell::new(true);
    let rolled = cell.modify(|tat| {
        raced.set(tat != charge.after);
        // Read after the state: every admission in `tat` read the clock no
        // later than this.
        gcra.rolled_back(tat, charge, clock.now(), n)
    });
    (raced.get(), rolled)
}

impl<C: Clock> DirectLimiter<C, Gcra> {
    /// A check of cost `n` at the quota `gcra` (`n` already checked
    /// against it) that also reports the admission it made and the
    /// generation of the bucket it made it on. An admission that a reset
    /// overlapped is reported as none: it is never rolled back (see
    /// `crate::resets`).
    pub(super) fn charge(&self, gcra: &Gcra, n: u64) -> (Decision, Option<(Charge, u64)>) {
        let (cell, resets) = self.bucket();
        let now = self.clock().now();
        let (charged, generation) = resets.charge(|| cell.update(gcra, now, n));
        match charged {
            Ok(outcome) => (
                outcome.decision(gcra, now, n),
                outcome.charge(now).zip(generation),
            ),
            // A direct limiter has no evictor, so its cell is never claimed.
            Err(_) => unreachable!("a direct limiter's cell is never tombstoned"),
        }
    }

    /// Takes the admission `charge` of cost `n`, made at the quota `gcra`,
    /// out again if the cell still holds the bucket of `generation`, the
    /// one it was charged to: after a reset, nothing. Returns whether the
    /// state had moved since the charge (another admission or rollback
    /// landed in between, or a reset).
    pub(super) fn roll_back(&self, gcra: &Gcra, charge: &Charge, generation: u64, n: u64) -> bool {
        let (cell, resets) = self.bucket();
        let mut raced = true;
        let current = resets.roll_back(generation, || {
            raced = take_out(cell, gcra, charge, self.clock(), n).0;
        });
        if !current {
            RACES.after_reset.add();
            probe!(ROLLBACK_AFTER_RESET);
        }
        raced
    }
}

impl<K, C> KeyedLimiter<K, C, Gcra>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
{
    /// Takes the admission `charge` of cost `n`, made at the quota `gcra`,
    /// out of `cell`, the cell it landed on, if that cell still holds the
    /// bucket. Returns whether the state had moved since the charge
    /// (another admission or rollback landed in between, or the bucket is
    /// gone).
    ///
    /// A dead cell's bucket was reset or evicted (as idle, when the charge
    /// had expired by itself, or to make room), and a new bucket for the
    /// key never held this charge: nothing to take out. A frozen cell's
    /// bucket is moving to a successor table; the charge is left in it
    /// rather than taken out of whatever bucket holds the key there, which
    /// may be a new one (see "Which bucket" in `crate::multi`).
    pub(super) fn roll_back(&self, gcra: &Gcra, cell: &Cell, charge: &Charge, n: u64) -> bool {
        let (raced, rolled) = take_out(cell, gcra, charge, self.clock(), n);
        if let Err(gone) = rolled {
            RACES.gone.add();
            match gone {
                Gone::Dead => probe!(ROLLBACK_FOUND_BUCKET_DEAD),
                Gone::Moved => probe!(ROLLBACK_FOUND_BUCKET_MOVED),
            }
        }
        raced
    }
}
