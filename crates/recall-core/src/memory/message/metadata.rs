//! A message's `metadata`: a free-form map, stored compactly.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::mark::{ResponseMark, KEY as MARK};

/// A message's `metadata`, kept small: nearly every stored message has a
/// `source`, nearly always one of a few words, so a known word is kept as a
/// static string that costs no allocation; anything else is kept in order
/// beside it (an unusual `source` among them), a response's mark typed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    source: Option<&'static str>,
    rest: Box<[(String, Field)]>,
}

/// A field's value. The same size as a `Value` (a test holds it), so that
/// typing the mark costs the other fields nothing.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    Json(Value),
    /// Only ever under `response`.
    Mark(Box<ResponseMark>),
}

impl Field {
    /// A value under `key`: under `response`, an object that reads as a
    /// mark is one, however it came (stored, or set by `insert`), so that
    /// a message reads the same before it is stored and after.
    fn of(key: &str, v: Value) -> Field {
        match (key == MARK).then(|| ResponseMark::of_value(&v)).flatten() {
            Some(mark) => Field::Mark(Box::new(mark)),
            None => Field::Json(v),
        }
    }
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
        match self.field(key)? {
            Field::Json(v) => Some(v),
            Field::Mark(_) => None,
        }
    }

    fn field(&self, key: &str) -> Option<&Field> {
        self.rest.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether `key` is set, to a value or a mark (`source` included).
    pub fn contains(&self, key: &str) -> bool {
        (key == "source" && self.source.is_some()) || self.field(key).is_some()
    }

    /// The response this message opens (`memory::chain`).
    pub fn mark(&self) -> Option<&ResponseMark> {
        match self.field(MARK)? {
            Field::Mark(m) => Some(m),
            Field::Json(_) => None,
        }
    }

    pub fn set_mark(&mut self, mark: ResponseMark) {
        self.set(MARK.to_owned(), Field::Mark(Box::new(mark)));
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
        let field = Field::of(&key, value);
        self.set(key, field);
    }

    fn set(&mut self, key: String, value: Field) {
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
        if !self.contains(key) {
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
            match v {
                Field::Json(v) => map.serialize_entry(k, v)?,
                Field::Mark(m) => map.serialize_entry(k, m)?,
            }
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
            let field = Field::of(&k, v);
            rest.push((k, field));
        }
        meta.rest = rest.into_boxed_slice();
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_typed_mark_costs_the_other_fields_nothing() {
        assert_eq!(std::mem::size_of::<Field>(), std::mem::size_of::<Value>());
    }

    #[test]
    fn a_stored_mark_reads_typed_and_writes_as_it_was() {
        let stored = json!({"source": "message", "x": [1],
                            "response": {"key": "k", "input_items": 1, "created_at": 3,
                                         "model": "m", "tools": []}});
        let meta: Metadata = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(meta.mark().map(|m| m.key.as_str()), Some("k"));
        // The mark is not an ordinary field.
        assert_eq!(meta.get(MARK), None);
        assert!(meta.contains(MARK));
        assert_eq!(meta.to_value(), stored);
        let mut meta = meta;
        meta.remove(MARK);
        assert_eq!(meta.to_value(), json!({"source": "message", "x": [1]}));
    }

    #[test]
    fn a_mark_inserted_as_a_value_reads_as_it_will_once_stored() {
        let mark = json!({"key": "k"});
        let mut meta = Metadata::default();
        meta.insert(MARK, mark.clone());
        let stored: Metadata = serde_json::from_value(meta.to_value()).unwrap();
        assert_eq!(meta, stored);
        assert_eq!(meta.mark().map(|m| m.key.as_str()), Some("k"));
        meta.insert(MARK, json!({"key": 5}));
        assert_eq!(meta.mark(), None);
        assert_eq!(meta.get(MARK), Some(&json!({"key": 5})));
    }

    #[test]
    fn a_response_field_that_is_no_mark_stays_a_value() {
        let stored = json!({"response": {"key": 5}});
        let meta: Metadata = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(meta.mark(), None);
        assert!(meta.contains(MARK));
        assert_eq!(meta.to_value(), stored);
    }
}
