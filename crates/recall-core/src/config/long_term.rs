//! `[long_term]`: long-term memory per user. Facts extracted
//! from conversations in the background, stored with embeddings, and
//! recalled by meaning into later turns and sessions.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// `embedding_model = "local:<dir>"`: a sentence-transformers folder recall
/// runs itself (`models::local`) instead of a model an upstream serves.
pub const LOCAL_MODEL_PREFIX: &str = "local:";

pub const DEFAULT_NAMESPACE: &str = "/strategies/{strategy}/users/{user}";

pub const SEMANTIC_PROMPT: &str = "You keep long-term memory about a user. From the \
conversation below, extract the facts about the user that will still be true and useful \
in a later conversation: who they are, where they live, what they do, what they own, \
their health, their family, their plans. Leave out what is only about this conversation.";

pub const USER_PREFERENCE_PROMPT: &str = "You keep long-term memory about a user. From the \
conversation below, extract the user's preferences: what they like and dislike, their \
habits, the choices they made and how they want to be answered.";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyType {
    /// The user's own sentences, stored as said: no model call.
    Verbatim,
    Semantic,
    UserPreference,
    Custom,
}

/// `[[long_term.strategies]]`: one kind of fact, with its own prompt and
/// its own namespace of records.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Strategy {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: StrategyType,
    /// Required for `custom`; replaces the built-in one otherwise.
    pub prompt: Option<String>,
    /// `{strategy}`, `{user}` and `{session}` are filled in.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// `verbatim` only: each record also holds the end of the reply the
    /// user was answering (`... (replying to: "...")`), so that "yes,
    /// twice" is found and read by what it answers.
    #[serde(default)]
    pub with_replies: bool,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}

impl Strategy {
    /// Whether its records are extracted by a model.
    pub fn needs_model(&self) -> bool {
        self.kind != StrategyType::Verbatim
    }

    /// What the extract model is told to look for.
    pub fn prompt(&self) -> &str {
        match (&self.prompt, self.kind) {
            (Some(p), _) => p,
            (None, StrategyType::UserPreference) => USER_PREFERENCE_PROMPT,
            (None, _) => SEMANTIC_PROMPT,
        }
    }
}

/// How a turn's records are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ranking {
    /// By meaning and by words (BM25), fused by rank.
    Hybrid,
    /// By cosine similarity alone.
    Cosine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Retrieve {
    /// The result of the search started after the last user message.
    Prefetch,
    /// A search before the upstream call, within `inline_timeout_ms`.
    Inline,
}

/// How the embedding model is asked to write its vectors
/// (`encoding_format`). Base64 (little-endian f32s, as OpenAI's and the
/// official SDKs' default) is a quarter of the bytes and no number parsing;
/// `float` is for a server that refuses it. Either answer is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbeddingEncoding {
    Base64,
    Float,
}

impl EmbeddingEncoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Base64 => "base64",
            Self::Float => "float",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LongTermConfig {
    pub enabled: bool,
    /// The model that extracts facts, routed like any other. Without
    /// one, the default strategy is `verbatim`, which calls no model.
    pub extract_model: Option<String>,
    /// The model that embeds facts and queries, called on its upstream's
    /// `/v1/embeddings`, or `local:<dir>` to run one in process.
    pub embedding_model: Option<String>,
    pub embedding_encoding: EmbeddingEncoding,
    /// None: one `semantic` strategy with an extract model, one
    /// `verbatim` strategy without.
    pub strategies: Vec<Strategy>,
    /// Extraction runs every this many turns, and when a session ends.
    pub extract_every_turns: usize,
    /// A fact this close (cosine) to a record of its namespace updates it.
    pub merge_threshold: f32,
    /// Records sent with a turn, at most.
    pub limit: usize,
    /// ... and at most this many tokens of them (the facts message, each
    /// line with its date; four characters a token), best first.
    pub max_tokens: usize,
    /// ... each scoring at least this (cosine similarity to the query),
    /// or, ranked `hybrid`, sharing a word with it.
    pub score_threshold: f32,
    pub ranking: Ranking,
    /// `{facts}` is replaced by the records, one per line.
    pub template: String,
    pub retrieve: Retrieve,
    pub inline_timeout_ms: u64,
    /// The least recently used records of a fuller user go first.
    pub max_records_per_user: usize,
    /// An extraction answer's first this many distinct facts are stored,
    /// per strategy; the model's answer would otherwise set how many
    /// embeddings an extraction asks for.
    pub max_facts_per_answer: usize,
    /// The `max_tokens` an extraction asks for. Unset: `facts_tokens` of
    /// `max_facts_per_answer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extract_max_tokens: Option<u32>,
    /// Model calls of long-term jobs running at once, over all sessions.
    pub concurrency: usize,
    /// How long one model call may take.
    pub timeout_secs: u64,
    /// Attempts of a job before it gives up.
    pub attempts: u32,
}

