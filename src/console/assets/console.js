// recall console: the session page's live updates (in place: a change
// fetches the page and replaces the parts that moved) and the Interrupt
// button; times in the reader's own time zone. No inline script is
// allowed by the page's Content-Security-Policy, so everything is here.
"use strict";

(function () {
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  const localTimes = (root) => {
    for (const t of root.querySelectorAll("time[data-ms]")) {
      const d = new Date(Number(t.dataset.ms));
      if (!isNaN(d)) { t.title = t.textContent; t.textContent = d.toLocaleString(); }
    }
  };
  localTimes(document);

  if (!document.getElementById("transcript")) return;
  const button = () => document.getElementById("interrupt");

  document.addEventListener("click", async (e) => {
    const b = button();
    if (!b || e.target !== b) return;
    b.disabled = true;
    try {
      const r = await fetch(b.dataset.action, {
        method: "POST",
        headers: { "x-csrf-token": csrf },
        credentials: "same-origin",
      });
      if (!r.ok) { b.disabled = false; }
    } catch (err) {
      b.disabled = false;
    }
  });

  // A form sent from this page (End session, Save summary) goes where
  // its answer says; an update in place would race it.
  let leaving = false;
  let events = null;
  for (const form of document.querySelectorAll("form")) {
    form.addEventListener("submit", () => { leaving = true; if (events) events.close(); });
  }

  // Something typed and not saved (a summary being edited) is never
  // replaced: the page says that part is stale instead.
  const editing = (part) => [...part.querySelectorAll("textarea, input[type=text]")]
    .some((f) => f === document.activeElement || f.value !== f.defaultValue);
  const stale = () => { const n = document.getElementById("stale"); if (n) n.hidden = false; };

  // The parts a change can move, replaced in place from a fresh copy of
  // the page: the reader keeps the scroll, what they typed, and which
  // groups they opened.
  const PARTS = ["session-facts", "before", "transcript"];
  const swap = (id, fresh) => {
    const old = document.getElementById(id), neu = fresh.getElementById(id);
    if (!old || !neu) return;
    if (old.dataset.version && old.dataset.version === neu.dataset.version) return;
    if (editing(old)) { stale(); return; }
    const opened = new Set([...old.querySelectorAll("details[data-key]")]
      .filter((d) => d.open).map((d) => d.dataset.key));
    const node = document.importNode(neu, true);
    for (const d of node.querySelectorAll("details[data-key]")) {
      if (opened.has(d.dataset.key)) d.open = true;
    }
    if (old.tagName === "DETAILS" && node.tagName === "DETAILS") node.open = old.open;
    localTimes(node);
    old.replaceWith(node);
  };

  const update = async () => {
    const r = await fetch(window.location.href, { credentials: "same-origin" });
    // Ended, or not this reader's any more: say so, keep what is shown.
    if (!r.ok) { stale(); return false; }
    const fresh = new DOMParser().parseFromString(await r.text(), "text/html");
    if (!fresh.getElementById("transcript")) { stale(); return false; }
    const y = window.scrollY;
    const bottom = window.innerHeight + y >= document.documentElement.scrollHeight - 4;
    for (const id of PARTS) swap(id, fresh);
    const b = button(), nb = fresh.getElementById("interrupt");
    if (b && nb) b.disabled = nb.disabled;
    window.scrollTo(0, bottom ? document.documentElement.scrollHeight : y);
    return true;
  };

  const listen = () => {
    const transcript = document.getElementById("transcript");
    const url = transcript.dataset.live + "?since=" + encodeURIComponent(transcript.dataset.signature);
    events = new EventSource(url);
    events.addEventListener("reply", (e) => {
      const data = JSON.parse(e.data);
      const live = document.getElementById("live");
      const text = live && live.querySelector(".live-text");
      if (text) { text.textContent = data.text; }
      if (live) { live.hidden = false; }
      const b = button();
      if (b) { b.disabled = false; }
    });
    events.addEventListener("changed", async () => {
      events.close();
      if (leaving) { return; }
      let listening = false;
      try { listening = await update(); } catch (err) { stale(); }
      if (listening && !leaving) { listen(); }
    });
  };
  listen();

  const reload = document.getElementById("stale-reload");
  if (reload) { reload.addEventListener("click", () => window.location.reload()); }
})();
