// A resumed run (tm --resume): its attempts said in the header, and marked on every chart: the time it was down on
// the wall-time axis, the step its checkpoint sent it back to on the step axis. It reads the snapshot's ``attempts``
// (the engine's), and marks nothing for a run started once. It takes the page's state as an argument instead of
// importing page.js, which draws every chart with these marks: the report's bundle needs modules without a cycle.

import { cssVar } from "./chart.js";
import { clock, duration, finite } from "./format.js";

export function attempts(state) {
  return (state.doc && state.doc.snapshot && state.doc.snapshot.attempts) || [];
}

// "attempt 2 · resumed after step 150 · down 31.2 s (attempt 1 lost)", or nothing for a run started once.
export function attemptsText(state) {
  const list = attempts(state);
  if (list.length < 2) return "";
  const now = list[list.length - 1];
  const before = list[list.length - 2];
  const parts = [`attempt ${now.attempt}`];
  if (finite(now.resumed_from)) parts.push(`resumed after step ${now.resumed_from}`);
  else if (now.end === "running") parts.push("restarting");
  if (finite(now.gap_s)) parts.push(`down ${duration(now.gap_s)} (attempt ${before.attempt} ${before.end})`);
  const redone = list.reduce((n, a) => n + (a.superseded_steps || 0), 0);
  if (redone) parts.push(`${redone} steps done again`);
  return parts.join(" · ");
}

// The header's line for the attempts: its text, and each restart's start time as its tooltip.
export function attemptsTitle(state) {
  return attempts(state).slice(1).map((a) => `attempt ${a.attempt} started ${clock(a.start_wall)}`).join("\n");
}

// Chart marks ({from, to, label, color}) where the run was down or went back, on the given x axis.
export function attemptMarks(state) {
  const axis = state.axis;
  const list = attempts(state);
  const marks = [];
  const color = cssVar("--muted") || "#6b7280";
  for (let i = 1; i < list.length; i++) {
    const before = list[i - 1];
    const now = list[i];
    if (axis === "wall" && finite(before.last_wall) && finite(now.start_wall)) {
      marks.push({ from: before.last_wall, to: now.start_wall, label: `down ${duration(now.gap_s)}`, color, kind: "gap" });
    } else if (axis === "step" && finite(now.resumed_from)) {
      marks.push({ from: now.resumed_from, to: now.resumed_from, label: `attempt ${now.attempt}`, color, kind: "gap" });
    }
  }
  return marks;
}
