// Fleet page: nodes and GPUs appear and change colour as agents report; no reload.
(function () {
  "use strict";
  const nodes = document.getElementById("nodes");

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function renderNode(n) {
    let card = nodes.querySelector('[data-node="' + CSS.escape(n.name) + '"]');
    if (!card) {
      const empty = document.getElementById("no-nodes");
      if (empty) empty.remove();
      card = el("div");
      card.dataset.node = n.name;
      const names = Array.from(nodes.querySelectorAll("[data-node]")).map(function (c) { return c.dataset.node; });
      const after = names.filter(function (x) { return x < n.name; }).pop();
      const ref = after ? nodes.querySelector('[data-node="' + CSS.escape(after) + '"]').nextSibling : nodes.firstChild;
      nodes.insertBefore(card, ref);
    }
    card.className = "node health-" + n.health;
    card.replaceChildren();
    const head = el("div", "node-head");
    head.append(el("span", "node-name", n.name), el("span", "badge", n.health));
    const gpus = el("div", "gpus");
    n.devices.forEach(function (d) {
      const g = el("span", "gpu health-" + d.health, String(d.index));
      g.dataset.gpu = d.uuid;
      g.title = "GPU " + d.index + " · " + (d.temp_c == null ? "?" : d.temp_c) + " °C · " + (d.util_pct == null ? "?" : d.util_pct) + " %";
      gpus.append(g);
    });
    card.append(head, gpus);
    document.getElementById("node-count").textContent = nodes.querySelectorAll("[data-node]").length;
  }

  function renderIncident(i) {
    const rows = document.getElementById("incident-rows");
    let row = rows.querySelector('[data-incident="' + i.id + '"]');
    if (i.state === "resolved") { if (row) row.remove(); return; }
    const empty = rows.querySelector(".empty");
    if (empty) empty.remove();
    if (!row) { row = el("tr"); row.dataset.incident = i.id; rows.prepend(row); }
    row.replaceChildren();
    const sev = el("td"); sev.append(el("span", "sev sev-" + i.severity, i.severity));
    const link = el("a", "", i.summary); link.href = "/incidents/" + i.id + "/";
    const cause = el("td"); cause.append(link);
    row.append(sev, el("td", "", i.group || ""), cause, el("td", "", String(i.symptom_count)), el("td", "", i.opened_at));
  }

  Faultline.on("node.changed", renderNode);
  Faultline.on("incident.changed", renderIncident);
  Faultline.onResync(function () { location.reload(); });
  Faultline.start("fleet");
})();
