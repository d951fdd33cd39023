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
  const VALUES = Object.assign({ tickformat: ",.4~r" }, AXIS);  // the console's number format
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
  ], layout({ barmode: "group", yaxis: Object.assign({ title: { text: "interruptions" } }, VALUES),
    yaxis2: { title: { text: "GPU-h" }, overlaying: "y", side: "right", showgrid: false, tickformat: ",.4~r", rangemode: "tozero" } }), CONFIG);
  // Only the days the fleet reported on: a week of data over a 30-day window is seven
  // bars, one tick a day, not thirty ticks of nothing. The legend sits above the plot,
  // clear of the dates.
  const days = (r.per_day || []).filter(function (d) { return d.observed || d.interruptions; });
  const DAY_MS = 86400000;
  const most = days.reduce(function (m, d) { return Math.max(m, d.interruptions); }, 0);
  const first = days.length ? Date.parse(days[0].day) : Date.now();
  const last = days.length ? Date.parse(days[days.length - 1].day) : Date.now();
  Plotly.newPlot("chart-days", [
    { type: "bar", name: "interruptions", x: days.map(function (d) { return d.day; }),
      y: days.map(function (d) { return d.interruptions; }), marker: { color: "#e5484d" }, width: DAY_MS * 0.6 },
    { type: "scatter", mode: "lines+markers", name: "ETTR", x: days.map(function (d) { return d.day; }),
      y: days.map(function (d) { return d.ettr; }), yaxis: "y2", line: { color: "#2f9e6b" } },
  ], layout({ margin: { l: 60, r: 60, t: 30, b: 40 }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    xaxis: Object.assign({ type: "date", range: [first - DAY_MS / 2, last + DAY_MS / 2], tickformat: "%b %d",
      dtick: DAY_MS * Math.max(1, Math.ceil(days.length / 10)), tickangle: 0 }, AXIS),
    yaxis: Object.assign({ title: { text: "interruptions" }, rangemode: "tozero", dtick: Math.max(1, Math.ceil(most / 5)) }, AXIS),
    yaxis2: { title: { text: "ETTR" }, overlaying: "y", side: "right", range: [0, 1.05], showgrid: false } }), CONFIG);
  document.getElementById("reliability-page").dataset.drawn = "1";
})();
