//! The Conversations API on recall's sessions: a conversation is a
//! session, so one created through chat (`x-session-id`) is a
//! conversation under the same id, and the other way round. Items are the
//! session's messages (deleted ones are superseded, as edits are), with
//! ids that name their message (`ids::item`). Tenancy and the admin token
//! apply as on the session API.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::Extension;
use axum::Json;
use serde_json::{json, Map, Value};

use super::read::{page, PageQuery};
use super::request::items_to_messages;
use super::{ids, items};
use crate::api::auth::Access;
use crate::api::sessions::{self, Target, Turns};
use crate::api::users::metadata_user;
use crate::api::{PathParams, QueryParams};
use crate::error::{ApiError, NotFound, RequestError};
use crate::memory::interruption;
use crate::memory::message::Message;
use crate::memory::session::Session;
use crate::server::app::App;
use crate::summaries::turn::note_of;

/// OpenAI's limit on the items a conversation is created with.
const MAX_NEW_ITEMS: usize = 20;

fn not_found(id: &str) -> NotFound {
    NotFound {
        what: "Conversation",
        id: id.to_owned(),
        param: None,
        code: "conversation_not_found",
    }
}

fn item_not_found(id: &str) -> NotFound {
    NotFound {
        what: "Item",
        id: id.to_owned(),
        param: None,
        code: "item_not_found",
    }
}

async fn existing(app: &App, target: &Target) -> Result<Arc<Session>, ApiError> {
    if crate::memory::session::validate_id(&target.name).is_err() {
        return Err(not_found(&target.name).into());
    }
    app.sessions
        .find(&target.id, &app.policy.storage)
        .await?
        .ok_or_else(|| not_found(&target.name).into())
}

fn conversation(name: &str, session: &Session) -> Value {
    json!({
        "id": name, "object": "conversation", "created_at": session.created_ms / 1000,
        "metadata": session.metadata(),
    })
}

/// `metadata` as OpenAI takes it: at most 16 pairs, keys up to 64
/// characters, string values up to 512.
fn metadata(body: &Map<String, Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    let bad = |msg: &str| -> ApiError { RequestError::invalid(msg, Some("metadata")).into() };
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            if m.len() > 16 {
                return Err(bad("`metadata` holds at most 16 pairs"));
            }
            for (k, v) in m {
                if k.chars().count() > 64 {
                    return Err(bad("`metadata` keys are at most 64 characters"));
                }
                if v.as_str().is_none_or(|s| s.chars().count() > 512) {
                    return Err(bad(
                        "`metadata` values are strings of at most 512 characters",
                    ));
                }
            }
            Ok(Some(m.clone()))
        }
        Some(_) => Err(bad("`metadata` must be an object of strings")),
    }
}

async fn object_body(app: &App, body: Body) -> Result<Map<String, Value>, ApiError> {
    match sessions::json_body(app, body).await? {
        Value::Null => Ok(Map::new()),
        Value::Object(m) => Ok(m),
        _ => Err(RequestError::invalid("the body must be a JSON object", None).into()),
    }
}

/// The `items` of a body as messages to store, checked.
fn new_items(body: &Map<String, Value>, max: usize) -> Result<Vec<Message>, ApiError> {
    let list = match body.get("items") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(RequestError::invalid("`items` must be an array", Some("items")).into())
        }
    };
    if list.len() > max {
        return Err(RequestError::invalid(
            format!("`items` holds at most {max} items"),
            Some("items"),
        )
        .into());
    }
    let messages = items_to_messages(list, "items")?;
    // As on the chat path: leading ones are instructions, and go elsewhere.
    if crate::memory::message::leading_instructions(&messages) > 0 {
        return Err(RequestError::invalid(
            format!("`items[0]` is a {} message: instructions go in a response's `instructions`, or in the session's system_messages", messages[0].role),
            Some("items"),
        )
        .into());
    }
    Ok(messages)
}

/// The items of stored messages, from `first_seq` on.
fn items_of(name: &str, first_seq: u64, messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .enumerate()
        .flat_map(|(i, m)| items::of_message(m, &ids::items_base(name, first_seq + i as u64)))
        .collect()
}

/// `POST /v1/conversations` with optional `items` (up to 20) and
/// `metadata`.
pub async fn create(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = object_body(&app, body).await?;
    let metadata = metadata(&body)?.unwrap_or_default();
    let messages = new_items(&body, MAX_NEW_ITEMS)?;
    let access = access.map_or(Access::All, |Extension(a)| a);
    let name = ids::new_session("conv");
    let target = Target {
        id: access.internal(&name).into_owned(),
        name,
    };
    let now = app.policy.clock.now_ms();
    // A user named in the metadata gets their note carried in.
    let user = metadata_user(&app, &access, &metadata);
    let note = match &user {
        Some((key, _)) => note_of(&app, key).await,
        None => None,
    };
    let (session, ()) = sessions::write(&app, &target, true, Turns::Wait, |s| {
        if let Some((key, name)) = &user {
            s.carry(key, name, note.clone());
        }
        let mut ticket = s.set_metadata(&app.policy, metadata.clone(), now)?;
        if !messages.is_empty() {
            let (_, appended) = s.append_messages(&app.policy, messages.clone(), now)?;
            ticket = ticket.and(appended);
        }
        Ok(((), ticket))
    })
    .await?;
    Ok(Json(conversation(&target.name, &session)))
}

/// `GET /v1/conversations/{id}`
pub async fn get(State(app): State<Arc<App>>, target: Target) -> Result<Json<Value>, ApiError> {
    let session = existing(&app, &target).await?;
    Ok(Json(conversation(&target.name, &session)))
}

