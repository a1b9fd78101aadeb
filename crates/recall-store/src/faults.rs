//! Test-only: makes chosen storage writes fail the way a full disk, a
//! database busy past its timeout, or a Redis out of memory would. Built
//! only with the `fault-injection` feature, which this crate's own tests
//! turn on (a dev-dependency on itself): no config reaches it.
//!
//! A failed round fails every batch in it, as a failed commit does. A
//! failed batch fails inside the writer's real per-session unit (SQLite's
//! savepoint, Redis's script call), so the rollback path that runs is the
//! production one.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{Batch, Op};

type Matcher = Box<dyn Fn(&Op) -> bool + Send>;

#[derive(Default)]
pub struct Faults {
    /// Set when anything is planned: an idle plan costs one load a round.
    armed: AtomicBool,
    plan: Mutex<Plan>,
    rounds_failed: AtomicUsize,
    batches_failed: AtomicUsize,
    /// While set, the writer holds its next round, so that what is
    /// submitted meanwhile is written together in one round.
    paused: AtomicBool,
    /// The most batches seen in one round.
    largest_round: AtomicUsize,
}

#[derive(Default)]
struct Plan {
    /// The next this many rounds fail whole.
    rounds: usize,
    /// A batch with an op a rule matches fails, `times` times per rule.
    rules: Vec<(Matcher, usize)>,
    random: Option<Random>,
}

/// Random faults, repeatable from their seed.
struct Random {
    state: u64,
    /// Chances, per thousand, that a session's batch or a whole round fails.
    batch: u64,
    round: u64,
}

impl Random {
    fn roll(&mut self, per_mille: u64) -> bool {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.state >> 33) % 1000 < per_mille
    }
}

impl Faults {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` write rounds fail whole.
    pub fn fail_rounds(&self, n: usize) {
        self.plan().rounds += n;
        self.armed.store(true, Ordering::Release);
    }

    /// The next `times` batches holding an op that `matches` fail.
    pub fn fail_batches(&self, times: usize, matches: impl Fn(&Op) -> bool + Send + 'static) {
        self.plan().rules.push((Box::new(matches), times));
        self.armed.store(true, Ordering::Release);
    }

    /// The next `times` writes of session `id` fail.
    pub fn fail_session(&self, id: &str, times: usize) {
        let id = id.to_owned();
        self.fail_batches(times, move |op| op.session() == Some(id.as_str()));
    }

    /// From now on each session's batch fails with `batch_per_mille`
    /// chances in a thousand, and each round with `round_per_mille`.
    pub fn random(&self, seed: u64, batch_per_mille: u64, round_per_mille: u64) {
        self.plan().random = Some(Random {
            state: seed,
            batch: batch_per_mille,
            round: round_per_mille,
        });
        self.armed.store(true, Ordering::Release);
    }

    /// Nothing more fails.
    pub fn clear(&self) {
        *self.plan() = Plan::default();
        self.armed.store(false, Ordering::Release);
    }

    /// Holds the writer before its next round until `resume`.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::Release);
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// The most batches the writer has written in one round.
    pub fn largest_round(&self) -> usize {
        self.largest_round.load(Ordering::Relaxed)
    }

    /// How many rounds and batches were made to fail so far.
    pub fn injected(&self) -> (usize, usize) {
        (
            self.rounds_failed.load(Ordering::Relaxed),
            self.batches_failed.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn round_fails(&self, batches: usize) -> bool {
        self.largest_round.fetch_max(batches, Ordering::Relaxed);
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        let mut plan = self.plan();
        let fails = if plan.rounds > 0 {
            plan.rounds -= 1;
            true
        } else {
            let round = plan.random.as_ref().map_or(0, |r| r.round);
            plan.random.as_mut().is_some_and(|r| r.roll(round))
        };
        if fails {
            self.rounds_failed.fetch_add(1, Ordering::Relaxed);
        }
        fails
    }

    pub(crate) fn batch_fails(&self, batch: &Batch) -> bool {
        if !self.armed.load(Ordering::Acquire) || batch.session().is_none() {
            return false;
        }
        let mut plan = self.plan();
        let hit = plan
            .rules
            .iter()
            .position(|(m, times)| *times > 0 && batch.ops.iter().any(m));
        let fails = match hit {
            Some(i) => {
                plan.rules[i].1 -= 1;
                true
            }
            None => {
                let chance = plan.random.as_ref().map_or(0, |r| r.batch);
                plan.random.as_mut().is_some_and(|r| r.roll(chance))
            }
        };
        if fails {
            self.batches_failed.fetch_add(1, Ordering::Relaxed);
        }
        fails
    }
}
