//! A message's `metadata`: seed 000's free-form map, stored compactly.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A message's `metadata`, kept small: nearly every stored message has a
/// `source`, nearly always one of a few words, so a known word is kept as a
/// static string that costs no allocation; anything else is kept in order
/// beside it (an unusual `source` among them).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    source: Option<&'static str>,
    rest: Box<[(String, Value)]>,
}

const KNOWN_SOURCES: &[&str] = &[
    "message",
    "llm",
    "llm_failure",
    "cache",
    "asr",
    "greeting",
    "command",
    "silence",
];

impl Metadata {
    /// Any field but a known `source` (see `get_str`).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.rest.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A text field, `source` included.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        if key == "source" {
            if let Some(s) = self.source {
                return Some(s);
            }
        }
        self.get(key)?.as_str()
    }

    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        if key == "source" {
            self.source = None;
            if let Some(word) = value
                .as_str()
                .and_then(|t| KNOWN_SOURCES.iter().find(|k| **k == t))
            {
                self.source = Some(word);
                self.remove_rest("source");
                return;
            }
        }
        match self.rest.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => {
                let mut rest = std::mem::take(&mut self.rest).into_vec();
                rest.push((key, value));
                self.rest = rest.into_boxed_slice();
            }
        }
    }

    /// Sets `key` unless it is set already.
    pub fn insert_default(&mut self, key: &str, value: impl FnOnce() -> Value) {
        let present = (key == "source" && self.source.is_some()) || self.get(key).is_some();
        if !present {
            self.insert(key, value());
        }
    }

    pub fn remove(&mut self, key: &str) {
        if key == "source" {
            self.source = None;
        }
        self.remove_rest(key);
    }

    fn remove_rest(&mut self, key: &str) {
        if self.rest.iter().any(|(k, _)| k == key) {
            let mut rest = std::mem::take(&mut self.rest).into_vec();
            rest.retain(|(k, _)| k != key);
            self.rest = rest.into_boxed_slice();
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Metadata {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.rest.len() + 1))?;
        if let Some(source) = self.source {
            map.serialize_entry("source", source)?;
        }
        for (k, v) in self.rest.iter() {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        let mut meta = Metadata::default();
        let mut rest = Vec::with_capacity(map.len());
        for (k, v) in map {
            if k == "source" {
                if let Some(word) = v
                    .as_str()
                    .and_then(|t| KNOWN_SOURCES.iter().find(|w| **w == t))
                {
                    meta.source = Some(word);
                    continue;
                }
            }
            rest.push((k, v));
        }
        meta.rest = rest.into_boxed_slice();
        Ok(meta)
    }
}
