//! How a background job calls a model: under a global limit of calls at
//! once, within a timeout per call, and again after a failure (a doubling
//! pause between attempts) until it gives up. Each failed attempt and each
//! give-up is counted by job.
//!
//! Each call is a background call under its upstream's `max_concurrent`
//! (`background`): it waits behind live requests, and a live request that
//! needs its slot makes it yield. A yielded call is dropped (its
//! connection closed, nothing of it kept) and made again from the start
//! once it has a slot again: counted as a yield, not as a failed attempt.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::background::{Stopped, Try};
use super::ModelError;
use crate::metrics::{Job, JobOutcome, Metrics};

/// The first pause after a failed attempt; it doubles, up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
pub struct RunnerLimits {
    pub concurrency: usize,
    /// The model's time per call: the waits for an upstream slot are not
    /// counted (they have the upstream's `timeout_secs`).
    pub timeout: Duration,
    pub attempts: u32,
}

pub struct Runner {
    permits: Semaphore,
    limits: RunnerLimits,
    pub(crate) metrics: Arc<Metrics>,
}

impl Runner {
    pub fn new(limits: RunnerLimits, metrics: Arc<Metrics>) -> Self {
        Self {
            permits: Semaphore::new(limits.concurrency.max(1)),
            limits,
            metrics,
        }
    }

    /// `call`'s answer, after as many attempts as it takes and the limits
    /// allow. `call` checks the answer too: an answer it refuses is a
    /// failed attempt.
    pub async fn run<T, F, Fut>(&self, job: Job, call: F) -> Result<T, ModelError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, ModelError>>,
    {
        let attempts = self.limits.attempts.max(1);
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            match self.attempt(job, &call).await {
                Ok(t) => return Ok(t),
                Err(e) => {
                    self.metrics.memory.job(job, JobOutcome::Failed);
                    tracing::warn!(?job, attempt, error = %e, "a model call of a background job failed");
                    if attempt >= attempts {
                        self.metrics.memory.job(job, JobOutcome::GaveUp);
                        return Err(e);
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            attempt += 1;
        }
    }

    /// One attempt: `call`, made again as often as it yields its slot.
    async fn attempt<T, F, Fut>(&self, job: Job, call: &F) -> Result<T, ModelError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, ModelError>>,
    {
        let timeout = self.limits.timeout;
        // The semaphore is never closed; the permit is kept across yields.
        let _permit = self.permits.acquire().await.ok();
        let mut waited = Duration::ZERO;
        loop {
            let this = Try::new(waited);
            let started = Instant::now();
            let answer = this.run(timeout, call()).await;
            waited += this.waited();
            let answer = match answer {
                Err(Stopped::Yielded) => {
                    self.metrics.memory.background_yield(job);
                    tracing::debug!(
                        ?job,
                        "a background model call gave its upstream slot to a live request; it is made again"
                    );
                    continue;
                }
                Err(Stopped::TimedOut) => Err(ModelError::Timeout(timeout.as_secs())),
                Ok(answer) => answer,
            };
            let took = started.elapsed().saturating_sub(this.waited());
            self.metrics.memory.call(job, took);
            return answer;
        }
    }
}
