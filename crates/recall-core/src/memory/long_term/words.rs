//! A text's terms, as keyword ranking and the verbatim strategy read
//! them: bm25's English tokenizer (Unicode words, lower-cased, accents
//! folded, stop words dropped, Snowball-stemmed).

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::{Arc, OnceLock};

use bm25::{DefaultTokenizer, Language, Tokenizer};

fn tokenizer() -> &'static DefaultTokenizer {
    // Built once: it loads its stop-word list into a set.
    static T: OnceLock<DefaultTokenizer> = OnceLock::new();
    T.get_or_init(|| DefaultTokenizer::new(Language::English))
}

/// `text`'s terms, in order, repeats kept.
pub fn terms(text: &str) -> Vec<String> {
    tokenizer().tokenize(text)
}

/// How many words of `text` carry meaning (not stop words).
pub fn content_words(text: &str) -> usize {
    terms(text).len()
}

/// A term as a number: records' terms are compared, never read back.
pub type Term = u64;

/// `text`'s terms as numbers (the same on every run: no random seed).
pub fn term_ids(text: &str) -> Vec<Term> {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    terms(text).iter().map(|t| hasher.hash_one(t)).collect()
}

/// A record's terms, computed once: a search reads every record's, and
/// stemming them each time cost far more than the search.
#[derive(Clone, Default)]
pub struct Terms(OnceLock<Arc<[Term]>>);

impl Terms {
    pub fn of(&self, text: &str) -> &[Term] {
        self.0.get_or_init(|| term_ids(text).into())
    }
}

/// A cache of what the text says: records are equal whatever it holds.
impl PartialEq for Terms {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Terms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Terms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_go_and_words_are_stemmed() {
        assert_eq!(
            terms("I went to the Support Groups!"),
            ["went", "support", "group"]
        );
        assert_eq!(content_words("Thanks, it was so nice of you"), 2);
        assert_eq!(content_words(""), 0);
    }
}
