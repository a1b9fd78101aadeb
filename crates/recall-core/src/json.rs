//! JSON written straight into a buffer: the upstream body (`vendor`),
//! a Response (`api::responses`).
//!
//! serde_json escapes a string by looking up every byte in a table; for
//! the window's text, most of the body, that was the largest single cost of
//! a turn in recall's own code (docs/perf-journal.md, item 24). Text with nothing
//! to escape, which is most conversation, is found 32 bytes at a time
//! and copied in one go; anything else, and every value that is not a
//! string, is still written by serde_json, so the output is byte for byte
//! what serde_json writes (the tests below hold that).

use serde::Serialize;
use serde_json::Value;

/// Appends `s` as a JSON string.
pub fn string(out: &mut Vec<u8>, s: &str) {
    if plain(s.as_bytes()) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing to a Vec cannot fail, and a str always serialises.
        let _ = serde_json::to_writer(out, s);
    }
}

/// Appends `v` as serde_json writes it.
pub fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> serde_json::Result<()> {
    serde_json::to_writer(out, v)
}

/// Appends a JSON value, a string through `string`.
pub fn json(out: &mut Vec<u8>, v: &Value) -> serde_json::Result<()> {
    match v {
        Value::String(s) => {
            string(out, s);
            Ok(())
        }
        other => value(out, other),
    }
}

/// A JSON object being written: its commas, and its braces.
pub struct Object<'o> {
    out: &'o mut Vec<u8>,
    empty: bool,
}

impl<'o> Object<'o> {
    pub fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, empty: true }
    }

    /// Writes `key` and its colon; the value goes into what is returned.
    pub fn key(&mut self, key: &str) -> &mut Vec<u8> {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
        string(self.out, key);
        self.out.push(b':');
        self.out
    }

    pub fn close(self) {
        self.out.push(b'}');
    }
}

/// Whether no byte of `b` needs escaping in a JSON string: no quote, no
/// backslash, no control character (serde_json escapes exactly these).
/// Checked 32 bytes at a time without a branch per byte, which the
/// compiler turns into vector compares, several times faster than a loop
/// that stops at the first such byte (docs/perf-journal.md, item 24).
fn plain(b: &[u8]) -> bool {
    let escaped = |c: u8| (c < 0x20) | (c == b'"') | (c == b'\\');
    let mut chunks = b.chunks_exact(32);
    for chunk in &mut chunks {
        if chunk.iter().fold(false, |any, &c| any | escaped(c)) {
            return false;
        }
    }
    !chunks.remainder().iter().any(|&c| escaped(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn written(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        string(&mut out, s);
        out
    }

    #[test]
    fn every_byte_that_needs_escaping_is_escaped_wherever_it_sits() {
        for c in (0u8..0x20).chain([b'"', b'\\', 0x7f]) {
            for at in 0..17 {
                let mut s = "a".repeat(17);
                s.replace_range(at..at + 1, std::str::from_utf8(&[c]).unwrap());
                assert_eq!(
                    written(&s),
                    serde_json::to_vec(&s).unwrap(),
                    "{c:#x} at {at}"
                );
            }
        }
    }

    #[test]
    fn an_object_has_commas_between_its_entries_only() {
        let mut out = Vec::new();
        let mut o = Object::open(&mut out);
        string(o.key("a"), "x\"y");
        json(o.key("b"), &json!([1, "é"])).unwrap();
        value(o.key("c"), &3).unwrap();
        o.close();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":"x\"y","b":[1,"é"],"c":3}"#
        );
    }

    proptest! {
        #[test]
        fn strings_are_written_as_serde_json_writes_them(s in any::<String>()) {
            prop_assert_eq!(written(&s), serde_json::to_vec(&s).unwrap());
        }

        #[test]
        fn text_with_a_few_special_bytes_is_written_as_serde_json_writes_it(
            s in "[a-z \"\\\\\u{0}-\u{1f}\u{7f}é€😀]{0,40}"
        ) {
            prop_assert_eq!(written(&s), serde_json::to_vec(&s).unwrap());
        }
    }
}