/// `POST /v1/conversations/{id}` with `metadata`: replaces it.
pub async fn update(
    State(app): State<Arc<App>>,
    access: Option<Extension<Access>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = object_body(&app, body).await?;
    let Some(metadata) = metadata(&body)? else {
        return Err(RequestError::invalid("missing `metadata`", Some("metadata")).into());
    };
    existing(&app, &target).await?;
    let now = app.policy.clock.now_ms();
    let access = access.map_or(Access::All, |Extension(a)| a);
    let user = metadata_user(&app, &access, &metadata);
    let (session, ()) = sessions::write(&app, &target, false, Turns::Wait, |s| {
        if let Some((key, name)) = &user {
            s.carry(key, name, None);
        }
        Ok(((), s.set_metadata(&app.policy, metadata.clone(), now)?))
    })
    .await
    .map_err(|e| not_found_for_session(e, &target.name))?;
    Ok(Json(conversation(&target.name, &session)))
}

/// The session API's "session not found" in the Conversations API's words.
fn not_found_for_session(e: ApiError, name: &str) -> ApiError {
    match e {
        ApiError::Request(RequestError::SessionNotFound { .. }) => not_found(name).into(),
        e => e,
    }
}

/// `DELETE /v1/conversations/{id}`: ends the session, as the session API's
/// end does (the `session_ended` webhook included).
pub async fn delete(State(app): State<Arc<App>>, target: Target) -> Result<Json<Value>, ApiError> {
    let session = existing(&app, &target).await?;
    let ended =
        crate::server::lifecycle::end(&app, &session, crate::webhook::EndReason::Ended).await?;
    if ended.is_none() {
        return Err(not_found(&target.name).into());
    }
    Ok(Json(
        json!({"id": target.name, "object": "conversation.deleted", "deleted": true}),
    ))
}

/// `GET /v1/conversations/{id}/items`: newest first unless `order=asc`.
pub async fn list_items(
    State(app): State<Arc<App>>,
    target: Target,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let session = existing(&app, &target).await?;
    let history = session.snapshot();
    let list = history
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| !interruption::is_superseded(m))
        .flat_map(|(i, m)| {
            let seq = history.first_seq + i as u64;
            items::of_message(m, &ids::items_base(&target.name, seq))
        })
        .collect();
    page(list, &q).map(Json)
}

/// `POST /v1/conversations/{id}/items` with `items`: appended without
/// calling the model.
pub async fn add_items(
    State(app): State<Arc<App>>,
    target: Target,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body = object_body(&app, body).await?;
    let messages = new_items(&body, app.config.server.max_request_messages)?;
    if messages.is_empty() {
        return Err(
            RequestError::invalid("`items` must hold at least one item", Some("items")).into(),
        );
    }
    existing(&app, &target).await?;
    let now = app.policy.clock.now_ms();
    let (_, appended) = sessions::write(&app, &target, false, Turns::AsConfigured, |s| {
        s.append_messages(&app.policy, messages.clone(), now)
    })
    .await
    .map_err(|e| not_found_for_session(e, &target.name))?;
    let data = items_of(&target.name, appended.first_seq, &appended.messages);
    Ok(Json(json!({
        "object": "list",
        "first_id": data.first().map(|i| i["id"].clone()),
        "last_id": data.last().map(|i| i["id"].clone()),
        "has_more": false,
        "data": data,
    })))
}

/// The item the path names (`{item_id}` in the conversation `target`), and
/// the sequence number of its message; a 404 for a conversation or an item
/// that is not there.
async fn find_item(
    app: &App,
    target: &Target,
    path: &HashMap<String, String>,
) -> Result<(u64, Value), ApiError> {
    let item_id = path.get("item_id").map_or("", String::as_str);
    let session = existing(app, target).await?;
    item_in(&target.name, &session, item_id).ok_or_else(|| item_not_found(item_id).into())
}

/// The message an item id names, if it is in this conversation and not
/// deleted: its sequence number and the item.
fn item_in(name: &str, session: &Session, item_id: &str) -> Option<(u64, Value)> {
    let (of, seq, _) = ids::parse_item(item_id)?;
    if of != name {
        return None;
    }
    let history = session.snapshot();
    let i = usize::try_from(seq.checked_sub(history.first_seq)?).ok()?;
    let m = history.messages.get(i)?;
    if interruption::is_superseded(m) {
        return None;
    }
    let item = items::of_message(m, &ids::items_base(name, seq))
        .into_iter()
        .find(|it| it["id"].as_str() == Some(item_id))?;
    Some((seq, item))
}

/// `GET /v1/conversations/{id}/items/{item_id}`
pub async fn get_item(
    State(app): State<Arc<App>>,
    target: Target,
    PathParams(path): PathParams,
) -> Result<Json<Value>, ApiError> {
    let (_, item) = find_item(&app, &target, &path).await?;
    Ok(Json(item))
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: the item's message
/// leaves what the model and the listings see (a reply with tool calls
/// goes whole); answers with the conversation.
pub async fn delete_item(
    State(app): State<Arc<App>>,
    target: Target,
    PathParams(path): PathParams,
) -> Result<Json<Value>, ApiError> {
    let (seq, _) = find_item(&app, &target, &path).await?;
    let now = app.policy.clock.now_ms();
    let (session, deleted) = sessions::write(&app, &target, false, Turns::AsConfigured, |s| {
        s.delete_message(&app.policy, seq, now)
    })
    .await
    .map_err(|e| not_found_for_session(e, &target.name))?;
    if !deleted {
        let item_id = path.get("item_id").map_or("", String::as_str);
        return Err(item_not_found(item_id).into());
    }
    Ok(Json(conversation(&target.name, &session)))
}
