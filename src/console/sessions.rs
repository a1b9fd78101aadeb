//! The sessions page: every session the caller may see, newest first,
//! searched by id or user, a page at a time.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;

use super::ctx::Ctx;
use super::page;
use crate::api::auth::Access;
use crate::api::QueryParams;
use crate::error::ApiError;
use crate::memory::session::Overview;
use crate::server::app::App;

pub const PAGE: usize = 50;
/// The most stored sessions one page view reads (the working set is
/// always read whole): a console is for looking, not for scanning a
/// million sessions on every click.
pub const SCANNED: usize = 10_000;

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    page: usize,
}

pub async fn page(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Response {
    let Some(access) = ctx.access.clone() else {
        return page::refused(StatusCode::UNAUTHORIZED, "Sign in first.", &ctx.csrf);
    };
    let (all, capped) = match overviews(&app, &access).await {
        Ok(all) => all,
        Err(e) => return page::error(&ctx, e),
    };
    let tenants = access == Access::All && app.client_keys.is_some();
    let picked = pick(all, &q.q, q.page);
    page::page(&ctx, "Sessions", render(&picked, &q, tenants, capped))
}

/// The sessions the caller may see, as they know their ids, and whether
/// storage held more than `SCANNED` of them.
async fn overviews(app: &App, access: &Access) -> Result<(Vec<Overview>, bool), ApiError> {
    let mut by_id: HashMap<String, Overview> = app
        .sessions
        .all()
        .iter()
        .filter(|s| access.show(&s.id).is_some())
        .map(|s| (s.id.clone(), s.overview()))
        .collect();
    let storage = &app.policy.storage;
    let mut capped = false;
    if storage.persistent() {
        // Ids sort by tenant first: a tenant's sessions follow `<tenant>:`.
        let from = access.internal("");
        let mut after = Some(from.into_owned()).filter(|a| !a.is_empty());
        let mut read = 0;
        loop {
            if read >= SCANNED {
                capped = true;
                break;
            }
            let page = storage.list(after.as_deref(), 500, None).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id.clone());
            read += page.len();
            let mut past = false;
            for l in page {
                if access.show(&l.id).is_none() {
                    past = true;
                } else if !by_id.contains_key(&l.id) {
                    by_id.insert(l.id.clone(), Overview::from_listed(l));
                }
            }
            if past && *access != Access::All {
                break;
            }
        }
    }
    let shown = by_id
        .into_values()
        .map(|mut o| {
            if let Some(shown) = access.show(&o.id) {
                o.id = shown.to_owned();
            }
            o
        })
        .collect();
    Ok((shown, capped))
}

/// One page of sessions matching `q`.
#[derive(Debug)]
pub struct Picked {
    pub rows: Vec<Overview>,
    pub total: usize,
    pub page: usize,
    pub pages: usize,
}

/// Sessions whose id or a user contains `q` (any case), newest first
/// (last active, then id), page `page` of them.
pub fn pick(mut all: Vec<Overview>, q: &str, page: usize) -> Picked {
    let q = q.trim().to_lowercase();
    if !q.is_empty() {
        all.retain(|o| {
            o.id.to_lowercase().contains(&q)
                || o.users.iter().any(|u| u.to_lowercase().contains(&q))
        });
    }
    all.sort_by(|a, b| {
        b.last_active_at
            .cmp(&a.last_active_at)
            .then_with(|| a.id.cmp(&b.id))
    });
    let total = all.len();
    let pages = total.div_ceil(PAGE).max(1);
    let page = page.min(pages - 1);
    let rows = all.into_iter().skip(page * PAGE).take(PAGE).collect();
    Picked {
        rows,
        total,
        page,
        pages,
    }
}

pub fn session_href(id: &str) -> String {
    format!("/ui/sessions/{}", segment(id))
}

pub fn user_href(user: &str) -> String {
    format!("/ui/users/{}", segment(user))
}

/// The user page of a user of session `id` (as the caller knows it): the
/// admin, who sees `<tenant>:<id>`, reaches that tenant's user as
/// `<tenant>:<user>`, which is how the user's memory is kept.
pub fn users_href(id: &str, user: &str, tenants: bool) -> String {
    match split_tenant(id, tenants) {
        ("", _) => user_href(user),
        (tenant, _) => user_href(&format!("{tenant}:{user}")),
    }
}

