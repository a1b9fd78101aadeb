//! A Responses API response's mark on the first message of its input
//! (`memory::chain`), typed. It is stored as the JSON object it always
//! was (`metadata.response`), but kept in memory as a struct: as a map it
//! was 2.4 times a chat turn's memory, allocated key by key and cloned so
//! when the turn began (docs/perf-journal.md, item 43).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The metadata key the mark is stored under.
pub const KEY: &str = "response";

/// What recall keeps of a response besides its messages.
/// Only `key` is required, as only it made a stored object a mark before.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ResponseMark {
    /// The last part of the response's id.
    pub key: String,
    /// How many messages its input is.
    #[serde(default = "one")]
    pub input_items: u64,
    /// Seconds.
    #[serde(default)]
    pub created_at: i64,
    #[serde(default)]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_response_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The request's fields the Response echoes (`tools`, ...), beside
    /// the others in the stored object, as they always were.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

fn one() -> u64 {
    1
}

impl ResponseMark {
    /// A stored mark, if `value` is one: any object whose known fields
    /// have their types.
    pub fn of_value(value: &Value) -> Option<Self> {
        if !value.is_object() {
            return None;
        }
        Self::deserialize(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_mark_is_stored_as_the_object_it_was() {
        let stored = json!({"key": "k1", "input_items": 2, "created_at": 7, "model": "m",
                            "previous_response_id": "resp_x", "conversation": "conv_y",
                            "instructions": "be brief", "metadata": {"a": "b"},
                            "tools": [{"type": "function"}], "temperature": 0.5});
        let mark = ResponseMark::of_value(&stored).expect("a mark");
        assert_eq!(mark.key, "k1");
        assert_eq!(mark.input_items, 2);
        assert_eq!(mark.conversation.as_deref(), Some("conv_y"));
        assert_eq!(mark.fields.len(), 2);
        assert_eq!(serde_json::to_value(&mark).unwrap(), stored);
        // Fields it does not have stay out of the object.
        let bare = json!({"key": "k", "input_items": 1, "created_at": 0, "model": ""});
        let mark = ResponseMark::of_value(&bare).unwrap();
        assert_eq!(serde_json::to_value(&mark).unwrap(), bare);
    }

    #[test]
    fn what_is_not_a_mark_is_not_read_as_one() {
        for odd in [
            json!("k"),
            json!(null),
            json!([1]),
            json!({"key": 3}),
            json!({"key": "k", "input_items": "two"}),
            json!({}),
            json!({"tools": []}),
        ] {
            assert_eq!(ResponseMark::of_value(&odd), None, "{odd}");
        }
    }
}
