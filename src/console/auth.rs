//! Who may use the console, and the checks every request passes.
//!
//! Signing in trades the admin token (or a client key, which then sees its
//! own tenant only) for an HttpOnly, SameSite=Strict cookie. The cookie
//! holds an HMAC of the token, not the token: it is the same on every
//! replica, needs no server state, and stops working when the token is
//! changed. A bearer header works too, as on the session API.
//!
//! Writes are protected twice: the Origin, when a browser sends one, must
//! be this host; and a double-submit token (`recall_csrf`, a random cookie
//! the page repeats in its forms and `x-csrf-token`) must match.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use ring::hmac;
use subtle::ConstantTimeEq;

use super::page;
use crate::api::auth::{bearer, Access, ClientKeys};
use crate::server::app::App;

pub const SESSION_COOKIE: &str = "recall_console";
pub const CSRF_COOKIE: &str = "recall_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";
pub const CSRF_FIELD: &str = "csrf";
/// Forms are small: a summary is the largest thing posted.
const MAX_FORM_BYTES: usize = 256 * 1024;

/// The cookies that sign a console user in, by value.
pub struct Gate {
    admin: Option<String>,
    tenants: HashMap<String, Arc<str>>,
}

/// What every console handler gets from the guard.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub access: Access,
    pub csrf: String,
    /// Signed in with a cookie (so a sign-out makes sense).
    pub signed_in: bool,
}

fn sign(key: &[u8], what: &[u8]) -> String {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), what);
    hex(tag.as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Gate {
    pub fn new(admin_token: Option<&str>, keys: Option<&ClientKeys>) -> Self {
        let tenants = keys
            .map(|k| {
                k.digests()
                    .map(|(digest, tenant)| (tenant_cookie(digest), Arc::clone(tenant)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            admin: admin_token.map(admin_cookie),
            tenants,
        }
    }

    /// Nothing to sign in with: the console is as open as the session API.
    pub fn open(&self) -> bool {
        self.admin.is_none() && self.tenants.is_empty()
    }

    /// The cookie a token signs in with, if it is the admin token or a
    /// client key.
    pub fn login(&self, token: &str) -> Option<String> {
        let as_admin = admin_cookie(token);
        if self.access(&as_admin) == Some(Access::All) {
            return Some(as_admin);
        }
        let cookie = tenant_cookie(&ClientKeys::digest_of(token));
        self.tenants.contains_key(&cookie).then_some(cookie)
    }

    /// Who a cookie signs in, if anyone.
    pub fn access(&self, cookie: &str) -> Option<Access> {
        if let Some(admin) = &self.admin {
            if bool::from(cookie.as_bytes().ct_eq(admin.as_bytes())) {
                return Some(Access::All);
            }
        }
        let (known, tenant) = self.tenants.get_key_value(cookie)?;
        bool::from(known.as_bytes().ct_eq(cookie.as_bytes()))
            .then(|| Access::Tenant(Arc::clone(tenant)))
    }
}

fn admin_cookie(token: &str) -> String {
    format!("a.{}", sign(token.as_bytes(), b"recall console admin"))
}

fn tenant_cookie(digest: &[u8; 32]) -> String {
    format!("t.{}", sign(digest, b"recall console"))
}

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
    hex(&bytes)
}

fn well_formed(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()) && token != ZERO
}

const ZERO: &str = "00000000000000000000000000000000";

/// The console's one middleware: who is asking, the CSRF token, and the
/// checks on writes.
pub async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let Some(gate) = app.console.as_ref().map(|c| &c.gate) else {
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
    let signed = cookie(headers, SESSION_COOKIE).and_then(|c| gate.access(c));
    let access = who(&app, gate, headers).or(signed.clone());
    let ctx = |access| Ctx {
        access,
        csrf: csrf.clone(),
        signed_in: signed.is_some(),
    };
    let login = path == "/ui/login";
    let mut response = match (access, login) {
        (None, false) if request.method() == Method::GET => {
            Redirect::to("/ui/login").into_response()
        }
        (None, false) => page::refused(StatusCode::UNAUTHORIZED, "Sign in first.", &csrf),
        (access, _) => {
            let ctx = ctx(access.unwrap_or(Access::All));
            match checked(request, &ctx, fresh).await {
                Ok(mut request) => {
                    // The session API's extractors (`Target`, `UserTarget`)
                    // scope ids by this.
                    request.extensions_mut().insert(ctx.access.clone());
                    request.extensions_mut().insert(ctx);
                    next.run(request).await
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

/// A bearer header's access: the admin token, a client key, or, with
/// neither configured, everyone.
fn who(app: &App, gate: &Gate, headers: &HeaderMap) -> Option<Access> {
    if gate.open() {
        return Some(Access::All);
    }
    let given = bearer(headers)?;
    let admin = app
        .admin_token
        .as_ref()
        .is_some_and(|t| bool::from(given.as_bytes().ct_eq(t.as_bytes())));
    if admin {
        return Some(Access::All);
    }
    app.client_keys
        .as_ref()?
        .tenant(headers)
        .map(Access::Tenant)
}

/// A write passes if its Origin (when sent) is this host and it carries
/// the CSRF token, in `x-csrf-token` or as the form's `csrf` field. The
/// form is read here and handed on unchanged.
async fn checked(request: Request, ctx: &Ctx, fresh: bool) -> Result<Request, &'static str> {
    if request.method() != Method::POST {
        return Ok(request);
    }
    let headers = request.headers();
    if let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        let origin = origin.to_str().unwrap_or_default();
        let host = host.to_str().unwrap_or_default();
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
    fn a_token_signs_in_as_the_admin_or_a_tenant_and_the_cookie_is_not_the_token() {
        let keys = ClientKeys::from_keys(["sk-a", "sk-b"].into_iter())
            .unwrap()
            .unwrap();
        let gate = Gate::new(Some("admin-secret"), Some(&keys));
        assert!(!gate.open());
        let admin = gate.login("admin-secret").unwrap();
        assert!(!admin.contains("admin-secret"));
        assert_eq!(gate.access(&admin), Some(Access::All));
        let a = gate.login("sk-a").unwrap();
        let b = gate.login("sk-b").unwrap();
        assert_ne!(a, b);
        assert!(!a.contains("sk-a"));
        let tenant = |c: &str| match gate.access(c) {
            Some(Access::Tenant(t)) => t.to_string(),
            other => panic!("{other:?}"),
        };
        assert_ne!(tenant(&a), tenant(&b));
        assert_eq!(gate.login("sk-c"), None);
        assert_eq!(gate.login(""), None);
        assert_eq!(gate.access("a.00"), None);
        // The same token gives the same cookie in another process.
        let again = Gate::new(Some("admin-secret"), Some(&keys));
        assert_eq!(again.access(&admin), Some(Access::All));
        // A changed token no longer signs the old cookie in.
        assert_eq!(Gate::new(Some("rotated"), None).access(&admin), None);
        assert!(Gate::new(None, None).open());
    }

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
    fn csrf_tokens_are_random_and_a_zero_token_never_passes() {
        let (t1, t2) = (new_token(), new_token());
        assert!(well_formed(&t1) && t1 != t2);
        assert!(csrf_ok(&t1, &t1));
        assert!(!csrf_ok(&t2, &t1));
        assert!(!csrf_ok(ZERO, ZERO));
        assert!(!well_formed("xyz"));
    }
}