/// What a path segment may hold as it is (RFC 3986's unreserved
/// characters, and `:` and `@`, which session ids use).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b':')
    .remove(b'@');

/// A path segment, percent-encoded.
pub fn segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, SEGMENT).to_string()
}

fn render(p: &Picked, q: &ListQuery, tenants: bool, capped: bool) -> Markup {
    let link = |page: usize| {
        format!(
            "/ui?q={}&page={page}",
            percent_encoding::utf8_percent_encode(&q.q, percent_encoding::NON_ALPHANUMERIC)
        )
    };
    html! {
        h1 { "Sessions" }
        form #search method="get" action="/ui" {
            input type="search" name="q" value=(q.q) placeholder="session id or user";
            button type="submit" { "Search" }
        }
        p.count {
            (p.total) " sessions" @if !q.q.is_empty() { " matching “" (q.q) "”" }
            @if capped { " (stored sessions read: the first " (SCANNED) " by id, and all in this process)" }
        }
        table #sessions {
            thead { tr {
                @if tenants { th { "Tenant" } }
                th { "Session" } th { "User" } th.num { "Turns" } th.num { "Messages" }
                th { "Last active" } th { "In flight" } th { "Summary" }
            } }
            tbody {
                @for o in &p.rows {
                    @let (tenant, name) = split_tenant(&o.id, tenants);
                    tr.session data-session=(o.id) {
                        @if tenants { td.tenant { (tenant) } }
                        td { a.session-link href=(session_href(&o.id)) { (name) } }
                        td { @for u in &o.users { a.user-link href=(users_href(&o.id, u, tenants)) { (u) } " " } }
                        td.num { (o.turn_id) }
                        td.num { (o.message_count) }
                        td { (page::when(o.last_active_at)) }
                        td { @if o.in_flight { span.badge.live { "streaming" } } }
                        td { @if o.summary.is_some() { "yes" } }
                    }
                }
            }
        }
        @if p.pages > 1 {
            nav.pages {
                @if p.page > 0 { a href=(link(p.page - 1)) { "← newer" } }
                span { "page " (p.page + 1) " of " (p.pages) }
                @if p.page + 1 < p.pages { a href=(link(p.page + 1)) { "older →" } }
            }
        }
    }
}

/// An admin sees every tenant's sessions under `<tenant>:<id>`.
pub fn split_tenant(id: &str, tenants: bool) -> (&str, &str) {
    match id.split_once(':') {
        Some((t, rest)) if tenants => (t, rest),
        _ => ("", id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(id: &str, user: &str, active: i64) -> Overview {
        Overview {
            id: id.into(),
            message_count: 0,
            turn_id: 0,
            created_at: 0,
            last_active_at: active,
            users: vec![user.into()],
            in_flight: false,
            summary: None,
            carried_note: None,
            recalled: None,
        }
    }

    #[test]
    fn newest_first_searched_by_id_or_user_and_paged() {
        let all: Vec<_> = (0..120)
            .map(|i| o(&format!("s{i}"), if i % 2 == 0 { "Ana" } else { "bo" }, i))
            .collect();
        let p = pick(all.clone(), "", 0);
        assert_eq!((p.total, p.pages, p.rows.len()), (120, 3, PAGE));
        assert_eq!(p.rows[0].id, "s119");
        let last = pick(all.clone(), "", 9);
        assert_eq!((last.page, last.rows.len()), (2, 20));
        let ana = pick(all.clone(), "ana", 0);
        assert_eq!(ana.total, 60);
        assert!(ana.rows.iter().all(|r| r.users[0] == "Ana"));
        assert_eq!(pick(all, "S11", 0).total, 11);
    }

    #[test]
    fn hrefs_encode_what_a_path_cannot_hold() {
        assert_eq!(user_href("a b/c"), "/ui/users/a%20b%2Fc");
        assert_eq!(split_tenant("ab12:s1", true), ("ab12", "s1"));
        assert_eq!(split_tenant("ab12:s1", false), ("", "ab12:s1"));
        assert_eq!(users_href("ab12:s1", "ana", true), "/ui/users/ab12:ana");
        assert_eq!(users_href("s1", "ana", true), "/ui/users/ana");
        assert_eq!(users_href("ab12:s1", "ana", false), "/ui/users/ana");
    }
}
