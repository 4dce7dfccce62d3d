// Live progress of a queued / running training run: poll its JSON every 2 s and reload
// the page (server-rendered charts) when its status or step count changes.
(function () {
  var el = document.getElementById("live");
  if (!el) return;
  var run = el.dataset.run, status = el.dataset.status, steps = el.dataset.steps;
  function tick() {
    fetch("/admin/api/runs/" + encodeURIComponent(run) + "?page_size=1", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        document.getElementById("live-text").textContent = d.status + ", " + d.steps + (d.steps === 1 ? " step" : " steps");
        if (d.status !== status || String(d.steps) !== steps) location.reload();
      })
      .catch(function () {})
      .finally(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();
