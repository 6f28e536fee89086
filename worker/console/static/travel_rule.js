// The hosted Travel Rule page in its iframe: on its close message, read the deposit's detail at
// once and show the new state. Only a message from the frame itself (event.source), of the
// documented type and source, counts. Its origin is the hosted page's, or "null": the frame is
// sandboxed without allow-same-origin, which gives it an opaque origin, and the console's CSP
// (frame-src) lets that frame load nothing but the hosted page's origin.
"use strict";
(function () {
  const box = document.getElementById("hosted");
  const frame = document.getElementById("hosted-frame");
  if (!box || !frame) return;
  const origin = box.dataset.origin;
  let busy = false;

  // The frame takes the window's height below it, so that only the frame scrolls (the hosted
  // page cannot tell its own height across origins): one scrollbar, not two.
  function fit() {
    const rect = frame.getBoundingClientRect();
    const below = document.body.getBoundingClientRect().bottom - rect.bottom;
    const top = rect.top + window.scrollY;
    frame.style.height = Math.max(window.innerHeight - top - below, 400) + "px";
  }
  fit();
  window.addEventListener("resize", fit);

  async function refresh() {
    if (busy) return;
    busy = true;
    const body = new URLSearchParams({ csrf: box.dataset.csrf, note: "hosted page closed" });
    try {
      const answer = await fetch(box.dataset.refresh, {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRF-Token": box.dataset.csrf },
        body: body,
      });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const data = await answer.json();
      const state = document.getElementById("state");
      state.textContent = data.state;
      state.dataset.state = data.state;
      document.getElementById("wls").textContent = data.whiteListStatus || "-";
      document.getElementById("closed").hidden = false;
      fit();
    } finally {
      busy = false;
    }
  }

  window.addEventListener("message", function (event) {
    if (event.source !== frame.contentWindow) return;
    if (event.origin !== origin && event.origin !== "null") return;
    const data = event.data;
    if (!data || typeof data !== "object") return;
    if (data.type !== "DEPOSIT_TRAVEL_RULE_CLOSED" || data.source !== "deposit-travel-rule") return;
    refresh();
  });
})();
