//! `[[upstreams]]` and `[cache]`: where requests go, how each upstream sees
//! a conversation, and the answer cache in front of them.

use serde::{Deserialize, Serialize};

use super::InterruptedRendering;
use super::MockKind;

/// What an upstream is sent of the conversational extension fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// OpenAI's fields only: `turn_id`, `timestamp` and `metadata` are
    /// stripped, as OpenAI rejects unknown fields.
    #[default]
    Openai,
    /// Every field, plus `turn_id`, `timestamp` and `interruptable`.
    Custom,
}

impl Vendor {
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Openai => "openai",
            Vendor::Custom => "custom",
        }
    }
}

/// Which sequences of roles an upstream accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Roles {
    /// Any order (OpenAI and most servers).
    #[default]
    Any,
    /// User and assistant alternate, as strict chat templates (Mistral,
    /// Gemma) require: messages of one role in a row are merged.
    Alternate,
}

/// How recall asks this upstream for an answer of a given shape (its
/// own extraction calls): `response_format` of type `json_schema`, of type
/// `json_object` with the schema beside it (llama-cpp-python's server), or
/// none (the prompt alone says what to write).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// `json_schema` first; a refusal that names the field steps down to
    /// the next, remembered for the process.
    #[default]
    Auto,
    JsonSchema,
    JsonObject,
    None,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    pub base_url: String,
    /// Environment variable holding the API key. When it is unset or empty the
    /// client's own `Authorization` header is forwarded instead.
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub vendor: Vendor,
    #[serde(default = "default_models")]
    pub models: Vec<String>,
    /// Extra top-level body fields removed before the request goes upstream.
    #[serde(default)]
    pub strip_fields: Vec<String>,
    /// Sent as the top-level `interruptable` field in vendor "custom" mode.
    #[serde(default = "default_true")]
    pub interruptable: bool,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_secs: u64,
    /// Time allowed until the upstream's response headers arrive (the
    /// first byte).
    #[serde(default = "default_timeout", alias = "first_byte_timeout_secs")]
    pub timeout_secs: u64,
    /// Longest silence allowed between two reads of the response body
    /// (between two chunks of a stream).
    #[serde(default = "default_read_timeout", alias = "idle_timeout_secs")]
    pub read_timeout_secs: u64,
    /// Another upstream's name: a call that cannot connect, or that gets a
    /// 5xx before any byte of an answer, is made once more there.
    #[serde(default)]
    pub fallback: Option<String>,
    /// Static headers added to every upstream request (e.g. Azure's `api-key`).
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub interrupted: InterruptedRendering,
    #[serde(default = "default_marker")]
    pub interrupted_marker: String,
    /// What the upstream's chat template accepts of roles in a row.
    #[serde(default)]
    pub roles: Roles,
    /// The most requests recall has open to this upstream at once (0: no
    /// limit). Live turns come first: a drain of a cut reply holds a slot
    /// only while no live request waits.
    #[serde(default)]
    pub max_concurrent: usize,
    /// How recall's own calls that expect a shape ask for it.
    #[serde(default)]
    pub structured_output: StructuredOutput,
    /// `mock://` upstreams only: the wait before each streamed content
    /// chunk. Unset: `DEFAULT_CHUNK_DELAY_MS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_chunk_delay_ms: Option<u64>,
    /// `mock://` upstreams only: words per streamed content chunk. Unset:
    /// `DEFAULT_WORDS_PER_CHUNK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_words_per_chunk: Option<usize>,
}

fn default_marker() -> String {
    " [interrupted by user]".into()
}

fn default_models() -> Vec<String> {
    vec!["*".into()]
}
fn default_true() -> bool {
    true
}
fn default_connect_timeout() -> u64 {
    10
}
fn default_timeout() -> u64 {
    120
}
fn default_read_timeout() -> u64 {
    120
}

impl UpstreamConfig {
    pub fn is_custom(&self) -> bool {
        self.vendor == Vendor::Custom
    }

    /// Whether `base_url` names a built-in mock (valid or not).
    pub fn is_mock(&self) -> bool {
        MockKind::from_base_url(&self.base_url).is_some()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Answer a repeated user message from memory instead of the upstream.
    pub exact_match: bool,
    pub scope: CacheScope,
    pub ttl_secs: u64,
    pub max_entries: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            exact_match: false,
            scope: CacheScope::Session,
            ttl_secs: 3600,
            max_entries: 10_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Session,
    Global,
}
