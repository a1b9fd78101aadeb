//! What the echo mock knows of long-term memory: facts extracted from an
//! extraction request (the user's statements), and embeddings that make
//! recall by meaning visible with no model. Pure and deterministic.
//!
//! An embedding is a bag of words, hashed into `DIMS` buckets and
//! normalised. Words of a few everyday topics count as their topic, so
//! that "what snack should I bring?" is near "I am allergic to peanuts"
//! (both are about food) and far from "I live in Hanoi".

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use crate::memory::long_term::headings::EXTRACT_HEADING;
use crate::memory::long_term::vector_bytes;

pub const DIMS: usize = 256;

/// Words that say nothing about the topic.
const STOP: &[&str] = &[
    "a", "about", "am", "an", "and", "any", "are", "at", "be", "but", "can", "could", "do", "does",
    "for", "from", "have", "has", "how", "i", "i'm", "in", "is", "it", "me", "my", "of", "on",
    "or", "our", "please", "should", "so", "some", "that", "the", "this", "to", "very", "was",
    "we", "were", "what", "when", "where", "which", "who", "will", "with", "would", "you", "your",
];

/// Topics and the words (singular) that stand for them.
const TOPICS: &[(&str, &[&str])] = &[
    (
        "food",
        &[
            "snack",
            "food",
            "eat",
            "peanut",
            "nut",
            "allergic",
            "allergy",
            "meal",
            "lunch",
            "dinner",
            "breakfast",
            "cook",
            "restaurant",
            "vegetarian",
            "vegan",
            "hungry",
            "dish",
            "pizza",
            "sushi",
            "coffee",
            "tea",
            "drink",
            "cake",
        ],
    ),
    (
        "place",
        &[
            "live", "city", "hanoi", "paris", "london", "home", "country", "move", "moved",
            "address", "town", "visit", "travel", "trip", "weather",
        ],
    ),
    (
        "work",
        &[
            "job", "work", "engineer", "company", "office", "career", "boss", "meeting",
        ],
    ),
    (
        "family",
        &[
            "wife", "husband", "son", "daughter", "kid", "child", "children", "family", "mother",
            "father", "sister", "brother", "dog", "cat", "pet",
        ],
    ),
    (
        "music",
        &[
            "music", "song", "band", "guitar", "piano", "jazz", "sing", "concert",
        ],
    ),
    (
        "sport",
        &[
            "sport", "run", "running", "football", "soccer", "tennis", "gym", "swim",
        ],
    ),
    ("name", &["name", "called", "call"]),
];

/// A vector as `/v1/embeddings` writes it for the request's
/// `encoding_format`: `"base64"`, its little-endian f32s; else numbers.
pub fn encoded(v: &[f32], format: &Value) -> Value {
    if format == "base64" {
        return Value::String(STANDARD.encode(vector_bytes(v)));
    }
    json!(v)
}

/// The mock embedding of `text`: unit length, or all zeros for a text of
/// stop words only.
pub fn embedding(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; DIMS];
    for word in text
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .map(str::to_lowercase)
        .filter(|w| !w.is_empty() && !STOP.contains(&w.as_str()))
    {
        let word = singular(&word);
        let term = TOPICS
            .iter()
            .find(|(_, words)| words.contains(&word))
            .map_or(word, |(topic, _)| topic);
        v[bucket(term)] += 1.0;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

fn singular(word: &str) -> &str {
    match word.strip_suffix('s') {
        Some(stem) if stem.len() >= 3 && !stem.ends_with('s') => stem,
        _ => word,
    }
}

/// FNV-1a: stable across runs and platforms, unlike std's hasher.
fn bucket(term: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in term.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % DIMS as u64) as usize
}

/// Whether `asked` (the last user message) is recall's extraction request.
pub fn is_extraction(asked: &str) -> bool {
    asked.contains(EXTRACT_HEADING)
}

/// The mock's extraction answer: every statement (a sentence not ending in
/// `?`) of the request's `user:` lines, as `{"facts": [{"text"}]}` (the
/// shape recall's schema and prompt ask for).
pub fn facts(asked: &str) -> String {
    let mut facts: Vec<String> = Vec::new();
    for said in asked.lines().filter_map(|l| l.strip_prefix("user: ")) {
        let mut start = 0;
        for (i, c) in said.char_indices() {
            if matches!(c, '.' | '!' | '?') {
                let sentence = said[start..=i].trim();
                start = i + c.len_utf8();
                keep(&mut facts, sentence);
            }
        }
        keep(&mut facts, said[start..].trim());
    }
    let list: Vec<Value> = facts.iter().map(|f| json!({"text": f})).collect();
    json!({"facts": list}).to_string()
}

fn keep(facts: &mut Vec<String>, sentence: &str) {
    if sentence.ends_with('?') {
        return;
    }
    let fact = sentence.trim_end_matches(['.', '!']).trim();
    if fact.split_whitespace().count() >= 2 && !facts.iter().any(|f| f == fact) {
        facts.push(fact.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::long_term::cosine;

    /// At the default thresholds, which were chosen with a real model
    /// (the local embedder), not for these vectors.
    #[test]
    fn related_questions_are_near_and_others_far() {
        let defaults = crate::config::LongTermConfig::default();
        let (score, merge) = (defaults.score_threshold, defaults.merge_threshold);
        let peanuts = embedding("I am allergic to peanuts");
        let hanoi = embedding("I live in Hanoi");
        let snack = embedding("What snack should I bring?");
        let music = embedding("Can you recommend some music?");
        assert!(cosine(&peanuts, &snack) >= score);
        assert!(cosine(&hanoi, &snack) < score);
        assert!(cosine(&peanuts, &music) < score && cosine(&hanoi, &music) < score);
        // Another fact of the same topic is not taken for the same one.
        let shellfish = embedding("I am allergic to shellfish");
        assert!(cosine(&peanuts, &shellfish) < merge);
        assert_eq!(embedding("I am allergic to peanuts."), peanuts);
        assert!((cosine(&peanuts, &peanuts) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn facts_are_the_user_statements() {
        let asked = format!(
            "{EXTRACT_HEADING}\nuser: Hi. I am allergic to peanuts. I live in Hanoi! Can you help?\nassistant: I am a bot."
        );
        let v: Value = serde_json::from_str(&facts(&asked)).unwrap();
        assert_eq!(
            v,
            json!({"facts": [{"text": "I am allergic to peanuts"}, {"text": "I live in Hanoi"}]})
        );
    }
}