impl Default for LongTermConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            extract_model: None,
            embedding_model: None,
            embedding_encoding: EmbeddingEncoding::Base64,
            strategies: Vec::new(),
            extract_every_turns: 3,
            merge_threshold: 0.93,
            limit: 100,
            max_tokens: 1000,
            score_threshold: 0.2,
            ranking: Ranking::Hybrid,
            template: "Relevant facts about the user:\n{facts}".into(),
            retrieve: Retrieve::Inline,
            inline_timeout_ms: 300,
            max_records_per_user: 1000,
            max_facts_per_answer: 50,
            extract_max_tokens: None,
            concurrency: 4,
            timeout_secs: 30,
            attempts: 3,
        }
    }
}

/// Tokens of one fact in an extraction answer, as `{"text": "..."}, `:
/// a sentence of about 60 characters.
const FACT_TOKENS: u32 = 24;
/// The answer's own `{"facts": [...]}` and a fence or a preamble.
const ANSWER_TOKENS: u32 = 32;
/// The derived `max_tokens` of an extraction is at most this: past it, a
/// model is rambling, not listing facts.
pub const MAX_DERIVED_EXTRACT_TOKENS: u32 = 4096;

/// The `max_tokens` that lets an extraction answer hold `facts` facts of
/// a typical length.
pub fn facts_tokens(facts: usize) -> u32 {
    let facts = u32::try_from(facts).unwrap_or(u32::MAX);
    facts
        .saturating_mul(FACT_TOKENS)
        .saturating_add(ANSWER_TOKENS)
        .min(MAX_DERIVED_EXTRACT_TOKENS)
}

impl LongTermConfig {
    /// The `max_tokens` of an extraction.
    pub fn extract_max_tokens(&self) -> u32 {
        self.extract_max_tokens
            .unwrap_or_else(|| facts_tokens(self.max_facts_per_answer))
    }

    /// The configured strategies, or the default one: `semantic` with an
    /// extract model, `verbatim` without.
    pub fn strategies(&self) -> Vec<Strategy> {
        if !self.strategies.is_empty() {
            return self.strategies.clone();
        }
        let (name, kind) = match self.extract_model {
            Some(_) => ("semantic", StrategyType::Semantic),
            None => ("verbatim", StrategyType::Verbatim),
        };
        vec![Strategy {
            name: name.into(),
            kind,
            prompt: None,
            namespace: default_namespace(),
            with_replies: false,
        }]
    }

    /// Whether any strategy calls the extract model.
    pub fn needs_extract_model(&self) -> bool {
        self.strategies().iter().any(Strategy::needs_model)
    }

    /// The directory of a `local:` embedding model, as written: a relative
    /// one is taken from the working directory, as `storage.path` is.
    pub fn local_embedder(&self) -> Option<&Path> {
        self.embedding_model
            .as_deref()?
            .strip_prefix(LOCAL_MODEL_PREFIX)
            .map(Path::new)
    }

