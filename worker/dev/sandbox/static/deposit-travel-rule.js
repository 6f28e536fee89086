// The hosted deposit Travel Rule page's behaviour: field groups, one submission per form,
// the messages to the embedding window, and dark mode on the parent's request.
// It runs in a sandboxed iframe without allow-same-origin: no cookies, no storage.
(function () {
  "use strict";

  var SOURCE = "deposit-travel-rule";
  var inFrame = window.parent !== window;

  function tell(message) {
    // The frame's origin is opaque, so the parent cannot be named; it checks event.source.
    if (inFrame) {
      window.parent.postMessage(message, "*");
    }
  }

  function closed() {
    // Exactly the interface's two constant strings.
    tell({ type: "DEPOSIT_TRAVEL_RULE_CLOSED", source: SOURCE });
  }

  function setDark(on) {
    var sheet = document.getElementById("dark-stylesheet");
    if (sheet) {
      sheet.media = on ? "all" : "not all";
    }
    document.documentElement.className = on ? "dark" : "light";
    document.body.setAttribute("data-dark-mode", on ? "true" : "false");
    var field = document.querySelector("input[name=darkMode]");
    if (field) {
      field.value = on ? "true" : "false";
    }
    // The list's links carry the mode to the form.
    var links = document.querySelectorAll("a.deposit-link");
    for (var i = 0; i < links.length; i += 1) {
      var target = new URL(links[i].href);
      target.searchParams.set("darkMode", on ? "true" : "false");
      links[i].href = target.toString();
    }
  }

  window.addEventListener("message", function (event) {
    if (event.source !== window.parent) {
      return;
    }
    var data = event.data;
    if (data && data.type === "DARK_MODE" && typeof data.darkMode === "boolean") {
      setDark(data.darkMode);
    }
  });

  function showGroups(select, attribute) {
    if (!select) {
      return;
    }
    var groups = document.querySelectorAll("[" + attribute + "]");
    for (var i = 0; i < groups.length; i += 1) {
      groups[i].hidden = groups[i].getAttribute(attribute) !== select.value;
    }
  }

  var kind = document.getElementById("field-correspondentType");
  var wallet = document.getElementById("field-walletType");
  function refresh() {
    showGroups(kind, "data-correspondent");
    showGroups(wallet, "data-wallet");
  }
  if (kind) {
    kind.addEventListener("change", refresh);
  }
  if (wallet) {
    wallet.addEventListener("change", refresh);
  }
  refresh();

  var form = document.getElementById("payer-form");
  if (form) {
    form.addEventListener("submit", function (event) {
      // One submission per render; the server's Idempotency-Key covers any that slip through.
      if (form.getAttribute("data-sent") === "true") {
        event.preventDefault();
        return;
      }
      form.setAttribute("data-sent", "true");
      var button = document.getElementById("submit-button");
      if (button) {
        button.disabled = true;
      }
    });
  }

  var close = document.getElementById("close-button");
  if (close) {
    close.addEventListener("click", closed);
  }

  var done = document.getElementById("submission-confirmation");
  if (done) {
    // Proposed by the interface, not confirmed: the embedder may ignore it.
    tell({
      type: "DEPOSIT_TRAVEL_RULE_SUBMITTED",
      source: SOURCE,
      transactionId: done.getAttribute("data-transaction-id"),
      whiteListStatus: done.getAttribute("data-white-list-status"),
    });
    closed();
  }
})();
