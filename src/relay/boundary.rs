//! Where the upstream's bytes may be cut for the client: between SSE
//! events. An upstream's frames need not end between events (a TCP
//! segment, an HTTP chunk); relaying half an event and then recall's own
//! error event, when the stream breaks there, would join the two into one
//! event the client's SDK cannot read. So the bytes of an event not yet
//! complete are held until it is.

use bytes::{Bytes, BytesMut};

/// The state of the SSE line scanner between frames, and the bytes held.
pub(super) struct EventBoundary {
    /// Bytes after the last event boundary, not given out yet. Grown in
    /// place, so an event that comes in many small frames is copied once.
    held: BytesMut,
    /// The last byte seen ended a line (or nothing was seen yet).
    line_start: bool,
    /// The last byte seen was a `\r`: a `\n` next belongs to its line end.
    after_cr: bool,
}

impl EventBoundary {
    pub(super) fn new() -> Self {
        Self {
            held: BytesMut::new(),
            line_start: true,
            after_cr: false,
        }
    }

    /// What of the bytes so far ends at the last event boundary in them
    /// (an empty line), to be given out now; the rest is held. `None`
    /// while no boundary has come.
    pub(super) fn complete(&mut self, frame: Bytes) -> Option<Bytes> {
        if frame.is_empty() {
            return None;
        }
        // The usual frame: whole events ending in a blank line, whatever
        // came before (a last `\n` after a line end is always an empty
        // line), so no byte needs looking at.
        if frame.ends_with(b"\n\n") || frame.ends_with(b"\r\n\r\n") {
            self.line_start = true;
            self.after_cr = false;
            return Some(self.with_held(frame));
        }
        let Some(end) = self.scan(&frame) else {
            self.held.extend_from_slice(&frame);
            return None;
        };
        let out = self.with_held(frame.slice(..end));
        self.held.extend_from_slice(&frame[end..]);
        Some(out)
    }

    /// How many bytes are held.
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Just past the last empty line's end in `frame`, moving the scanner
    /// over all of it.
    fn scan(&mut self, frame: &[u8]) -> Option<usize> {
        // Nothing held after a `\r`: the last bytes given out ended with
        // a blank line's `\r`, and a `\n` first here is the rest of it,
        // to go out now rather than with the next event.
        let mut end = (self.held.is_empty() && self.after_cr).then_some(0);
        for (i, &b) in frame.iter().enumerate() {
            match b {
                b'\n' if self.after_cr => {
                    // The `\r\n` of a line already ended at its `\r`.
                    self.after_cr = false;
                    if end == Some(i) {
                        end = Some(i + 1);
                    }
                }
                b'\n' | b'\r' => {
                    if self.line_start {
                        end = Some(i + 1);
                    }
                    self.line_start = true;
                    self.after_cr = b == b'\r';
                }
                _ => {
                    self.line_start = false;
                    self.after_cr = false;
                }
            }
        }
        end.filter(|&e| e > 0)
    }

    /// `bytes` after what is held, copied only when something is.
    fn with_held(&mut self, bytes: Bytes) -> Bytes {
        if self.held.is_empty() {
            return bytes;
        }
        self.held.extend_from_slice(&bytes);
        self.held.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sse_parse::SseParser;

    fn run(frames: &[&str]) -> Vec<String> {
        let mut b = EventBoundary::new();
        frames
            .iter()
            .filter_map(|f| b.complete(Bytes::copy_from_slice(f.as_bytes())))
            .map(|out| String::from_utf8(out.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn whole_events_pass_as_they_are() {
        let frame = Bytes::from_static(b"data: 1\n\ndata: 2\n\n");
        let mut b = EventBoundary::new();
        let out = b.complete(frame.clone()).unwrap();
        assert_eq!(out.as_ptr(), frame.as_ptr(), "not copied");
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn half_an_event_is_held_until_it_completes() {
        assert_eq!(
            run(&["data: 1\n\ndata: {\"a", "\": 2}\n", "\ndata: 3"]),
            ["data: 1\n\n", "data: {\"a\": 2}\n\n"]
        );
        // Between the two newlines, and with `\r\n` and `\r` line ends.
        assert_eq!(run(&["data: 1\n", "\n"]), ["data: 1\n\n"]);
        assert_eq!(
            run(&["data: 1\r\n\r", "\ndata: 2\r\r"]),
            ["data: 1\r\n\r", "\ndata: 2\r\r"]
        );
        // The `\n` of a blank `\r\n` line is not held for the next event
        // (a client that ends events only at `\r\n\r\n` would wait).
        assert_eq!(
            run(&["data: 1\r\n\r", "\ndata: 2"]),
            ["data: 1\r\n\r", "\n"]
        );
        assert_eq!(run(&["data: 1\r\n", "\r\n"]), ["data: 1\r\n\r\n"]);
    }

    fn events_in(bytes: &[u8]) -> usize {
        let mut p = SseParser::new();
        p.feed(bytes);
        std::iter::from_fn(|| p.next_event()).count()
    }

    proptest! {
        /// However a stream is cut into frames, what is given out is the
        /// stream up to its last blank line, in pieces that each end at a
        /// boundary: the SSE parser finds as many events in the pieces,
        /// each parsed alone, as in the stream up to there.
        #[test]
        fn pieces_end_between_events(
            events in prop::collection::vec(("[a-z{}\": ]{0,12}", 0..3usize), 1..8),
            cuts in prop::collection::vec(0..200usize, 0..10),
            tail in "[a-z:]{0,6}",
        ) {
            let ends = ["\n\n", "\r\n\r\n", "\r\r"];
            let stream: String = events
                .iter()
                .map(|(data, end)| format!("data: {data}{}", ends[*end]))
                .chain([format!("data: {tail}")])
                .collect();
            let bytes = stream.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            cuts.push(bytes.len());
            let mut b = EventBoundary::new();
            let mut given = Vec::new();
            let mut counted = 0;
            let mut last = 0;
            for c in cuts {
                if let Some(out) = b.complete(Bytes::copy_from_slice(&bytes[last..c])) {
                    prop_assert!(!out.is_empty());
                    counted += events_in(&out);
                    given.extend_from_slice(&out);
                }
                last = c;
            }
            let whole_end = stream.len() - "data: ".len() - tail.len();
            prop_assert_eq!(&given[..], &bytes[..whole_end]);
            prop_assert_eq!(b.held(), bytes.len() - whole_end);
            prop_assert_eq!(counted, events_in(&bytes[..whole_end]));
        }
    }
}
