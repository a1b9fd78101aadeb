"""The web console (`/ui`) in a real browser: headless Chromium through
Selenium (browser.py), in front of the real recall binary on its built-in
mock upstream (mock://echo, a word every 100 ms).

- A streaming reply shows live on the session page and grows; the page's
  Interrupt button cuts it off; the page then shows, in place (it never
  reloads), the cut reply as what was heard, a "cut off here" marker and
  the unheard rest of the original, and the history API has
  `metadata.interrupted`.
- A new message and a superseded reply appear on an open session page in
  place: its scroll, the summary being typed and an opened group stay.
- Message text is escaped: markup in a message shows as text, runs nothing
  and adds no element.
- With an admin token, the console asks for it: a wrong one is refused
  (401, an error, no sessions); the right one leads to the sessions page
  with an HttpOnly, SameSite=Strict cookie.
- The sessions page lists the sessions; every page has the CSRF meta tag
  and the navigation; the session page's forms (Edit summary, End
  session) work when the browser posts them; the overview draws its
  charts.

Screenshots of the session page (after the cut) and of the overview go to
docs/console/ with RECALL_SCREENSHOTS set, else to a temporary directory.
Without Chromium, chromedriver or Selenium the tests are skipped, but in
CI (CI=true) they fail.
"""

from __future__ import annotations

import html.parser
import json
import re
import threading
import time

import httpx
import pytest

from browser import ConsoleRecall, new_driver, quit_driver, screenshot_dir, tools, wait_for
from launch import http

try:
    from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
except ImportError:  # new_driver() skips (or fails in CI) with the reason
    NoAlertPresentException = StaleElementReferenceException = By = None

TOKEN = "console-browser-test-token-3f9a1c"

# About 60 words: the mock streams its answer (this, quoted, and a
# sentence or two more) a word every 100 ms, so the reply takes ~8 s.
LONG_MESSAGE = (
    "Tell me everything about the lighthouse keeper who lived on the small rocky island "
    "far out in the northern sea, how he kept the great lamp burning through every storm, "
    "what he ate in the long winters, which ships he saved from the reefs, who came to "
    "visit him each spring, and why he never once left the island in forty years."
)
# The mock's whole answer to a session's first message (README, Quickstart).
FULL_ANSWER = (f'You said: "{LONG_MESSAGE}" I see nothing you said before that. '
               "I received 2 messages (1 system, 1 user).")

XSS_MESSAGE = '<script>alert("x")</script> "><img src=x onerror=alert(1)>'


# -- fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser_tools():
    """Skips (fails in CI) before any recall starts when there is no browser."""
    return tools()


@pytest.fixture(scope="module")
def console(browser_tools):
    """recall with an open console (no admin token)."""
    s = ConsoleRecall().start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def locked_console(browser_tools):
    """recall whose console (and API) asks for the admin token."""
    extra = '\n[admin]\ntoken_env = "RECALL_CONSOLE_TEST_TOKEN"\n'
    s = ConsoleRecall(extra, env={"RECALL_CONSOLE_TEST_TOKEN": TOKEN}).start()
    yield s
    s.stop()


@pytest.fixture
def driver():
    d = new_driver()
    yield d
    quit_driver(d)


@pytest.fixture(autouse=True)
def _logs_on_failure(request):
    """conftest.py adds recall's log to a failed test's report."""
    for name in ("console", "locked_console"):
        if name in request.fixturenames:
            request.node.stack = request.getfixturevalue(name)
    yield


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return screenshot_dir(tmp_path_factory)


# -- helpers --------------------------------------------------------------------


def squash(text: str) -> str:
    """Text without whitespace: what the page shows may break lines and
    spaces differently from the stored text."""
    return re.sub(r"\s+", "", text)


def norm(text: str) -> str:
    return " ".join(text.split())


def css(driver, selector):
    return driver.find_elements(By.CSS_SELECTOR, selector)


def no_alert(driver):
    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        return
    text = alert.text
    alert.dismiss()
    raise AssertionError(f"a JavaScript alert is open ({text!r}): message text ran as code")


