// Sluice console: the connection indicator and keyboard navigation.
// Loaded with the page's CSP nonce; no inline handlers, no eval.
(function () {
  "use strict";
  var conn = document.getElementById("conn");
  function state(s, text) {
    if (!conn) return;
    conn.dataset.state = s;
    conn.textContent = text;
  }
  // A page without a live feed has nothing to connect: hide the indicator
  // rather than show a permanent "not connected".
  if (conn && !document.querySelector("[ws-connect]")) conn.hidden = true;
  document.body.addEventListener("htmx:wsConnecting", function () { state("connecting", "connecting…"); });
  document.body.addEventListener("htmx:wsOpen", function () {
    state("open", "live");
    if (conn) conn.title = "Live updates: connected";
  });
  document.body.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    // 1006/1011/1012/1013: the extension reconnects with backoff.
    var retry = [1006, 1011, 1012, 1013].indexOf(code) >= 0;
    // 1008: the session ended (signed out elsewhere, expired, roles changed).
    var text = retry ? "reconnecting…" : code === 1008 ? "signed out · reload" : "disconnected · reload";
    state("closed", text);
    if (conn) conn.title = retry ? "Live updates lost; retrying. The numbers below are from " + lastUpdate() + "." :
      code === 1008 ? "Your session ended here or in another tab. Reload to sign in again." :
      "Live updates stopped. Reload the page to see current numbers.";
  });
  function lastUpdate() {
    var u = document.getElementById("updated");
    return u ? u.textContent.trim().replace(/^as of /, "") : "earlier";
  }
  // "g" then a key jumps to a section (keys are on the nav links).
  var pending = false;
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName)))) return;
    if (!pending) { pending = e.key === "g"; return; }
    pending = false;
    var link = document.querySelector('nav a[data-key="' + e.key + '"]');
    if (link) link.click();
  });
})();
