//! The built-in console at `/ui` (`[console] enabled`): server-rendered
//! pages over what recall already holds, a little plain JavaScript for the
//! live session page, nothing from outside the binary.
//!
//! Layers, outermost first: `api::observe` (request id, log line,
//! metrics), then `auth::guard` (who is asking; a CSRF token on every page
//! and its check on every write; the Origin check), then the handler. The
//! handlers read through the session API's own functions (`Target`,
//! `existing`) and write through its handlers, so the console can do
//! nothing the API could not, with the same tenant scoping.
//!
//! `transcript` (a session's messages as shown), `sessions::pick`,
//! `live::next`, `series` and `plot` are pure; the rest is HTTP.

pub mod auth;
pub(crate) mod ctx;
pub mod gate;
mod live;
mod page;
pub mod plot;
pub mod series;
mod session;
mod sessions;
pub mod state;
pub mod transcript;
mod users;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use maud::html;

use crate::server::app::App;
use ctx::Ctx;

pub fn routes(app: &Arc<App>) -> Router<Arc<App>> {
    Router::new()
        .route("/ui", get(sessions::page))
        .route("/ui/", get(|| async { Redirect::permanent("/ui") }))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/overview", get(overview))
        .route("/ui/sessions/{id}", get(session::page))
        .route("/ui/sessions/{id}/live", get(live::stream))
        .route("/ui/sessions/{id}/interrupt", post(session::interrupt))
        .route("/ui/sessions/{id}/end", post(session::end))
        .route("/ui/sessions/{id}/summary", post(session::summary))
        .route("/ui/users/{user}", get(users::page))
        .route(
            "/ui/users/{user}/records/{id}/delete",
            post(users::delete_record),
        )
        .route("/ui/users/{user}/forget", post(users::forget))
        .route("/ui/assets/{file}", get(asset))
        .route("/ui/{*rest}", axum::routing::any(no_page))
        .route_layer(middleware::from_fn_with_state(Arc::clone(app), auth::guard))
}

async fn login_page(State(app): State<Arc<App>>, Extension(ctx): Extension<Ctx>) -> Response {
    if app.console.as_ref().is_some_and(|c| c.gate.open()) {
        return Redirect::to("/ui").into_response();
    }
    login_form(&ctx, StatusCode::OK, None)
}

fn login_form(ctx: &Ctx, status: StatusCode, error: Option<&str>) -> Response {
    let body = html! {
        h1 { "Sign in" }
        p { "The admin token ([admin] token_env), or a client key to see its own sessions." }
        @if let Some(e) = error { p #login-error .error { (e) } }
        form #login method="post" action="/ui/login" {
            (page::csrf_field(&ctx.csrf))
            label for="token" { "Token" }
            input #token type="password" name="token" autocomplete="current-password" autofocus;
            button #login-submit type="submit" { "Sign in" }
        }
    };
    page::respond(status, page::frame(&ctx.csrf, "Sign in", false, body))
}

async fn login(
    State(app): State<Arc<App>>,
    Extension(ctx): Extension<Ctx>,
    body: axum::body::Bytes,
) -> Response {
    let token = auth::form_field(&body, "token").unwrap_or_default();
    let cookie = app
        .console
        .as_ref()
        .and_then(|c| c.gate.login(token.trim(), app.policy.clock.now_ms()));
    match cookie {
        Some(cookie) => {
            let mut r = Redirect::to("/ui").into_response();
            r.headers_mut().append(
                header::SET_COOKIE,
                auth::set_cookie(
                    auth::SESSION_COOKIE,
                    &cookie,
                    Some(gate::MAX_AGE_MS as u64 / 1000),
                ),
            );
            r
        }
        None => {
            tracing::warn!("console: a sign-in with a wrong token");
            login_form(
                &ctx,
                StatusCode::UNAUTHORIZED,
                Some("That token is not known here."),
            )
        }
    }
}

async fn logout() -> Response {
    let mut r = Redirect::to("/ui/login").into_response();
    r.headers_mut().append(
        header::SET_COOKIE,
        auth::set_cookie(auth::SESSION_COOKIE, "", Some(0)),
    );
    r
}

async fn overview(State(app): State<Arc<App>>, Extension(ctx): Extension<Ctx>) -> Response {
    if ctx.access != Some(crate::api::auth::Access::All) {
        let why = "The overview shows the figures of every tenant: the admin's only.";
        return page::refused(StatusCode::FORBIDDEN, why, &ctx.csrf);
    }
    let charts = app
        .console
        .as_ref()
        .map(|c| c.series.charts())
        .unwrap_or_default();
    let sessions = app.sessions.len();
    let body = html! {
        h1 { "Overview" }
        p { (sessions) " sessions in this process's working set. Figures of the last hour, sampled every "
            (app.config.console.sample_secs) " s in this process." }
        div.charts { @for c in &charts { (plot::chart(c)) } }
    };
    page::page(&ctx, "Overview", body)
}

async fn no_page(Extension(ctx): Extension<Ctx>) -> Response {
    page::refused(StatusCode::NOT_FOUND, "There is no such page.", &ctx.csrf)
}

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let mut r = (
        [(header::CONTENT_TYPE, HeaderValue::from_static(kind))],
        body,
    )
        .into_response();
    r.headers_mut().extend(page::security_headers());
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    r
}
