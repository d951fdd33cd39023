// Small helpers shared by the console pages: DOM building, JSON fetches, debouncing,
// and the in-place row updates every page does when an event or a refetch arrives.
(function () {
  "use strict";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (!r.ok) throw new Error(url + " answered " + r.status);
        return r.json();
      });
  }

  // One call at most per `ms`, the last one wins: bursts of events cost one refetch.
  function debounce(fn, ms) {
    let timer = null;
    return function () {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    };
  }

  function num(v, digits) {
    if (v === null || v === undefined) return "—";
    return Number(v).toFixed(digits === undefined ? 0 : digits);
  }

  function incidentRow(i, withGroup) {
    const row = el("tr");
    row.dataset.incident = i.id;
    row.dataset.version = i.version;
    const sev = el("td"); sev.append(el("span", "sev sev-" + i.severity, i.severity));
    const st = el("td"); st.append(el("span", "istate istate-" + i.state, i.state));
    const cause = el("td");
    const link = el("a", "", i.summary); link.href = "/incidents/" + i.id + "/";
    cause.append(link, " ", el("code", "muted", i.kind));
    const cells = [sev, st];
    if (withGroup) {
      const g = el("td");
      if (i.group) { const a = el("a", "", i.group); a.href = "/groups/" + encodeURIComponent(i.group) + "/"; g.append(a); }
      cells.push(g);
    }
    const opened = el("td"); const t = el("time", "", i.opened_at); t.dateTime = i.opened_at; opened.append(t);
    cells.push(cause, el("td", "num", i.symptom_count), opened);
    row.append.apply(row, cells);
    return row;
  }

  // Insert or replace one incident row, ignoring anything older than what is shown.
  function upsertIncident(tbody, i, opts) {
    let row = tbody.querySelector('[data-incident="' + i.id + '"]');
    if (row && Number(row.dataset.version) > i.version) return;
    if (opts.dropResolved && i.state === "resolved") { if (row) row.remove(); return; }
    const empty = tbody.querySelector(".empty");
    if (empty) empty.remove();
    const fresh = incidentRow(i, opts.withGroup);
    if (row) row.replaceWith(fresh); else tbody.prepend(fresh);
  }

  function fillIncidents(tbody, incidents, opts) {
    tbody.replaceChildren();
    incidents.forEach(function (i) { tbody.append(incidentRow(i, opts.withGroup)); });
    if (!incidents.length) {
      const tr = el("tr", "empty"); const td = el("td", "", opts.emptyText); td.colSpan = opts.cols; tr.append(td); tbody.append(tr);
    }
  }

  // ISO 8601 -> "2026-11-29 10:00:05 UTC" in place; the full value stays in the tooltip.
  function times(root) {
    root.querySelectorAll("time").forEach(function (t) {
      // Fresh ISO text (a live update just set it) wins over the attribute of the old value.
      const text = t.textContent.trim();
      const raw = /^\d{4}-\d\d-\d\dT/.test(text) ? text : t.getAttribute("datetime");
      const d = new Date(raw);
      if (!raw || isNaN(d)) return;
      t.setAttribute("datetime", raw);
      t.title = raw;
      t.textContent = d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    });
  }

  document.addEventListener("DOMContentLoaded", function () { times(document); });

  window.Console = { times: times, el: el, getJSON: getJSON, debounce: debounce, num: num, upsertIncident: upsertIncident, fillIncidents: fillIncidents };
})();
