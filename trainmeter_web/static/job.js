// The job part: one row per node of a job of several nodes (the job hub's run only), from the snapshot's `nodes`.
// A single-node run has no nodes and the part stays hidden. Every string from a node is set as text, never as HTML.

import { duration } from "./format.js";
import { $, card, el, metric, setText, state } from "./page.js";

const STATE_WORDS = {
  live: "live",
  behind: "catching up",
  lost: "lost",
  ended: "ended",
};

function seconds(value) {
  return Number.isFinite(value) ? duration(value) : "n/a";
}

function nodeRow(node, straggler) {
  const status = STATE_WORDS[node.state] || node.state;
  let detail = "";
  if (node.state === "lost") detail = `silent for ${seconds(node.silent_s)}${node.last_kind ? `, last sent a ${node.last_kind} record` : ""}`;
  else if (node.state === "behind") detail = `${node.behind ?? "some"} records on their way`;
  const gaps = node.gap_records ? `${node.gap_records} records lost in ${node.gaps} gap${node.gaps > 1 ? "s" : ""}` : "none";
  const clock = Number.isFinite(node.clock_offset_s)
    ? `${node.clock_basis === "the hub's own clock" ? "the hub's" : `${node.clock_offset_s.toFixed(3)} s`}${Number.isFinite(node.clock_uncertainty_s) && node.clock_basis !== "the hub's own clock" ? ` ± ${duration(node.clock_uncertainty_s)}` : ""}`
    : "n/a";
  const row = el("tr", { "data-node": node.node_rank, class: node.state === "lost" ? "lost" : node.state === "behind" ? "behind" : "" },
    el("td", { class: "num" }, String(node.node_rank)),
    el("td", {}, node.host + (node.host === straggler ? " (straggler)" : "")),
    el("td", { class: "node-state" }, detail ? `${status}: ${detail}` : status),
    el("td", {}, (node.ranks || []).join(", ") || "none yet"),
    el("td", { class: "num" }, seconds(node.step_time_s)),
    el("td", { class: "num" }, seconds(node.lag_s)),
    el("td", {}, gaps),
    el("td", { class: "num" }, clock));
  return row;
}

export function renderJob() {
  const part = $("job");
  const snap = state.doc && state.doc.snapshot;
  const nodes = (snap && snap.nodes) || [];
  part.hidden = nodes.length === 0;
  if (!nodes.length) return;
  const job = snap.job || {};
  setText($("job-sub"), `Job ${job.id || ""}: ${nodes.length} of ${job.nnodes ?? nodes.length} nodes seen, each forwarding its records here. Which node is slow, behind or lost?`);
  const lag = metric("straggler_node_lag_s");
  const straggler = lag && Number.isFinite(lag.value) ? lag.label : null;
  const sub = straggler
    ? `the straggler is ${straggler}: its ranks report each step ${duration(lag.value)} after the first node's (on the job hub's clock)`
    : (lag && lag.absent) || "";
  const body = card($("job-cards"), "job-nodes", "Nodes", sub);
  const head = el("tr", {}, ...["node", "host", "state", "ranks", "step time", "behind the first", "gaps", "clock offset"].map((h) => el("th", {}, h)));
  body.replaceChildren(el("table", { class: "nodes" }, el("thead", {}, head), el("tbody", {}, ...nodes.map((n) => nodeRow(n, straggler)))));
}
