// Sluice console: the connection indicator and keyboard navigation.
// Loaded with the page's CSP nonce; no inline handlers, no eval.
(function () {
  "use strict";
  // A page that answers a form's POST (a conflict, a refused value) names
  // its own address: shown in the address bar, a reload reads the page
  // instead of asking to send the form again.
  var own = document.querySelector('meta[name="sluice-page-url"]');
  if (own && window.history && history.replaceState) {
    var u = own.getAttribute("content");
    if (u && u.charAt(0) === "/" && u.charAt(1) !== "/" && location.pathname + location.search !== u) history.replaceState(null, "", u);
  }
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
  // A live fragment that names the state the page already shows
  // (data-live-key, e.g. the approvals page's signal, which the feed sends
  // again on every connect) is not swapped in: swapping it would reload
  // the list under the operator's pointer for nothing.
  document.body.addEventListener("htmx:oobBeforeSwap", function (e) {
    var d = e.detail, have = d.target && d.target.dataset ? d.target.dataset.liveKey : "";
    var next = d.fragment && d.fragment.firstElementChild;
    if (have && next && next.dataset && next.dataset.liveKey === have) {
      d.shouldSwap = false;
      d.target.dataset.liveUnchanged = have; // what was left out, for whoever looks
    }
  });
  // A live fragment replaces the elements in it, the one with the
  // keyboard's focus too (a tile's link, a dead letter's row): focus then
  // fell to the page's body every tick, and a keyboard or screen-reader
  // user could not stay on the dashboard's lower half. The element of the
  // same place in the new fragment (same id, or same link and test id)
  // takes the focus back; when the fragment no longer has it, the
  // fragment itself does, so the next Tab goes on from there.
  var refocus = null;
  function focusKey(el) {
    if (el.id) return "#" + el.id;
    return el.tagName + "|" + (el.getAttribute("href") || "") + "|" + (el.dataset.testid || "") + "|" + (el.getAttribute("name") || "");
  }
  document.body.addEventListener("htmx:oobBeforeSwap", function (e) {
    var d = e.detail, a = document.activeElement;
    if (d.shouldSwap && d.target && d.target.id && a && a !== document.body && d.target.contains(a)) {
      refocus = { fragment: d.target.id, key: focusKey(a) };
    }
  });
  document.body.addEventListener("htmx:oobAfterSwap", function () {
    if (!refocus) return;
    var r = refocus, root = document.getElementById(r.fragment);
    refocus = null;
    if (!root || (document.activeElement && document.activeElement !== document.body)) return;
    var all = root.querySelectorAll("a[href], button, input, select, textarea, [tabindex]");
    for (var i = 0; i < all.length; i++) {
      if (focusKey(all[i]) === r.key) { all[i].focus({ preventScroll: true }); return; }
    }
    if (!root.hasAttribute("tabindex")) root.setAttribute("tabindex", "-1");
    root.focus({ preventScroll: true });
  });
  // A form marked data-swap-errors shows the server's refusal in its
  // target as it shows a success: htmx leaves error answers out of the
  // page, and a refused reveal (no reason, too many a minute, a form from
  // an earlier sign-in) looked like nothing happened, or like the value
  // revealed before, which stayed on screen.
  document.body.addEventListener("htmx:beforeSwap", function (e) {
    var d = e.detail, status = d.xhr ? d.xhr.status : 0;
    if (status >= 400 && d.elt && d.elt.closest && d.elt.closest("[data-swap-errors]")) {
      d.shouldSwap = true;
      d.isError = false;
    }
  });
  function lastUpdate() {
    var u = document.getElementById("updated");
    return u ? u.textContent.trim().replace(/^as of /, "") : "earlier";
  }
  // Times: the server prints UTC (<time datetime=… data-local>, views.Time);
  // here they read in the browser's time zone, the date only when not
  // today, the UTC instant kept in the title. Fragments swapped in later
  // (htmx, the live feed) are caught by the observer below.
  var fmts = {};
  function fmt(opts) {
    var k = JSON.stringify(opts);
    return fmts[k] || (fmts[k] = new Intl.DateTimeFormat(undefined, opts));
  }
  function localText(d, ms) {
    var now = new Date();
    var o = { hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" };
    if (ms) o.fractionalSecondDigits = 3;
    if (d.toDateString() !== now.toDateString()) {
      o.month = "short"; o.day = "numeric";
      if (d.getFullYear() !== now.getFullYear()) o.year = "numeric";
    }
    return fmt(o).format(d);
  }
  function localize(root) {
    if (!root.querySelectorAll) return;
    var list = root.matches && root.matches("time[data-local]") ? [root] : root.querySelectorAll("time[data-local]");
    Array.prototype.forEach.call(list, function (el) {
      var iso = el.getAttribute("datetime");
      if (el.dataset.shown === iso) return;
      var d = new Date(iso);
      if (isNaN(d)) return; // keep the server's UTC text
      el.textContent = localText(d, el.dataset.local === "ms");
      el.dataset.shown = iso;
    });
  }
  localize(document);
  new MutationObserver(function (muts) {
    muts.forEach(function (m) { Array.prototype.forEach.call(m.addedNodes, localize); });
  }).observe(document.body, { childList: true, subtree: true });

  // Copy buttons (views.CopyID): the full id to the clipboard, "copied" on
  // the button and in the status region for screen readers.
  var announce = document.getElementById("announce");
  function say(text) { if (announce) announce.textContent = text; }
  function fallbackCopy(text) {
    // Outside a secure context there is no Clipboard API.
    var ta = document.createElement("textarea");
    ta.value = text; ta.setAttribute("readonly", ""); ta.className = "sr";
    document.body.appendChild(ta); ta.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    ta.remove();
    return ok;
  }
  function copy(btn) {
    var id = btn.dataset.copy;
    function done(ok) {
      btn.dataset.copied = ok ? "yes" : "no";
      say(ok ? "Copied " + id : "Could not copy " + id + "; select it instead");
      clearTimeout(btn._copyTimer);
      btn._copyTimer = setTimeout(function () { delete btn.dataset.copied; }, 1600);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(id).then(function () { done(true); }, function () { done(fallbackCopy(id)); });
    } else {
      done(fallbackCopy(id));
    }
  }
  document.addEventListener("click", function (e) {
    var btn = e.target.closest && e.target.closest("button.copy-id");
    if (btn) { e.preventDefault(); copy(btn); }
  });

  // Keyboard: "?" lists the keys (the dialog in the layout), "g" then a
  // key jumps to a section (keys are on the nav links), "/" focuses the
  // filter, "j"/"k" move through the rows of the list, "y" copies the id
  // of the focused row.
  function rows() {
    return Array.prototype.filter.call(document.querySelectorAll("main tbody tr, main ul.list > li"), function (r) {
      return r.offsetParent !== null;
    });
  }
  function moveRow(step) {
    var all = rows();
    if (!all.length) return false;
    var at = -1, a = document.activeElement;
    for (var i = 0; i < all.length; i++) if (all[i].contains(a)) { at = i; break; }
    var next = all[Math.max(0, Math.min(all.length - 1, at < 0 ? 0 : at + step))];
    var target = next.querySelector("a[href], button:not([hidden])");
    if (!target) { next.tabIndex = -1; target = next; }
    target.focus();
    target.scrollIntoView({ block: "nearest" });
    return true;
  }
  function copyFocused() {
    var a = document.activeElement;
    if (!a || a === document.body) return false;
    var btn = a.matches("button.copy-id") ? a : null;
    var scope = a.closest("tr, li, dd, .head, p");
    if (!btn && scope) btn = scope.querySelector("button.copy-id");
    if (!btn) return false;
    copy(btn);
    return true;
  }
  var pending = false;
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey || (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName)))) return;
    var keys = document.getElementById("keys");
    if (keys && keys.open) return; // the dialog closes itself on Esc
    if (pending) {
      pending = false;
      // Only a letter names a section (a quote would break the selector).
      var link = /^[a-z]$/.test(e.key) && document.querySelector('nav a[data-key="' + e.key + '"]');
      if (link) { e.preventDefault(); link.click(); }
      return;
    }
    var handled = false;
    switch (e.key) {
      case "g": pending = true; return;
      case "?":
        if (keys && keys.showModal) { keys.showModal(); handled = true; }
        break;
      case "/":
        var f = document.querySelector('main [role="search"] :is(input:not([type="hidden"]), select), main .filters :is(input:not([type="hidden"]), select)');
        if (f) { f.focus(); handled = true; }
        break;
      case "j": handled = moveRow(1); break;
      case "k": handled = moveRow(-1); break;
      case "y": handled = copyFocused(); break;
    }
    if (handled) e.preventDefault();
  });
})();