def page_text(driver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text[:1000]


def check_frame(driver, page: str):
    """What every console page has: the CSRF meta tag and the navigation."""
    metas = css(driver, 'meta[name="csrf-token"]')
    assert len(metas) == 1, f"{page}: expected one <meta name=csrf-token>, found {len(metas)}"
    assert (metas[0].get_dom_attribute("content") or "").strip(), f"{page}: the csrf-token meta is empty"
    assert css(driver, 'a[href="/ui"]'), f"{page}: no navigation link a[href=\"/ui\"]"
    assert css(driver, 'a[href="/ui/overview"]'), f"{page}: no navigation link a[href=\"/ui/overview\"]"


def save(driver, shots, name: str, capsys):
    path = shots / name
    assert driver.save_screenshot(str(path)), f"could not save {path}"
    with capsys.disabled():
        print(f"\n[console screenshot] {path}")
    return path


def chat(base: str, session: str, content: str, **extra):
    r = httpx.post(f"{base}/v1/chat/completions",
                   headers={"x-session-id": session},
                   json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra},
                   timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


class Streamer(threading.Thread):
    """Reads one streaming chat completion to its end, in the background."""

    def __init__(self, base: str, session: str, content: str):
        super().__init__(daemon=True)
        self.base, self.session, self.content = base, session, content
        self.text = ""
        self.done = False  # saw `data: [DONE]`
        self.status = None
        self.error = None

    def run(self):
        body = {"model": "gpt-4o-mini", "stream": True,
                "messages": [{"role": "user", "content": self.content}]}
        try:
            with httpx.stream("POST", f"{self.base}/v1/chat/completions", json=body,
                              headers={"x-session-id": self.session}, timeout=60) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        self.done = True
                        continue
                    for choice in json.loads(data).get("choices") or []:
                        self.text += (choice.get("delta") or {}).get("content") or ""
        except Exception as e:  # a cut stream may end abruptly: noted, not raised
            self.error = e


class Forms(html.parser.HTMLParser):
    """The inputs of each form with an id, as {form id: {name: value}}."""

    def __init__(self):
        super().__init__()
        self.forms: dict[str, dict[str, str]] = {}
        self.current = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.current = a.get("id")
            if self.current:
                self.forms[self.current] = {}
        elif tag == "input" and self.current and a.get("name"):
            self.forms[self.current][a["name"]] = a.get("value") or ""

    def handle_endtag(self, tag):
        if tag == "form":
            self.current = None


def login_form_fields(client: httpx.Client, base: str) -> dict:
    r = client.get(f"{base}/ui/login")
    assert r.status_code == 200, f"GET /ui/login: {r.status_code} {r.text[:300]}"
    parser = Forms()
    parser.feed(r.text)
    assert "login" in parser.forms, f"no form#login on /ui/login:\n{r.text[:1000]}"
    return parser.forms["login"]


# -- the tests ------------------------------------------------------------------


def test_live_stream_then_interrupt(console, driver, shots, capsys):
    base, sid = console.recall_url, "browser-demo"
    streamer = Streamer(base, sid, LONG_MESSAGE)
    streamer.start()
    wait_for(lambda: http("GET", f"{base}/v1/sessions/{sid}")[1].get("in_flight"), 10,
             "the streaming reply to be in flight")

    driver.get(f"{base}/ui/sessions/{sid}")
    no_alert(driver)
    check_frame(driver, f"/ui/sessions/{sid}")
    assert css(driver, "#transcript"), "no #transcript on the session page"
    live = css(driver, "#live")
    assert live, "no #live element while a reply streams"
    assert "streaming" in (live[0].get_dom_attribute("class") or "").split(), \
        f"#live's class is {live[0].get_dom_attribute('class')!r}, expected 'msg streaming'"

    def live_text():
        return css(driver, "#live .live-text")[0].text  # visible text only: "" while hidden

    first = wait_for(lambda: live_text().strip(), 8, "text in #live .live-text while the reply streams")
    time.sleep(1.0)
    second = wait_for(lambda: (t := live_text().strip()) and len(t) > len(first) and t, 5,
                      f"#live .live-text to grow past {len(first)} characters ({first!r})")
    for seen in (first, second):
        assert norm(FULL_ANSWER).startswith(norm(seen)), \
            f"the live text is not the start of the mock's answer:\n  live: {seen!r}\n  answer: {FULL_ANSWER!r}"

    button = css(driver, "button#interrupt")
    assert button, "no button#interrupt on the session page"
    assert button[0].is_enabled(), "button#interrupt is disabled while a reply streams"
    assert streamer.is_alive() and not streamer.done, "the reply ended before the interrupt"
    driver.execute_script("window.__recallBeforeInterrupt = true")
    button[0].click()

    # The client's stream ends at the cut, without [DONE].
    streamer.join(10)
    assert not streamer.is_alive(), "the client's stream went on after the interrupt"
    assert streamer.status == 200, f"streaming status {streamer.status} ({streamer.error!r})"
    assert not streamer.done, "the client's stream ended with [DONE]: the reply was not cut"
    assert streamer.text and norm(FULL_ANSWER).startswith(norm(streamer.text)), streamer.text

    # The page shows the cut by itself, in place: no reload, from the
    # page or from here.
    reloaded = lambda: not driver.execute_script("return window.__recallBeforeInterrupt === true")
    last_seen = "no #transcript .msg.interrupted"

    # Then the drain fills in the original (a few more seconds of the
    # mock), which the page shows in place too.
    def cut_reply():
        nonlocal last_seen
        assert not reloaded(), "the session page reloaded itself instead of updating in place"
        msgs = css(driver, "#transcript .msg.interrupted")
        if msgs:
            m = msgs[-1]
            parts = [m.find_elements(By.CSS_SELECTOR, c) for c in (".heard", ".cut-marker", ".unheard")]
            texts = [p[0].text if p else None for p in parts]
            last_seen = "heard {!r}, cut-marker {!r}, unheard {!r}".format(*texts)
            if all(parts) and texts[2].strip() and squash(texts[0] + texts[2]) == squash(FULL_ANSWER):
                return m, parts[0][0], parts[1][0], parts[2][0]
        return None

    try:
        m, heard, marker, unheard = wait_for(cut_reply, 20, (
            "a .msg.interrupted with .heard, .cut-marker and a non-empty .unheard, "
            "heard + unheard being the mock's whole answer"))
    except AssertionError as e:
        raise AssertionError(f"{e}\n  last seen: {last_seen}\n  answer: {FULL_ANSWER!r}") from None
    no_alert(driver)
    assert not reloaded(), "the session page reloaded itself instead of updating in place"
    assert "role-assistant" in (m.get_dom_attribute("class") or "").split(), \
        f"the cut reply's classes: {m.get_dom_attribute('class')!r}"
    heard_text, unheard_text, marker_text = heard.text, unheard.text, marker.text
    assert heard_text.strip(), "the .heard part is empty"
    assert "cut off here" in marker_text.lower(), f".cut-marker says {marker_text!r}"
    assert re.search(r"\d{1,2}:\d{2}", marker_text), f".cut-marker has no time: {marker_text!r}"
    assert squash(heard_text + unheard_text) == squash(FULL_ANSWER), (
        "heard + unheard is not the mock's whole answer:\n"
        f"  heard:   {heard_text!r}\n  unheard: {unheard_text!r}\n  answer:  {FULL_ANSWER!r}")
    assert heard_text.strip().startswith("You said:"), heard_text
    # The unheard rest is muted: it does not look like the heard part.
    look = "return [getComputedStyle(arguments[0]).color, getComputedStyle(arguments[0]).opacity]"
    heard_look, unheard_look = driver.execute_script(look, heard), driver.execute_script(look, unheard)
    assert heard_look != unheard_look, \
        f".unheard is not muted: it has the color and opacity of .heard ({heard_look})"
    assert not css(driver, "#live .live-text") or not css(driver, "#live")[0].is_displayed(), \
        "#live still shows after the reply was cut"

    # The same reply through the history API.
    status, history = console.history(sid)
    assert status == 200, history
    replies = [c for c in history["contents"] if c["role"] == "assistant"]
    assert replies, history
    meta = replies[-1].get("metadata") or {}
    assert meta.get("interrupted") is True, f"metadata of the cut reply: {meta}"
    assert squash(meta.get("original", "")) == squash(FULL_ANSWER), meta
    assert squash(replies[-1]["content"]) == squash(heard_text), \
        f"the page's heard part {heard_text!r} is not the stored content {replies[-1]['content']!r}"

    save(driver, shots, "session.png", capsys)


def test_session_page_updates_in_place(console, driver):
    """An open session page shows a new message and a superseded reply by
    itself, without reloading: it keeps the reader's scroll,
    the summary they are typing, and the group of superseded messages they
    opened."""
    base, sid = console.recall_url, "browser-in-place"
    for i in range(6):
        chat(base, sid, f"Message number {i}, long enough to take a line or two of the page.")
    driver.set_window_size(1000, 500)
    driver.get(f"{base}/ui/sessions/{sid}")
    assert css(driver, "#transcript"), "no #transcript on the session page"
    driver.execute_script("window.__recallNotReloaded = true")
    not_reloaded = lambda: driver.execute_script("return window.__recallNotReloaded === true")
    typed = "typed here, not saved"
    area = css(driver, "form#summary-form textarea[name=summary]")
    assert area, "no form#summary-form textarea"
    area[0].send_keys(typed)
    driver.execute_script("window.scrollTo(0, 250)")
    y = driver.execute_script("return window.scrollY")
    assert y > 0, "the page is too short to scroll"

    def contents():
        return [e.text for e in css(driver, "#transcript .msg .content")]

    # A new message.
    chat(base, sid, "A new message arrives.")
    wait_for(lambda: any(t.strip() == "A new message arrives." for t in contents()), 10,
             "the new message on the open session page")
    assert not_reloaded(), "the page reloaded to show the new message"
    area = css(driver, "form#summary-form textarea[name=summary]")
    assert area and area[0].get_property("value").endswith(typed), \
        f"the summary being typed was lost: {area[0].get_property('value')!r}"
    assert abs(driver.execute_script("return window.scrollY") - y) <= 2, "the page lost its scroll"
    assert not css(driver, "#stale") or not css(driver, "#stale")[0].is_displayed(), \
        "the stale note shows although nothing being edited changed"

    # The client regenerates the last reply (the same history again): the
    # reply it replaces is superseded, shown in a closed group.
    status, history = console.history(sid)
    assert status == 200, history
    resent = [{"role": m["role"], "content": m["content"]} for m in history["contents"]][:-1]
    r = httpx.post(f"{base}/v1/chat/completions", headers={"x-session-id": sid},
                   json={"model": "gpt-4o-mini", "messages": resent}, timeout=30)
    assert r.status_code == 200, r.text
    wait_for(lambda: css(driver, "#transcript details.superseded"), 10,
             "the superseded reply on the open session page")
    assert not_reloaded(), "the page reloaded to show the superseded reply"
    group = css(driver, "#transcript details.superseded")[-1]
    group.find_element(By.CSS_SELECTOR, "summary").click()
    assert group.get_property("open"), "the superseded group did not open"

    # One more change: the opened group stays open, the typing stays.
    chat(base, sid, "And one more.")
    wait_for(lambda: any(t.strip() == "And one more." for t in contents()), 10,
             "the next message on the open session page")
    assert not_reloaded(), "the page reloaded to show the next message"
    groups = css(driver, "#transcript details.superseded")
    assert groups and groups[-1].get_property("open"), "the group the reader opened closed"
    area = css(driver, "form#summary-form textarea[name=summary]")
    assert area and area[0].get_property("value").endswith(typed), "the summary being typed was lost"


def test_message_text_is_escaped(console, driver):
    base, sid = console.recall_url, "browser-xss"
    chat(base, sid, XSS_MESSAGE)
    driver.get(f"{base}/ui/sessions/{sid}")
    time.sleep(0.5)  # time for an <img onerror> or a script to fire, were there one
    no_alert(driver)
    check_frame(driver, f"/ui/sessions/{sid}")
    assert css(driver, "#transcript"), "no #transcript on the session page"
    assert not css(driver, "#transcript img"), "an <img> from a message is in #transcript"
    assert not css(driver, "#transcript script"), "a <script> from a message is in #transcript"
    users = [e.text for e in css(driver, "#transcript .msg.role-user .content")]
    assert any('<script>alert("x")</script>' in t for t in users), \
        f"the user message's markup does not show as text: {users}"
    assert any('"><img src=x onerror=alert(1)>' in t for t in users), users
    # The mock's answer quotes it too, as text.
    replies = [e.text for e in css(driver, "#transcript .msg.role-assistant .content")]
    assert any('<script>alert("x")</script>' in t for t in replies), replies
    no_alert(driver)


def test_sessions_list_and_session_page(console, driver):
    base, sid = console.recall_url, "browser-list"
    chat(base, sid, "My name is Ada.")
    chat(base, sid, "What is my name?")

    driver.get(f"{base}/ui")
    check_frame(driver, "/ui")
    assert css(driver, "table#sessions"), "no table#sessions on /ui"
    rows = css(driver, f'table#sessions tr.session[data-session="{sid}"]')
    assert len(rows) == 1, f"expected one tr.session for {sid}, found {len(rows)}"
    links = rows[0].find_elements(By.CSS_SELECTOR, "a.session-link")
    assert links and links[0].get_dom_attribute("href") == f"/ui/sessions/{sid}", \
        [a.get_dom_attribute("href") for a in links]
    assert css(driver, "form#search input[name=q]"), "no form#search with input[name=q] on /ui"

    links[0].click()
    wait_for(lambda: driver.current_url.endswith(f"/ui/sessions/{sid}"), 10, "the session page")
    check_frame(driver, f"/ui/sessions/{sid}")
    roles = [(m.get_dom_attribute("class") or "").split() for m in css(driver, "#transcript .msg")]
    assert [r for r in roles if "role-user" in r] and [r for r in roles if "role-assistant" in r], roles
    texts = [e.text for e in css(driver, "#transcript .msg .content")]
    assert any("My name is Ada." == t.strip() for t in texts), texts
    assert any('Before that you said: "My name is Ada."' in t for t in texts), texts
    live = css(driver, "#live")
    assert live and not live[0].is_displayed(), "#live shows while nothing streams"
    button = css(driver, "button#interrupt")
    assert button, "no button#interrupt on the session page"
    assert not (button[0].is_displayed() and button[0].is_enabled()), \
        "button#interrupt is enabled while nothing streams"
    assert css(driver, "form#end"), "no form#end on the session page"
    assert css(driver, "form#summary-form textarea[name=summary]"), \
        "no form#summary-form with textarea[name=summary] on the session page"


def submit_and_wait(driver, form_selector: str):
    """Submits a form with its button; returns once another page loaded."""
    form = css(driver, form_selector)
    assert form, f"no {form_selector}"
    form[0].find_element(By.CSS_SELECTOR, "button[type=submit], button:not([type])").click()

    def gone():
        try:
            form[0].is_enabled()
            return False
        except StaleElementReferenceException:
            return True

    wait_for(gone, 10, f"a page after submitting {form_selector}")


def test_session_forms_post_from_the_browser(console, driver):
    """Edit summary and End session, as a person would: forms posted by
    the browser itself (its Origin, its cookies, the page's CSRF field)."""
    base, sid = console.recall_url, "browser-forms"
    chat(base, sid, "I live in Paris.")
    summary = "The user lives in Paris."

    driver.get(f"{base}/ui/sessions/{sid}")
    area = css(driver, "form#summary-form textarea[name=summary]")
    assert area, "no form#summary-form with textarea[name=summary]"
    area[0].clear()
    area[0].send_keys(summary)
    submit_and_wait(driver, "form#summary-form")
    status, history = console.history(sid)
    assert status == 200, history
    assert summary in json.dumps(history.get("summary")), (
        f"the summary was not saved (history: {history.get('summary')!r}); "
        f"the page ({driver.current_url}) says:\n{page_text(driver)}")
    area = css(driver, "form#summary-form textarea[name=summary]")
    assert area and area[0].get_property("value") == summary, "the page does not show the saved summary"

    submit_and_wait(driver, "form#end")
    status, _ = http("GET", f"{base}/v1/sessions/{sid}")
    assert status == 404, (f"the session is still there after End session ({status}); "
                           f"the page ({driver.current_url}) says:\n{page_text(driver)}")
    assert driver.current_url.rstrip("/").endswith("/ui"), \
        f"End session did not lead to /ui: {driver.current_url} says:\n{page_text(driver)}"
    assert css(driver, "table#sessions"), page_text(driver)
    assert not css(driver, f'tr.session[data-session="{sid}"]'), "the ended session is still listed"


def test_overview_draws_charts(console, driver, shots, capsys):
    chat(console.recall_url, "browser-overview", "Hello there.")
    driver.get(f"{console.recall_url}/ui/overview")
    check_frame(driver, "/ui/overview")
    charts = wait_for(lambda: css(driver, "svg.chart"), 5, "an svg.chart on /ui/overview")
    assert charts[0].is_displayed(), "the first svg.chart is not displayed"
    size = charts[0].size
    assert size["width"] > 50 and size["height"] > 20, f"the first svg.chart is {size}"
    save(driver, shots, "overview.png", capsys)


def test_login_with_the_admin_token(locked_console, driver):
    base = locked_console.recall_url

    # HTTP first: the statuses and the cookie's attributes as sent.
    with httpx.Client(follow_redirects=False, timeout=10, headers={"origin": base}) as client:
        r = client.get(f"{base}/ui")
        assert r.status_code in (200, 303), f"GET /ui without a token: {r.status_code}"
        if r.status_code == 303:
            assert r.headers["location"].endswith("/ui/login"), r.headers
        else:
            assert 'id="login"' in r.text, "GET /ui without a token shows no login form"
        fields = login_form_fields(client, base)
        r = client.post(f"{base}/ui/login", data={**fields, "token": "not-the-token"})
        assert r.status_code == 401, f"a wrong token: {r.status_code} {r.text[:300]}"
        assert 'id="login-error"' in r.text, r.text[:1000]
        fields = login_form_fields(client, base)
        r = client.post(f"{base}/ui/login", data={**fields, "token": TOKEN})
        assert r.status_code == 303, f"the right token: {r.status_code} {r.text[:300]}"
        assert r.headers["location"] in ("/ui", f"{base}/ui"), r.headers
        cookies = [c for c in r.headers.get_list("set-cookie") if c.startswith("recall_console=")]
        assert cookies, r.headers.get_list("set-cookie")
        attrs = {a.strip().split("=")[0].lower(): a.strip() for a in cookies[0].split(";")[1:]}
        assert "httponly" in attrs, cookies[0]
        assert attrs.get("samesite", "").lower() == "samesite=strict", cookies[0]
        assert attrs.get("path", "").lower() == "path=/ui", cookies[0]

    # Then in the browser.
    driver.get(f"{base}/ui")
    no_alert(driver)
    form = wait_for(lambda: css(driver, "form#login"), 5, "form#login on /ui without a token")[0]
    assert (form.get_dom_attribute("method") or "").lower() == "post", form.get_dom_attribute("method")
    assert form.get_dom_attribute("action") == "/ui/login", form.get_dom_attribute("action")
    token = css(driver, "input#token")
    assert token, "no input#token"
    assert token[0].get_dom_attribute("name") == "token" and token[0].get_dom_attribute("type") == "password", \
        (token[0].get_dom_attribute("name"), token[0].get_dom_attribute("type"))
    assert css(driver, 'meta[name="csrf-token"]'), "no csrf-token meta on the login page"
    assert not css(driver, "table#sessions"), "the sessions table shows without a token"

    token[0].send_keys("not-the-token")
    css(driver, "button#login-submit")[0].click()
    # The answer is the login form again with #login-error, or some
    # other page (a refusal, say), whose text then tells what went wrong.
    wait_for(lambda: css(driver, "#login-error") or not css(driver, "form#login"), 10,
             "a page after submitting a wrong token")
    error = css(driver, "#login-error")
    assert error, f"a wrong token: no #login-error; the page ({driver.current_url}) says:\n{page_text(driver)}"
    assert error[0].is_displayed() and error[0].text.strip(), "#login-error is empty or hidden"
    assert not css(driver, "table#sessions"), "the sessions table shows after a wrong token"
    assert not [c for c in driver.get_cookies() if c["name"] == "recall_console"], driver.get_cookies()

    css(driver, "input#token")[0].send_keys(TOKEN)
    css(driver, "button#login-submit")[0].click()
    wait_for(lambda: css(driver, "table#sessions") or not css(driver, "form#login"), 10,
             "a page after submitting the right token")
    assert css(driver, "table#sessions"), \
        f"the right token: no table#sessions; the page ({driver.current_url}) says:\n{page_text(driver)}"
    assert driver.current_url.rstrip("/").endswith("/ui"), driver.current_url
    assert not css(driver, "#login-error")
    check_frame(driver, "/ui (signed in)")
    cookie = [c for c in driver.get_cookies() if c["name"] == "recall_console"]
    assert len(cookie) == 1, driver.get_cookies()
    assert cookie[0].get("httpOnly") is True, cookie
    assert cookie[0].get("sameSite") == "Strict", cookie
    assert cookie[0].get("path") == "/ui", cookie
    assert driver.execute_script("return document.cookie").find("recall_console") < 0, \
        "the console's cookie is readable from JavaScript"

    # Signed in, the other pages open too.
    driver.get(f"{base}/ui/overview")
    assert css(driver, "svg.chart"), "no svg.chart on /ui/overview once signed in"
