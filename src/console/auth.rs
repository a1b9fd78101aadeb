//! Who may use the console, and the checks every request passes.
//!
//! Signing in trades the admin token (or a client key, which then sees its
//! own tenant only) for an HttpOnly, SameSite=Strict cookie (`gate`); a
//! bearer header works too, as on the session API (`api::bearer_access`).
//! With neither configured the console is open, like the session API, but
//! only to a loopback host name or one of `[console] allowed_hosts`: a
//! page of another site whose name was made to point at this machine (DNS
//! rebinding) does not name one of those.
//!
//! Writes are protected twice: the Origin, when a browser sends one, must
//! be this host; and a double-submit token (`recall_csrf`, a random cookie
//! the page repeats in its forms and `x-csrf-token`) must match.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

use super::ctx::{Ctx, CSRF_FIELD, CSRF_HEADER};
use super::page;
use crate::api::auth::Access;
use crate::server::app::App;

pub const SESSION_COOKIE: &str = "recall_console";
pub const CSRF_COOKIE: &str = "recall_csrf";
/// Forms are small: a summary is the largest thing posted.
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The value of cookie `name` in a request's headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

pub fn set_cookie(name: &str, value: &str, max_age: Option<u64>) -> HeaderValue {
    let age = max_age
        .map(|s| format!("; Max-Age={s}"))
        .unwrap_or_default();
    let text = format!("{name}={value}; Path=/ui; HttpOnly; SameSite=Strict{age}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn new_token() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // The system's randomness failing is not something a page can fix;
    // a zero token then fails every check (see `csrf_ok`).
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    hex::encode(bytes)
}

fn well_formed(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()) && token != ZERO
}

const ZERO: &str = "00000000000000000000000000000000";

/// The console's one middleware: who is asking, the CSRF token, and the
/// checks on writes.
pub async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(console) = app.console.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let path = request.uri().path().to_owned();
    if path.starts_with("/ui/assets/") {
        return next.run(request).await;
    }
    let headers = request.headers();
    let (csrf, fresh) = match cookie(headers, CSRF_COOKIE).filter(|t| well_formed(t)) {
        Some(t) => (t.to_owned(), false),
        None => (new_token(), true),
    };
    let gate = &console.gate;
    let now = app.policy.clock.now_ms();
    let signed = cookie(headers, SESSION_COOKIE).and_then(|c| gate.access(c, now));
    let access = if gate.open() {
        let allowed = &app.config.console.allowed_hosts;
        match host(&request) {
            Some(h) if loopback(&h) || allowed.iter().any(|a| a.eq_ignore_ascii_case(&h)) => {
                Some(Access::All)
            }
            _ => {
                let why = "This console has no token, so it answers only on a loopback \
                    address (localhost, 127.0.0.1, [::1]) or a host in [console] allowed_hosts. \
                    Set [admin] token_env to open it from elsewhere.";
                return page::refused(StatusCode::FORBIDDEN, why, &csrf);
            }
        }
    } else {
        crate::api::bearer_access(&app, headers).or(signed.clone())
    };
    let login = path == "/ui/login";
    let mut response = match (access, login) {
        (None, false) if request.method() == Method::GET => {
            Redirect::to("/ui/login").into_response()
        }
        (None, false) => page::refused(StatusCode::UNAUTHORIZED, "Sign in first.", &csrf),
        (access, _) => {
            let ctx = Ctx {
                access,
                csrf: csrf.clone(),
                signed_in: signed.is_some(),
            };
            match checked(request, &ctx, fresh).await {
                Ok(mut request) => {
                    // The session API's extractors (`Target`, `UserTarget`)
                    // scope ids by this.
                    if let Some(a) = &ctx.access {
                        request.extensions_mut().insert(a.clone());
                    }
                    request.extensions_mut().insert(ctx);
                    as_page(next.run(request).await, &csrf).await
                }
                Err(why) => page::refused(StatusCode::FORBIDDEN, why, &csrf),
            }
        }
    };
    if fresh {
        response
            .headers_mut()
            .append(header::SET_COOKIE, set_cookie(CSRF_COOKIE, &csrf, None));
    }
    response
}

