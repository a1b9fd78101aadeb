//! The session page: what the upstream is sent before the conversation,
//! the conversation as the user heard it (with what was cut off), where
//! the last turn's window began, and the session's actions.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};
use serde_json::json;

use super::auth::form_field;
use super::ctx::Ctx;
use super::page::{self, csrf_field, when};
use super::sessions::{session_href, users_href};
use super::transcript::{entries, Entry, Shown};
use crate::api::auth::Access;
use crate::api::sessions::{self, existing, Target};
use crate::memory::message::Message;
use crate::memory::session::Seen;
use crate::server::app::App;

pub async fn page(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    target: Target,
) -> Response {
    let session = match existing(&app, &target).await {
        Ok(s) => s,
        Err(e) => return page::error(&ctx, e),
    };
    let seen = session.seen();
    let title = format!("Session {}", target.name);
    let tenants = ctx.access == Some(Access::All) && app.client_keys.is_some();
    let body = render(&ctx, &app.instructions, &target, &seen, tenants);
    page::page(&ctx, &title, body)
}

fn render(ctx: &Ctx, configured: &[Message], target: &Target, s: &Seen, tenants: bool) -> Markup {
    let href = session_href(&target.name);
    html! {
        h1 { "Session " span.id { (target.name) } }
        dl.facts #session-facts {
            @if !s.users.is_empty() { dt { "Users" } dd { @for u in &s.users { a.user-link href=(users_href(&target.name, u, tenants)) { (u) } " " } } }
            dt { "Turns" } dd { (s.turn_id) }
            dt { "Messages held" } dd { (s.messages.len()) }
            dt { "Started" } dd { (when(s.created_ms)) }
            dt { "Last active" } dd { (when(s.last_active_ms)) }
        }
        div.actions {
            button #interrupt type="button" data-action=(format!("{href}/interrupt"))
                disabled[s.streaming.is_none()] { "Interrupt" }
            form #end method="post" action=(format!("{href}/end")) {
                (csrf_field(&ctx.csrf))
                button type="submit" { "End session" }
            }
        }
        (before(ctx, configured, &href, s))
        div #stale .note hidden {
            "The session changed since this page was drawn, and you are editing what changed. "
            button #stale-reload type="button" { "Reload" }
        }
        h2 { "Conversation" }
        div #transcript data-live=(format!("{href}/live")) data-signature=(s.signature) {
            @for e in entries(&s.messages, s.first_seq, s.window_from) {
                (entry(&e))
            }
            div #live .msg.role-assistant.streaming hidden[s.streaming.is_none()] {
                div.meta { span.role { "assistant" } span.badge.live { "streaming" } }
                div.content.live-text { (s.streaming.as_deref().unwrap_or("")) }
            }
        }
    }
}

/// What every turn sends ahead of the window, in the order it is sent.
/// `data-version` names its content, so that the live page replaces it
/// only when it changed (never under a summary being edited).
fn before(ctx: &Ctx, configured: &[Message], href: &str, s: &Seen) -> Markup {
    let inner = before_parts(ctx, configured, href, s);
    let version = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        inner.0.hash(&mut h);
        h.finish()
    };
    html! {
        details #before open data-version=(version) {
            summary { "Sent before the conversation" }
            (inner)
        }
    }
}

fn before_parts(ctx: &Ctx, configured: &[Message], href: &str, s: &Seen) -> Markup {
    let summary = s.remembered.summary.as_ref();
    html! {
        {
            @for m in configured { (system("configured", m)) }
            @for m in &s.system_messages { (system("session", m)) }
            @if let Some(note) = &s.remembered.carried {
                div.sys.note { div.meta { span.badge { "carried note" } } div.content { (note) } }
            }
            div.sys.summary {
                div.meta {
                    span.badge { "running summary" }
                    @if let Some(sm) = summary {
                        " covers messages up to #" (sm.until.saturating_sub(1)) ", by " (sm.model) ", " (when(sm.at_ms))
                    } @else { " none yet" }
                }
                @if let Some(sm) = summary { div.content { (sm.text) } }
                form #summary-form method="post" action=(format!("{href}/summary")) {
                    (csrf_field(&ctx.csrf))
                    textarea name="summary" rows="3" { (summary.map_or("", |s| s.text.as_str())) }
                    button type="submit" { "Save summary" }
                }
            }
            @if let Some(facts) = &s.facts_sent {
                div.sys.facts #facts-sent {
                    div.meta { span.badge { "facts sent last turn" } }
                    ul { @for f in facts.iter() { li { (f.text) @if let Some(sc) = f.score { span.score { (format!(" {sc:.2}")) } } } } }
                }
            }
            @if let Some(next) = &s.facts_next {
                div.sys.facts #facts-next {
                    div.meta { span.badge { "facts for the next turn" } @if !next.searched { " (the user's newest)" } }
                    ul { @for f in &next.facts { li { (f.text) } } }
                }
            }
        }
    }
}

