//! The JSON of an answer that is not JSON alone, as a model that was not
//! held to a schema writes it: inside a Markdown fence, among prose
//! ("Here are the facts: {...}"), or cut off where the model stopped at
//! `max_tokens`. Pure text handling; what the JSON must hold is the
//! caller's.

/// The inside of a Markdown code fence, if the answer is one (an
/// unclosed fence's rest).
pub fn unfenced(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// `text` with the control characters inside its JSON strings escaped
/// (`\n`, `\t`, `\r`, else `\u00XX`): JSON forbids them raw, and a model
/// held to JSON by a grammar may still write a line break inside a
/// string. Outside strings they are whitespace and stay as they are.
pub fn controls_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    let raw = |c: char| c < ' ';
    if !text.contains(raw) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    let (mut in_string, mut escaped, mut changed) = (false, false, false);
    for c in text.chars() {
        if in_string && raw(c) {
            changed = true;
            // An escape's backslash before a raw control is kept as it
            // came: the pair was never valid JSON either way.
            escaped = false;
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c => out.push_str(&format!("\\u{:04x}", c as u32)),
            }
            continue;
        }
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            _ => {}
        }
        out.push(c);
    }
    if changed {
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// A JSON object or array found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<'a> {
    /// Its brackets balance (it may still not be JSON).
    Closed(&'a str),
    /// The text ends inside it: closed after its last whole object, list,
    /// or string in a list, if it has one (`{"facts": [{"text": "a"}, {"te`
    /// gives `{"facts": [{"text": "a"}]}`).
    Open(Option<String>),
}

/// The objects and arrays of `text` that sit outside any other, in order:
/// one pass over the text, so a long answer costs no more than its
/// length. Brackets inside JSON strings do not count; a bracket that
/// closes what it did not open ends that candidate, and the search goes
/// on after it.
pub fn values(text: &str) -> Vec<Found<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    // The closers still owed, innermost last.
    let mut open: Vec<u8> = Vec::new();
    let (mut start, mut in_string, mut escaped) = (0, false, false);
    // The end of the last value closed inside the current one, and what
    // was still owed there.
    let mut last_whole: Option<(usize, Vec<u8>)> = None;
    for (i, &b) in bytes.iter().enumerate() {
        if open.is_empty() {
            if let Some(closer) = closer_of(b) {
                open.push(closer);
                start = i;
                last_whole = None;
            }
            continue;
        }
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    // A string that is an item of a list is whole (in an
                    // object it may be a key).
                    if open.last() == Some(&b']') {
                        last_whole = Some((i + 1, open.clone()));
                    }
                }
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => open.extend(closer_of(b)),
            b'}' | b']' if open.last() == Some(&b) => {
                open.pop();
                if open.is_empty() {
                    out.push(Found::Closed(&text[start..=i]));
                } else {
                    last_whole = Some((i + 1, open.clone()));
                }
            }
            b'}' | b']' => open.clear(),
            _ => {}
        }
    }
    if !open.is_empty() {
        let repaired = last_whole.map(|(end, owed)| {
            let mut s = text[start..end].to_owned();
            s.extend(owed.iter().rev().map(|&c| char::from(c)));
            s
        });
        out.push(Found::Open(repaired));
    }
    out
}

fn closer_of(b: u8) -> Option<u8> {
    match b {
        b'{' => Some(b'}'),
        b'[' => Some(b']'),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_inside_strings_are_escaped_and_only_there() {
        let answer =
            "{\n  \"facts\": [{\"text\": \"I am a nurse\nin Hanoi\tand \\\"ok\\\"\u{1}\"}]\n}";
        let fixed = controls_escaped(answer);
        assert_eq!(
            fixed,
            "{\n  \"facts\": [{\"text\": \"I am a nurse\\nin Hanoi\\tand \\\"ok\\\"\\u0001\"}]\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&fixed).unwrap();
        assert_eq!(
            v["facts"][0]["text"],
            "I am a nurse\nin Hanoi\tand \"ok\"\u{1}"
        );
        assert!(matches!(
            controls_escaped("{\"a\": 1}\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn fences_are_taken_off() {
        assert_eq!(unfenced("```json\n[1]\n```"), "[1]");
        assert_eq!(unfenced("```\n[1]```"), "[1]");
        assert_eq!(unfenced("```json\n[1, 2"), "[1, 2");
        assert_eq!(unfenced("[1]"), "[1]");
    }

    #[test]
    fn values_among_prose_are_found_in_order() {
        let text =
            r#"Here are the facts: {"facts": [{"text": "I have a {cat}"}]} and [1, [2]]. Done."#;
        assert_eq!(
            values(text),
            [
                Found::Closed(r#"{"facts": [{"text": "I have a {cat}"}]}"#),
                Found::Closed("[1, [2]]"),
            ]
        );
        // An escaped quote does not end a string.
        let text = r#"x {"text": "say \"]\" now"} y"#;
        assert_eq!(
            values(text),
            [Found::Closed(r#"{"text": "say \"]\" now"}"#)]
        );
        assert!(values("no JSON at all: \"quoted\" text").is_empty());
    }

    #[test]
    fn a_mismatched_bracket_ends_its_candidate() {
        assert_eq!(values("[} then [3]"), [Found::Closed("[3]")]);
    }

    #[test]
    fn an_open_value_is_closed_after_its_last_whole_item() {
        let cut = r#"{"facts": [{"text": "I live in Hanoi"}, {"text": "I have two daugh"#;
        assert_eq!(
            values(cut),
            [Found::Open(Some(
                r#"{"facts": [{"text": "I live in Hanoi"}]}"#.to_owned()
            ))]
        );
        let cut = r#"Facts: [{"text": "a"}, {"text": "b"}, "#;
        assert_eq!(
            values(cut),
            [Found::Open(Some(
                r#"[{"text": "a"}, {"text": "b"}]"#.to_owned()
            ))]
        );
        // A string is a whole item of a list, not of an object (a key).
        assert_eq!(
            values(r#"["a", "b"#),
            [Found::Open(Some(r#"["a"]"#.to_owned()))]
        );
        assert_eq!(values(r#"{"facts""#), [Found::Open(None)]);
        // Nothing whole inside it yet.
        assert_eq!(values(r#"{"facts": [{"text": "I li"#), [Found::Open(None)]);
        // A closed value before it stays as it was.
        assert_eq!(
            values(r#"[1] {"facts": ["#),
            [Found::Closed("[1]"), Found::Open(None)]
        );
    }
}
