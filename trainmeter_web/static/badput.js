// The badput buckets of the time split (docs/metrics.md, "Time split and goodput"): their order and words, and one
// bar per attempt of a resumed run, each the attempt's share (snapshot.attempts[].phases_s). It takes the page's
// state as an argument, as attempts.js does, so the report's bundle can use it without a cycle.

import { palette } from "./chart.js";
import { duration, finite } from "./format.js";

// Productive step time first, then the buckets in the engine's order (formulas.BADPUT_BUCKETS).
export const BUCKETS = [
  "compute", "startup", "compile", "data_wait", "checkpoint", "checkpoint_load", "eval", "profiler", "hang",
  "superseded", "down", "after_last_step", "other",
];

export const BUCKET_WORDS = {
  compute: "compute (productive)",
  startup: "start-up and imports",
  compile: "compile",
  data_wait: "data wait",
  checkpoint: "checkpoint save",
  checkpoint_load: "checkpoint load",
  eval: "eval",
  profiler: "profiler",
  hang: "hangs",
  superseded: "steps done again",
  down: "down between attempts",
  after_last_step: "after the last step",
  other: "other (unattributed)",
};

// A bucket's colour: the same in the run's bar and in every attempt's.
export function bucketColor(name) {
  const i = BUCKETS.indexOf(name);
  return palette(i < 0 ? BUCKETS.length : i);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

// One bar per attempt, each its share of the split (the gap before it is its "down"); nothing for a run started once,
// whose one bar is the run's.
export function attemptBars(state) {
  const list = (state.doc && state.doc.snapshot && state.doc.snapshot.attempts) || [];
  if (list.length < 2) return "";
  const rows = el("div", { class: "attempt-bars", id: "attempt-bars" });
  for (const attempt of list) {
    const shares = attempt.phases_s || {};
    const total = Object.values(shares).reduce((a, b) => a + (finite(b) && b > 0 ? b : 0), 0);
    const bar = el("div", { class: "split", role: "img", "aria-label": `attempt ${attempt.attempt}'s time split` });
    const named = [];
    for (const name of BUCKETS) {
      const v = shares[name];
      if (!finite(v) || v <= 0 || !total) continue;
      const seg = el("span", { "data-part": name, title: `${BUCKET_WORDS[name]} ${duration(v)}` });
      seg.style.width = `${(v / total) * 100}%`;
      seg.style.background = bucketColor(name);
      bar.append(seg);
      named.push(`${BUCKET_WORDS[name]} ${duration(v)}`);
    }
    const head = el("p", { class: "sub" }, `attempt ${attempt.attempt} · ${duration(total)} · ${attempt.end}`);
    rows.append(el("div", { class: "attempt-bar", "data-attempt": String(attempt.attempt), title: named.join(", ") }, head, bar));
  }
  return rows;
}
