// curia dashboard: follows the page's live part over server-sent events
// and sends the admin actions' forms, showing the answer as the API gave it.
"use strict";
(function () {
  var live = document.getElementById("live");
  var conn = document.getElementById("conn");
  var result = document.getElementById("result");
  var token = document.querySelector('meta[name="curia-token"]').content;

  // Swap in a new live part, keeping open <details> (a delete's
  // confirmation) and ticked boxes as they were.
  function swap(html) {
    var open = {}, ticked = {};
    live.querySelectorAll("details[open]").forEach(function (d) { open[d.id] = true; });
    live.querySelectorAll("input[type=checkbox]:checked").forEach(function (c) {
      ticked[c.form.parentNode.id + "/" + c.name] = true;
    });
    live.innerHTML = html;
    live.querySelectorAll("details").forEach(function (d) { if (open[d.id]) d.open = true; });
    live.querySelectorAll("input[type=checkbox]").forEach(function (c) {
      if (ticked[c.form.parentNode.id + "/" + c.name]) c.checked = true;
    });
  }

  var url = "/events?page=" + encodeURIComponent(live.dataset.page) +
    "&filter=" + encodeURIComponent(live.dataset.filter || "");
  var es = new EventSource(url);
  es.addEventListener("live", function (e) {
    swap(e.data);
    conn.textContent = "live";
    conn.className = "conn up";
  });
  es.onerror = function () {
    conn.textContent = "reconnecting…";
    conn.className = "conn down";
  };

  // The answer as the dashboard gave it: a refusal is the API's code and
  // message as they are (its message may say "refused" itself); the
  // class colours it.
  function show(ok, text) {
    result.hidden = false;
    result.className = ok ? "ok" : "refused";
    result.textContent = text;
  }

  // Forms of class "action" post with fetch; the answer is text.
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form.classList.contains("action")) return;
    e.preventDefault();
    var buttons = form.querySelectorAll("button");
    buttons.forEach(function (b) { b.disabled = true; });
    fetch(form.action, {
      method: "POST",
      headers: { "X-Curia-Token": token },
      body: new URLSearchParams(new FormData(form)),
    }).then(function (resp) {
      return resp.text().then(function (text) { show(resp.ok, text); });
    }).catch(function (err) {
      show(false, "the dashboard did not answer: " + err);
    }).finally(function () {
      buttons.forEach(function (b) { b.disabled = false; });
    });
  });
})();