/// An error the session API's extractors or handlers answered in
/// OpenAI's JSON shape (a bad query, an unknown session), as a page.
async fn as_page(response: Response, csrf: &str) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || !json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let message = parsed["error"]["message"]
        .as_str()
        .unwrap_or("The request failed.");
    page::refused(status, message, csrf)
}

/// The host a request names, without its port, lower-case: the Host
/// header, or an HTTP/2 request's authority.
fn host(request: &Request) -> Option<String> {
    let named = match request.headers().get(header::HOST) {
        Some(h) => h.to_str().ok()?.to_owned(),
        None => request.uri().authority()?.as_str().to_owned(),
    };
    let name = match named.strip_prefix('[') {
        Some(v6) => format!("[{}]", v6.split(']').next()?),
        None => named.split(':').next()?.to_owned(),
    };
    Some(name.to_ascii_lowercase())
}

fn loopback(host: &str) -> bool {
    host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A write passes if its Origin (when sent) is this host and it carries
/// the CSRF token, in `x-csrf-token` or as the form's `csrf` field. The
/// form is read here and handed on unchanged.
async fn checked(request: Request, ctx: &Ctx, fresh: bool) -> Result<Request, &'static str> {
    if request.method() != Method::POST {
        return Ok(request);
    }
    let headers = request.headers();
    let authority = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), authority) {
        let origin = origin.to_str().unwrap_or_default();
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| o == host);
        if !same {
            return Err("This form came from another site.");
        }
    }
    // A token made for this very request was never on a page.
    if fresh {
        return Err("The page was too old: reload it and try again.");
    }
    if let Some(given) = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) {
        return csrf_ok(given, &ctx.csrf)
            .then_some(request)
            .ok_or("The page was too old: reload it and try again.");
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM_BYTES)
        .await
        .map_err(|_| "The form is too large.")?;
    let given = form_field(&bytes, CSRF_FIELD).unwrap_or_default();
    if !csrf_ok(&given, &ctx.csrf) {
        return Err("The page was too old: reload it and try again.");
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

fn csrf_ok(given: &str, expected: &str) -> bool {
    well_formed(expected) && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

/// One field of an `application/x-www-form-urlencoded` body.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_form_fields_are_read_as_browsers_send_them() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; recall_csrf=abc"),
        );
        h.append(
            header::COOKIE,
            HeaderValue::from_static("recall_console=t.x"),
        );
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("t.x"));
        assert_eq!(cookie(&h, "b"), None);
        let body = b"csrf=0f&summary=Ana+lives+in+%3CHanoi%3E.%20%E2%9C%93";
        assert_eq!(
            form_field(body, "summary").unwrap(),
            "Ana lives in <Hanoi>. ✓"
        );
        assert_eq!(form_field(body, "csrf").unwrap(), "0f");
        assert_eq!(form_field(body, "token"), None);
        let set = set_cookie(SESSION_COOKIE, "v", Some(0));
        assert_eq!(
            set,
            "recall_console=v; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"
        );
    }

    #[test]
    fn only_loopback_names_count_as_loopback() {
        let named = |h: &str| {
            let r = Request::builder()
                .header(header::HOST, h)
                .body(Body::empty())
                .unwrap();
            host(&r).unwrap()
        };
        assert_eq!(named("LocalHost:8080"), "localhost");
        assert_eq!(named("[::1]:8080"), "[::1]");
        assert_eq!(named("127.0.0.2"), "127.0.0.2");
        for h in ["localhost", "[::1]", "127.0.0.1", "127.9.9.9"] {
            assert!(loopback(h), "{h}");
        }
        for h in [
            "attacker.example",
            "localhost.attacker.example",
            "10.0.0.1",
            "0.0.0.0",
            "[::2]",
        ] {
            assert!(!loopback(h), "{h}");
        }
        let h2 = Request::builder()
            .uri("http://Example.org:81/ui")
            .body(Body::empty())
            .unwrap();
        assert_eq!(host(&h2).unwrap(), "example.org");
    }

    #[test]
    fn csrf_tokens_are_random_and_a_zero_token_never_passes() {
        let (t1, t2) = (new_token(), new_token());
        assert!(well_formed(&t1) && t1 != t2);
        assert!(csrf_ok(&t1, &t1));
        assert!(!csrf_ok(&t2, &t1));
        assert!(!csrf_ok(ZERO, ZERO));
        assert!(!well_formed("xyz"));
    }
}
