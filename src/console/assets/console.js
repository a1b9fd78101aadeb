// recall console: the session page's live updates and the Interrupt
// button; times in the reader's own time zone. No inline script is
// allowed by the page's Content-Security-Policy, so everything is here.
"use strict";

(function () {
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  for (const t of document.querySelectorAll("time[data-ms]")) {
    const d = new Date(Number(t.dataset.ms));
    if (!isNaN(d)) { t.title = t.textContent; t.textContent = d.toLocaleString(); }
  }

  const transcript = document.getElementById("transcript");
  if (!transcript) return;
  const live = document.getElementById("live");
  const text = live && live.querySelector(".live-text");
  const button = document.getElementById("interrupt");

  if (button) {
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const r = await fetch(button.dataset.action, {
          method: "POST",
          headers: { "x-csrf-token": csrf },
          credentials: "same-origin",
        });
        if (!r.ok) { button.disabled = false; }
      } catch (e) {
        button.disabled = false;
      }
    });
  }

  const url = transcript.dataset.live + "?since=" + encodeURIComponent(transcript.dataset.signature);
  const events = new EventSource(url);
  // A form sent from this page (End session, Save summary) goes where
  // its answer says; a reload on the change it causes would cut it off.
  let leaving = false;
  for (const form of document.querySelectorAll("form")) {
    form.addEventListener("submit", () => { leaving = true; events.close(); });
  }

  events.addEventListener("reply", (e) => {
    const data = JSON.parse(e.data);
    if (text) { text.textContent = data.text; }
    if (live) { live.hidden = false; }
    if (button) { button.disabled = false; }
  });
  // Something typed and not saved (a summary being edited) is not thrown
  // away by a reload: the page says it is stale instead.
  const editing = () => [...document.querySelectorAll("textarea, input[type=text]")]
    .some((f) => f === document.activeElement || f.value !== f.defaultValue);
  events.addEventListener("changed", () => {
    events.close();
    if (leaving) { return; }
    if (!editing()) { window.location.reload(); return; }
    const note = document.getElementById("stale");
    if (note) { note.hidden = false; }
  });
  const reload = document.getElementById("stale-reload");
  if (reload) { reload.addEventListener("click", () => window.location.reload()); }
})();
