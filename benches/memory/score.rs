//! How the evaluation scores what a model was sent, with no model: the
//! share of an evidence line's words of meaning found in it, whether the
//! gold answer's words are all there, and (with an answering model)
//! LoCoMo's token F1 of its answer. Words are lower-cased runs of letters
//! and digits; words of meaning are those not in a short English
//! stop-word list. Nothing is stemmed: a word counts only as written.

use std::collections::HashSet;

/// An evidence line is in context when more than this share of its words
/// of meaning are ("most of them").
pub const EVIDENCE_SHARE: f64 = 0.5;

const STOP: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "also",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "even",
    "few",
    "for",
    "from",
    "further",
    "get",
    "got",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "ll",
    "m",
    "me",
    "more",
    "most",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "re",
    "s",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "t",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "us",
    "ve",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "d",
    "oh",
    "yeah",
    "yes",
    "hey",
    "hi",
    "really",
    "like",
    "thanks",
    "thank",
    "wow",
    "much",
    "well",
];

/// `text`'s words, lower-cased, in order.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// `text`'s distinct words of meaning.
pub fn content_words(text: &str) -> HashSet<String> {
    words(text)
        .into_iter()
        .filter(|w| !STOP.contains(&w.as_str()))
        .collect()
}

/// What a model was sent, as a set of words to look things up in.
pub struct Context {
    words: HashSet<String>,
}

impl Context {
    pub fn new(text: &str) -> Self {
        Self {
            words: words(text).into_iter().collect(),
        }
    }

    /// The share of `line`'s words of meaning present (1 for a line
    /// without any).
    pub fn share(&self, line: &str) -> f64 {
        let wanted = content_words(line);
        if wanted.is_empty() {
            return 1.0;
        }
        let found = wanted.iter().filter(|w| self.words.contains(*w)).count();
        found as f64 / wanted.len() as f64
    }

    /// Whether `line` is in context: most of its words of meaning are.
    pub fn holds_evidence(&self, line: &str) -> bool {
        self.share(line) > EVIDENCE_SHARE
    }

    /// Whether every word of meaning of `answer` is present.
    pub fn holds_answer(&self, answer: &str) -> bool {
        content_words(answer).iter().all(|w| self.words.contains(w))
    }
}

/// LoCoMo's token F1 of a predicted answer against the gold one (its
/// normalisation: lower case, no punctuation, no articles; without its
/// Porter stemming).
pub fn f1(predicted: &str, gold: &str) -> f64 {
    let norm = |s: &str| -> Vec<String> {
        words(s)
            .into_iter()
            .filter(|w| !matches!(w.as_str(), "a" | "an" | "the" | "and"))
            .collect()
    };
    let (p, g) = (norm(predicted), norm(gold));
    if p.is_empty() || g.is_empty() {
        return f64::from(u8::from(p == g));
    }
    let mut left = g.clone();
    let mut common = 0usize;
    for w in &p {
        if let Some(i) = left.iter().position(|x| x == w) {
            left.swap_remove(i);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / p.len() as f64;
    let recall = common as f64 / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}
