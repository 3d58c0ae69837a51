// The communication part: how much of each rank's step waits on its collectives (exposed, not overlapped), its data
// wait and compute, its bus bandwidth per operation kind (nccl-tests' busbw), and the straggler with its cause. From the
// snapshot's `ranks` and metrics; every string from a rank is set as text, never as HTML.

import { bytes, duration, finite } from "./format.js";
import { $, card, el, metric, state } from "./page.js";

const BANDWIDTH = "bus_bandwidth_bps.";

function seconds(value) {
  return finite(value) ? duration(value) : "n/a";
}

// Each rank's bus bandwidths: rank -> {"all_reduce ×4": metric key}, and the column names in order.
function bandwidths(metrics) {
  const byRank = new Map();
  const columns = new Set();
  for (const key of Object.keys(metrics).sort()) {
    if (!key.startsWith(BANDWIDTH)) continue;
    const [, op, size, rank] = key.split(".");
    if (!rank || !rank.startsWith("rank")) continue;
    const column = `${op} ×${size}`;
    columns.add(column);
    const id = Number(rank.slice(4));
    if (!byRank.has(id)) byRank.set(id, {});
    byRank.get(id)[column] = key;
  }
  return { byRank, columns: [...columns] };
}

function bandwidthCell(key) {
  const m = key ? metric(key) : null;
  if (!m) return el("td", { class: "num muted" }, "none");
  if (!finite(m.value)) return el("td", { class: "num muted", title: m.absent || "" }, "n/a");
  return el("td", { class: "num", "data-explain": key, tabindex: 0 }, `${bytes(m.value)}/s`);
}

export function renderCommunication() {
  const snap = state.doc && state.doc.snapshot;
  if (!snap) return;
  const metrics = snap.metrics || {};
  const rank = metric("straggler_rank");
  const wait = metric("straggler_wait_s");
  // The live document keys the ranks by rank (a patch carries only those that moved); a report's may be a list.
  const ranks = Array.isArray(snap.ranks) ? snap.ranks : Object.values(snap.ranks || {});
  const reporting = ranks.filter((r) => finite(r.collective_wait_s)).sort((a, b) => a.rank - b.rank);
  let sub;
  if (rank && finite(rank.value)) {
    sub = `the straggler is rank ${rank.value} on ${rank.label || "its host"}: the others wait ${seconds(wait && wait.value)} per step for it; cause: ${(wait && wait.label) || "unknown"}`;
  } else {
    sub = (rank && rank.absent) || "no collective probe reported";
  }
  const body = card($("communication-cards"), "communication-ranks", "Ranks", sub);
  const straggler = rank && finite(rank.value) ? rank.value : null;
  if (!reporting.length) {
    body.replaceChildren(el("p", { class: "empty" }, (metric("collective_wait_s") || {}).absent || "no collective probe reported"));
    return;
  }
  const { byRank, columns } = bandwidths(metrics);
  const heads = ["rank", "host", "step time", "exposed collective wait", "data wait", "compute", ...columns.map((c) => `bus bandwidth ${c}`)];
  const rows = reporting.map((r) => el("tr", { "data-rank": r.rank, class: r.rank === straggler ? "straggler" : "" },
    el("td", { class: "num" }, String(r.rank)),
    el("td", {}, r.host + (r.rank === straggler ? " (straggler)" : "")),
    el("td", { class: "num" }, seconds(r.step_time_s)),
    el("td", { class: "num", "data-explain": `collective_wait_s.rank${r.rank}`, tabindex: 0 }, seconds(r.collective_wait_s)),
    el("td", { class: "num" }, seconds(r.data_wait_s)),
    el("td", { class: "num" }, seconds(r.compute_s)),
    ...columns.map((c) => bandwidthCell((byRank.get(r.rank) || {})[c]))));
  body.replaceChildren(el("table", { class: "ranks" },
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))), el("tbody", {}, ...rows)));
}
