// Fleet page: nodes, GPUs, groups and incidents change in place as events arrive; after a
// reconnect (or when an event cannot be placed, e.g. under a filter) the page refetches
// its JSON twin, so no update is lost and nothing reloads.
(function () {
  "use strict";
  const C = window.Console;
  const el = C.el;
  const page = document.getElementById("fleet-page");
  const nodes = document.getElementById("nodes");
  const filtered = page.dataset.filtered === "1";
  // Health values and their order, best to worst, as the page hands them over.
  const H = C.vocab.HEALTH;
  const ORDER = C.vocab.HEALTH_ORDER;
  // A node whose newest batch arrived this late is flagged: past the 10 s after which the
  // service calls a silent node down, its data is a backlog (a cut or lossy link).
  const LATE_S = 10;

  function worst(n) {
    let w = n.health || H.UNKNOWN;
    n.devices.forEach(function (d) { if (ORDER.indexOf(d.health) > ORDER.indexOf(w)) w = d.health; });
    return ORDER.indexOf(w) < 0 ? H.UNKNOWN : w;
  }

  function nodeCard(n) {
    const w = n.worst || worst(n);
    const latched = n.lifecycle && n.lifecycle !== "healthy";
    if (nodes.dataset.compact === "1" && w === H.OK && !n.quarantined && !n.cordoned && !latched) {
      const tile = el("div", "node compact health-" + H.OK);
      tile.dataset.node = n.name;
      // A tile from the page's JSON carries its GPU count, not its GPUs; a live push, its GPUs.
      const count = n.devices ? n.devices.length : n.gpus;
      tile.dataset.gpus = count;
      tile.title = n.name + " · " + count + " GPUs " + H.OK;
      tile.append(el("span", "node-name", n.name));
      return tile;
    }
    const card = el("div", "node health-" + w + (n.quarantined ? " quarantined" : "") + (n.cordoned ? " cordoned" : ""));
    card.dataset.node = n.name;
    card.dataset.lifecycle = n.lifecycle || "healthy";
    const head = el("div", "node-head");
    const name = el("span", "node-name");
    const link = el("a", "", n.name);
    link.href = "/nodes/" + encodeURIComponent(n.name) + "/";
    name.append(link);
    if (latched) {
      // The latched lifecycle (faulted, out of service, validating...) and since when.
      const flag = el("span", "flag lifecycle lifecycle-" + n.lifecycle, n.lifecycle);
      flag.dataset.lifecycle = n.lifecycle;
      flag.title = (n.lifecycle_reason || "") + (n.taken_out_by ? " · out by " + n.taken_out_by : "");
      if (n.lifecycle_since) {
        const since = C.when(n.lifecycle_since);
        since.className = "since";
        flag.append(" · ", since);
      }
      name.append(flag);
    }
    if (n.replace_flagged) name.append(el("span", "flag flag-replace", "replace"));
    if (n.quarantined) name.append(el("span", "flag flag-quarantined", "quarantined"));
    if (n.cordoned) name.append(el("span", "flag flag-cordoned", "cordoned"));
    if (n.delivery_delay_s != null && n.delivery_delay_s >= LATE_S) {
      const late = el("span", "flag flag-late", "data " + C.dur(n.delivery_delay_s) + " late");
      late.title = "delivery delay of the newest batch (node page: p95 and worst)";
      name.append(late);
    }
    head.append(name, el("span", "badge", w));
    const gpus = el("div", "gpus");
    n.devices.forEach(function (d) {
      const g = el("span", "gpu health-" + d.health, d.index);
      g.dataset.gpu = d.uuid;
      g.title = "GPU " + d.index + " · " + d.health + " · " + (d.temp_c == null ? "?" : d.temp_c) + " °C · " + (d.util_pct == null ? "?" : d.util_pct) + " %";
      gpus.append(g);
    });
    if (latched) card.append(head, el("div", "node-reason muted small", n.lifecycle_reason || ""), gpus);
    else card.append(head, gpus);
    return card;
  }

  function counts() {
    const cards = nodes.querySelectorAll("[data-node]");
    document.getElementById("node-count").textContent = cards.length;
    document.getElementById("kpi-nodes").textContent = cards.length;
    let gpus = nodes.querySelectorAll(".gpu").length;
    nodes.querySelectorAll(".node.compact").forEach(function (t) { gpus += Number(t.dataset.gpus || 8); });
    document.getElementById("kpi-gpus").textContent = gpus;
    const bad = function (h) { return nodes.querySelectorAll(".node.health-" + h).length; };
    document.getElementById("kpi-bad").textContent = bad(H.CRITICAL) + " / " + bad(H.DOWN);
    document.getElementById("kpi-incidents").textContent = document.querySelectorAll("#incident-rows [data-incident]").length;
  }

  function renderNode(n) {
    let card = nodes.querySelector('[data-node="' + CSS.escape(n.name) + '"]');
    if (!card && filtered) { resync(); return; }  // a filtered page cannot tell if it matches
    const fresh = nodeCard(n);
    if (card) { card.replaceWith(fresh); counts(); return; }
    const empty = document.getElementById("no-nodes");
    if (empty) empty.remove();
    const after = Array.from(nodes.querySelectorAll("[data-node]")).find(function (c) { return c.dataset.node > n.name; });
    nodes.insertBefore(fresh, after || null);
    counts();
  }

  function groupRow(g) {
    const tr = el("tr"); tr.dataset.group = g.name;
    const name = el("td"); const a = el("a", "", g.name); a.href = "/groups/" + encodeURIComponent(g.name) + "/"; name.append(a);
    const st = el("td"); st.append(el("span", "state state-" + g.state, g.state));
    tr.append(name, el("td", "", g.kind), st, el("td", "num", g.generation), el("td", "num", g.restart_count),
      el("td", "num", g.ranks), el("td", "", g.goodput_label), el("td", "num", C.num(g.tail_ratio)), el("td", "num", g.open_incidents));
    return tr;
  }

  function render(data) {
    nodes.dataset.compact = data.compact ? "1" : "";
    nodes.classList.toggle("compact-mode", !!data.compact);
    nodes.replaceChildren();
    data.nodes.forEach(function (n) { nodes.append(nodeCard(n)); });
    if (!data.nodes.length) { const p = el("p", "empty", "No node matches."); p.id = "no-nodes"; nodes.append(p); }
    const groups = document.getElementById("group-rows");
    groups.replaceChildren();
    data.groups.forEach(function (g) { groups.append(groupRow(g)); });
    if (!data.groups.length) { const tr = el("tr", "empty"); const td = el("td", "", "No groups."); td.colSpan = 9; tr.append(td); groups.append(tr); }
    document.getElementById("kpi-groups").textContent = data.groups.length;
    C.fillIncidents(document.getElementById("incident-rows"), data.incidents, { withGroup: true, cols: 6, emptyText: "No open incidents." });
    counts();
    C.times(document);
  }

  function resyncNow() { C.getJSON(page.dataset.json).then(render).catch(function () { /* the banner already says we are stale */ }); }
  const resync = C.debounce(resyncNow, 800);

  Faultline.on("node.changed", renderNode);
  Faultline.on("incident.changed", function (i) {
    C.upsertIncident(document.getElementById("incident-rows"), i, { withGroup: true, dropResolved: true });
    counts();
    C.times(document);
    resync();  // group rows carry open-incident counts
  });
  Faultline.onResync(resyncNow);
  Faultline.start("fleet");
})();
