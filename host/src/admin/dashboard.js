// Hourglass dashboard: keeps the token for mutating forms and refreshes the page in place.
(function () {
  "use strict";
  var tokenInput = document.getElementById("token");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("hourglass-token") || "";
    tokenInput.addEventListener("change", function () {
      sessionStorage.setItem("hourglass-token", tokenInput.value);
    });
  }
  // Forms carry the token typed at the top (when the server wants one).
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var field = form.querySelector("input[name=token]");
    if (field) {
      if (tokenInput && tokenInput.value) { field.value = tokenInput.value; }
      else { field.remove(); }
    }
  }, true);
  // Refresh the live part every 2 s, unless the user is in the middle of something.
  function busy() {
    var a = document.activeElement;
    if (a && (a.tagName === "INPUT" || a.tagName === "TEXTAREA")) { return true; }
    return document.querySelector("#live input[type=checkbox]:checked") !== null;
  }
  function refresh() {
    if (busy() || document.hidden) { return; }
    var url = new URL(location.href);
    url.searchParams.delete("msg");
    fetch(url, { headers: { "Accept": "text/html" } }).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (!text || busy()) { return; }
      var doc = new DOMParser().parseFromString(text, "text/html");
      var fresh = doc.getElementById("live");
      var live = document.getElementById("live");
      if (fresh && live) {
        var msg = document.getElementById("msg");
        live.innerHTML = fresh.innerHTML;
        if (msg && !document.getElementById("msg")) { live.insertBefore(msg, live.firstChild); }
      }
    }).catch(function () { /* the host may be restarting: try again next tick */ });
  }
  setInterval(refresh, 2000);
})();
