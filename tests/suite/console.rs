//! The console at `/ui`, through the real server: each page and action,
//! escaping, sign-in, tenants, CSRF, and the live session stream. The
//! browser itself is driven in `tests/sdk/python/test_console_browser.py`.

use crate::common;

use std::sync::Mutex;
use std::time::Duration;

use common::*;
use reqwest::header::{HeaderMap, COOKIE, SET_COOKIE};
use reqwest::Method;
use serde_json::{json, Value};

const ADMIN: &str = "console-admin-secret";
const KEY_A: &str = "sk-console-a";
const KEY_B: &str = "sk-console-b";
const XSS: &str = r#"<script>alert("x")</script> "><img src=x onerror=alert(1)>"#;

/// A client that keeps the console's cookies, and follows no redirect.
struct Browser {
    client: reqwest::Client,
    url: String,
    cookies: Mutex<Vec<(String, String)>>,
}

struct Page {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Browser {
    fn new(h: &Harness) -> Self {
        Self {
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            url: h.url.clone(),
            cookies: Mutex::default(),
        }
    }

    fn cookie(&self, name: &str) -> Option<String> {
        let jar = self.cookies.lock().unwrap();
        jar.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    fn keep(&self, headers: &HeaderMap) {
        let mut jar = self.cookies.lock().unwrap();
        for v in headers.get_all(SET_COOKIE) {
            let first = v.to_str().unwrap().split(';').next().unwrap();
            let (k, v) = first.split_once('=').unwrap();
            jar.retain(|(name, _)| name != k);
            if !v.is_empty() {
                jar.push((k.to_owned(), v.to_owned()));
            }
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Page {
        let jar: Vec<String> = self
            .cookies
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let req = if jar.is_empty() {
            req
        } else {
            req.header(COOKIE, jar.join("; "))
        };
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        self.keep(&headers);
        Page {
            status,
            headers,
            body: resp.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str) -> Page {
        self.send(self.client.get(format!("{}{path}", self.url)))
            .await
    }

    /// A form post with the page's CSRF token added.
    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        let mut form: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some(token) = self.cookie("recall_csrf") {
            form.push(("csrf".into(), token));
        }
        self.send(self.client.post(format!("{}{path}", self.url)).form(&form))
            .await
    }
}

fn location(p: &Page) -> &str {
    p.headers
        .get("location")
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

async fn console(extra: &str) -> Harness {
    Harness::start(
        &format!("[console]\nenabled = true\n{extra}"),
        "models = [\"*\"]",
    )
    .await
}

/// A console behind an admin token and two client keys, in variables of
/// its own (tests run in parallel in one process).
async fn guarded(tag: &str) -> Harness {
    let keys_var = format!("RECALL_TEST_CONSOLE_KEYS_{tag}");
    let admin_var = format!("RECALL_TEST_CONSOLE_ADMIN_{tag}");
    std::env::set_var(&keys_var, format!("{KEY_A},{KEY_B}"));
    std::env::set_var(&admin_var, ADMIN);
    console(&format!(
        "[auth]\napi_keys_env = \"{keys_var}\"\n[admin]\ntoken_env = \"{admin_var}\"\n"
    ))
    .await
}

async fn chat_as(h: &Harness, key: &str, session: &str, text: &str) {
    let resp = h
        .client
        .post(format!("{}/v1/chat/completions", h.url))
        .bearer_auth(key)
        .header("x-session-id", session)
        .header("x-user-id", "ana")
        .json(&json!({"model": "m", "messages": [user(text)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn every_page_escapes_what_messages_hold_and_sends_a_strict_policy() {
    let h = console("").await;
    say_as(&h, None, XSS, "s-xss", XSS).await;
    let b = Browser::new(&h);
    for path in [
        "/ui",
        "/ui/sessions/s-xss",
        "/ui/overview",
        &format!("/ui/users/{}", urlencode(XSS)),
    ] {
        let p = b.get(path).await;
        assert_eq!(p.status, 200, "{path}: {}", p.body);
        let csp = p.headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
        assert_eq!(p.headers["x-frame-options"], "DENY");
        // A browser sends its Origin with a form only under such a policy.
        assert_eq!(p.headers["referrer-policy"], "same-origin");
        assert!(!p.body.contains("<script>alert"), "{path}");
        assert!(!p.body.contains("<img"), "{path}");
        assert!(!p.body.contains("onerror=alert(1)>"), "{path}");
    }
    let page = b.get("/ui/sessions/s-xss").await.body;
    assert!(page.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"));
    assert!(page.contains(r#"<div class="msg role-user" data-seq="0">"#));
    // The only scripts are recall's own file.
    assert_eq!(page.matches("<script").count(), 1);
    assert!(page.contains(r#"<script src="/ui/assets/console.js" defer>"#));
}

#[tokio::test]
async fn the_console_is_off_unless_enabled() {
    let h = Harness::start("", "models = [\"*\"]").await;
    let (status, body) = h
        .chat(Some("s"), json!({"model": "m", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 200, "{body}");
    let resp = h.client.get(format!("{}/ui", h.url)).send().await.unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn a_session_page_shows_what_was_heard_what_was_cut_and_what_was_replaced() {
    let h =
        console("[history]\nwindow_messages = 2\n[interruption]\ncapture_original = true\n").await;
    let b = Browser::new(&h);
    // Turn 1, then a greeting from the session API with its source.
    h.say("s1", "My name is Ada.").await;
    let greeting = json!({"messages": [{"role": "assistant", "content": "Welcome back!",
        "metadata": {"source": "greeting"}}]});
    let (status, _) = h
        .api(Method::POST, "/v1/sessions/s1/messages", Some(greeting))
        .await;
    assert_eq!(status, 200);
    // Turn 2 streams slowly and is interrupted after its first words.
    let words = [
        "Once ", "upon ", "a ", "time ", "there ", "was ", "a ", "fox.",
    ];
    h.upstream.push(sse_text(&words, Duration::from_millis(60)));
    let resp = h
        .post_chat(
            "s1",
            json!({"model": "m", "stream": true, "messages": [user("Tell me a story.")]}),
        )
        .await;
    let (_rest, _seen) = read_until(resp, "upon").await;
    let (status, body) = h
        .api(
            Method::POST,
            "/v1/sessions/s1/interrupt",
            Some(json!({"spoken": "Once upon"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The drain reads the original to its end.
    wait_for(&h, "s1", 4, Duration::from_secs(5), |m| {
        m["metadata"]["original"] == "Once upon a time there was a fox."
    })
    .await;
    // Turn 3, then the client regenerates it (the same history again).
    h.upstream.push(completion("A tool, then."));
    let (status, _) = h
        .chat(
            Some("s1"),
            json!({"model": "m", "messages": [user("And then?")]}),
        )
        .await;
    assert_eq!(status, 200);
    regenerate(&h, "s1").await;

    let page = b.get("/ui/sessions/s1").await.body;
    assert!(
        page.contains(r#"<span class="heard">Once upon</span>"#),
        "{page}"
    );
    assert!(page.contains(r#"<span class="cut-marker">cut off here"#));
    assert!(page.contains(r#"<span class="unheard"> a time there was a fox.</span>"#));
    assert!(page.contains(r#"<span class="badge source">greeting</span>"#));
    assert!(
        page.contains("<summary>regenerated (1 message)</summary>"),
        "{page}"
    );
    assert!(page.contains("A tool, then."));
    // The last turn's window of 2 began at "And then?".
    let marker = page
        .find(r#"class="window-start""#)
        .expect("a window marker");
    let and_then = page.rfind("And then?").unwrap();
    assert!(marker < and_then && page[marker..and_then].matches("class=\"msg ").count() == 1);
}

#[tokio::test]
async fn tool_calls_and_results_show_as_cards() {
    let h = console("").await;
    let calls = json!({"contents": [
        user("Weather in Hanoi?"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Hanoi\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "31 C"},
        assistant("It is 31 C."),
    ]});
    let (status, body) = h
        .api(Method::PUT, "/v1/sessions/t1/history", Some(calls))
        .await;
    assert_eq!(status, 200, "{body}");
    let page = Browser::new(&h).get("/ui/sessions/t1").await.body;
    assert!(page.contains(r#"<div class="card tool-call"><span class="badge">tool call</span> <strong>get_weather</strong>"#), "{page}");
    assert!(page.contains("{&quot;city&quot;:&quot;Hanoi&quot;}"));
    assert!(page.contains(r#"<div class="card tool-result"><span class="badge">tool result</span> for <span class="call-id">call_1</span>"#));
}

#[tokio::test]
async fn signing_in_takes_the_admin_token_or_a_client_key_and_sets_a_strict_cookie() {
    let h = guarded("login").await;
    chat_as(&h, KEY_A, "a-only", "hello from a").await;
    chat_as(&h, KEY_B, "b-only", "hello from b").await;
    let b = Browser::new(&h);
    let p = b.get("/ui").await;
    assert_eq!((p.status, location(&p)), (303, "/ui/login"));
    let login = b.get("/ui/login").await;
    assert!(login
        .body
        .contains(r#"<form id="login" method="post" action="/ui/login">"#));
    // Wrong token: 401, the form again, no cookie.
    let p = b.post("/ui/login", &[("token", "nope")]).await;
    assert_eq!(p.status, 401);
    assert!(p.body.contains(r#"id="login-error""#));
    assert!(b.cookie("recall_console").is_none());
    assert_eq!(b.get("/ui").await.status, 303);
    // The admin token.
    let p = b.post("/ui/login", &[("token", ADMIN)]).await;
    assert_eq!((p.status, location(&p)), (303, "/ui"));
    let set = p.headers[SET_COOKIE].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/ui")
    );
    assert!(!set.contains(ADMIN), "the cookie is not the token");
    let p = b.get("/ui").await;
    assert_eq!(p.status, 200);
    assert!(p.body.contains("<th>Tenant</th>"), "the admin sees tenants");
    assert!(p.body.contains("a-only") && p.body.contains("b-only"));
    let b_internal = between(&p.body, r#"<tr class="session" data-session=""#, "\"");
    let b_internal = if b_internal.ends_with(":b-only") {
        b_internal.to_owned()
    } else {
        between(
            &p.body[p.body.find("b-only").unwrap() - 40..],
            r#"data-session=""#,
            "\"",
        )
        .to_owned()
    };
    assert!(b_internal.ends_with(":b-only"), "{b_internal}");
    assert_eq!(
        b.get(&format!("/ui/sessions/{b_internal}")).await.status,
        200
    );
    // A client key sees its own sessions only, and not another's page.
    let a = Browser::new(&h);
    assert_eq!(
        a.post("/ui/login", &[]).await.status,
        403,
        "no token yet: refused"
    );
    a.get("/ui/login").await;
    assert_eq!(a.post("/ui/login", &[("token", KEY_A)]).await.status, 303);
    let p = a.get("/ui").await;
    assert!(
        p.body.contains("a-only") && !p.body.contains("b-only"),
        "{}",
        p.body
    );
    assert!(!p.body.contains("<th>Tenant</th>"));
    assert_eq!(a.get("/ui/sessions/b-only").await.status, 404);
    assert_eq!(
        a.get(&format!("/ui/sessions/{b_internal}")).await.status,
        404
    );
    assert_eq!(
        a.get(&format!("/ui/sessions/{b_internal}/live?since=1"))
            .await
            .status,
        404
    );
    let p = a.post(&format!("/ui/sessions/{b_internal}/end"), &[]).await;
    assert_eq!(p.status, 404, "another tenant's session cannot be ended");
    assert_eq!(a.get("/ui/sessions/a-only").await.status, 200);
    // A tenant's user pages are its own users; the overview is the admin's.
    assert_eq!(a.get("/ui/overview").await.status, 403);
    assert_eq!(b.get("/ui/overview").await.status, 200);
    // The admin's user links name the tenant's user as its memory is kept.
    let admin_page = b.get(&format!("/ui/sessions/{b_internal}")).await.body;
    let tenant_b = b_internal.split(':').next().unwrap();
    assert!(
        admin_page.contains(&format!(r#"href="/ui/users/{tenant_b}:ana""#)),
        "{admin_page}"
    );
    let own = h
        .client
        .get(format!("{}/ui/sessions/b-only", h.url))
        .bearer_auth(KEY_B)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(own.contains(r#"href="/ui/users/ana""#));
    // A bearer header works without signing in; a wrong one does not.
    let bearer = h
        .client
        .get(format!("{}/ui", h.url))
        .bearer_auth(KEY_B)
        .send()
        .await
        .unwrap();
    let text = bearer.text().await.unwrap();
    assert!(text.contains("b-only") && !text.contains("a-only"));
    let wrong = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(format!("{}/ui/sessions/a-only", h.url))
        .bearer_auth("sk-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 303);
    // Signing out forgets the cookie.
    let p = b.post("/ui/logout", &[]).await;
    assert_eq!((p.status, location(&p)), (303, "/ui/login"));
    assert!(b.cookie("recall_console").is_none());
    assert_eq!(b.get("/ui").await.status, 303);
}

#[tokio::test]
async fn a_write_without_the_pages_token_or_from_another_origin_changes_nothing() {
    let h = console("").await;
    h.say("s-csrf", "hello").await;
    let b = Browser::new(&h);
    b.get("/ui/sessions/s-csrf").await;
    let token = b.cookie("recall_csrf").expect("a CSRF cookie");
    let end = format!("{}/ui/sessions/s-csrf/end", h.url);
    // No token, a wrong one, the right one from another origin.
    let bare = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let cookie = format!("recall_csrf={token}");
    let tries = [
        bare.post(&end).header(COOKIE, &cookie).form(&[("x", "y")]),
        bare.post(&end)
            .header(COOKIE, &cookie)
            .form(&[("csrf", "0123456789abcdef0123456789abcdef")]),
        bare.post(&end)
            .header(COOKIE, &cookie)
            .header("origin", "http://evil.example")
            .form(&[("csrf", token.as_str())]),
        bare.post(&end).header("x-csrf-token", &token),
    ];
    for t in tries {
        let resp = t.send().await.unwrap();
        assert_eq!(resp.status(), 403);
    }
    assert_eq!(
        h.history("s-csrf").await.0,
        200,
        "the session is still there"
    );
    let p = b.post("/ui/sessions/s-csrf/end", &[]).await;
    assert_eq!((p.status, location(&p)), (303, "/ui"));
    assert_eq!(h.history("s-csrf").await.0, 404);
}

#[tokio::test]
async fn the_live_stream_sends_the_reply_as_it_grows_then_a_change() {
    let h = console("").await;
    h.say("s-live", "first").await;
    let b = Browser::new(&h);
    let words = ["one ", "two ", "three ", "four ", "five ", "six"];
    h.upstream
        .push(sse_text(&words, Duration::from_millis(150)));
    let resp = h
        .post_chat(
            "s-live",
            json!({"model": "m", "stream": true, "messages": [user("count")]}),
        )
        .await;
    let (rest, _) = read_until(resp, "one").await;
    let page = b.get("/ui/sessions/s-live").await.body;
    assert!(
        page.contains(
            r#"<button id="interrupt" type="button" data-action="/ui/sessions/s-live/interrupt">"#
        ),
        "enabled while streaming"
    );
    let sig = between(&page, r#"data-signature=""#, "\"");
    let cookie = format!("recall_csrf={}", b.cookie("recall_csrf").unwrap());
    let live = h
        .client
        .get(format!("{}/ui/sessions/s-live/live?since={sig}", h.url))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(live.headers()["content-type"], "text/event-stream");
    let drained = tokio::spawn(read_rest(rest));
    let text = tokio::time::timeout(Duration::from_secs(10), live.text())
        .await
        .expect("the live stream ends after the reply")
        .unwrap();
    drained.await.unwrap();
    let replies: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.contains("text"))
        .collect();
    assert!(replies.len() >= 2, "the reply grows: {text}");
    let first: Value = serde_json::from_str(replies[0]).unwrap();
    let last: Value = serde_json::from_str(replies[replies.len() - 1]).unwrap();
    assert!(last["text"].as_str().unwrap().len() > first["text"].as_str().unwrap().len());
    assert!(text.contains("event: changed"), "{text}");
    // An idle page's stream says nothing until the session changes.
    let page = b.get("/ui/sessions/s-live").await.body;
    assert!(page.contains(r#"data-action="/ui/sessions/s-live/interrupt" disabled"#));
}

/// The client regenerates the last reply: the same history again, without
/// it (answered "Another answer.").
async fn regenerate(h: &Harness, session: &str) {
    let history = h.history(session).await.1["contents"].clone();
    let mut resent: Vec<Value> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!({"role": m["role"], "content": m["content"]}))
        .collect();
    resent.pop();
    h.upstream.push(completion("Another answer."));
    let (status, body) = h
        .chat(Some(session), json!({"model": "m", "messages": resent}))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The parts the live page replaces in place name what they hold: the
/// part before the conversation a version that moves only with its
/// content (so that a summary being typed is left alone when nothing in
/// it changed), a superseded group the message it begins with (so that a
/// group the reader opened stays open).
#[tokio::test]
async fn the_live_pages_parts_name_their_content() {
    let h = console("").await;
    let b = Browser::new(&h);
    h.say("parts", "My name is Ada.").await;
    let version =
        |page: &str| between(page, r#"<details id="before" open data-version=""#, "\"").to_owned();
    let first = b.get("/ui/sessions/parts").await.body;
    assert!(
        first.contains(r#"<dl class="facts" id="session-facts">"#),
        "{first}"
    );
    h.say("parts", "I live in Paris.").await;
    let second = b.get("/ui/sessions/parts").await.body;
    assert!(!version(&first).is_empty());
    assert_eq!(
        version(&first),
        version(&second),
        "a new turn moved the part before it"
    );
    let (status, _) = h
        .api(
            Method::PUT,
            "/v1/sessions/parts/summary",
            Some(json!({"summary": "Ada lives in Paris."})),
        )
        .await;
    assert_eq!(status, 200);
    let third = b.get("/ui/sessions/parts").await.body;
    assert_ne!(
        version(&second),
        version(&third),
        "a new summary left its version"
    );
    // The client regenerates the last reply (the same history again).
    regenerate(&h, "parts").await;
    let fourth = b.get("/ui/sessions/parts").await.body;
    // Keyed by the message it begins with.
    let group = r#"<details class="superseded" data-key=""#;
    assert!(fourth.contains(group), "{fourth}");
    let key = between(&fourth, group, "\"");
    let first_inside = between(
        &fourth[fourth.find(group).unwrap()..],
        r#"data-seq=""#,
        "\"",
    );
    assert_eq!(key, first_inside, "{fourth}");
}

#[tokio::test]
async fn the_summary_can_be_edited_and_the_user_page_deletes_records_and_forgets() {
    let h = console(&format!(
        "[long_term]\nenabled = true\nextract_model = \"{EXTRACTOR}\"\nembedding_model = \"{EMBEDDER}\"\n\
         extract_every_turns = 1000\nattempts = 1\n"
    ))
    .await;
    say_as(
        &h,
        None,
        "ana",
        "s-mem",
        "I live in Hanoi. I am allergic to peanuts.",
    )
    .await;
    let (status, body) = h
        .api(Method::POST, "/v1/sessions/s-mem/memory/extract", None)
        .await;
    assert_eq!(status, 200, "{body}");
    let b = Browser::new(&h);
    b.get("/ui/sessions/s-mem").await;
    let p = b
        .post(
            "/ui/sessions/s-mem/summary",
            &[("summary", "Ana lives in <Hanoi>.")],
        )
        .await;
    assert_eq!((p.status, location(&p)), (303, "/ui/sessions/s-mem"));
    let (_, session) = h.api(Method::GET, "/v1/sessions/s-mem", None).await;
    assert_eq!(session["summary"]["text"], "Ana lives in <Hanoi>.");
    assert!(b
        .get("/ui/sessions/s-mem")
        .await
        .body
        .contains("Ana lives in &lt;Hanoi&gt;."));
    // An empty summary is refused, as on the API, and changes nothing.
    let p = b
        .post("/ui/sessions/s-mem/summary", &[("summary", " ")])
        .await;
    assert_eq!(p.status, 400);
    let (_, session) = h.api(Method::GET, "/v1/sessions/s-mem", None).await;
    assert_eq!(session["summary"]["text"], "Ana lives in <Hanoi>.");

    let page = b.get("/ui/users/ana").await.body;
    let count = page.matches(r#"<tr class="record""#).count();
    assert!(count >= 1, "{page}");
    let id = between(&page, r#"<tr class="record" data-record=""#, "\"");
    let p = b
        .post(&format!("/ui/users/ana/records/{id}/delete"), &[])
        .await;
    assert_eq!((p.status, location(&p)), (303, "/ui/users/ana"));
    let (status, _) = h
        .api(
            Method::GET,
            &format!("/v1/users/ana/memory/records/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        b.get("/ui/users/ana")
            .await
            .body
            .matches(r#"<tr class="record""#)
            .count(),
        count - 1
    );
    let p = b.post("/ui/users/ana/forget", &[]).await;
    assert_eq!(p.status, 303);
    let (_, list) = h
        .api(Method::GET, "/v1/users/ana/memory/records", None)
        .await;
    assert_eq!(list["data"], json!([]));
}

#[tokio::test]
async fn the_overview_draws_the_metrics_it_sampled() {
    let h = console("sample_secs = 1\n").await;
    h.say("s-o", "hello").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    h.say("s-o", "again").await;
    let page = Browser::new(&h).get("/ui/overview").await.body;
    assert!(page.matches(r#"<svg class="chart""#).count() >= 5, "{page}");
    assert!(
        !page.contains("style="),
        "no inline styles under the policy"
    );
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> &'a str {
    let from = s
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in {s}"))
        + start.len();
    let len = s[from..].find(end).unwrap();
    &s[from..from + len]
}

fn urlencode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

#[tokio::test]
async fn a_client_set_timestamp_out_of_any_calendar_still_renders() {
    let h = console("").await;
    for ts in [300_000_000_000_000_i64, -5, i64::MAX] {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "x", "timestamp": ts,
             "metadata": {"interrupt_timestamp": ts}}]});
        let (status, _) = h.chat(Some("s-time"), body).await;
        assert_eq!(status, 200);
    }
    let p = Browser::new(&h).get("/ui/sessions/s-time").await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert!(p
        .body
        .contains(r#"<span class="raw-time">300000000000000</span>"#));
    assert_eq!(Browser::new(&h).get("/ui").await.status, 200);
}

#[tokio::test]
async fn a_console_without_a_token_answers_only_on_loopback_names_or_allowed_hosts() {
    let h = console("allowed_hosts = [\"recall.internal\"]\n").await;
    h.say("s-host", "hello").await;
    let get = |host: &'static str| {
        h.client
            .get(format!("{}/ui/sessions/s-host", h.url))
            .header("host", host)
            .send()
    };
    // A page of another site whose name now points here (DNS rebinding).
    let rebound = get("attacker.example:8080").await.unwrap();
    assert_eq!(rebound.status(), 403);
    assert!(!rebound.text().await.unwrap().contains("hello"));
    for ok in [
        "localhost:8080",
        "127.0.0.1",
        "[::1]:80",
        "Recall.Internal:8080",
    ] {
        assert_eq!(get(ok).await.unwrap().status(), 200, "{ok}");
    }
}

#[tokio::test]
async fn the_interrupt_button_gets_a_204_and_a_form_goes_back() {
    let h = console("").await;
    h.say("s-btn", "hello").await;
    let b = Browser::new(&h);
    b.get("/ui/sessions/s-btn").await;
    let token = b.cookie("recall_csrf").unwrap();
    let resp = h
        .client
        .post(format!("{}/ui/sessions/s-btn/interrupt", h.url))
        .header(COOKIE, format!("recall_csrf={token}"))
        .header("x-csrf-token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let (_, hist) = h.history("s-btn").await;
    assert_eq!(hist["contents"][1]["metadata"]["interrupted"], true);
    // Nothing left to interrupt: the page says why.
    let resp = b.post("/ui/sessions/s-missing/interrupt", &[]).await;
    assert_eq!(resp.status, 404);
    assert!(resp.body.contains("not found"));
}

#[tokio::test]
async fn a_bad_address_under_ui_is_a_page_not_json() {
    let h = console("").await;
    let b = Browser::new(&h);
    for (path, status, says) in [
        ("/ui/sessions/nobody", 404, "session `nobody` not found"),
        ("/ui?page=x", 400, "query string is invalid"),
        ("/ui/sessions/s/live", 400, "query string is invalid"),
        ("/ui/no/such/page", 404, "There is no such page."),
    ] {
        let p = b.get(path).await;
        assert_eq!(p.status, status, "{path}");
        assert!(
            p.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}"
        );
        assert!(p.body.contains(says), "{path}: {}", p.body);
        assert!(p.headers.contains_key("content-security-policy"));
    }
}

#[tokio::test]
async fn a_users_page_shows_when_each_record_was_said_and_what_superseded_what() {
    let h = console(&format!(
        "[long_term]\nenabled = true\nembedding_model = \"{EMBEDDER}\"\nextract_every_turns = 1000\n"
    ))
    .await;
    for (session, text, at) in [
        ("s-paris", "I live in Paris.", 1_683_554_160_000i64),
        (
            "s-berlin",
            "I moved to Berlin last week.",
            1_684_573_200_000,
        ),
    ] {
        say_at(&h, "ana", session, text, Some(at)).await;
        let path = format!("/v1/sessions/{session}/memory/extract");
        let (status, body) = h.api(Method::POST, &path, None).await;
        assert_eq!(status, 200, "{body}");
    }
    let (_, page) = h
        .api(
            Method::GET,
            "/v1/users/ana/memory/records?include_superseded=true",
            None,
        )
        .await;
    let id_of = |word: &str| {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["text"].as_str().unwrap().contains(word))
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let (paris, berlin) = (id_of("Paris"), id_of("Berlin"));
    let b = Browser::new(&h);
    let body = b.get("/ui/users/ana").await.body;
    assert!(
        body.contains("Long-term records (1 current, 1 superseded)"),
        "{body}"
    );
    // Each record with the day it was said; Paris marked, linking Berlin.
    assert!(body.contains(r#"<time data-ms="1683554160000">"#), "{body}");
    assert!(body.contains(r#"<time data-ms="1684573200000">"#), "{body}");
    let row = between(&body, &format!(r#"data-record="{paris}""#), "</tr>");
    assert!(
        row.contains(&format!(
            r##"superseded by <a href="#record-{berlin}">{berlin}</a>"##
        )),
        "{row}"
    );
    assert!(
        body.contains(&format!(
            r#"<tr class="record superseded" data-record="{paris}" id="record-{paris}""#
        )),
        "{body}"
    );
    let row = between(&body, &format!(r#"data-record="{berlin}""#), "</tr>");
    assert!(!row.contains("superseded by"), "{row}");
}
