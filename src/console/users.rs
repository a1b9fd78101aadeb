//! The user page: the note a user's next session starts with, and their
//! long-term records, each with a delete; and forgetting the user.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::html;

use super::ctx::Ctx;
use super::page::{self, csrf_field, when};
use super::sessions::{segment, user_href};
use crate::api::users::UserTarget;
use crate::api::PathParams;
use crate::error::ApiError;
use crate::memory::long_term::Record;
use crate::server::app::App;

pub async fn page(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    user: UserTarget,
) -> Response {
    let storage = &app.policy.storage;
    let read = async {
        let note = app.notes.get(storage, &user.key).await?;
        let held = app.records.of(storage, &user.key).await?;
        Ok::<_, ApiError>((note, held))
    };
    let (note, held) = match read.await {
        Ok(r) => r,
        Err(e) => return page::error(&ctx, e),
    };
    let mut records: Vec<&Record> = held.records.iter().map(|r| &**r).collect();
    records.sort_by(|a, b| b.updated_at.cmp(&a.updated_at).then(b.id.cmp(&a.id)));
    let superseded = records.iter().filter(|r| r.superseded_by.is_some()).count();
    let href = user_href(&user.name);
    let note = note.filter(|n| !n.forgotten);
    let body = html! {
        h1 { "User " span.id { (user.name) } }
        section #note {
            h2 { "Carried note" }
            @match &note {
                Some(n) => {
                    p.meta { "by " (n.model) ", " (when(n.at_ms)) }
                    div.content { (n.text) }
                }
                None => p.empty { "No note: the user's next session starts without one." }
            }
        }
        section #records {
            h2 {
                "Long-term records (" (records.len() - superseded) " current"
                @if superseded > 0 { ", " (superseded) " superseded" }
                ")"
            }
            @if records.is_empty() { p.empty { "No records." } }
            @else {
                table #record-list {
                    thead { tr { th { "Fact" } th { "Said" } th { "Strategy" } th { "Namespace" } th { "Updated" } th { "Recalled" } th {} } }
                    tbody {
                        @for r in &records {
                            tr.record.superseded[r.superseded_by.is_some()] data-record=(r.id) id=(format!("record-{}", r.id)) {
                                td {
                                    (r.text)
                                    @if let Some(by) = &r.superseded_by {
                                        div.meta {
                                            "superseded by "
                                            a href=(format!("#record-{by}")) { (by) }
                                            @if let Some(t) = r.valid_to { " from " (when(t)) }
                                        }
                                    }
                                }
                                td { @if let Some(t) = r.said_at { (when(t)) } }
                                td { (r.strategy) }
                                td.ns { (r.namespace) }
                                td { (when(r.updated_at)) }
                                td { @if r.recalled_at > 0 { (when(r.recalled_at)) } }
                                td {
                                    form.delete method="post" action=(format!("{href}/records/{}/delete", segment(&r.id))) {
                                        (csrf_field(&ctx.csrf))
                                        button type="submit" { "Delete" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        form #forget method="post" action=(format!("{href}/forget")) {
            (csrf_field(&ctx.csrf))
            button type="submit" { "Forget this user (note and records)" }
        }
    };
    page::page(&ctx, &format!("User {}", user.name), body)
}

/// `POST /ui/users/{user}/records/{id}/delete`.
pub async fn delete_record(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    user: UserTarget,
    path: PathParams,
) -> Response {
    let back = user_href(&user.name);
    page::done_or_error(
        &ctx,
        crate::long_term::routes::delete_record(State(app), user, path).await,
        &back,
    )
}

/// `POST /ui/users/{user}/forget`: as `DELETE /v1/users/{user}/memory`.
pub async fn forget(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    user: UserTarget,
) -> Response {
    let back = user_href(&user.name);
    match crate::api::users::delete_user_memory(State(app), user).await {
        // Nothing was left to forget: the page says so already.
        Ok(_) | Err(ApiError::Request(crate::error::RequestError::ObjectNotFound(_))) => {
            Redirect::to(&back).into_response()
        }
        Err(e) => page::error(&ctx, e),
    }
}
