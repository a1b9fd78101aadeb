//! Upstream chunks that were ready at once, handed to the client as one
//! frame.
//!
//! An upstream that sends faster than one chunk per wakeup (a burst after a
//! pause, a cached or fast model, a local one) would otherwise cost one
//! write to the client per chunk: hyper writes a frame as soon as the body
//! has no next one ready, and the upstream connection's task hands over one
//! chunk at a time. The bytes are the same; only how many writes carry them
//! changes. The first chunk with content is never held, so the time to the
//! first token is what the upstream gives.

use bytes::{Bytes, BytesMut};

use crate::proxy::accumulate::Event;

/// A batch grows to about this before it goes out whatever follows it.
pub(super) const MAX_BATCH_BYTES: usize = 32 << 10;

/// Chunks read and accounted as relayed, not yet handed to the client.
#[derive(Default)]
pub(super) struct Batch {
    frames: Vec<Bytes>,
    events: Vec<Event>,
    len: usize,
    /// The body has found nothing ready once since the last chunk.
    looked: bool,
}

/// What to do with the batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Hand it out now.
    HandOut,
    /// Let the upstream connection's task read what else has arrived (it
    /// was woken when the last chunk was taken): wake this body's task,
    /// which the scheduler runs after it, and look again then.
    LookAgain,
}

impl Batch {
    /// Adds a chunk: `content_went_out` says whether content had been
    /// handed out before it (until then, every chunk goes at once).
    pub(super) fn push(
        &mut self,
        bytes: Bytes,
        events: Vec<Event>,
        content_went_out: bool,
    ) -> Next {
        self.len += bytes.len();
        self.frames.push(bytes);
        if self.events.is_empty() {
            self.events = events;
        } else {
            self.events.extend(events);
        }
        self.looked = false;
        if content_went_out && self.len < MAX_BATCH_BYTES {
            Next::LookAgain
        } else {
            Next::HandOut
        }
    }

    /// The upstream had no chunk ready: `None` if there is nothing to hand
    /// out. The first time after a chunk is not yet evidence that the
    /// upstream's connection has run: hyper polls a body a second time in
    /// the same turn when the first poll wrote nothing (its `poll_loop`), so
    /// the batch waits for a second.
    pub(super) fn nothing_ready(&mut self) -> Option<Next> {
        if self.frames.is_empty() {
            return None;
        }
        if std::mem::replace(&mut self.looked, true) {
            Some(Next::HandOut)
        } else {
            Some(Next::LookAgain)
        }
    }

    /// The batch as one frame and its events, if it holds any.
    pub(super) fn take(&mut self) -> Option<(Bytes, Vec<Event>)> {
        let events = std::mem::take(&mut self.events);
        let len = std::mem::take(&mut self.len);
        self.looked = false;
        let bytes = match self.frames.len() {
            0 => return None,
            1 => self.frames.pop()?,
            _ => {
                let mut joined = BytesMut::with_capacity(len);
                for frame in self.frames.drain(..) {
                    joined.extend_from_slice(&frame);
                }
                joined.freeze()
            }
        };
        Some((bytes, events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> (Bytes, Vec<Event>) {
        let data = format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#);
        let event = Event::parse(&data);
        (Bytes::from(format!("data: {data}\n\n")), vec![event])
    }

    #[test]
    fn chunks_go_at_once_until_content_has_gone_out() {
        let mut batch = Batch::default();
        let (bytes, events) = chunk("Hi");
        assert_eq!(batch.push(bytes.clone(), events, false), Next::HandOut);
        let (out, _) = batch.take().unwrap();
        assert_eq!(out.as_ptr(), bytes.as_ptr(), "one chunk is not copied");
        assert!(batch.take().is_none());
        assert_eq!(batch.nothing_ready(), None);
    }

    #[test]
    fn chunks_ready_together_go_out_as_one_frame_in_order() {
        let mut batch = Batch::default();
        let (mut expected, mut expected_events) = (Vec::new(), Vec::new());
        for text in ["a", "b", "c"] {
            let (bytes, events) = chunk(text);
            expected.extend_from_slice(&bytes);
            expected_events.extend(events.clone());
            assert_eq!(batch.push(bytes, events, true), Next::LookAgain);
            // A chunk after an empty look starts the looking over.
            assert_eq!(batch.nothing_ready(), Some(Next::LookAgain));
        }
        assert_eq!(batch.nothing_ready(), Some(Next::HandOut));
        let (out, events) = batch.take().unwrap();
        assert_eq!(&out[..], &expected[..]);
        assert_eq!(events, expected_events);
        assert!(batch.take().is_none());
    }

    #[test]
    fn a_full_batch_goes_out() {
        let mut batch = Batch::default();
        let (bytes, events) = chunk(&"x".repeat(MAX_BATCH_BYTES / 2));
        assert_eq!(
            batch.push(bytes.clone(), events.clone(), true),
            Next::LookAgain
        );
        assert_eq!(batch.push(bytes, events, true), Next::HandOut);
        let (out, events) = batch.take().unwrap();
        assert!(out.len() > MAX_BATCH_BYTES && events.len() == 2);
    }
}
