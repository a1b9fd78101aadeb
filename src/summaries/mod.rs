//! Summaries and notes: a session's running summary, folded in the
//! background (`folds`) or set and folded through the session API
//! (`routes`); a note carried into a user's next session (`carry`); what a
//! turn sends of both (`turn`). The summary model's jobs run off the hot
//! path, under a global limit (`summary_concurrency`), with a timeout per
//! call and attempts with a doubling pause between them. Only what the
//! model answered, and what `summary::accept` takes for a summary, is
//! returned. The model itself is behind `ChatModel`: the configured
//! upstream in the server, a script in the tests.

pub mod carry;
pub(crate) mod folds;
pub mod routes;
pub(crate) mod turn;

pub use crate::models::{Answer, Ask, ChatModel, ModelError, UpstreamChat};

use std::sync::Arc;
use std::time::Duration;

use crate::config::MemoryConfig;
use crate::memory::message::Message;
use crate::memory::summary::{self, Fold};
use crate::memory::tokens::Encoding;
use crate::metrics::{Job, Metrics};
use crate::models::{Runner, RunnerLimits};

pub struct Summarizer {
    model: Arc<dyn ChatModel>,
    config: MemoryConfig,
    runner: Runner,
}

/// What a fold's model wrote, and what the messages it read cost.
#[derive(Debug, Clone)]
pub struct Written {
    pub text: String,
    pub covered_tokens: u64,
}

impl Summarizer {
    pub fn new(config: MemoryConfig, model: Arc<dyn ChatModel>, metrics: Arc<Metrics>) -> Self {
        let limits = RunnerLimits {
            concurrency: config.summary_concurrency,
            timeout: Duration::from_secs(config.summary_timeout_secs),
            attempts: config.summary_attempts,
        };
        Self {
            runner: Runner::new(limits, metrics),
            model,
            config,
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
        let c = &self.config;
        let ask = Ask {
            messages,
            max_tokens: c.summary_max_tokens(),
            shape: None,
        };
        let text = self.ask(Job::Fold, &ask, c.summary_max_chars).await?;
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
        let c = &self.config;
        let ask = Ask {
            messages: summary::carry_prompt(
                &c.carry_over_prompt,
                note,
                summary,
                c.carry_over_max_chars,
            ),
            max_tokens: c.note_max_tokens(),
            shape: None,
        };
        self.ask(Job::Note, &ask, c.note_max_chars()).await
    }

    async fn ask(&self, job: Job, ask: &Ask, max_chars: usize) -> Result<String, ModelError> {
        self.runner
            .run(job, || async {
                let answer = self.model.complete(ask).await?;
                Ok(summary::accept(&answer.text, max_chars, answer.cut_off)?)
            })
            .await
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.runner.metrics
    }
}

#[cfg(test)]
mod tests;
