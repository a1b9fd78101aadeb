//! Long-term memory per user (seed 002), as plain data: records, what an
//! extraction answer holds, similarity, merging a new fact into what is
//! known, ranking for recall, and which records a full user gives up.
//! Nothing here calls a model or storage.

pub mod headings;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A fact about a user, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub text: String,
    pub strategy: String,
    pub namespace: String,
    pub user: String,
    pub session: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// When a recall last sent it (eviction keeps what is used).
    #[serde(default)]
    pub recalled_at: i64,
    pub embedding: Vec<f32>,
}

/// Why an extraction answer holds no facts to store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("the extraction answer is not JSON: {0}")]
    NotJson(String),
    #[error("the extraction answer is not a list of facts")]
    NotAList,
    #[error("fact {0} has no text")]
    NoText(usize),
}

/// The facts of an extraction answer: a JSON list of `{"text": ...}`
/// (or of strings), possibly inside a ```json fence or under `"facts"`.
/// Anything else is malformed, and stores nothing.
pub fn facts(answer: &str) -> Result<Vec<String>, Malformed> {
    let body = unfenced(answer.trim());
    let v: Value = serde_json::from_str(body).map_err(|e| Malformed::NotJson(e.to_string()))?;
    let list = match v {
        Value::Array(list) => list,
        Value::Object(mut o) => match o.remove("facts") {
            Some(Value::Array(list)) => list,
            _ => return Err(Malformed::NotAList),
        },
        _ => return Err(Malformed::NotAList),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.into_iter().enumerate() {
        let text = match item {
            Value::String(s) => s,
            Value::Object(mut o) => match o.remove("text") {
                Some(Value::String(s)) => s,
                _ => return Err(Malformed::NoText(i)),
            },
            _ => return Err(Malformed::NoText(i)),
        };
        let text = text.trim();
        if text.is_empty() {
            return Err(Malformed::NoText(i));
        }
        if !out.iter().any(|t: &String| t == text) {
            out.push(text.to_owned());
        }
    }
    Ok(out)
}

/// The inside of a Markdown code fence, if the answer is one.
fn unfenced(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// Cosine similarity of two vectors, -1 to 1; 0 when either is all zeros
/// or their lengths differ (another embedding model's vector).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    (dot / (na.sqrt() * nb.sqrt())).clamp(-1.0, 1.0) as f32
}

/// What storing a new fact does: update the closest record of its
/// namespace when it is within `threshold`, else add one.
#[derive(Debug, Clone, PartialEq)]
pub enum Merge {
    Update { index: usize, score: f32 },
    Add,
}

pub fn merge(known: &[Record], namespace: &str, embedding: &[f32], threshold: f32) -> Merge {
    known
        .iter()
        .enumerate()
        .filter(|(_, r)| r.namespace == namespace)
        .map(|(i, r)| (i, cosine(&r.embedding, embedding)))
        .filter(|&(_, score)| score >= threshold)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(Merge::Add, |(index, score)| Merge::Update { index, score })
}

/// The records most like `query`, best first: at most `limit`, each
/// scoring at least `threshold`; ties go to the newer record.
pub fn rank<'a>(
    records: &'a [Record],
    query: &[f32],
    limit: usize,
    threshold: f32,
) -> Vec<(&'a Record, f32)> {
    let mut scored: Vec<(&Record, f32)> = records
        .iter()
        .map(|r| (r, cosine(&r.embedding, query)))
        .filter(|&(_, s)| s >= threshold)
        .collect();
    scored.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| b.0.updated_at.cmp(&a.0.updated_at))
    });
    scored.truncate(limit);
    scored
}

/// Which records a user over `max` gives up: the least recently used
/// (recalled or updated), oldest first.
pub fn evict(records: &[Record], max: usize) -> Vec<usize> {
    if records.len() <= max {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| {
        let r = &records[i];
        (r.recalled_at.max(r.updated_at), r.created_at)
    });
    order.truncate(records.len() - max);
    order
}

/// A namespace from its template (`{strategy}`, `{user}`, `{session}`).
pub fn namespace(template: &str, strategy: &str, user: &str, session: &str) -> String {
    template
        .replace("{strategy}", strategy)
        .replace("{user}", user)
        .replace("{session}", session)
}

#[cfg(test)]
mod tests;