    /// The failing key (within the section) and why; `served` says whether
    /// an upstream serves a model.
    pub(super) fn validate(&self, served: impl Fn(&str) -> bool) -> Result<(), (String, String)> {
        let fail = |k: &str, m: String| Err((k.to_owned(), m));
        if !self.enabled {
            return Ok(());
        }
        for (key, model) in [
            ("extract_model", &self.extract_model),
            ("embedding_model", &self.embedding_model),
        ] {
            match model {
                None if key == "extract_model" && !self.needs_extract_model() => {}
                None if key == "extract_model" => {
                    return fail(
                        key,
                        "must name a model: a strategy other than verbatim extracts facts with it"
                            .into(),
                    )
                }
                None => return fail(key, "must name a model (long_term is enabled)".into()),
                Some(_) if key == "embedding_model" && self.local_embedder().is_some() => {}
                Some(m) if !served(m) => {
                    return fail(key, format!("({m:?}) is served by no upstream's `models`"))
                }
                Some(_) => {}
            }
        }
        if let Some(dir) = self.local_embedder() {
            local_model(dir).map_err(|m| ("embedding_model".to_owned(), m))?;
        }
        if !(0.0..=1.0).contains(&self.merge_threshold) {
            return fail("merge_threshold", "must be between 0 and 1".into());
        }
        if !(0.0..=1.0).contains(&self.score_threshold) {
            return fail("score_threshold", "must be between 0 and 1".into());
        }
        if !(1..=200).contains(&self.limit) {
            return fail("limit", "must be between 1 and 200".into());
        }
        if !self.template.contains("{facts}") {
            return fail("template", "must contain {facts}".into());
        }
        for (key, value) in [
            ("extract_every_turns", self.extract_every_turns),
            ("max_records_per_user", self.max_records_per_user),
            ("max_tokens", self.max_tokens),
            ("max_facts_per_answer", self.max_facts_per_answer),
            ("concurrency", self.concurrency),
            ("timeout_secs", self.timeout_secs as usize),
            ("attempts", self.attempts as usize),
            ("inline_timeout_ms", self.inline_timeout_ms as usize),
        ] {
            if value == 0 {
                return fail(key, "must be at least 1".into());
            }
        }
        if let Some(n) = self.extract_max_tokens {
            if !(1..=super::MAX_ANSWER_TOKENS).contains(&n) {
                let max = super::MAX_ANSWER_TOKENS;
                return fail("extract_max_tokens", format!("must be from 1 to {max}"));
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, s) in self.strategies.iter().enumerate() {
            let key = format!("strategies[{i}]");
            if s.name.trim().is_empty() || names.contains(&s.name.as_str()) {
                return Err((key, "needs a name of its own".into()));
            }
            names.push(&s.name);
            if s.kind == StrategyType::Custom && s.prompt.as_deref().is_none_or(str::is_empty) {
                return Err((key, "of type custom needs a prompt".into()));
            }
            if s.kind == StrategyType::Verbatim && s.prompt.is_some() {
                return Err((
                    key,
                    "of type verbatim calls no model: it takes no prompt".into(),
                ));
            }
            if s.kind != StrategyType::Verbatim && s.with_replies {
                return Err((key, "with_replies is for a verbatim strategy".into()));
            }
            if !s.namespace.contains("{user}") {
                return Err((
                    key,
                    "namespace must contain {user}: records are a user's".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Whether a `local:` model can be named at all: this build runs one, and
/// the name has a directory.
fn local_model(dir: &Path) -> Result<(), String> {
    let named = local_name(dir);
    if !cfg!(feature = "local-embedder") {
        return Err(format!(
            "{named} names a local model, but this recall was built without the \
             `local-embedder` feature: build it with default features, or name a model \
             an upstream serves"
        ));
    }
    if dir.as_os_str().is_empty() {
        return Err(format!(
            "{named} must name a directory after `{LOCAL_MODEL_PREFIX}`"
        ));
    }
    Ok(())
}

/// Whether a `local:` model's directory is there (what is in it is read
/// when the server starts).
pub(super) fn local_folder(dir: &Path) -> Result<(), String> {
    let named = local_name(dir);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{named}: {} is not a directory", dir.display())),
        Err(e) => Err(format!("{named}: cannot read {}: {e}", dir.display())),
    }
}

fn local_name(dir: &Path) -> String {
    format!("(\"{LOCAL_MODEL_PREFIX}{}\")", dir.display())
}
