//! What memory beyond the window measures: summary jobs by outcome and
//! duration, how far the summary lags behind the window, what it saves,
//! and the gaps when it lags too far; long-term memory's jobs and what
//! they changed of users' records; the background calls of any job that
//! gave their upstream slot to a live request.

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
    /// Extracts facts from a session's messages into its user's records.
    Extract,
    /// Searches a user's records for the facts of a session's next turn.
    Recall,
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
    /// The extract model's answer was not a list of facts: nothing stored.
    Malformed,
}

impl JobOutcome {
    const ALL: [JobOutcome; 5] = [
        Self::Stored,
        Self::Stale,
        Self::Failed,
        Self::GaveUp,
        Self::Malformed,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Stale => "stale",
            Self::Failed => "failed",
            Self::GaveUp => "gave_up",
            Self::Malformed => "malformed",
        }
    }
}

impl Job {
    fn label(self) -> &'static str {
        match self {
            Job::Fold => "fold",
            Job::Note => "note",
            Job::Extract => "extract",
            Job::Recall => "recall",
        }
    }

    fn long_term(self) -> bool {
        matches!(self, Job::Extract | Job::Recall)
    }
}

/// What a long-term job did to a user's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordChange {
    Added,
    Updated,
    Evicted,
}

impl RecordChange {
    fn label(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Updated => "updated",
            Self::Evicted => "evicted",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    change: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeftOutLabels {
    reason: &'static str,
}

/// Why an extracted fact was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftOut {
    /// Past `long_term.max_facts_per_answer`.
    OverMaxFacts,
    /// Longer than a fact may be.
    TooLong,
}

impl LeftOut {
    fn label(self) -> &'static str {
        match self {
            Self::OverMaxFacts => "over_max_facts",
            Self::TooLong => "too_long",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobOnlyLabels {
    job: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepDownLabels {
    upstream: String,
    refused: &'static str,
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
    long_term_jobs: Family<JobLabels, Counter>,
    long_term_seconds: Histogram,
    records: Family<ChangeLabels, Counter>,
    facts_left_out: Family<LeftOutLabels, Counter>,
    background_yields: Family<JobOnlyLabels, Counter>,
    step_downs: Family<StepDownLabels, Counter>,
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
        let long_term_jobs = Family::<JobLabels, Counter>::default();
        registry.register(
            "long_term_jobs",
            "Long-term memory jobs, by job (extract: facts into records; recall: a search for the next turn) and outcome (stored, stale, failed attempt, gave_up, malformed)",
            long_term_jobs.clone(),
        );
        let long_term_seconds = super::latency();
        registry.register(
            "long_term_call_duration_seconds",
            "Time of one call of the extract or embedding model",
            long_term_seconds.clone(),
        );
        let records = Family::<ChangeLabels, Counter>::default();
        registry.register(
            "long_term_records",
            "Changes of users' long-term records by extraction (added, updated, evicted)",
            records.clone(),
        );
        let facts_left_out = Family::<LeftOutLabels, Counter>::default();
        registry.register(
            "long_term_facts_left_out",
            format!(
                "Facts of extraction answers not stored, by reason (over_max_facts: past long_term.max_facts_per_answer; too_long: longer than {} characters)",
                recall_core::memory::long_term::MAX_FACT_CHARS
            ),
            facts_left_out.clone(),
        );
        let background_yields = Family::<JobOnlyLabels, Counter>::default();
        registry.register(
            "background_yields",
            "Background model calls, by job, cut to give their upstream slot (max_concurrent) to a live request, and made again: not failed attempts",
            background_yields.clone(),
        );
        let step_downs = Family::<StepDownLabels, Counter>::default();
        registry.register(
            "structured_output_step_downs",
            "Requests of recall's own model calls refused for their response_format (refused: json_schema or json_object), each asked again at once the next way; not failures of the model",
            step_downs.clone(),
        );
        for reason in [LeftOut::OverMaxFacts, LeftOut::TooLong] {
            facts_left_out
                .get_or_create(&LeftOutLabels {
                    reason: reason.label(),
                })
                .inc_by(0);
        }
        for change in [
            RecordChange::Added,
            RecordChange::Updated,
            RecordChange::Evicted,
        ] {
            records
                .get_or_create(&ChangeLabels {
                    change: change.label(),
                })
                .inc_by(0);
        }
        for job in [Job::Fold, Job::Note, Job::Extract, Job::Recall] {
            background_yields
                .get_or_create(&JobOnlyLabels { job: job.label() })
                .inc_by(0);
            let family = if job.long_term() {
                &long_term_jobs
            } else {
                &jobs
            };
            for outcome in JobOutcome::ALL {
                family
                    .get_or_create(&JobLabels {
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
            long_term_jobs,
            long_term_seconds,
            records,
            facts_left_out,
            background_yields,
            step_downs,
        }
    }

    fn jobs_of(&self, job: Job) -> &Family<JobLabels, Counter> {
        if job.long_term() {
            &self.long_term_jobs
        } else {
            &self.jobs
        }
    }

    pub fn job(&self, job: Job, outcome: JobOutcome) {
        self.jobs_of(job)
            .get_or_create(&JobLabels {
                job: job.label(),
                outcome: outcome.label(),
            })
            .inc();
    }

    pub fn jobs(&self, job: Job, outcome: JobOutcome) -> u64 {
        self.jobs_of(job)
            .get_or_create(&JobLabels {
                job: job.label(),
                outcome: outcome.label(),
            })
            .get()
    }

    /// Jobs of long-term memory, or of the summary model, that ended: stored,
    /// stale or given up. (A malformed extraction also gave up.)
    pub fn ended(&self, long_term: bool) -> u64 {
        [Job::Fold, Job::Note, Job::Extract, Job::Recall]
            .into_iter()
            .filter(|j| j.long_term() == long_term)
            .flat_map(|j| {
                [JobOutcome::Stored, JobOutcome::Stale, JobOutcome::GaveUp].map(|o| self.jobs(j, o))
            })
            .sum()
    }

    /// Failed model calls of every job, each attempt counted.
    pub fn failed_attempts(&self) -> u64 {
        [Job::Fold, Job::Note, Job::Extract, Job::Recall]
            .into_iter()
            .map(|j| self.jobs(j, JobOutcome::Failed))
            .sum()
    }

    /// A call of `job` gave its upstream slot to a live request.
    pub fn background_yield(&self, job: Job) {
        self.background_yields
            .get_or_create(&JobOnlyLabels { job: job.label() })
            .inc();
    }

    pub fn background_yields(&self, job: Job) -> u64 {
        self.background_yields
            .get_or_create(&JobOnlyLabels { job: job.label() })
            .get()
    }

    /// One call of `job`'s model took `took`, its waits for a slot left out.
    pub fn call(&self, job: Job, took: Duration) {
        let h = if job.long_term() {
            &self.long_term_seconds
        } else {
            &self.job_seconds
        };
        h.observe(took.as_secs_f64());
    }

    pub fn records(&self, change: RecordChange, n: usize) {
        self.records
            .get_or_create(&ChangeLabels {
                change: change.label(),
            })
            .inc_by(n as u64);
    }

    /// A request to `upstream` refused for its `response_format` of type
    /// `refused`.
    pub fn structured_step_down(&self, upstream: &str, refused: &'static str) {
        self.step_downs
            .get_or_create(&StepDownLabels {
                upstream: upstream.to_owned(),
                refused,
            })
            .inc();
    }

    pub fn facts_left_out(&self, reason: LeftOut, n: usize) {
        self.facts_left_out
            .get_or_create(&LeftOutLabels {
                reason: reason.label(),
            })
            .inc_by(n as u64);
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
