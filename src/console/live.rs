//! `GET /ui/sessions/{id}/live`: server-sent events for an open session
//! page. `reply` carries the reply in flight as its client has received
//! it so far; `changed` says that something the page shows moved (the
//! page fetches itself again, replaces the parts that changed and listens
//! from the new signature). The session is looked at a few times a
//! second, from this task alone: the request path does nothing for the
//! console.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::stream;
use serde::Deserialize;
use serde_json::json;

use super::ctx::Ctx;
use super::page;
use crate::api::sessions::{existing, Target};
use crate::api::QueryParams;
use crate::server::app::App;

const EVERY: Duration = Duration::from_millis(150);
/// A stream ends after this; the browser's EventSource opens a new one.
const AT_MOST: Duration = Duration::from_secs(600);

#[derive(Debug, Deserialize)]
pub struct LiveQuery {
    /// The signature of the page that listens.
    since: u64,
}

/// What the stream does next, given what it saw and what it sent.
#[derive(Debug, PartialEq)]
pub enum Next {
    Changed,
    Reply(String),
    Nothing,
}

/// Pure: the page is stale once the signature moved (or the session is
/// gone); else a reply text not sent yet is sent.
pub fn next(since: u64, now: Option<(u64, Option<&str>)>, sent: Option<&str>) -> Next {
    match now {
        None => Next::Changed,
        Some((signature, _)) if signature != since => Next::Changed,
        Some((_, Some(text))) if Some(text) != sent => Next::Reply(text.to_owned()),
        Some(_) => Next::Nothing,
    }
}

struct Watch {
    app: Arc<App>,
    /// The id, not the session: an ended session is not kept alive by a
    /// page that watches it.
    id: String,
    since: u64,
    sent: Option<String>,
    until: tokio::time::Instant,
    done: bool,
}

pub async fn stream(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    target: Target,
    QueryParams(q): QueryParams<LiveQuery>,
) -> Response {
    let session = match existing(&app, &target).await {
        Ok(s) => s,
        Err(e) => return page::error(&ctx, e),
    };
    let watch = Watch {
        app,
        id: session.id.clone(),
        since: q.since,
        sent: None,
        until: tokio::time::Instant::now() + AT_MOST,
        done: false,
    };
    let events = stream::unfold(watch, |mut w| async move {
        loop {
            if w.done || tokio::time::Instant::now() >= w.until {
                return None;
            }
            let here = w.app.sessions.get(&w.id);
            let glance = here.map(|s| s.glance());
            let now = glance
                .as_ref()
                .map(|g| (g.signature, g.streaming.as_deref()));
            match next(w.since, now, w.sent.as_deref()) {
                Next::Changed => {
                    w.done = true;
                    return Some((Ok::<_, std::convert::Infallible>(changed()), w));
                }
                Next::Reply(text) => {
                    let event = Event::default()
                        .event("reply")
                        .data(json!({ "text": text }).to_string());
                    w.sent = Some(text);
                    return Some((Ok(event), w));
                }
                Next::Nothing => tokio::time::sleep(EVERY).await,
            }
        }
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    response.headers_mut().extend(page::security_headers());
    response
}

fn changed() -> Event {
    Event::default().event("changed").data("{}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_signature_or_a_gone_session_is_a_change_and_new_text_is_sent_once() {
        assert_eq!(next(1, None, None), Next::Changed);
        assert_eq!(next(1, Some((2, None)), None), Next::Changed);
        assert_eq!(next(1, Some((1, None)), None), Next::Nothing);
        assert_eq!(
            next(1, Some((1, Some("He"))), None),
            Next::Reply("He".into())
        );
        assert_eq!(next(1, Some((1, Some("He"))), Some("He")), Next::Nothing);
        assert_eq!(
            next(1, Some((1, Some("Hello"))), Some("He")),
            Next::Reply("Hello".into())
        );
    }
}
