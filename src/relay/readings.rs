//! What the relay read of an answer, handed along to a reader of the same
//! body inside recall (the Responses API's translation), so that the
//! answer is parsed once: the events of each streamed frame, and where a
//! whole completion's parts lie. A body recall wrote itself (an error
//! event, the cache's answer) has none: its reader parses it. The bytes
//! are kept with what was read of them, so that the reader uses it only
//! for the very bytes it holds.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::proxy::accumulate::{Event, Parts};

#[derive(Clone, Default)]
pub struct Readings(Arc<Mutex<Slots>>);

#[derive(Default)]
struct Slots {
    /// The last frame the body handed out, and its events.
    frame: Option<(Bytes, Vec<Event>)>,
    /// A whole answer, and where its parts are.
    whole: Option<(Bytes, Parts)>,
}

impl Readings {
    pub(super) fn put_frame(&self, frame: &Bytes, events: Vec<Event>) {
        self.slots().frame = Some((frame.clone(), events));
    }

    /// The events of `frame`, if the relay parsed it (the same bytes, not
    /// equal ones).
    pub fn take_frame(&self, frame: &Bytes) -> Option<Vec<Event>> {
        let (bytes, events) = self.slots().frame.take()?;
        same(&bytes, frame).then_some(events)
    }

    pub(super) fn put_whole(&self, body: &Bytes, parts: Parts) {
        self.slots().whole = Some((body.clone(), parts));
    }

    /// Where the parts of `body` are, if the relay read it.
    pub fn take_whole(&self, body: &Bytes) -> Option<Parts> {
        let (bytes, parts) = self.slots().whole.take()?;
        same(&bytes, body).then_some(parts)
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn same(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_given_for_the_very_frame_they_were_parsed_from_once() {
        let tap = Readings::default();
        let frame = Bytes::from_static(b"data: [DONE]\n\n");
        tap.put_frame(&frame, vec![Event::Done]);
        assert_eq!(tap.take_frame(&frame), Some(vec![Event::Done]));
        assert_eq!(tap.take_frame(&frame), None, "taken twice");
        // Equal bytes elsewhere (a frame recall wrote) are parsed by the reader.
        tap.put_frame(&frame, vec![Event::Done]);
        let copy = Bytes::copy_from_slice(&frame);
        assert_eq!(tap.take_frame(&copy), None);
        assert_eq!(tap.take_frame(&frame), None, "a miss clears what was put");
    }

    #[test]
    fn a_whole_answer_s_parts_are_given_for_the_very_body_once() {
        let tap = Readings::default();
        let body = Bytes::from_static(br#"{"model":"m"}"#);
        let parts = Parts {
            model: Some(9..12),
            ..Parts::default()
        };
        tap.put_whole(&body, parts.clone());
        assert_eq!(tap.take_whole(&Bytes::copy_from_slice(&body)), None);
        tap.put_whole(&body, parts.clone());
        assert_eq!(tap.take_whole(&body), Some(parts));
        assert_eq!(tap.take_whole(&body), None, "taken twice");
    }
}
