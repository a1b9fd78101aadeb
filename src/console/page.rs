//! The console's page frame and the headers every page carries. maud
//! escapes every value written into a template, so message text, ids and
//! users render as text whatever they hold.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use super::ctx::Ctx;
use crate::error::ApiError;

/// Scripts and styles only from recall itself, no inline code (a message
/// that smuggled markup in still could not run), no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn security_headers() -> [(HeaderName, HeaderValue); 5] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ]
}

pub fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut r = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        markup.into_string(),
    )
        .into_response();
    r.headers_mut().extend(security_headers());
    r
}

/// A whole page: the frame, the navigation and `body`.
pub fn page(ctx: &Ctx, title: &str, body: Markup) -> Response {
    respond(StatusCode::OK, frame(&ctx.csrf, title, ctx.signed_in, body))
}

pub fn frame(csrf: &str, title: &str, signed_in: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="csrf-token" content=(csrf);
                title { (title) " · recall" }
                link rel="stylesheet" href="/ui/assets/console.css";
                script src="/ui/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/ui" { "recall" }
                    nav {
                        a href="/ui" { "Sessions" }
                        a href="/ui/overview" { "Overview" }
                    }
                    @if signed_in {
                        form.logout method="post" action="/ui/logout" {
                            (csrf_field(csrf))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name=(super::ctx::CSRF_FIELD) value=(csrf); }
}

/// A short page saying why a request was refused.
pub fn refused(status: StatusCode, why: &str, csrf: &str) -> Response {
    let body = html! {
        h1 { (status.canonical_reason().unwrap_or("Error")) }
        p.error { (why) }
        p { a href="/ui" { "Back to the sessions" } }
    };
    respond(status, frame(csrf, "Error", false, body))
}

/// An API error as a page, with its status and message.
pub fn error(ctx: &Ctx, e: ApiError) -> Response {
    let (status, ..) = e.parts();
    refused(status, &e.to_string(), &ctx.csrf)
}

/// An action's answer: back to `to` when it was done, else why not.
pub fn done_or_error<T>(ctx: &Ctx, done: Result<T, ApiError>, to: &str) -> Response {
    match done {
        Ok(_) => axum::response::Redirect::to(to).into_response(),
        Err(e) => error(ctx, e),
    }
}

/// A time in Unix milliseconds as the page shows it (UTC; the script
/// puts it in the reader's time zone, from `data-ms`).
pub fn when(ms: i64) -> Markup {
    match crate::clock::http_date(ms) {
        Some(date) => html! { time data-ms=(ms) { (date) } },
        None => html! { span.raw-time { (ms) } },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_utc_dates() {
        let s = when(1_795_601_609_164).into_string();
        assert_eq!(
            s,
            r#"<time data-ms="1795601609164">Wed, 25 Nov 2026 10:13:29 GMT</time>"#
        );
    }

    #[test]
    fn text_is_escaped_and_the_policy_forbids_inline_code() {
        let m = frame("t", "<script>alert(1)</script>", false, html! {});
        let s = m.into_string();
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(!s.contains("<script>alert"));
        assert!(!CSP.contains("unsafe-inline"));
    }
}
