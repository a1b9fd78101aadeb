//! What memory beyond the window measures: summary jobs by outcome and
//! duration, how far the summary lags behind the window, what it saves,
//! and the gaps when it lags too far.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// What a job of the summary model does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// Folds messages into a session's running summary.
    Fold,
    /// Folds an ended session's summary into its user's note.
    Note,
}

/// How one attempt of a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// Its answer was stored.
    Stored,
    /// Its answer came after the summary it extended was replaced.
    Stale,
    /// The model failed, or answered something that is not a summary.
    Failed,
    /// Every attempt failed: the job gave up until asked again.
    GaveUp,
}

impl JobOutcome {
    const ALL: [JobOutcome; 4] = [Self::Stored, Self::Stale, Self::Failed, Self::GaveUp];

    fn label(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Stale => "stale",
            Self::Failed => "failed",
            Self::GaveUp => "gave_up",
        }
    }
}

impl Job {
    fn label(self) -> &'static str {
        match self {
            Job::Fold => "fold",
            Job::Note => "note",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    job: &'static str,
    outcome: &'static str,
}

#[derive(Clone)]
pub struct MemoryMetrics {
    jobs: Family<JobLabels, Counter>,
    job_seconds: Histogram,
    lag: Histogram,
    saved: Histogram,
    gaps: Counter,
}

impl MemoryMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let jobs = Family::<JobLabels, Counter>::default();
        registry.register(
            "summary_jobs",
            "Summary model jobs, by job (fold: a running summary; note: a user's carried note) and outcome (stored, stale, failed attempt, gave_up)",
            jobs.clone(),
        );
        let job_seconds = super::latency();
        registry.register(
            "summary_job_duration_seconds",
            "Time of one call of the summary model",
            job_seconds.clone(),
        );
        let lag = Histogram::new([0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]);
        registry.register(
            "summary_lag_messages",
            "Per turn, the stored messages outside the plain window that the summary does not cover yet",
            lag.clone(),
        );
        let saved = Histogram::new(exponential_buckets(16.0, 2.0, 14));
        registry.register(
            "summary_tokens_saved",
            "Per turn, the tokens of the messages the summary covers, less the summary's own",
            saved.clone(),
        );
        let gaps = Counter::default();
        registry.register(
            "summary_gaps",
            "Turns whose window could not reach back to the summary (more than summary_max_lag_messages uncovered)",
            gaps.clone(),
        );
        for job in [Job::Fold, Job::Note] {
            for outcome in JobOutcome::ALL {
                jobs.get_or_create(&JobLabels {
                    job: job.label(),
                    outcome: outcome.label(),
                })
                .inc_by(0);
            }
        }
        Self {
            jobs,
            job_seconds,
            lag,
            saved,
            gaps,
        }
    }

    pub fn job(&self, job: Job, outcome: JobOutcome) {
        self.jobs
            .get_or_create(&JobLabels {
                job: job.label(),
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn jobs(&self, job: Job, outcome: JobOutcome) -> u64 {
        self.jobs
            .get_or_create(&JobLabels {
                job: job.label(),
                outcome: outcome.label(),
            })
            .get()
    }

    pub fn call(&self, took: Duration) {
        self.job_seconds.observe(took.as_secs_f64());
    }

    /// A turn's window: `lag` uncovered messages outside it, `saved` tokens,
    /// and whether its reach was given up.
    pub fn turn(&self, lag: u64, saved: u64, gap: bool) {
        self.lag.observe(lag as f64);
        if saved > 0 {
            self.saved.observe(saved as f64);
        }
        if gap {
            self.gaps.inc();
        }
    }

    pub fn gaps(&self) -> u64 {
        self.gaps.get()
    }
}
