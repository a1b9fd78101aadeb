//! A user's records as they are stored: `Held`, a record's JSON without
//! its embedding, and the embedding as little-endian `f32`s. Shared by
//! the SQLite and Redis backends, and nothing else of `records`.

use std::sync::Arc;

use serde_json::Value;

use crate::StorageError;
use recall_core::memory::long_term::{self, Record};

/// One user's records as stored at `version`; `forgotten_at` is when they
/// were last all forgotten (0 never). Records are in id order on every
/// backend (`touched` finds them by binary search). Each is shared: a
/// change copies the list of pointers and only the records it changes
/// (copying every record's strings was a measurable share of a process's
/// CPU with long-term memory on: docs/perf-journal.md, item 47).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub version: u64,
    pub forgotten_at: i64,
    pub records: Vec<Arc<Record>>,
}

/// A record as stored beside its embedding: its JSON without the
/// embedding (kilobytes of numbers as text), which is kept as a blob.
pub(crate) fn body(r: &Record) -> Result<String, StorageError> {
    let bare = Record {
        embedding: Vec::new().into(),
        ..r.clone()
    };
    let mut v = serde_json::to_value(&bare).map_err(|e| corrupt(&r.id, e))?;
    if let Value::Object(o) = &mut v {
        o.remove("embedding");
    }
    Ok(v.to_string())
}

/// A record from its stored body and embedding.
pub(crate) fn record(body: &str, blob: &[u8]) -> Result<Record, StorageError> {
    let mut v: Value = serde_json::from_str(body).map_err(|e| corrupt("?", e))?;
    let Value::Object(o) = &mut v else {
        return Err(corrupt("?", "not a JSON object"));
    };
    let id = o
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    o.insert("embedding".into(), Value::Array(Vec::new()));
    let mut r: Record = serde_json::from_value(v).map_err(|e| corrupt(&id, e))?;
    r.embedding = from_blob(blob).map_err(|e| corrupt(&id, e))?.into();
    Ok(r)
}

/// A stored body with `recalled_at` set, all else as it was.
pub(crate) fn with_recalled(body: &str, at_ms: i64) -> Result<String, StorageError> {
    let mut v: Value = serde_json::from_str(body).map_err(|e| corrupt("?", e))?;
    let Value::Object(o) = &mut v else {
        return Err(corrupt("?", "not a JSON object"));
    };
    o.insert("recalled_at".into(), at_ms.into());
    Ok(v.to_string())
}

/// An embedding as stored (`long_term::vector_bytes`).
pub(crate) fn to_blob(embedding: &[f32]) -> Vec<u8> {
    long_term::vector_bytes(embedding)
}

pub(crate) fn from_blob(blob: &[u8]) -> Result<Vec<f32>, StorageError> {
    long_term::vector_of_bytes(blob).ok_or_else(|| {
        StorageError::Corrupt(format!("an embedding of {} bytes is not f32s", blob.len()))
    })
}

fn corrupt(id: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(format!("memory record {id}: {e}"))
}
