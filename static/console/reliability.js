// Reliability page: two Plotly charts drawn from the report the server rendered into the
// page (the same dict GET /api/v1/reliability/ returns): interruptions and lost GPU-hours by
// layer, and ETTR with interruptions per day.
(function () {
  "use strict";
  const data = document.getElementById("reliability-data");
  if (!data || !window.Plotly) return;
  const r = JSON.parse(data.textContent);
  const CONFIG = { displaylogo: false, responsive: true };
  const AXIS = { gridcolor: "#26313c", zerolinecolor: "#26313c", linecolor: "#26313c" };
  function layout(extra) {
    return Object.assign({
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: "#d7dde3", size: 11 }, margin: { l: 60, r: 60, t: 10, b: 50 },
      legend: { orientation: "h", y: -0.25 }, xaxis: AXIS, yaxis: AXIS,
    }, extra || {});
  }
  const layers = r.by_layer || [];
  Plotly.newPlot("chart-layers", [
    { type: "bar", name: "interruptions", x: layers.map(function (l) { return l.label; }),
      y: layers.map(function (l) { return l.count; }), marker: { color: "#4ea1ff" }, offsetgroup: 1 },
    { type: "bar", name: "lost GPU-hours", x: layers.map(function (l) { return l.label; }),
      y: layers.map(function (l) { return l.lost_gpu_hours; }), yaxis: "y2", marker: { color: "#e5794d" }, offsetgroup: 2 },
  ], layout({ barmode: "group", yaxis: Object.assign({ title: { text: "interruptions" } }, AXIS),
    yaxis2: { title: { text: "GPU-h" }, overlaying: "y", side: "right", showgrid: false } }), CONFIG);
  const days = r.per_day || [];
  Plotly.newPlot("chart-days", [
    { type: "bar", name: "interruptions", x: days.map(function (d) { return d.day; }),
      y: days.map(function (d) { return d.interruptions; }), marker: { color: "#e5484d" } },
    { type: "scatter", mode: "lines+markers", name: "ETTR", x: days.map(function (d) { return d.day; }),
      y: days.map(function (d) { return d.ettr; }), yaxis: "y2", line: { color: "#2f9e6b" } },
  ], layout({ xaxis: Object.assign({ type: "date" }, AXIS), yaxis: Object.assign({ title: { text: "interruptions" } }, AXIS),
    yaxis2: { title: { text: "ETTR" }, overlaying: "y", side: "right", range: [0, 1.05], showgrid: false } }), CONFIG);
  document.getElementById("reliability-page").dataset.drawn = "1";
})();
