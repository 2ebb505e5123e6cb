// LatentSift explorer: sortable tables, row filter, trajectory columns, charts (data embedded in the page).
(function () {
  "use strict";
  document.querySelectorAll("table.sortable").forEach(function (t) { new Tablesort(t); });

  var box = document.getElementById("filter");
  if (box) {
    var rows = Array.prototype.slice.call(document.querySelectorAll("#instances tbody tr"));
    var count = document.getElementById("count");
    var apply = function () {
      var q = box.value.trim().toLowerCase(), n = 0;
      rows.forEach(function (r) {
        var show = !q || r.textContent.toLowerCase().indexOf(q) >= 0;
        r.hidden = !show; if (show) n++;
      });
      count.textContent = n + " of " + rows.length + " pools";
    };
    box.addEventListener("input", apply); apply();
  }

  document.querySelectorAll("input.view").forEach(function (cb) {
    cb.addEventListener("change", function () {
      var s = document.querySelector('section.traj[data-traj="' + cb.dataset.traj + '"]');
      if (s) s.hidden = !cb.checked;
    });
  });
  // a link to a step (evidence list, #t<i>-s<j> in the address) shows its trajectory first
  function reveal() {
    var el = location.hash && document.getElementById(location.hash.slice(1));
    if (!el) return;
    var s = el.closest("section.traj");
    if (s && s.hidden) {
      s.hidden = false;
      var cb = document.querySelector('input.view[data-traj="' + s.dataset.traj + '"]');
      if (cb) cb.checked = true;
      el.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", reveal); reveal();

  var data = document.getElementById("chart-data");
  if (!data || typeof Chart === "undefined") return;
  var charts = JSON.parse(data.textContent);
  var pct = function (v) { return v === null || v === undefined ? "n/a" : (100 * v).toFixed(1) + "%"; };
  var tip = function (valueFmt) {
    return { callbacks: { label: function (ctx) {
      var p = ctx.raw, s = ctx.dataset.label + ": " + valueFmt(p.y);
      if (p.lo !== undefined && p.lo !== null) s += " [" + valueFmt(p.lo) + ", " + valueFmt(p.hi) + "]";
      if (p.k !== undefined) s += " at K=" + p.k + ", " + (p.x === null ? "n/a" : Math.round(p.x)) + " tokens";
      return s;
    } } };
  };
  var common = { responsive: true, maintainAspectRatio: false, animation: false,
                 interaction: { mode: "nearest", intersect: false } };
  var el = document.getElementById("chart-best");
  if (el) new Chart(el, { type: "line", data: { datasets: charts.best_vs_tokens.map(function (d) {
      return { label: d.label, data: d.data, showLine: true, pointRadius: 4, borderColor: d.color,
               backgroundColor: d.color }; }) },
    options: Object.assign({}, common, { parsing: { xAxisKey: "x", yAxisKey: "y" },
      scales: { x: { type: "linear", title: { display: true, text: "verification tokens per instance" } },
                y: { title: { display: true, text: "Best@K" }, ticks: { callback: pct } } },
      plugins: { tooltip: tip(pct) } }) });
  el = document.getElementById("chart-retention");
  if (el) new Chart(el, { type: "line", data: { labels: charts.ks, datasets: charts.retention.map(function (d) {
      return { label: d.label, data: d.data, pointRadius: 4, borderColor: d.color,
               backgroundColor: d.color }; }) },
    options: Object.assign({}, common, { parsing: { xAxisKey: "x", yAxisKey: "y" },
      scales: { x: { title: { display: true, text: "K" } }, y: { title: { display: true, text: "retention" },
                ticks: { callback: pct } } }, plugins: { tooltip: tip(pct) } }) });
  el = document.getElementById("chart-diff");
  if (el) new Chart(el, { type: "bar", data: { labels: charts.ks, datasets: charts.differences.map(function (d) {
      return { label: d.label, data: d.data, borderColor: d.color, backgroundColor: d.color }; }) },
    options: Object.assign({}, common, { parsing: { xAxisKey: "x", yAxisKey: "y" },
      scales: { x: { title: { display: true, text: "K" } }, y: { title: { display: true,
                text: "retention difference" }, ticks: { callback: pct } } }, plugins: { tooltip: tip(pct) } }) });
})();
