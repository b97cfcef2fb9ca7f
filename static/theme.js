// Sluice console: the colour theme, loaded in <head> without defer so the
// stored choice applies before the first paint (no flash of the other
// theme). "system" (the default) leaves the choice to prefers-color-scheme
// through the CSS color-scheme; "light" and "dark" pin it on <html>.
(function () {
  "use strict";
  var KEY = "sluice.theme";
  var root = document.documentElement;
  // html.js shows what only works with scripts (copy buttons, the toggle).
  root.classList.add("js");
  function stored() {
    try {
      var v = localStorage.getItem(KEY);
      return v === "light" || v === "dark" ? v : "system";
    } catch (e) { return "system"; } // storage refused: follow the system
  }
  function apply(v) {
    if (v === "system") delete root.dataset.theme; else root.dataset.theme = v;
    var sel = document.getElementById("theme");
    if (sel) sel.value = v;
  }
  apply(stored());
  document.addEventListener("DOMContentLoaded", function () {
    var sel = document.getElementById("theme");
    if (!sel) return;
    sel.value = stored();
    sel.addEventListener("change", function () {
      try {
        if (sel.value === "system") localStorage.removeItem(KEY); else localStorage.setItem(KEY, sel.value);
      } catch (e) { /* not remembered; still applied to this page */ }
      apply(sel.value);
    });
  });
  // Another tab changed the theme: follow it.
  window.addEventListener("storage", function (e) { if (e.key === KEY) apply(stored()); });
})();
