// The dashboard page: one live stream (/api/events) carries the whole state first, then merge patches and new history
// points. Every string from the run (series keys, the command, fact notes) is put on the page with textContent only;
// nothing here builds HTML from data. No number is invented: what the engine left absent reads "n/a" with its reason.

import { finite } from "./format.js";
import { $, charts, hideTip, onFocus, onPointer, POINTS, setText, state } from "./page.js";
import { renderAxisButtons, renderConnection, renderHeader, renderProgress, renderTiles, renderTraining } from "./parts.js";
import { renderAlerts, renderDetails, renderEfficiency, renderGpus, renderNode, renderPassport } from "./panels.js";

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
    const response = await fetch("/api/run", { credentials: "same-origin" });
    if (response.ok) {
      state.run = await response.json();
      renderDetails();
      renderHeader();
    }
  } catch (err) {
    // the stream's reconnect will bring us back
  }
}

async function fetchPassport() {
  try {
    const response = await fetch("/api/passport", { credentials: "same-origin" });
    if (response.ok) {
      state.passport = await response.json();
      renderPassport();
    }
  } catch (err) {
    // shown as not yet available
  }
}

function render() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    if (!state.doc) return;
    renderHeader();
    renderConnection();
    renderProgress();
    renderTiles();
    renderAxisButtons();
    renderTraining();
    renderEfficiency();
    renderNode();
    renderGpus();
    renderAlerts();
  });
}

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  setText($("theme-toggle"), theme === "dark" ? "Light theme" : "Dark theme");
  for (const chart of charts.values()) chart.draw();
  render();
}

function init() {
  const saved = localStorage.getItem("tm-theme");
  const prefersDark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  applyTheme(saved || (prefersDark ? "dark" : "light"));
  $("theme-toggle").addEventListener("click", () => {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    localStorage.setItem("tm-theme", next);
    applyTheme(next);
  });
  for (const button of document.querySelectorAll("#x-axis button")) {
    button.addEventListener("click", () => {
      if (button.dataset.axis === state.axis) return;
      state.axis = button.dataset.axis;
      localStorage.setItem("tm-axis", state.axis);
      connect(); // the stream sends every series again on the new axis
    });
  }
  $("model-card").addEventListener("toggle", () => {
    if ($("model-card").open) fetchPassport();
  });
  $("copy-passport").addEventListener("click", async () => {
    const text = state.passport && state.passport.markdown;
    if (!text) return;
    try {
      await navigator.clipboard.writeText(text);
      setText($("copy-state"), "copied");
    } catch (err) {
      setText($("copy-state"), "the browser refused the clipboard: select the text instead");
    }
  });
  document.addEventListener("mouseover", onPointer);
  document.addEventListener("focusin", onFocus);
  document.addEventListener("focusout", hideTip);
  document.addEventListener("scroll", hideTip, { passive: true });
  connect();
}

init();
