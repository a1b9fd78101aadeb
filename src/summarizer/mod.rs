//! The summary model's jobs: a fold of a session's running summary, and a
//! note carried into a user's next session. Each runs off the hot path,
//! under a global limit (`summary_concurrency`), with a timeout per call
//! and attempts with a doubling pause between them. Only what the model
//! answered, and what `summary::accept` takes for a summary, is returned.
//! The model itself is behind `SummaryModel`: the configured upstream in
//! the server, a script in the tests.

pub mod carry;
mod model;

pub use model::{ModelError, SummaryModel, UpstreamModel};

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::config::MemoryConfig;
use crate::memory::message::Message;
use crate::memory::summary::{self, Fold};
use crate::memory::tokens::Encoding;
use crate::metrics::{Job, JobOutcome, Metrics};

/// The first pause after a failed attempt; it doubles, up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(10);

pub struct Summarizer {
    model: Arc<dyn SummaryModel>,
    config: MemoryConfig,
    permits: Semaphore,
    metrics: Arc<Metrics>,
}

/// What a fold's model wrote, and what the messages it read cost.
#[derive(Debug, Clone)]
pub struct Written {
    pub text: String,
    pub covered_tokens: u64,
}

impl Summarizer {
    pub fn new(config: MemoryConfig, model: Arc<dyn SummaryModel>, metrics: Arc<Metrics>) -> Self {
        Self {
            permits: Semaphore::new(config.summary_concurrency.max(1)),
            model,
            config,
            metrics,
        }
    }

    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// The model the summaries name as their writer.
    pub fn model_name(&self) -> &str {
        self.model.name()
    }

    /// The new running summary for `fold`.
    pub async fn fold(&self, fold: &Fold) -> Result<Written, ModelError> {
        let messages = summary::prompt(&self.config.summary_prompt, fold);
        let text = self
            .ask(Job::Fold, messages, self.config.summary_max_chars)
            .await?;
        // Counted as chars / 4: the summary model's tokenizer is not the
        // chat model's, and this only feeds a metric.
        let covered_tokens = fold
            .messages
            .iter()
            .map(|m: &Arc<Message>| m.tokens(Encoding::Approx) as u64)
            .sum();
        Ok(Written {
            text,
            covered_tokens,
        })
    }

    /// The user's note with an ended session's `summary` folded in.
    pub async fn note(&self, note: Option<&str>, summary: &str) -> Result<String, ModelError> {
        let max = self.config.carry_over_max_chars;
        let messages = summary::carry_prompt(&self.config.carry_over_prompt, note, summary, max);
        // A model asked to stay within `max` may overshoot a little; twice
        // that is no longer a note.
        self.ask(Job::Note, messages, max.saturating_mul(2)).await
    }

    async fn ask(
        &self,
        job: Job,
        messages: Vec<serde_json::Value>,
        max_chars: usize,
    ) -> Result<String, ModelError> {
        let attempts = self.config.summary_attempts.max(1);
        let timeout = Duration::from_secs(self.config.summary_timeout_secs);
        let mut pause = FIRST_PAUSE;
        let mut attempt = 1;
        loop {
            let answer = {
                // The semaphore is never closed.
                let _permit = self.permits.acquire().await.ok();
                let started = Instant::now();
                let answer = tokio::time::timeout(timeout, self.model.complete(messages.clone()))
                    .await
                    .unwrap_or(Err(ModelError::Timeout(timeout.as_secs())));
                self.metrics.memory.call(started.elapsed());
                answer
            };
            let kept = answer.and_then(|a| summary::accept(&a, max_chars).map_err(Into::into));
            match kept {
                Ok(text) => return Ok(text),
                Err(e) => {
                    self.metrics.memory.job(job, JobOutcome::Failed);
                    tracing::warn!(?job, attempt, error = %e, "the summary model failed");
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

#[cfg(test)]
mod tests;
