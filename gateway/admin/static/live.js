// Live progress of a queued / running training run: poll its JSON every 2 s and reload
// the page (server-rendered charts) when its status or step count changes. The reload
// drops the form's one-time message (?msg=run+queued): it said what the action did, and
// the page then shows where the run is (issue 38: the banner stayed after the publish).
(function () {
  var el = document.getElementById("live");
  if (!el) return;
  var run = el.dataset.run, status = el.dataset.status, steps = el.dataset.steps;
  function reload() {
    var url = new URL(location.href);
    url.searchParams.delete("msg");
    location.replace(url.toString());
  }
  function tick() {
    fetch("/admin/api/runs/" + encodeURIComponent(run) + "?page_size=1", {credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) {
        if (!d) return;
        document.getElementById("live-text").textContent = d.status + ", " + d.steps + (d.steps === 1 ? " step" : " steps");
        if (d.status !== status || String(d.steps) !== steps) reload();
      })
      .catch(function () {})
      .finally(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();
