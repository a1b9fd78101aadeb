//! A chat completion body read for its Response, in one typed pass that
//! borrows from the bytes: the model, choice 0's message and finish
//! reason, and the usage. Pure.
//!
//! Leaves stay raw JSON and go out as they came. What a `Value` reading
//! tolerated still reads: a message or usage that is not an object reads
//! as none, as indexing a `Value` finds nothing in it; choices after the
//! first are skipped unread, so an odd one does not spoil the answer.

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::usage::Usage;
use crate::exchange::accumulate::Parts;

/// A chat completion as far as a Response reads it. Made only by `read`
/// and `of_parts`.
#[derive(Default)]
pub struct Completion<'a> {
    pub(super) model: Option<&'a RawValue>,
    pub(super) finish_reason: Option<&'a RawValue>,
    pub(super) usage: Option<Usage>,
    /// Empty when choice 0 has no message or it is not an object.
    pub(super) message: ChatMessage<'a>,
}

/// Choice 0's message: its content, refusal and calls, raw.
#[derive(Deserialize, Default)]
pub(super) struct ChatMessage<'a> {
    #[serde(borrow, default)]
    pub(super) content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) refusal: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) tool_calls: Option<&'a RawValue>,
}

impl<'a> Completion<'a> {
    /// Reads a completion body. One that repeats a key (JSON allows it,
    /// the typed reading refuses it) is read as a `Value` reads it, the
    /// last one kept, by way of `spare`: then its leaves go out as `Value`
    /// writes them.
    pub fn read(body: &'a [u8], spare: &'a mut Vec<u8>) -> serde_json::Result<Self> {
        normal(body, spare)
            .map(Self::of_body)
            .or_else(|first| Self::piecewise(body).map_err(|_| first))
    }

    /// The last resort, for a body the typed readings refuse (a lone
    /// surrogate, or a number past `f64`, where a typed reading looks):
    /// choice 0's message and the usage each read on their own from their
    /// raw JSON, left out if they do not read, so that an answer the relay
    /// accepted and stored is still a Response.
    fn piecewise(body: &'a [u8]) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct Raw<'a> {
            #[serde(borrow, default)]
            model: Option<&'a RawValue>,
            #[serde(borrow, default)]
            choices: First<RawChoice<'a>>,
            #[serde(borrow, default)]
            usage: Option<&'a RawValue>,
        }
        #[derive(Deserialize)]
        struct RawChoice<'a> {
            #[serde(borrow, default)]
            message: Option<&'a RawValue>,
            #[serde(borrow, default)]
            finish_reason: Option<&'a RawValue>,
        }
        fn part<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
            serde_json::from_str::<IfObject<T>>(raw?.get()).ok()?.0
        }
        let Raw {
            model,
            choices: First(choice),
            usage,
        } = serde_json::from_slice(body)?;
        let (message, finish_reason) = choice
            .map(|c| (part(c.message).unwrap_or_default(), c.finish_reason))
            .unwrap_or_default();
        Ok(Self {
            model,
            finish_reason,
            usage: part(usage).map(ChatUsage::counts),
            message,
        })
    }

    /// The completion from where the relay found its parts (choice 0 by
    /// its index, as the record has it), each read on its own as the
    /// whole reading reads it: one that repeats a key by way of a `spare`
    /// (the last one kept), one that reads neither way left out, as
    /// `piecewise` leaves it. None if a range is not in the body.
    pub fn of_parts(body: &'a [u8], parts: &Parts, spares: &'a mut [Vec<u8>; 2]) -> Option<Self> {
        fn at<'a>(body: &'a [u8], at: &Option<Range<usize>>) -> Option<Option<&'a [u8]>> {
            match at {
                None => Some(None),
                Some(at) => body.get(at.clone()).map(Some),
            }
        }
        fn raw(part: Option<&[u8]>) -> Option<&RawValue> {
            serde_json::from_slice(part?).ok()
        }
        let [for_usage, for_message] = spares;
        let usage: Option<IfObject<ChatUsage>> =
            at(body, &parts.usage)?.and_then(|p| normal(p, for_usage).ok());
        let message: Option<IfObject<ChatMessage>> =
            at(body, &parts.message)?.and_then(|p| normal(p, for_message).ok());
        Some(Self {
            model: raw(at(body, &parts.model)?),
            finish_reason: raw(at(body, &parts.finish_reason)?),
            usage: usage.and_then(|u| u.0).map(ChatUsage::counts),
            message: message.and_then(|m| m.0).unwrap_or_default(),
        })
    }

    fn of_body(body: Body<'a>) -> Self {
        let Body {
            model,
            choices: First(choice),
            usage: IfObject(usage),
        } = body;
        let (message, finish_reason) = choice
            .map(|c| (c.message.0.unwrap_or_default(), c.finish_reason))
            .unwrap_or_default();
        Self {
            model,
            finish_reason,
            usage: usage.map(ChatUsage::counts),
            message,
        }
    }
}

/// JSON read typed, or, when it repeats a key (JSON allows it, the typed
/// reading refuses it), as a `Value` reads it (the last one kept), by way
/// of `spare`. The typed reading's error if the `Value` reading fails too.
fn normal<'a, T: Deserialize<'a>>(json: &'a [u8], spare: &'a mut Vec<u8>) -> serde_json::Result<T> {
    let first = match serde_json::from_slice(json) {
        Ok(read) => return Ok(read),
        Err(e) => e,
    };
    *spare = serde_json::from_slice::<Value>(json)
        .and_then(|v| serde_json::to_vec(&v))
        .map_err(|_| first)?;
    let spare: &'a Vec<u8> = spare;
    serde_json::from_slice(spare)
}

/// The body as read; the rest is skipped unparsed.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: First<Choice<'a>>,
    #[serde(borrow, default)]
    usage: IfObject<ChatUsage<'a>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: IfObject<ChatMessage<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

/// Chat's usage, its numbers raw; the rest is skipped unparsed.
#[derive(Deserialize)]
struct ChatUsage<'a> {
    #[serde(borrow, default)]
    prompt_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    total_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt_tokens_details: IfObject<Details<'a>>,
    #[serde(borrow, default)]
    completion_tokens_details: IfObject<Details<'a>>,
}

#[derive(Deserialize)]
struct Details<'a> {
    #[serde(borrow, default)]
    cached_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_tokens: Option<&'a RawValue>,
}

impl ChatUsage<'_> {
    /// The counts. A number counts only where `Value::as_u64` would take
    /// it (whole, not negative, in range), else 0.
    fn counts(self) -> Usage {
        let n = |raw: Option<&RawValue>| raw.and_then(|r| r.get().parse().ok()).unwrap_or(0);
        let (prompt, completion) = (
            self.prompt_tokens_details.0,
            self.completion_tokens_details.0,
        );
        Usage::of_chat([
            n(self.prompt_tokens),
            n(prompt.and_then(|d| d.cached_tokens)),
            n(self.completion_tokens),
            n(completion.and_then(|d| d.reasoning_tokens)),
            n(self.total_tokens),
        ])
    }
}

/// The first element of a list, the rest skipped unread.
struct First<T>(Option<T>);

impl<T> Default for First<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct List<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for List<T> {
            type Value = First<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let first = seq.next_element()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(List(PhantomData))
    }
}

/// A `T` read from an object; any other value reads as none.
struct IfObject<T>(Option<T>);

impl<T> Default for IfObject<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for IfObject<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
            type Value = IfObject<T>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| IfObject(Some(t)))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(IfObject(None))
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }

            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }

            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }

            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
        }
        d.deserialize_any(Object(PhantomData))
    }
}
