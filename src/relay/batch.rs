//! Upstream chunks that were ready at once, handed to the client as one
//! frame.
//!
//! An upstream that sends faster than the relay writes (a burst after a
//! pause, a fast or cached model, a backlog on a busy machine) would
//! otherwise cost one write to the client per chunk: hyper's client hands
//! a body over one chunk at a time, and hyper's server writes a frame as
//! soon as the body has no next one ready. The bytes are the same; only how
//! many writes carry them changes. The first chunk with content is never
//! held, so the time to the first token is what the upstream gives; nor is
//! a chunk that comes alone (tokens a model streams milliseconds apart).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::proxy::accumulate::Event;

/// A batch goes out once it holds this many bytes (or more, by the last
/// chunk's), whatever follows it.
pub(super) const MAX_BATCH_BYTES: usize = 32 << 10;

/// Chunks read closer together than this are a backlog, worth waiting a
/// turn of the scheduler for the next. Within a burst the relay reads a
/// chunk every few tens of µs; the fastest models stream a token every
/// 0.5 ms or more.
pub(super) const BURST_GAP: Duration = Duration::from_micros(250);

/// Chunks read and accounted as relayed, not yet handed to the client.
#[derive(Default)]
pub(super) struct Batch {
    frames: Vec<Bytes>,
    events: Vec<Event>,
    len: usize,
    /// The body has found nothing ready once since the last chunk.
    looked: bool,
    last_read: Option<Instant>,
}

/// What to do with the batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Hand it out now.
    HandOut,
    /// Let the upstream connection's task read what else has arrived (it
    /// was woken when the last chunk was taken): wake this body's task,
    /// which the scheduler runs after it, and look again then. (Should the
    /// body's task run first, the batch goes out with less in it: a write
    /// more, nothing lost.)
    LookAgain,
}

impl Batch {
    /// Adds a chunk read at `now`: `content_went_out` says whether content
    /// had been handed out before it (until then, every chunk goes at once).
    pub(super) fn push(
        &mut self,
        bytes: Bytes,
        events: Vec<Event>,
        content_went_out: bool,
        now: Instant,
    ) -> Next {
        self.len += bytes.len();
        self.frames.push(bytes);
        if self.events.is_empty() {
            self.events = events;
        } else {
            self.events.extend(events);
        }
        self.looked = false;
        // Read soon after the one before: chunks are coming faster than
        // they go out, and the next may be ready too.
        let close = self
            .last_read
            .is_some_and(|t| now.saturating_duration_since(t) < BURST_GAP);
        self.last_read = Some(now);
        if content_went_out && close && self.len < MAX_BATCH_BYTES {
            Next::LookAgain
        } else {
            Next::HandOut
        }
    }

    /// The upstream had no chunk ready: `None` if there is nothing to hand
    /// out. The first time after a chunk is not yet evidence that the
    /// upstream's connection has run: when a body's poll leaves hyper's
    /// write pending and its flush ready, hyper polls the body again in
    /// the same turn (its `poll_loop`), so the batch waits for a second.
    pub(super) fn nothing_ready(&mut self) -> Option<Next> {
        if self.frames.is_empty() {
            return None;
        }
        if !std::mem::replace(&mut self.looked, true) {
            return Some(Next::LookAgain);
        }
        Some(Next::HandOut)
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

    fn push(batch: &mut Batch, text: &str, content_went_out: bool, at: Instant) -> Next {
        let (bytes, events) = chunk(text);
        batch.push(bytes, events, content_went_out, at)
    }

    const CLOSE: Duration = Duration::from_micros(20);

    #[test]
    fn chunks_go_at_once_until_content_has_gone_out() {
        let (mut batch, t) = (Batch::default(), Instant::now());
        let (bytes, events) = chunk("Hi");
        assert_eq!(batch.push(bytes.clone(), events, false, t), Next::HandOut);
        let (out, _) = batch.take().unwrap();
        assert_eq!(out.as_ptr(), bytes.as_ptr(), "one chunk is not copied");
        assert_eq!(push(&mut batch, "a", false, t + CLOSE), Next::HandOut);
        assert!(batch.take().is_some() && batch.take().is_none());
        assert_eq!(batch.nothing_ready(), None);
    }

    #[test]
    fn chunks_that_come_alone_go_at_once() {
        let (mut batch, t) = (Batch::default(), Instant::now());
        for i in 0..5 {
            let at = t + Duration::from_millis(20 * i);
            assert_eq!(push(&mut batch, "tok", true, at), Next::HandOut);
            assert!(batch.take().is_some());
        }
    }

    #[test]
    fn a_burst_goes_out_as_one_frame_in_order_and_a_later_chunk_at_once() {
        let (mut batch, mut t) = (Batch::default(), Instant::now());
        assert_eq!(push(&mut batch, "first", true, t), Next::HandOut);
        let (mut expected, mut expected_events) = (Vec::new(), Vec::new());
        batch.take().unwrap();
        for text in ["a", "b", "c"] {
            t += CLOSE;
            let (bytes, events) = chunk(text);
            expected.extend_from_slice(&bytes);
            expected_events.extend(events.clone());
            assert_eq!(batch.push(bytes, events, true, t), Next::LookAgain);
            // hyper's second poll in the same turn finds nothing yet.
            assert_eq!(batch.nothing_ready(), Some(Next::LookAgain));
        }
        assert_eq!(batch.nothing_ready(), Some(Next::HandOut));
        let (out, events) = batch.take().unwrap();
        assert_eq!(&out[..], &expected[..]);
        assert_eq!(events, expected_events);
        // A chunk that comes later, after a batch of several, goes alone
        // at once; two close together start a burst again.
        t += Duration::from_millis(5);
        assert_eq!(push(&mut batch, "d", true, t), Next::HandOut);
        batch.take().unwrap();
        assert_eq!(push(&mut batch, "e", true, t + CLOSE), Next::LookAgain);
    }

    #[test]
    fn a_full_batch_goes_out() {
        let (mut batch, t) = (Batch::default(), Instant::now());
        let big = "x".repeat(MAX_BATCH_BYTES / 2);
        assert_eq!(push(&mut batch, &big, true, t), Next::HandOut);
        batch.take().unwrap();
        assert_eq!(push(&mut batch, &big, true, t + CLOSE), Next::LookAgain);
        assert_eq!(push(&mut batch, &big, true, t + CLOSE * 2), Next::HandOut);
        let (out, events) = batch.take().unwrap();
        assert!(out.len() > MAX_BATCH_BYTES && events.len() == 2);
    }
}
