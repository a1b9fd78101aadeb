//! A text's terms, as keyword ranking and the verbatim strategy read
//! them: bm25's English tokenizer (Unicode words, lower-cased, accents
//! folded, stop words dropped, Snowball-stemmed).

use std::sync::OnceLock;

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
