// Group page: facts, incidents and checkpoints update in place; charts come from the
// chart JSON (aggregated server-side: at most 256 rank bins x 120 time bins) and redraw
// with Plotly.react, which keeps zoom and never reflows the page.
(function () {
  "use strict";
  const C = window.Console;
  const el = C.el;
  const page = document.getElementById("group-page");
  const dark = getComputedStyle(document.body).backgroundColor;
  const STATE_COLORS = { initializing: "#4ea1ff", running: "#2f9e6b", quiescing: "#d9a400", checkpointing: "#7aa7d9",
    recovering: "#e5794d", failed: "#e5484d", completed: "#5b6773", stopped: "#5b6773" };
  const PHASE_COLORS = { compute: "#4ea1ff", collective: "#8e4ec6", input: "#d9a400", checkpoint: "#2f9e6b", optimizer: "#5b6773" };
  const CAUSE_COLORS = { stall: "#e5484d", restart: "#e5794d", checkpoint: "#2f9e6b", recompute: "#d9a400", invalid: "#8e4ec6" };
  const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  const AXIS = { gridcolor: "#26313c", zerolinecolor: "#26313c", linecolor: "#26313c" };

  function layout(extra) {
    const out = Object.assign({
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: "#d7dde3", size: 11 }, margin: { l: 60, r: 20, t: 10, b: 40 },
      legend: { orientation: "h", y: -0.2 },
    }, extra || {});
    ["xaxis", "yaxis", "yaxis2"].forEach(function (k) { out[k] = Object.assign({}, AXIS, out[k] || {}); });
    // Value axes in the console's number format: four significant digits, separators.
    ["yaxis", "yaxis2"].forEach(function (k) { if (!out[k].type) out[k].tickformat = out[k].tickformat || ",.4~r"; });
    out.yaxis2.showgrid = false;
    return out;
  }

  function draw(id, traces, lay) {
    const node = document.getElementById(id);
    if (!node || !window.Plotly) return;
    Plotly.react(node, traces, layout(lay), CONFIG);
  }

  function drawStates(states) {
    if (!states || !states.length) return;
    const traces = {};
    states.forEach(function (s) {
      const end = s.end ? new Date(s.end) : new Date();
      const t = traces[s.state] || (traces[s.state] = { type: "bar", orientation: "h", name: s.state, x: [], base: [], y: [],
        marker: { color: STATE_COLORS[s.state] || "#5b6773" }, hovertemplate: "%{customdata}<extra>" + s.state + "</extra>", customdata: [] });
      t.base.push(s.start);
      t.x.push(end - new Date(s.start));
      t.y.push("gen " + s.generation);
      t.customdata.push(s.state + " · gen " + s.generation + " · restarts " + (s.restart_count == null ? "?" : s.restart_count) + (s.reason ? " · " + s.reason : ""));
    });
    draw("chart-states", Object.values(traces), { barmode: "overlay", xaxis: { type: "date", gridcolor: "#26313c" }, yaxis: { autorange: "reversed", gridcolor: "#26313c" }, margin: { l: 60, r: 20, t: 10, b: 30 } });
  }

  function drawCharts(c) {
    if (!c || !c.heatmap) {
      ["chart-heatmap", "chart-percentiles", "chart-phases"].forEach(function (id) {
        const n = document.getElementById(id); if (n && !n.dataset.empty) { n.dataset.empty = "1"; n.append(el("p", "empty", "No steps reported in the last 10 minutes.")); }
      });
      return;
    }
    // Colours and axes anchor to the group's median step and its straggler limit (the
    // chart JSON's `scale`, console/charts.py step_scale): ranks a percent apart are one
    // colour, a rank past the limit is red, whatever the data's own min and max.
    const h = c.heatmap, sc = c.scale;
    const heat = { type: "heatmap", x: h.x, y: h.y, z: h.z, hoverongaps: false,
      colorbar: { title: { text: "ms" } }, hovertemplate: "%{y} · %{x}<br>slowest step %{z:,.4r} ms<extra></extra>" };
    if (sc) Object.assign(heat, { zauto: false, zmin: sc.zmin, zmax: sc.zmax, colorscale: sc.colorscale,
      colorbar: { title: { text: "ms" }, tickvals: [sc.median_ms, sc.limit_ms], ticktext: ["median " + C.num(sc.median_ms), "straggler " + C.num(sc.limit_ms)] } });
    else heat.colorscale = "Viridis";
    draw("chart-heatmap", [heat],
      { yaxis: { autorange: "reversed", title: { text: "ranks (" + C.num(h.ranks_per_bin) + " per row)" } }, xaxis: { type: "date" }, margin: { l: 90, r: 20, t: 10, b: 40 } });
    const p = c.percentiles;
    const lines = sc ? [["median", sc.median_ms, "#2f9e6b"], ["straggler limit", sc.limit_ms, "#d9a400"]].map(function (l) {
      return { type: "line", xref: "paper", x0: 0, x1: 1, y0: l[1], y1: l[1], line: { color: l[2], width: 1, dash: "dash" } };
    }) : [];
    const top = Math.max.apply(null, [sc ? sc.zmax : 0].concat(p.p99.filter(function (v) { return v != null; })));
    const rhoTop = Math.max.apply(null, [sc ? sc.rho_max : 1.5].concat(p.rho.filter(function (v) { return v != null; })));
    draw("chart-percentiles", [
      { type: "scatter", mode: "lines", name: "p50", x: p.t, y: p.p50, line: { color: "#2f9e6b" } },
      { type: "scatter", mode: "lines", name: "p90", x: p.t, y: p.p90, line: { color: "#d9a400" } },
      { type: "scatter", mode: "lines", name: "p99", x: p.t, y: p.p99, line: { color: "#e5484d" } },
      { type: "scatter", mode: "lines", name: "ρ tail (p99/p50)", x: p.t, y: p.rho, yaxis: "y2", line: { color: "#4ea1ff", dash: "dot" } },
    ], { shapes: lines,
      yaxis: Object.assign({ title: { text: "step ms" }, gridcolor: "#26313c" }, sc ? { range: [Math.max(0, sc.zmin), top * 1.02], autorange: false } : {}),
      yaxis2: { title: { text: "ρ" }, overlaying: "y", side: "right", range: [1, rhoTop * 1.02], autorange: false }, xaxis: { type: "date" } });
    const s = c.slowest;
    draw("chart-phases", Object.keys(s.phases).map(function (ph) {
      return { type: "bar", name: ph, x: s.ranks, y: s.phases[ph], marker: { color: PHASE_COLORS[ph] } };
    }), { barmode: "stack", yaxis: { title: { text: "mean ms" }, gridcolor: "#26313c" }, xaxis: { type: "category" } });
  }

  function drawBadput(b) {
    if (!b || !b.causes || !b.causes.length) return;
    const traces = [{ type: "bar", orientation: "h", name: "productive", y: ["wall"], x: [b.productive_s], marker: { color: "#2f9e6b" } }];
    b.causes.forEach(function (cause, i) {
      traces.push({ type: "bar", orientation: "h", name: cause, y: ["wall"], x: [b.seconds[i]], marker: { color: CAUSE_COLORS[cause] || "#5b6773" } });
    });
    draw("chart-badput", traces, { barmode: "stack", showlegend: true, legend: { orientation: "h", y: -0.45 },
      xaxis: { ticksuffix: " s" }, yaxis: { showticklabels: false }, margin: { l: 10, r: 10, t: 10, b: 80 } });
  }

  function setField(name, value) {
    document.querySelectorAll('[data-field="' + name + '"]').forEach(function (n) { n.textContent = value; });
  }

  function renderAdvice(a) {
    const box = document.getElementById("advice");
    box.replaceChildren();
    if (!a) { box.append(el("p", "muted", "No recovery advice yet: diagnosis has not run for this group.")); return; }
    const div = el("div", "advice " + (a.auto_restart_safe ? "safe" : "unsafe"));
    div.dataset.safe = a.auto_restart_safe ? "1" : "0";
    div.append(el("strong", "", a.auto_restart_safe ? "Automatic restart is safe" : "Automatic restart is NOT safe — a human must decide"), a.reason || "");
    const dl = el("dl", "facts");
    [["Restore from", a.checkpoint || "no valid checkpoint"], ["Lost steps", count(a.lost_steps)], ["Lost tokens", C.num(a.lost_tokens)], ["Lost GPU-hours", C.num(a.lost_gpu_hours)]].forEach(function (kv) {
      dl.append(el("dt", "", kv[0]), el("dd", "", kv[1]));
    });
    div.append(dl);
    box.append(div);
  }

  function renderCheckpoints(rows) {
    const tbody = document.getElementById("checkpoint-rows");
    if (!tbody) return;
    tbody.replaceChildren();
    rows.slice(0, 50).forEach(function (c) {
      const tr = el("tr", c.newest_valid ? "newest-valid" : "");
      const id = el("td"); id.append(el("code", "", c.id)); if (c.newest_valid) id.append(" ", el("span", "flag", "newest valid"));
      const valid = el("td");
      valid.append(c.valid ? el("span", "valid-yes", "valid") : c.valid === false ? el("span", "valid-no", "corrupt") : el("span", "valid-unknown", "not proven"));
      const at = el("td"); at.append(C.when(c.ts));
      tr.append(id, el("td", "num", count(c.step)), el("td", "", c.phase), valid, el("td", "num", count(c.generation)), at);
      tbody.append(tr);
    });
    if (!rows.length) { const tr = el("tr", "empty"); const td = el("td", "", "No checkpoints reported."); td.colSpan = 6; tr.append(td); tbody.append(tr); }
  }

  function render(g) {
    const state = document.querySelector('[data-field="state"]');
    state.className = "state state-" + g.state; state.textContent = g.state;
    setField("generation", count(g.generation));
    if (g.serving_state) {
      setField("serving_reason", g.serving_state.reason);
      setField("workers_ready", g.serving_state.ready + " / " + g.serving_state.workers);
    }
    setField("restart_count", count(g.restart_count));
    setField("ranks_world", count(g.ranks) + " / " + count(g.world_size));
    setField("goodput_label", g.goodput_label);
    setField("tail_ratio", C.num(g.tail_ratio));
    setField("open_incidents", g.open_incidents);
    setField("newest_valid_checkpoint", g.newest_valid_checkpoint || "none");
    document.querySelectorAll('[data-when="diagnosed_at"]').forEach(function (n) { n.replaceChildren(C.when(g.diagnosed_at)); });
    const gp = g.goodput || {};
    setField("tokens", C.num(gp.tokens_valid) + " / " + C.num(gp.tokens_total));
    setField("wall_s", C.dur(gp.wall_s));
    renderAdvice(g.recovery_advice);
    renderCheckpoints(g.checkpoints);
    C.fillIncidents(document.getElementById("incident-rows"), g.incidents, { withGroup: false, cols: 5, emptyText: "No incidents." });
    drawStates(g.states);
    drawBadput(g.badput);
    C.times(document);
  }

  const pct = C.pct;
  function count(v) { return v == null ? "—" : Number(v).toLocaleString("en-US"); }

  function drawServing(sv) {
    const t = sv.series.map(function (r) { return r.minute; });
    draw("chart-gserve", [{ type: "scatter", mode: "lines+markers", name: "G_serve", x: t,
      y: sv.series.map(function (r) { return r.g_serve; }), line: { color: "#2f9e6b" } }],
      { yaxis: { title: { text: "req/s" }, rangemode: "tozero" }, xaxis: { type: "date" }, showlegend: false });
    draw("chart-latency", [
      { type: "scatter", mode: "lines", name: "TTFT p99", x: t, y: sv.series.map(function (r) { return r.ttft_ms_p99; }), line: { color: "#e5794d" } },
      { type: "scatter", mode: "lines", name: "TPOT p99", x: t, y: sv.series.map(function (r) { return r.tpot_ms_p99; }), yaxis: "y2", line: { color: "#8e4ec6" } },
      { type: "scatter", mode: "lines", name: "TTFT SLO", x: t, y: t.map(function () { return sv.slo.ttft_ms_p99; }), line: { color: "#e5484d", dash: "dot" } },
    ], { yaxis: { title: { text: "TTFT ms" } }, yaxis2: { title: { text: "TPOT ms" }, overlaying: "y", side: "right" }, xaxis: { type: "date" } });
    document.getElementById("slo-note").textContent = "SLO: TTFT ≤ " + C.num(sv.slo.ttft_ms_p99, "ms") + ", TPOT ≤ " +
      C.num(sv.slo.tpot_ms_p99, "ms") + ", E2E ≤ " + C.num(sv.slo.e2e_ms_p99, "ms") + ", goodput ≥ " + pct(sv.slo.goodput_target);
    const tbody = document.getElementById("version-rows");
    tbody.replaceChildren();
    sv.versions.forEach(function (v) {
      const tr = el("tr");
      tr.dataset.version = v.version;
      const first = el("td"); first.append(C.when(v.first_seen));
      const last = el("td"); last.append(C.when(v.last_seen));
      tr.append(el("td", "", v.version), el("td", "num", count(v.workers)), el("td", "num", count(v.requests)), el("td", "num", pct(v.traffic_share)),
        el("td", "num", pct(v.slo_met_ratio)), first, last);
      tbody.append(tr);
    });
    if (!sv.versions.length) { const tr = el("tr", "empty"); const td = el("td", "", "No serving windows in the last hour."); td.colSpan = 7; tr.append(td); tbody.append(tr); }
    const rows = document.getElementById("worker-rows");
    rows.replaceChildren();
    sv.workers.forEach(function (w) {
      const tr = el("tr");
      tr.dataset.worker = w.worker;
      [w.worker, w.ready ? "yes" : "no", w.draining ? "yes" : "no", w.model_version || "—", w.adapter_version || "—", w.kv_schema || "—"]
        .forEach(function (v) { tr.append(el("td", "", v)); });
      [count(w.requests), pct(w.slo_met_ratio), C.num(w.ttft_ms_p99), C.num(w.tpot_ms_p99), C.num(w.kv_used_pct)]
        .forEach(function (v) { tr.append(el("td", "num", v)); });
      const at = el("td"); at.append(C.when(w.ts)); tr.append(at);
      rows.append(tr);
    });
    C.times(document);
  }

  function loadGroup() { return C.getJSON(page.dataset.json).then(render).catch(function () {}); }
  function loadCharts() {
    if (page.dataset.kind === "serving") {
      return C.getJSON(page.dataset.serving).then(drawServing).catch(function () {});
    }
    return C.getJSON(page.dataset.charts).then(drawCharts).catch(function () {});
  }
  const refresh = C.debounce(function () { loadGroup(); loadCharts(); }, 1000);

  // First paint: tables are server-rendered; charts need the JSON once.
  loadGroup().then(loadCharts);

  Faultline.on("incident.changed", function (i) {
    C.upsertIncident(document.getElementById("incident-rows"), i, { withGroup: false, dropResolved: false });
    C.times(document);
    refresh();
  });
  Faultline.on("group.changed", refresh);
  Faultline.onResync(refresh);
  Faultline.start("group:" + page.dataset.group);
})();
