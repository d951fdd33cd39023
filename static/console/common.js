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

  // The shared vocabularies (health values and order, severities, group states) as the
  // page hands them over (base.html's console-vocab, from agents/vocab.py): never spelled here.
  const vocabTag = document.getElementById("console-vocab");
  const vocab = vocabTag ? JSON.parse(vocabTag.textContent) : {};

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

  // The console's one number, duration and time format (console/formats.py, the same
  // rules and the same test cases): four significant digits, thousands separators, an SI
  // prefix from a million; durations in the largest units that fit; times relative, the
  // absolute UTC time on hover.
  const SIG = 4;
  function sig(x) {
    if (Math.abs(x) < 1e-12) return 0;
    const scale = 10 ** (SIG - 1 - Math.floor(Math.log10(Math.abs(x))));
    return Math.sign(x) * Math.floor(Math.abs(x) * scale + 0.5) / scale;
  }
  function plain(x) {
    if (Math.abs(x) >= 1000 || Number.isInteger(x)) return Math.round(x).toLocaleString("en-US");
    return x.toFixed(SIG + 2).replace(/0+$/, "").replace(/\.$/, "");
  }
  function num(v, unit) {
    if (v === null || v === undefined || v === "" || typeof v === "boolean") return "—";
    let x = Number(v);
    if (!isFinite(x)) return "—";
    x = sig(x);
    const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"]];
    for (let i = 0; i < SI.length; i++) {
      if (Math.abs(x) >= SI[i][0]) return plain(sig(x / SI[i][0])) + " " + SI[i][1] + (unit ? " " + unit : "");
    }
    return plain(x) + (unit ? " " + unit : "");
  }
  function pct(f) { return f === null || f === undefined ? "—" : num(Number(f) * 100, "%"); }
  function dur(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(Number(seconds))) return "—";
    let s = Number(seconds);
    const sign = s < 0 ? "-" : "";
    s = Math.abs(s);
    if (s < 1) return sign + num(s * 1000) + " ms";
    if (s < 60) return sign + num(s) + " s";
    let t = Math.round(s), whole, rest, names;
    if (t < 3600) { whole = Math.floor(t / 60); rest = t % 60; names = ["min", "s"]; }
    else if ((t = Math.round(s / 60)) < 1440) { whole = Math.floor(t / 60); rest = t % 60; names = ["h", "min"]; }
    else { t = Math.round(s / 3600); whole = Math.floor(t / 24); rest = t % 24; names = ["d", "h"]; }
    return sign + whole.toLocaleString("en-US") + " " + names[0] + (rest ? " " + rest + " " + names[1] : "");
  }
  function relative(d, now) {
    const delta = (now - d) / 1000, s = Math.abs(delta);
    if (s < 5) return "just now";
    let text;
    if (s < 60) text = Math.floor(s) + " s";
    else if (s < 3600) text = Math.floor(s / 60) + " min";
    else if (s < 86400) text = Math.floor(s / 3600) + " h";
    else text = Math.floor(s / 86400).toLocaleString("en-US") + " d";
    return delta < 0 ? "in " + text : text + " ago";
  }
  function absolute(d) { return d.toISOString().slice(0, 19).replace("T", " ") + " UTC"; }
  // A <time> for an ISO value (or "—"), as the server's `when` filter writes it.
  function when(iso) {
    if (!iso) return document.createTextNode("—");
    const d = new Date(iso);
    const t = el("time", "", isNaN(d) ? iso : relative(d, Date.now()));
    t.setAttribute("datetime", iso);
    if (!isNaN(d)) t.title = absolute(d);
    return t;
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
    const opened = el("td"); opened.append(when(i.opened_at));
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

  // <time> elements -> relative text, the absolute UTC time in the tooltip. A fresh ISO
  // text (a live update just set it) wins over the attribute of the value it replaced.
  function times(root) {
    const now = Date.now();
    root.querySelectorAll("time").forEach(function (t) {
      const text = t.textContent.trim();
      const raw = /^\d{4}-\d\d-\d\dT/.test(text) ? text : t.getAttribute("datetime");
      const d = new Date(raw);
      if (!raw || isNaN(d)) return;
      t.setAttribute("datetime", raw);
      t.title = absolute(d);
      t.textContent = relative(d, now);
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    times(document);
    setInterval(function () { times(document); }, 15000);  // "4 min ago" stays true
  });

  window.Console = { vocab: vocab, times: times, el: el, getJSON: getJSON, debounce: debounce, num: num, pct: pct, dur: dur, when: when, relative: relative, absolute: absolute, upsertIncident: upsertIncident, fillIncidents: fillIncidents };
})();
