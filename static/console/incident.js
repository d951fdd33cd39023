// Incident page: when this incident changes (acknowledged, symptoms grow, resolved, a
// comment lands) the page refetches its JSON and updates state, people, symptoms and
// timeline in place. Forms keep the newest version so a stale acknowledge is refused.
(function () {
  "use strict";
  const C = window.Console;
  const el = C.el;
  const page = document.getElementById("incident-page");
  const id = Number(page.dataset.incident);

  function renderFolds(data) {
    const box = document.getElementById("symptoms");
    const open = new Set(Array.from(box.querySelectorAll("details[open]")).map(function (d) { return d.dataset.kind; }));
    box.replaceChildren();
    data.symptom_folds.forEach(function (f) {
      const d = el("details", "fold"); d.dataset.kind = f.kind; d.open = open.has(f.kind);
      const s = el("summary");
      s.append(el("span", "count", f.count), el("code", "", f.kind), el("span", "why", f.reason + (f.active !== f.count ? " · " + f.active + " still active" : "")));
      const wrap = el("div"); const table = el("table", "grid"); const tb = el("tbody");
      f.items.slice(0, 200).forEach(function (x) {
        const tr = el("tr"); const subj = el("td"); subj.append(el("code", "", x.subject));
        const sev = el("td"); sev.append(el("span", "sev sev-" + x.severity, x.severity));
        tr.append(subj, sev, el("td", "", x.summary), el("td", "", x.active ? "yes" : "no")); tb.append(tr);
      });
      table.append(tb); wrap.append(table); d.append(s, wrap); box.append(d);
    });
    if (!data.symptom_folds.length) box.append(el("p", "empty", "No symptoms: the root cause stands alone."));
    document.getElementById("symptom-total").textContent = data.symptoms_total;
  }

  function renderTimeline(items) {
    const ol = document.getElementById("timeline");
    ol.replaceChildren();
    items.forEach(function (t) {
      const li = el("li", t.kind);
      const when = el("div", "when"); when.append(C.when(t.at), " · " + t.label);
      li.append(when);
      if (t.body) li.append(el("div", "body", t.body));
      ol.append(li);
    });
  }

  function render(data) {
    if (data.version < Number(page.dataset.version)) return;
    page.dataset.version = data.version;
    const st = document.getElementById("incident-state");
    st.className = "istate istate-" + data.state; st.textContent = data.state;
    document.querySelector('[data-field="acknowledged_by"]').textContent = data.acknowledged_by || "nobody yet";
    document.querySelector('[data-field="assignee"]').textContent = data.assignee || "nobody";
    document.querySelectorAll("[data-version-input]").forEach(function (i) { i.value = data.version; });
    const ack = document.getElementById("ack-button");
    if (ack) { ack.disabled = data.state !== "open"; ack.textContent = data.state === "open" ? "Acknowledge" : "Acknowledged"; }
    renderFolds(data);
    renderTimeline(data.timeline);
    C.times(document);
  }

  const refetch = C.debounce(function () { C.getJSON(page.dataset.json).then(render).catch(function () {}); }, 300);
  Faultline.on("incident.changed", function (i) { if (i.id === id) refetch(); });
  Faultline.onResync(refetch);
  Faultline.start(page.dataset.group ? "group:" + page.dataset.group : "fleet");
})();
