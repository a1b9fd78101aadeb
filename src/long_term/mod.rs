//! Long-term memory: a session's facts extracted into its user's records,
//! and the records searched for a turn, off the hot path. The extract and
//! embedding models are called through `models` (under the `Runner` the
//! summaries use too), the records kept by `store::Records`; what to
//! store, merge, rank and send is decided in the core's
//! `memory::long_term`. `jobs` runs both in the background for a session,
//! `for_turn` gives a turn its facts, `routes` is the records API.

pub(crate) mod for_turn;
pub mod jobs;
pub mod routes;

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::{LongTermConfig, Ranking, Strategy};
use crate::memory::long_term::verbatim::{self, Said};
use crate::memory::long_term::{self as lt, Fact, NewFact, Origin, Record};
use crate::memory::long_term::{hybrid, supersede};
use crate::memory::session::{Extraction, Query};
use crate::memory::tokens::Encoding;
use crate::metrics::{Job, JobOutcome, LeftOut, RecordChange};
use crate::models::structured::Shape;
use crate::models::{Ask, ChatModel, EmbeddingModel, ModelError, Runner, RunnerLimits};
use crate::store::{Records, Storage, StorageError};

#[derive(Debug, thiserror::Error)]
pub enum LongTermError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<LongTermError> for crate::error::ApiError {
    fn from(e: LongTermError) -> Self {
        match e {
            LongTermError::Model(e) => crate::error::ApiError::LongTermModel(e.to_string()),
            LongTermError::Storage(e) => e.into(),
        }
    }
}

/// What an extraction did to its user's records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extracted {
    /// The records it added or updated.
    pub ids: Vec<String>,
    pub facts: usize,
    pub added: usize,
    pub updated: usize,
    pub evicted: usize,
    /// Distinct facts past `max_facts_per_answer`, not stored.
    pub left_out: usize,
    /// Distinct facts longer than `MAX_FACT_CHARS`, not stored.
    pub too_long: usize,
    /// Older records the stored ones superseded.
    pub superseded: usize,
    /// The user's memory was deleted after the session began: nothing of
    /// it was written back.
    pub stale: bool,
}

/// The models, the records and the limits long-term memory works with.
pub struct LongTerm {
    pub config: LongTermConfig,
    strategies: Vec<Strategy>,
    /// None when every strategy is `verbatim`.
    chat: Option<Arc<dyn ChatModel>>,
    embedder: Arc<dyn EmbeddingModel>,
    runner: Runner,
    pub records: Arc<Records>,
    pub storage: Arc<Storage>,
    clock: Clock,
}

/// A change of the records that met another one is planned again, this
/// many times at most.
const ATTEMPTS: usize = 5;

/// A record sent again within this long is not marked recalled again.
const MARK_RECALLED_EVERY_MS: i64 = 10 * 60 * 1000;

