//! The exact-match answer cache: a user message that repeats an
//! earlier one, under the same model and the same instructions, gets the
//! earlier answer without a call to the upstream.
//!
//! Only complete text answers are stored: never interrupted or failed
//! replies, never tool calls.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;
use serde_json::{Map, Value};

use crate::config::{CacheConfig, CacheScope};
use recall_core::memory::message::Message;

/// A SHA-256 over everything that must match for an answer to be reused.
pub type Key = [u8; 32];

pub struct AnswerCache {
    scope: CacheScope,
    ttl: Duration,
    entries: Mutex<LruCache<Key, (Instant, String)>>,
}

impl AnswerCache {
    pub fn new(config: &CacheConfig) -> Option<Self> {
        if !config.exact_match {
            return None;
        }
        let cap = NonZeroUsize::new(config.max_entries)?;
        Some(Self {
            scope: config.scope,
            ttl: Duration::from_secs(config.ttl_secs),
            entries: Mutex::new(LruCache::new(cap)),
        })
    }

    /// The key of a request, or `None` when it cannot be answered from the
    /// cache: its last message is not a plain-text user message, it asks
    /// for tools, or the scope is the session and there is none.
    /// `session` is the session's id and incarnation (which changes when
    /// its history is reset, so that a reused id never sees old answers).
    /// `partition` is the client key's tenant (empty without client keys).
    /// `params` is the request body; every field but the messages and the
    /// streaming options must match too.
    pub fn key(
        &self,
        partition: &str,
        session: Option<(&str, u64)>,
        model: &str,
        instructions: &[Message],
        last: Option<&Message>,
        params: &Map<String, Value>,
    ) -> Option<Key> {
        let last = last.filter(|m| m.role == "user")?;
        let text = last.content_str()?;
        let has_tools = ["tools", "functions"].iter().any(|k| {
            params
                .get(*k)
                .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        });
        if has_tools {
            return None;
        }
        let scope = match self.scope {
            CacheScope::Session => {
                let (id, incarnation) = session?;
                format!("{id}\u{0}{incarnation}")
            }
            CacheScope::Global => String::new(),
        };
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut field = |bytes: &[u8]| {
            // Length-prefixed, so that no two field lists hash alike.
            ctx.update(&(bytes.len() as u64).to_le_bytes());
            ctx.update(bytes);
        };
        // Client keys never share answers, even with a global scope.
        field(partition.as_bytes());
        field(scope.as_bytes());
        field(model.as_bytes());
        for (k, v) in params {
            if !matches!(
                k.as_str(),
                "messages" | "stream" | "stream_options" | "session_id" | "model"
            ) {
                field(k.as_bytes());
                field(v.to_string().as_bytes());
            }
        }
        for m in instructions {
            field(m.role.as_str().as_bytes());
            field(m.content.to_string().as_bytes());
        }
        field(text.as_bytes());
        let digest = ctx.finish();
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        Some(key)
    }

    pub fn get(&self, key: &Key) -> Option<String> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(key) {
            Some((at, text)) if at.elapsed() < self.ttl => Some(text.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    /// Stores a reply if it is a complete plain-text answer: not cut off,
    /// not stopped by a length limit or a filter.
    pub fn put(&self, key: Key, reply: &Message, finish_reason: Option<&str>) {
        if reply.has_tool_calls()
            || recall_core::memory::interruption::is_interrupted(reply)
            || finish_reason.is_some_and(|r| r != "stop")
        {
            return;
        }
        let Some(text) = reply.content_str().filter(|t| !t.is_empty()) else {
            return;
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.put(key, (Instant::now(), text.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::accumulate::ReplyAccumulator;
    use recall_core::memory::message::Role;
    use serde_json::json;

    fn cache(scope: CacheScope) -> AnswerCache {
        AnswerCache::new(&CacheConfig {
            exact_match: true,
            scope,
            ttl_secs: 60,
            max_entries: 2,
        })
        .unwrap()
    }

    #[test]
    fn keys_depend_on_what_must_match() {
        let c = cache(CacheScope::Session);
        let q = Message::new(Role::User, "hours?");
        let sys = [Message::new(Role::System, "be brief")];
        let body = |v: Value| v.as_object().cloned().unwrap();
        let plain = body(json!({"model": "m", "stream": true, "messages": []}));
        let s1 = Some(("s1", 1));
        let k = c.key("", s1, "m", &sys, Some(&q), &plain).unwrap();
        assert_eq!(
            c.key("", s1, "m", &sys, Some(&q), &body(json!({}))),
            Some(k)
        );
        assert_ne!(
            c.key("", Some(("s1", 2)), "m", &sys, Some(&q), &plain),
            Some(k)
        );
        assert_ne!(
            c.key("", Some(("s2", 1)), "m", &sys, Some(&q), &plain),
            Some(k)
        );
        assert_ne!(c.key("", s1, "m2", &sys, Some(&q), &plain), Some(k));
        assert_ne!(c.key("", s1, "m", &[], Some(&q), &plain), Some(k));
        let json_mode = body(json!({"response_format": {"type": "json_object"}}));
        assert_ne!(c.key("", s1, "m", &sys, Some(&q), &json_mode), Some(k));
        let tools = body(json!({"tools": [{"type": "function"}]}));
        assert!(c.key("", s1, "m", &sys, Some(&q), &tools).is_none());
        let other = Message::new(Role::Assistant, "x");
        assert!(c.key("", s1, "m", &sys, Some(&other), &plain).is_none());
        assert!(c.key("", None, "m", &sys, Some(&q), &plain).is_none());
        let g = cache(CacheScope::Global);
        assert_eq!(
            g.key("", s1, "m", &sys, Some(&q), &plain),
            g.key("", None, "m", &sys, Some(&q), &plain)
        );
    }

    #[test]
    fn only_complete_text_answers_are_kept() {
        let c = cache(CacheScope::Global);
        let cut = recall_core::memory::interruption::interrupted_reply(
            Message::new(Role::Assistant, "Op"),
            &Message::new(Role::Assistant, "Open"),
            true,
            1,
            None,
            "endpoint",
        );
        c.put([1; 32], &cut, Some("stop"));
        assert_eq!(c.get(&[1; 32]), None);
        c.put(
            [3; 32],
            &Message::new(Role::Assistant, "9 to"),
            Some("length"),
        );
        assert_eq!(c.get(&[3; 32]), None);
        c.put(
            [2; 32],
            &Message::new(Role::Assistant, "9 to 5"),
            Some("stop"),
        );
        assert_eq!(c.get(&[2; 32]).as_deref(), Some("9 to 5"));
    }

    #[test]
    fn the_sse_form_accumulates_to_the_answer() {
        let mut acc = ReplyAccumulator::default();
        let mut parser = sse_parse::SseParser::new();
        let given = crate::proxy::protocol::Protocol::ChatCompletions
            .given_stream("m", "9 to 5", 1000, true);
        parser.feed(given.as_bytes());
        while let Some(e) = parser.next_event() {
            acc.push_data(&e.data);
        }
        assert!(acc.done && acc.finished);
        assert_eq!(acc.content(), "9 to 5");
    }
}