fn system(label: &str, m: &Message) -> Markup {
    let (text, _) = super::transcript::text_of(&m.content);
    html! {
        div.msg.role-system.sys {
            div.meta { span.role { (m.role.as_str()) } span.badge { (label) } }
            div.content { (text) }
        }
    }
}

fn entry(e: &Entry<'_>) -> Markup {
    match e {
        Entry::WindowStart => html! {
            div.window-start { "the last turn sent the upstream the messages from here on" }
        },
        Entry::Message(m) => message(m),
        Entry::Replaced { why, messages } => html! {
            // Keyed by its first message, so that a group the reader opened
            // stays open when the live page replaces the transcript.
            details.superseded data-key=(messages.first().map_or(0, |m| m.seq)) {
                summary { (why) " (" (messages.len()) @if messages.len() == 1 { " message)" } @else { " messages)" } }
                @for m in messages { (message(m)) }
            }
        },
    }
}

fn message(m: &Shown<'_>) -> Markup {
    html! {
        div.msg.(format!("role-{}", m.role)).interrupted[m.cut.is_some()].failure[m.failure.is_some()]
            data-seq=(m.seq) {
            div.meta {
                span.role { (m.role) }
                @if let Some(n) = m.name { span.name { (n) } }
                @if let Some(src) = m.source { span.badge.source { (src) } }
                @if let Some(t) = m.turn_id { span.turn { "turn " (t) } }
                @if let Some(ts) = m.timestamp { (when(ts)) }
                span.seq { "#" (m.seq) }
            }
            @if let Some(cut) = &m.cut {
                div.content {
                    span.heard { (m.text) }
                    span.cut-marker {
                        "cut off here"
                        @if let Some(at) = cut.at_ms { " · " (when(at)) }
                        @if let Some(by) = cut.by { " · by " (by) }
                    }
                    span.unheard { (cut.unheard) }
                }
                @if let Some(original) = cut.original {
                    div.original { span.badge { "original" } " " (original) }
                }
                @if !cut.complete { div.note { "the original was not read to its end" } }
                @if let Some(err) = cut.error { div.note { "error: " (err) } }
            } @else if !m.text.is_empty() {
                div.content { (m.text) }
            }
            @for p in &m.parts { span.badge.part { (p) } }
            @for c in &m.tool_calls {
                div.card.tool-call {
                    span.badge { "tool call" } " " strong { (c.name) }
                    @if let Some(id) = c.id { span.call-id { " " (id) } }
                    pre { (c.arguments) }
                }
            }
            @if let Some(id) = m.tool_call_id {
                div.card.tool-result { span.badge { "tool result" } " for " span.call-id { (id) } }
            }
            @if let Some(f) = m.failure { div.note.error { "the call failed: " (f) } }
        }
    }
}

/// `POST /ui/sessions/{id}/interrupt`: as the session API's. The page's
/// button (which sends `x-csrf-token`) gets a 204; a form goes back.
pub async fn interrupt(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    target: Target,
    headers: axum::http::HeaderMap,
) -> Response {
    let back = session_href(&target.name);
    let done = sessions::interrupt(State(app), target, Body::empty()).await;
    match done {
        Ok(_) if headers.contains_key(super::ctx::CSRF_HEADER) => {
            axum::http::StatusCode::NO_CONTENT.into_response()
        }
        done => page::done_or_error(&ctx, done, &back),
    }
}

/// `POST /ui/sessions/{id}/end`: as the session API's.
pub async fn end(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    target: Target,
) -> Response {
    page::done_or_error(&ctx, sessions::end(State(app), target).await, "/ui")
}

/// `POST /ui/sessions/{id}/summary` with the form's `summary`: as
/// `PUT /v1/sessions/{id}/summary`.
pub async fn summary(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    target: Target,
    body: axum::body::Bytes,
) -> Response {
    let back = session_href(&target.name);
    let text = form_field(&body, "summary").unwrap_or_default();
    let json = Body::from(json!({ "summary": text }).to_string());
    page::done_or_error(
        &ctx,
        crate::summaries::routes::put_summary(State(app), target, json).await,
        &back,
    )
}
