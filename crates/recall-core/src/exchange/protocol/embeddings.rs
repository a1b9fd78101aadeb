//! The chat-completions protocol's embeddings (`POST {base_url}/embeddings`):
//! the request for a list of texts, and the answer's vectors read in input
//! order (OpenAI's shape, each vector as a list of numbers or as base64).

use std::fmt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::memory::long_term::vector_of_bytes;

/// The request for `texts`' vectors, each in `encoding_format`.
pub fn body(model: &str, texts: &[String], encoding_format: &str) -> Vec<u8> {
    json!({"model": model, "input": texts, "encoding_format": encoding_format})
        .to_string()
        .into_bytes()
}

/// The `n` vectors of an embeddings answer, in input order.
///
/// Read straight into typed vectors when it has the expected shape: a tree
/// of JSON values cost a `Value` per number (1,536 of them for an OpenAI
/// embedding) and most of a long-term turn's parse time. An answer the
/// typed reading refuses is read as values, which says what is wrong.
/// A vector is a list of numbers or, for `encoding_format: "base64"`, its
/// little-endian f32s in base64 (a server may answer either way).
pub fn vectors(body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, String> {
    match serde_json::from_slice::<Answer>(body) {
        Ok(answer) => place(
            answer
                .data
                .into_iter()
                .enumerate()
                .map(|(i, item)| Ok((item.index.unwrap_or(i), item.embedding.0))),
            n,
        ),
        Err(_) => checked(body, n),
    }
}

#[derive(Deserialize)]
struct Answer {
    data: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    index: Option<usize>,
    embedding: Vector,
}

/// An answer's vector, from either of its forms.
struct Vector(Vec<f32>);

impl<'de> Deserialize<'de> for Vector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = Vector;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of numbers or a base64 string")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Vector, E> {
                decoded(s).map(Vector).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vector, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(x) = seq.next_element::<f32>()? {
                    v.push(x);
                }
                Ok(Vector(v))
            }
        }
        d.deserialize_any(Either)
    }
}

/// A base64 vector: little-endian f32s.
fn decoded(text: &str) -> Result<Vec<f32>, String> {
    let bytes = STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    vector_of_bytes(&bytes).ok_or_else(|| format!("{} bytes of base64 are not f32s", bytes.len()))
}

/// The answer read as JSON values, for the reason the typed reading
/// refused it.
fn checked(body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let data = v["data"]
        .as_array()
        .ok_or_else(|| "no `data` list".to_owned())?;
    let items = data.iter().enumerate().map(|(i, item)| {
        let index = item["index"].as_u64().map_or(i, |x| x as usize);
        let vector = match &item["embedding"] {
            Value::String(text) => decoded(text).map_err(|why| format!("item {i}: {why}"))?,
            Value::Array(list) => list
                .iter()
                .map(|x| x.as_f64().map(|f| f as f32))
                .collect::<Option<Vec<f32>>>()
                .ok_or_else(|| format!("item {i} holds something other than numbers"))?,
            _ => return Err(format!("item {i} has no `embedding`")),
        };
        Ok((index, vector))
    });
    place(items, n)
}

/// Each item's vector put in its input's place: exactly `n`, none empty,
/// no place taken twice.
fn place(
    items: impl ExactSizeIterator<Item = Result<(usize, Vec<f32>), String>>,
    n: usize,
) -> Result<Vec<Vec<f32>>, String> {
    if items.len() != n {
        return Err(format!("{} vectors for {n} texts", items.len()));
    }
    let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
    for (i, item) in items.enumerate() {
        let (index, vector) = item?;
        if vector.is_empty() {
            return Err(format!("item {i} is empty"));
        }
        match out.get_mut(index) {
            Some(slot @ None) => *slot = Some(vector),
            _ => return Err(format!("item {i} has index {index}, out of place")),
        }
    }
    out.into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| "a text has no vector".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str, n: usize) -> String {
        match vectors(body.as_bytes(), n) {
            Err(why) => why,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn vectors_come_back_in_input_order() {
        let body = r#"{"object":"list","model":"m","data":[
            {"object":"embedding","index":1,"embedding":[0.5,-1]},
            {"object":"embedding","index":0,"embedding":[1e-3,2.25]}],
            "usage":{"prompt_tokens":2,"total_tokens":2}}"#;
        let v = vectors(body.as_bytes(), 2).unwrap();
        assert_eq!(v, vec![vec![1e-3, 2.25], vec![0.5, -1.0]]);
        // Without indexes, in the order given.
        let body = r#"{"data":[{"embedding":[1]},{"embedding":[2]}]}"#;
        assert_eq!(
            vectors(body.as_bytes(), 2).unwrap(),
            vec![vec![1.0], vec![2.0]]
        );
        // An index that is not a number counts as its place, as before.
        let body = r#"{"data":[{"index":"x","embedding":[3]}]}"#;
        assert_eq!(vectors(body.as_bytes(), 1).unwrap(), vec![vec![3.0]]);
    }

    #[test]
    fn a_base64_vector_reads_as_its_numbers() {
        use crate::exchange::embed::encoded;
        let v = vec![1e-3, -2.25, f32::MIN_POSITIVE, 7.0];
        let b64 = encoded(&v, &json!("base64"));
        assert!(b64.is_string());
        assert_eq!(encoded(&v, &json!("float")), json!(v));
        let body =
            json!({"data": [{"index": 1, "embedding": b64}, {"index": 0, "embedding": [1]}]});
        let read = vectors(body.to_string().as_bytes(), 2).unwrap();
        assert_eq!(read, vec![vec![1.0], v.clone()]);
        // The checked reading (here for the out-of-place index) reads it too.
        let body = json!({"data": [{"index": "x", "embedding": b64}, {"embedding": "A"}]});
        assert!(refused(&body.to_string(), 2).contains("item 1: not base64"));
    }

    #[test]
    fn a_malformed_answer_says_what_is_wrong() {
        assert!(refused("[]", 1).contains("no `data` list"));
        assert!(refused(r#"{"data":[{"embedding":[1]}]}"#, 2).contains("1 vectors for 2 texts"));
        assert!(refused(r#"{"data":[{"embedding":{}}]}"#, 1).contains("no `embedding`"));
        assert!(refused(r#"{"data":[{"embedding":"AAAA"}]}"#, 1).contains("3 bytes"));
        assert!(refused(r#"{"data":[{"embedding":"A?"}]}"#, 1).contains("not base64"));
        assert!(refused(r#"{"data":[{"embedding":[1,"a"]}]}"#, 1).contains("other than numbers"));
        assert!(refused(r#"{"data":[{"embedding":[]}]}"#, 1).contains("is empty"));
        let twice = r#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}"#;
        assert!(refused(twice, 2).contains("out of place"));
        let beyond = r#"{"data":[{"index":5,"embedding":[1]}]}"#;
        assert!(refused(beyond, 1).contains("out of place"));
        assert!(refused("not json", 1).contains("expected"));
    }
}
