//! How a background job calls a model: under a global limit of calls at
//! once, within a timeout per call, and again after a failure (a doubling
//! pause between attempts) until it gives up. Each failed attempt and each
//! give-up is counted by job.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::ModelError;
use crate::metrics::{Job, JobOutcome, Metrics};

/// The first pause after a failed attempt; it doubles, up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy)]
pub struct RunnerLimits {
    pub concurrency: usize,
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
        let timeout = self.limits.timeout;
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            let answer = {
                // The semaphore is never closed.
                let _permit = self.permits.acquire().await.ok();
                let started = Instant::now();
                let answer = tokio::time::timeout(timeout, call())
                    .await
                    .unwrap_or(Err(ModelError::Timeout(timeout.as_secs())));
                self.metrics.memory.call(job, started.elapsed());
                answer
            };
            match answer {
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
}
