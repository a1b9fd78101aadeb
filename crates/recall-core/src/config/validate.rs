//! The checks a config passes before the server starts: each error names
//! the file and the key.

use std::path::Path;

use super::*;

/// A request this long after a close is a new turn, not the user talking
/// over the reply.
const MAX_BARGE_IN_AFTER_CLOSE_MS: u64 = 60_000;

impl Config {
    pub(super) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message: message.to_owned(),
        };
        if self.listen_addr().is_err() {
            return Err(invalid(
                "server.listen",
                "must be an address such as \"127.0.0.1:8080\"",
            ));
        }
        if self.server.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be greater than 0"));
        }
        if self.server.request_body_timeout_secs == 0 {
            return Err(invalid(
                "server.request_body_timeout_secs",
                "must be at least 1",
            ));
        }
        if self.server.max_request_messages == 0 {
            return Err(invalid("server.max_request_messages", "must be at least 1"));
        }
        if self.server.worker_threads > 1024 {
            return Err(invalid(
                "server.worker_threads",
                "must be at most 1024 (0 = one per CPU)",
            ));
        }
        for (key, name) in [
            ("session.header", &self.session.header),
            ("session.user_header", &self.session.user_header),
        ] {
            if http::HeaderName::try_from(name.as_str()).is_err() {
                return Err(invalid(key, "is not a valid HTTP header name"));
            }
        }
        if self.storage.backend == StorageBackend::Redis {
            if let Err(e) = self.storage.redis_target() {
                return Err(invalid("storage.url", &e));
            }
            if self.storage.key_prefix.contains(['{', '}']) {
                return Err(invalid(
                    "storage.key_prefix",
                    "must not contain { or }: recall puts each session's keys in a hash tag of their own",
                ));
            }
            if self.storage.lease_ms < 100 {
                return Err(invalid("storage.lease_ms", "must be at least 100"));
            }
            if self.storage.replica_ack_timeout_ms == 0 {
                return Err(invalid(
                    "storage.replica_ack_timeout_ms",
                    "must be at least 1 (0 would make WAIT wait for ever)",
                ));
            }
            if self.storage.timeout_ms < 100 {
                return Err(invalid("storage.timeout_ms", "must be at least 100"));
            }
        }
        if self.storage.backend == StorageBackend::Sqlite && self.storage.path.trim().is_empty() {
            return Err(invalid("storage.path", "must name the database file"));
        }
        if self.session.max_sessions == 0 {
            return Err(invalid("session.max_sessions", "must be at least 1"));
        }
        if let Some(url) = &self.webhook.url {
            if !is_http_url(url) {
                return Err(invalid(
                    "webhook.url",
                    &format!("({url:?}) must be an http(s) URL"),
                ));
            }
        }
        for e in &self.webhook.events {
            if !WEBHOOK_EVENTS.contains(&e.as_str()) {
                return Err(invalid(
                    "webhook.events",
                    &format!("({e:?}) must be one of {WEBHOOK_EVENTS:?}"),
                ));
            }
        }
        if self.webhook.timeout_secs == 0 {
            return Err(invalid("webhook.timeout_secs", "must be at least 1"));
        }
        if self.cache.exact_match && (self.cache.max_entries == 0 || self.cache.ttl_secs == 0) {
            return Err(invalid(
                "cache.max_entries",
                "and cache.ttl_secs must be greater than 0 when the cache is on",
            ));
        }
        let h = &self.history;
        if h.max_messages != 0 && (h.window_messages == 0 || h.window_messages > h.max_messages) {
            return Err(invalid(
                "history.window_messages",
                &format!(
                    "({}) must not be larger than history.max_messages ({}); 0 means no limit",
                    h.window_messages, h.max_messages
                ),
            ));
        }
        if h.window_tokens > MAX_WINDOW_TOKENS {
            return Err(invalid(
                "history.window_tokens",
                &format!(
                    "({}) is larger than any model's context (at most {MAX_WINDOW_TOKENS}); 0 means no limit",
                    h.window_tokens
                ),
            ));
        }
        let int = &self.interruption;
        if int.capture_original && (int.drain_timeout_secs == 0 || int.drain_max_bytes == 0) {
            return Err(invalid(
                "interruption.drain_timeout_secs",
                "and drain_max_bytes must be greater than 0 (set capture_original = false instead)",
            ));
        }
        if int.barge_in_after_close_ms > MAX_BARGE_IN_AFTER_CLOSE_MS {
            return Err(invalid(
                "interruption.barge_in_after_close_ms",
                &format!(
                    "({}) is longer than a user waits to be heard (at most {MAX_BARGE_IN_AFTER_CLOSE_MS}); 0 turns it off",
                    int.barge_in_after_close_ms
                ),
            ));
        }
        for (i, m) in self.system_messages.iter().enumerate() {
            if m.role != "system" && m.role != "developer" {
                return Err(invalid(
                    &format!("system_messages[{i}].role"),
                    "must be \"system\" or \"developer\"",
                ));
            }
        }
        if self.upstreams.is_empty() {
            return Err(invalid(
                "upstreams",
                "needs at least one [[upstreams]] entry",
            ));
        }
        for (i, u) in self.upstreams.iter().enumerate() {
            let key = |k: &str| format!("upstreams[{i}].{k}");
            if u.name.trim().is_empty() {
                return Err(invalid(&key("name"), "must not be empty"));
            }
            match MockKind::from_base_url(&u.base_url) {
                Some(Err(e)) => return Err(invalid(&key("base_url"), &e.to_string())),
                Some(Ok(_)) => {
                    validate_mock_pace(u).map_err(|(k, message)| invalid(&key(k), &message))?
                }
                None if !is_http_url(&u.base_url) => {
                    return Err(invalid(
                        &key("base_url"),
                        &format!(
                            "({:?}) must be an http(s) URL or \"{}\"",
                            u.base_url,
                            super::ECHO_URL
                        ),
                    ))
                }
                None => {
                    // The pace keys would be silently ignored here.
                    for (k, set) in [
                        ("mock_chunk_delay_ms", u.mock_chunk_delay_ms.is_some()),
                        ("mock_words_per_chunk", u.mock_words_per_chunk.is_some()),
                    ] {
                        if set {
                            return Err(invalid(&key(k), "applies only to a mock:// base_url"));
                        }
                    }
                }
            }
            if u.models.is_empty() {
                return Err(invalid(&key("models"), "must list at least one pattern"));
            }
            if u.timeout_secs == 0 || u.connect_timeout_secs == 0 || u.read_timeout_secs == 0 {
                return Err(invalid(
                    &key("timeout_secs"),
                    "timeouts must be at least 1 second",
                ));
            }
            if let Some(f) = &u.fallback {
                if f == &u.name || !self.upstreams.iter().any(|o| &o.name == f) {
                    return Err(invalid(
                        &key("fallback"),
                        &format!("({f:?}) must name another upstream"),
                    ));
                }
            }
            for (name, value) in &u.headers {
                if http::HeaderName::try_from(name.as_str()).is_err()
                    || http::HeaderValue::try_from(value.as_str()).is_err()
                {
                    return Err(invalid(
                        &key(&format!("headers.{name}")),
                        "is not a valid header",
                    ));
                }
            }
        }
        self.validate_memory()
            .map_err(|(k, m)| invalid(&format!("memory.{k}"), &m))?;
        let served = |model: &str| {
            self.upstreams.iter().any(|u| {
                u.models
                    .iter()
                    .any(|p| wildmatch::WildMatch::new(p).matches(model))
            })
        };
        self.long_term
            .validate(served)
            .map_err(|(k, m)| invalid(&format!("long_term.{k}"), &m))?;
        if !(1..=3600).contains(&self.console.sample_secs) {
            return Err(invalid("console.sample_secs", "must be from 1 to 3600"));
        }
        Ok(())
    }

    /// `[memory]`: the failing key (within the section) and why.
    fn validate_memory(&self) -> Result<(), (&'static str, String)> {
        let m = &self.memory;
        if !m.uses_model() {
            return Ok(());
        }
        let Some(model) = &m.summary_model else {
            return Err((
                "summary_model",
                "must name the model that writes summaries (summarize or carry_over is on)".into(),
            ));
        };
        if !self.upstreams.iter().any(|u| {
            u.models
                .iter()
                .any(|p| wildmatch::WildMatch::new(p).matches(model))
        }) {
            return Err((
                "summary_model",
                format!("({model:?}) is served by no upstream's `models`"),
            ));
        }
        for (key, template, slot) in [
            ("summary_template", &m.summary_template, "{summary}"),
            ("carry_over_template", &m.carry_over_template, "{note}"),
        ] {
            if !template.contains(slot) {
                return Err((key, format!("must contain {slot}")));
            }
        }
        for (key, value) in [
            ("summary_every_messages", m.summary_every_messages),
            ("summary_max_chars", m.summary_max_chars),
            ("summary_concurrency", m.summary_concurrency),
            ("carry_over_max_chars", m.carry_over_max_chars),
            ("max_tokens", m.max_tokens),
        ] {
            if value == 0 {
                return Err((key, "must be at least 1".into()));
            }
        }
        for (key, value) in [
            ("summary_max_tokens", m.summary_max_tokens),
            ("carry_over_max_tokens", m.carry_over_max_tokens),
        ] {
            if value.is_some_and(|n| !(1..=MAX_ANSWER_TOKENS).contains(&n)) {
                return Err((key, format!("must be from 1 to {MAX_ANSWER_TOKENS}")));
            }
        }
        let h = &self.history;
        if m.summarize
            && h.max_messages != 0
            && h.window_messages + m.summary_max_lag_messages > h.max_messages
        {
            return Err((
                "summary_max_lag_messages",
                format!(
                    "({}) plus history.window_messages ({}) must not exceed history.max_messages ({}): \
                     messages would be dropped before the summary covers them",
                    m.summary_max_lag_messages, h.window_messages, h.max_messages
                ),
            ));
        }
        if m.summary_timeout_secs == 0 || m.summary_attempts == 0 {
            return Err((
                "summary_timeout_secs",
                "and summary_attempts must be at least 1".into(),
            ));
        }
        if m.summary_prompt.trim().is_empty() || m.carry_over_prompt.trim().is_empty() {
            return Err((
                "summary_prompt",
                "and carry_over_prompt must not be empty".into(),
            ));
        }
        Ok(())
    }
}

/// The mock's pace keys: the failing key (relative to the upstream) and why.
fn validate_mock_pace(u: &UpstreamConfig) -> Result<(), (&'static str, String)> {
    if u.mock_words_per_chunk == Some(0) {
        return Err(("mock_words_per_chunk", "must be at least 1".into()));
    }
    let delay_ms = u
        .mock_chunk_delay_ms
        .unwrap_or(super::DEFAULT_CHUNK_DELAY_MS);
    if delay_ms >= u.read_timeout_secs.saturating_mul(1000) {
        return Err((
            "mock_chunk_delay_ms",
            format!(
                "({delay_ms}) must be shorter than read_timeout_secs ({} s), or every stream times out",
                u.read_timeout_secs
            ),
        ));
    }
    Ok(())
}

fn is_http_url(text: &str) -> bool {
    url::Url::parse(text)
        .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
}