pub struct Parts {
    pub chat: Option<Arc<dyn ChatModel>>,
    pub embedder: Arc<dyn EmbeddingModel>,
    pub records: Arc<Records>,
    pub storage: Arc<Storage>,
    pub clock: Clock,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl LongTerm {
    pub fn new(config: LongTermConfig, parts: Parts) -> Self {
        let limits = RunnerLimits {
            concurrency: config.concurrency,
            timeout: Duration::from_secs(config.timeout_secs),
            attempts: config.attempts,
        };
        Self {
            strategies: config.strategies(),
            runner: Runner::new(limits, parts.metrics),
            chat: parts.chat,
            embedder: parts.embedder,
            records: parts.records,
            storage: parts.storage,
            clock: parts.clock,
            config,
        }
    }

    pub fn strategies(&self) -> &[Strategy] {
        &self.strategies
    }

    fn metrics(&self) -> &crate::metrics::Metrics {
        &self.runner.metrics
    }

    /// Extracts `ex`'s facts with every strategy and stores them: the
    /// user's own sentences for `verbatim` (no model call), the extract
    /// model's answer for the others. A strategy that fails, or answers
    /// something that is not a list of facts, fails the whole
    /// extraction: nothing is stored.
    pub async fn extract(&self, ex: &Extraction) -> Result<Extracted, LongTermError> {
        if !lt::worth_extracting(&ex.messages) {
            return Ok(Extracted::default());
        }
        let mut found: Vec<(Said, &Strategy, String)> = Vec::new();
        let (mut left_out, mut too_long) = (0, 0);
        for s in &self.strategies {
            let said = if s.needs_model() {
                let facts = self.ask(s, ex).await?;
                left_out += facts.left_out;
                too_long += facts.too_long;
                let said_at = lt::newest_said(&ex.messages);
                facts
                    .kept
                    .into_iter()
                    .map(|text| Said { text, said_at })
                    .collect()
            } else {
                let (said, long) = verbatim::said(&ex.messages, s.with_replies);
                too_long += long;
                said
            };
            let namespace = lt::namespace(&s.namespace, &s.name, &ex.user_name, &ex.session);
            found.extend(said.into_iter().map(|f| (f, s, namespace.clone())));
        }
        if found.is_empty() {
            self.left_out(&ex.session, left_out, too_long);
            return Ok(Extracted {
                left_out,
                too_long,
                ..Extracted::default()
            });
        }
        let texts: Vec<String> = found.iter().map(|(f, ..)| f.text.clone()).collect();
        let vectors = self.embed(Job::Extract, texts).await?;
        let facts: Vec<NewFact> = found
            .into_iter()
            .zip(vectors)
            .map(|((said, s, namespace), embedding)| NewFact {
                text: said.text,
                strategy: s.name.clone(),
                namespace,
                said_at: said.said_at,
                embedding,
            })
            .collect();
        let mut stored = self
            .store(&ex.user, &ex.session, ex.began_ms, facts)
            .await?;
        // Counted once the rest is stored: a failed extraction is tried
        // again, and would count its answer's facts again.
        if !stored.stale {
            self.left_out(&ex.session, left_out, too_long);
            (stored.left_out, stored.too_long) = (left_out, too_long);
        }
        let outcome = if stored.stale {
            JobOutcome::Stale
        } else {
            JobOutcome::Stored
        };
        self.metrics().memory.job(Job::Extract, outcome);
        Ok(stored)
    }

    /// The extract model's facts in `ex` for strategy `s`.
    async fn ask(&self, s: &Strategy, ex: &Extraction) -> Result<lt::Facts, LongTermError> {
        let Some(chat) = &self.chat else {
            return Err(ModelError::NoExtractModel(s.name.clone()).into());
        };
        let ask = Ask {
            messages: lt::extract_prompt(s.prompt(), &ex.messages),
            max_tokens: self.config.extract_max_tokens(),
            shape: Some(Shape {
                name: lt::FACTS_SCHEMA_NAME,
                schema: lt::facts_schema(),
            }),
        };
        let facts = self
            .runner
            .run(Job::Extract, || async {
                let answer = chat.complete(&ask).await?;
                let max = self.config.max_facts_per_answer;
                Ok(lt::facts(&answer.text, max, answer.cut_off)?)
            })
            .await;
        match facts {
            Ok(f) => {
                if f.cut_off {
                    tracing::warn!(
                        session = %ex.session,
                        strategy = %s.name,
                        max_tokens = ask.max_tokens,
                        kept = f.kept.len(),
                        "an extraction answer stopped at max_tokens: its whole facts are stored, the rest is lost (long_term.extract_max_tokens)"
                    );
                }
                Ok(f)
            }
            Err(e) => {
                if matches!(e, ModelError::Malformed(_)) {
                    self.metrics()
                        .memory
                        .job(Job::Extract, JobOutcome::Malformed);
                }
                Err(e.into())
            }
        }
    }

    fn left_out(&self, session: &str, left_out: usize, too_long: usize) {
        let m = &self.metrics().memory;
        if left_out > 0 {
            m.facts_left_out(LeftOut::OverMaxFacts, left_out);
            tracing::warn!(
                session,
                max = self.config.max_facts_per_answer,
                left_out,
                "extraction answers held more facts than long_term.max_facts_per_answer allows; the rest were not stored"
            );
        }
        if too_long > 0 {
            m.facts_left_out(LeftOut::TooLong, too_long);
            tracing::warn!(
                session,
                max_chars = lt::MAX_FACT_CHARS,
                too_long,
                "extraction answers held facts too long to embed; they were not stored"
            );
        }
    }

    async fn embed(&self, job: Job, texts: Vec<String>) -> Result<Vec<Vec<f32>>, ModelError> {
        self.runner
            .run(job, || self.embedder.embed(texts.clone()))
            .await
    }

    /// Merges `facts` into `user`'s records, unless their memory was
    /// deleted after `began_ms`.
    pub async fn store(
        &self,
        user: &str,
        session: &str,
        began_ms: i64,
        facts: Vec<NewFact>,
    ) -> Result<Extracted, LongTermError> {
        let n = facts.len();
        for _ in 0..ATTEMPTS {
            let held = self.records.of(&self.storage, user).await?;
            if held.forgotten_at > 0 && held.forgotten_at >= began_ms {
                return Ok(Extracted {
                    facts: n,
                    stale: true,
                    ..Extracted::default()
                });
            }
            let origin = Origin {
                user,
                session,
                now_ms: self.clock.now_ms(),
            };
            let plan = lt::plan(
                &held.records,
                facts.clone(),
                &origin,
                self.config.merge_threshold,
                self.config.max_records_per_user,
                record_id,
            );
            let (added, updated, evicted) = (plan.added, plan.updated, plan.evicted);
            let superseded = plan.superseded;
            let ids: Vec<String> = plan.put.iter().map(|r| r.id.clone()).collect();
            let changed = self
                .records
                .change(&self.storage, user, held.version, plan.put, plan.remove)
                .await?;
            if changed {
                let m = &self.metrics().memory;
                m.records(RecordChange::Added, added);
                m.records(RecordChange::Updated, updated);
                m.records(RecordChange::Evicted, evicted);
                return Ok(Extracted {
                    ids,
                    facts: n,
                    added,
                    updated,
                    evicted,
                    left_out: 0,
                    too_long: 0,
                    superseded,
                    stale: false,
                });
            }
        }
        Err(StorageError::Failed(format!(
            "the user's records changed under {ATTEMPTS} attempts to store these facts"
        ))
        .into())
    }

    /// Stores one fact given by hand (the records API), as an extraction
    /// of `strategy` would.
    /// `user` is the key, `name` the user as the caller knows them.
    pub async fn add(
        &self,
        user: &str,
        name: &str,
        text: String,
        said_at: Option<i64>,
        strategy: &Strategy,
    ) -> Result<Extracted, LongTermError> {
        let mut vectors = self.embed(Job::Extract, vec![text.clone()]).await?;
        let embedding = vectors.pop().unwrap_or_default();
        let fact = NewFact {
            text,
            strategy: strategy.name.clone(),
            namespace: lt::namespace(&strategy.namespace, &strategy.name, name, ""),
            said_at,
            embedding,
        };
        self.store(user, "", i64::MAX, vec![fact]).await
    }

    /// `user`'s records most like `query`, best first, each with its score.
    pub async fn search(
        &self,
        user: &str,
        query: &str,
        limit: usize,
        threshold: f32,
        namespace: Option<&str>,
    ) -> Result<Vec<(Arc<Record>, f32)>, LongTermError> {
        let held = self.records.of(&self.storage, user).await?;
        // Nothing to rank (a new user's every turn, until a first
        // extraction): the embedding call would be paid for nothing.
        // A superseded record is never sent, nor found.
        let in_scope =
            |r: &Record| namespace.is_none_or(|ns| r.namespace == ns) && supersede::current(r);
        if !held.records.iter().any(|r| in_scope(r)) {
            return Ok(Vec::new());
        }
        let mut vectors = self.embed(Job::Recall, vec![query.to_owned()]).await?;
        let vector = vectors.pop().unwrap_or_default();
        let ranking = self.config.ranking;
        let rank = |records: &[&Arc<Record>]| match ranking {
            Ranking::Hybrid => shared(hybrid::rank(records, &vector, query, limit, threshold)),
            Ranking::Cosine => shared(lt::rank(records, &vector, limit, threshold)),
        };
        let within: Vec<&Arc<Record>> = held.records.iter().filter(|r| in_scope(r)).collect();
        Ok(rank(&within))
    }

    /// `facts` cut to the configured budget.
    fn budgeted(&self, facts: Vec<Fact>) -> Vec<Fact> {
        let c = &self.config;
        lt::within_budget(facts, &c.template, c.max_tokens, |t| {
            Encoding::Approx.count(t)
        })
    }

    /// The facts for the turn after `query`'s message, as configured; the
    /// records sent are marked as recalled (for eviction).
    pub async fn recall(&self, user: &str, query: &Query) -> Result<Vec<Fact>, LongTermError> {
        let c = &self.config;
        let found = self
            .search(user, &query.text, c.limit, c.score_threshold, None)
            .await?;
        let ranked: Vec<(&Record, f32)> = found.iter().map(|(r, s)| (&**r, *s)).collect();
        let facts = self.budgeted(lt::recalled(&ranked));
        // Eviction needs to know what is used, not when to the second: a
        // write per search would compete with the turns' own writes.
        let at = self.clock.now_ms();
        let stale: Vec<String> = found
            .iter()
            .filter(|(r, _)| r.recalled_at < at - MARK_RECALLED_EVERY_MS)
            .filter(|(r, _)| facts.iter().any(|f| f.id == r.id))
            .map(|(r, _)| r.id.clone())
            .collect();
        if !stale.is_empty() {
            if let Err(e) = self.records.recalled(&self.storage, user, &stale, at).await {
                tracing::warn!(error = %e, "could not mark records as recalled");
            }
        }
        self.metrics().memory.job(Job::Recall, JobOutcome::Stored);
        Ok(facts)
    }

    /// A new session's facts: the user's newest records.
    pub async fn recent(&self, user: &str) -> Result<Vec<Fact>, StorageError> {
        let held = self.records.of(&self.storage, user).await?;
        Ok(self.budgeted(lt::recent(&held.records, self.config.limit)))
    }
}

fn shared<R: Borrow<Arc<Record>>>(ranked: Vec<(&R, f32)>) -> Vec<(Arc<Record>, f32)> {
    ranked
        .into_iter()
        .map(|(r, s)| (Arc::clone(r.borrow()), s))
        .collect()
}

/// `mem_` and 24 random hex digits.
pub fn record_id() -> String {
    let mut bytes = [0u8; 12];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    format!("mem_{}", hex::encode(bytes))
}
