//! The chat path's answer as the Responses API's: a completion body as a
//! Response, a chat stream as the Responses event stream, translated as
//! the chunks arrive. An upstream's error answer is relayed as it is
//! (it already has OpenAI's error shape).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, BodyDataStream};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::Stream;
use sse_parse::SseParser;

use super::completion::Completion;
use super::events::Events;
use super::response::{of_completion, Echo};
use crate::error::ApiError;
use crate::proxy::accumulate::Event;
use crate::relay::Readings;

/// The largest chat completion read back for translation (as the relay's
/// own cap on a non-streaming answer).
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// `readings` holds what the relay parsed of the answer (a whole
/// completion's parts, each frame's events), so that what it covers is
/// not parsed again.
pub async fn translate(
    response: Response,
    echo: Echo,
    model: &str,
    stream: bool,
    readings: Readings,
) -> Result<Response, ApiError> {
    if response.status() != StatusCode::OK {
        return Ok(response);
    }
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if stream {
        let events = EventStream {
            inner: body.into_data_stream(),
            parser: SseParser::new(),
            readings,
            events: Events::new(echo, model),
            started: false,
            ended: false,
            closed: false,
        };
        return Ok(Response::from_parts(parts, Body::from_stream(events)));
    }
    let bytes = crate::api::whole(body, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "could not read the chat answer back");
            ApiError::Internal
        })?;
    // Where the relay found its parts (it read it for the record), else
    // read once more, typed and borrowed.
    let (mut spare, mut spares) = (Vec::new(), Default::default());
    let found = readings.take_whole(&bytes);
    let completion = match found.and_then(|p| Completion::of_parts(&bytes, &p, &mut spares)) {
        Some(completion) => Ok(completion),
        None => Completion::read(&bytes, &mut spare),
    };
    let completion = completion.map_err(|e| {
        tracing::error!(error = %e, "the chat answer is not a completion");
        ApiError::Internal
    })?;
    // The Response holds the reply and, without long `instructions` or
    // `tools` to echo, under a kilobyte besides: mostly written without
    // growing.
    let mut body = Vec::with_capacity(1024 + bytes.len());
    of_completion(&completion, &echo)
        .write(&mut body)
        .map_err(|_| ApiError::Internal)?;
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(Response::from_parts(parts, Body::from(body)))
}

/// The chat stream's body, read as it comes and given out as Responses
/// events. Dropping it drops the chat stream, which records the reply as
/// cut where the client stopped, as in chat.
struct EventStream {
    inner: BodyDataStream,
    /// For the frames recall wrote itself; the relay's come parsed.
    parser: SseParser,
    readings: Readings,
    events: Events,
    started: bool,
    /// The chat stream said how it ended: `[DONE]`, or an error event.
    ended: bool,
    closed: bool,
}

impl EventStream {
    /// The Responses events a frame of the chat stream gives.
    fn translate(&mut self, frame: &Bytes) -> Vec<u8> {
        // A delta's event is about the size of its chunk, so a frame's
        // events mostly fit without growing.
        let mut out = Vec::with_capacity(frame.len() + 128);
        if let Some(parsed) = self.readings.take_frame(frame) {
            for event in parsed {
                self.apply(event, &mut out);
            }
            return out;
        }
        self.parser.feed(frame);
        while let Some(event) = self.parser.next_event() {
            self.apply(Event::parse(&event.data), &mut out);
        }
        out
    }

    fn apply(&mut self, event: Event, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        match event {
            Event::Done => {
                self.ended = true;
                self.events.finish(out);
            }
            // recall's own error event (a broken stream, a reply not
            // stored) or the upstream's.
            Event::Chunk(delta) if delta.error().is_some() => {
                self.ended = true;
                let code = delta.error_code().unwrap_or("server_error");
                let message = delta.error().unwrap_or("the stream failed");
                self.events.failed(code, message, out);
            }
            Event::Chunk(delta) => self.events.chunk(&delta, out),
            Event::Malformed => {}
        }
    }
}

impl Stream for EventStream {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if !this.started {
            this.started = true;
            let mut start = Vec::with_capacity(2048);
            this.events.start(&mut start);
            return Poll::Ready(Some(Ok(Bytes::from(start))));
        }
        loop {
            if this.closed {
                return Poll::Ready(None);
            }
            match std::task::ready!(Pin::new(&mut this.inner).poll_next(cx)) {
                Some(Ok(bytes)) => {
                    let out = this.translate(&bytes);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Bytes::from(out))));
                    }
                }
                Some(Err(e)) => {
                    this.closed = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.closed = true;
                    if this.ended {
                        return Poll::Ready(None);
                    }
                    // Ended without `[DONE]`: complete if the upstream said
                    // how it finished, else cut (a newer request, the
                    // interrupt endpoint).
                    let mut out = Vec::new();
                    if this.events.finished() {
                        this.events.finish(&mut out);
                    } else {
                        this.events.incomplete("interrupted", &mut out);
                    }
                    return Poll::Ready(Some(Ok(Bytes::from(out))));
                }
            }
        }
    }
}
