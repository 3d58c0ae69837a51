// The live dashboard: one stream (/api/events) carries the whole state first, then merge patches and new history
// points; render.js draws them. Every string from the run (series keys, the command, fact notes) is put on the page
// with textContent only; nothing here builds HTML from data. No number is invented: what the engine left absent reads
// "n/a" with its reason.

import { finite } from "./format.js";
import { charts, el, POINTS, state } from "./page.js";
import { renderConnection, renderHeader } from "./parts.js";
import { renderDetails, renderPassport } from "./panels.js";
import { render, startPage } from "./render.js";
import { getJson } from "./source.js";

function connect() {
  if (state.source) state.source.close();
  const source = new EventSource(`/api/events?x=${encodeURIComponent(state.axis)}&points=${POINTS}`);
  state.source = source;
  source.addEventListener("state", (e) => {
    const data = JSON.parse(e.data);
    state.doc = data.doc;
    state.series = data.series || {};
    state.connected = true;
    for (const chart of charts.values()) chart.remove();
    charts.clear();
    fetchRun();
    render();
  });
  source.addEventListener("patch", (e) => {
    const data = JSON.parse(e.data);
    if (data.doc) {
      const before = state.doc.status && state.doc.status.state;
      merge(state.doc, data.doc);
      if (data.doc.snapshot && data.doc.snapshot.facts) fetchRun();
      if (state.doc.status && state.doc.status.state !== before) fetchRun();
    }
    for (const [name, points] of Object.entries(data.series || {})) appendPoints(name, points);
    render();
  });
  source.addEventListener("error", () => {
    state.connected = false;
    renderConnection();
  });
  source.addEventListener("open", () => {
    state.connected = true;
    renderConnection();
  });
}

function merge(target, patch) {
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete target[k];
    else if (typeof v === "object" && !Array.isArray(v) && target[k] && typeof target[k] === "object" && !Array.isArray(target[k])) {
      merge(target[k], v);
    } else target[k] = v;
  }
}

function appendPoints(name, points) {
  const have = state.series[name] || (state.series[name] = []);
  const lastX = have.length ? have[have.length - 1][0] : -Infinity;
  for (const p of points) if (!(p[0] <= lastX)) have.push(p);
  if (have.length > 2 * POINTS) state.series[name] = halve(have);
}

// Merge neighbours pairwise (count-weighted mean, min of mins, max of maxes): the page never holds more than it draws.

function halve(points) {
  const out = [];
  for (let i = 0; i + 1 < points.length; i += 2) {
    const a = points[i];
    const b = points[i + 1];
    const n = (a[4] || 1) + (b[4] || 1);
    const mean = finite(a[1]) && finite(b[1]) ? (a[1] * (a[4] || 1) + b[1] * (b[4] || 1)) / n : b[1];
    const lo = [a[2], b[2]].filter(finite);
    const hi = [a[3], b[3]].filter(finite);
    out.push([b[0], mean, lo.length ? Math.min(...lo) : null, hi.length ? Math.max(...hi) : null, n]);
  }
  if (points.length % 2) out.push(points[points.length - 1]);
  return out;
}

async function fetchRun() {
  try {
    const run = await getJson("/api/run");
    if (run) {
      state.run = run;
      renderDetails();
      renderHeader();
    }
  } catch (err) {
    // the stream's reconnect will bring us back
  }
}

async function fetchPassport() {
  try {
    const passport = await getJson("/api/passport");
    if (passport) {
      state.passport = passport;
      renderPassport();
    }
  } catch (err) {
    // shown as not yet available
  }
}

// The JSON API is there only where the server is: the live page links it, the page itself (which a report file
// carries) never does.
function linkApi() {
  document.querySelector("footer").append(" · ", el("a", { id: "api-link", href: "/api/snapshot" }, "JSON API"));
}

function init() {
  startPage({ onAxis: connect, onModelCard: fetchPassport }); // the stream sends every series again on a new axis
  linkApi();
  connect();
}

init();
