// agl dashboard: live updates. A page whose <main> has `data-live` listens to the store's
// changes (server-sent events from /dashboard/events) and re-renders <main> from a fresh copy
// of the same URL, keeping open <details> open. Nothing else on the page depends on script.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource || !window.fetch || !window.DOMParser) {
    return;
  }
  var busy = false;
  var again = false;

  function typing() {
    var a = document.activeElement;
    return a && main.contains(a) && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
  }

  function openDetails() {
    var ids = [];
    main.querySelectorAll("details[open][id]").forEach(function (d) { ids.push(d.id); });
    return ids;
  }

  function refresh() {
    if (busy || typing() || document.hidden) {
      again = true;
      return;
    }
    busy = true;
    var keep = openDetails();
    fetch(window.location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var next = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        if (!next) { return; }
        main.innerHTML = next.innerHTML;
        keep.forEach(function (id) {
          var d = document.getElementById(id);
          if (d) { d.open = true; }
        });
      })
      .catch(function () { /* the next change retries */ })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          window.setTimeout(refresh, 1000);
        }
      });
  }

  new EventSource("/dashboard/events").addEventListener("change", refresh);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && again) { again = false; refresh(); }
  });
})();
