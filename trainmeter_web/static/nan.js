// Where a series the loop reports stopped being a number (a NaN or infinite loss), and when: the stretches of its
// history whose values are null, on the chosen x axis and in wall time. The page marks them on the chart instead of
// letting the line simply stop. It reads only the history API; it never invents a value for a missing point.

import { clock, si } from "./format.js";
import { POINTS, state } from "./page.js";
import { getJson } from "./source.js";

// Runs of consecutive points whose value is not a number: [{from, to, count, ongoing}], x on the points' axis.
export function stretches(points) {
  const out = [];
  let run = null;
  for (const p of points || []) {
    if (!Number.isFinite(p[0])) continue;
    if (Number.isFinite(p[1])) {
      run = null;
      continue;
    }
    if (!run) {
      run = { from: p[0], to: p[0], count: 0, exact: true, ongoing: false };
      out.push(run);
    }
    run.to = p[0];
    run.count += 1;
    // a merged point is NaN when any of its raw values was: then the count of NaN values is not known here
    if ((p[4] || 1) > 1) run.exact = false;
  }
  if (out.length && points.length && !Number.isFinite(points[points.length - 1][1])) out[out.length - 1].ongoing = true;
  return out;
}

function where(x, axis) {
  if (axis === "step") return `step ${Math.round(x)}`;
  if (axis === "tokens") return `${si(x)} tokens`;
  if (axis === "flop") return `${si(x, "FLOP")} spent`;
  return clock(x);
}

// The wall times of a series' NaN stretches, fetched once per change of its NaN count (the page's own axis may be
// steps, which carry no time).
const walls = new Map(); // name -> {key, runs: [{from, to}]} or {key, pending: true}

function wallRuns(name, key, onLoaded) {
  const known = walls.get(name);
  if (known && known.key === key) return known.runs || null;
  walls.set(name, { key, pending: true });
  getJson(`/api/history?series=${encodeURIComponent(name)}&x=wall&points=${POINTS}`)
    .then((body) => {
      const points = body && body.series ? body.series[name] : null;
      walls.set(name, { key, runs: stretches(points || []) });
      onLoaded();
    })
    .catch(() => walls.set(name, { key, runs: [] }));
  return null;
}

// For the lines of one chart: the marks to draw and one note per stretch ("train loss is not a number from step
// 111 on, since 02:12:25"). ``onLoaded`` re-renders once the wall times arrive.
export function nanMarks(lines, onLoaded) {
  const marks = [];
  const notes = [];
  for (const line of lines) {
    const runs = stretches(state.series[line.name]);
    if (!runs.length) continue;
    const total = runs.reduce((n, r) => n + r.count, 0);
    const timed = state.axis === "wall" ? runs : wallRuns(line.name, `${total}:${runs.length}`, onLoaded);
    runs.slice(0, 3).forEach((run, i) => {
      marks.push({ from: run.from, to: run.to, label: "NaN" });
      const at = run.ongoing
        ? `from ${where(run.from, state.axis)} on`
        : run.from === run.to
          ? `at ${where(run.from, state.axis)}`
          : `from ${where(run.from, state.axis)} to ${where(run.to, state.axis)}`;
      // Thinned differently on the two axes, stretches pair up one to one only when they are as many.
      const paired = timed && timed.length === runs.length;
      const wall = paired ? timed[i] : timed && timed.length && i === 0 ? { from: timed[0].from } : null;
      let when = "";
      if (wall && state.axis !== "wall") {
        when = run.ongoing || !paired
          ? `, since ${clock(wall.from)}`
          : `, ${clock(wall.from)}${wall.to !== wall.from ? ` to ${clock(wall.to)}` : ""}`;
      }
      const count = run.exact ? (run.count === 1 ? "1 value, " : `${run.count} values, `) : "";
      notes.push(`${line.label} is not a number ${at}${when} (${count}marked NaN)`);
    });
    if (runs.length > 3) notes.push(`${line.label} is not a number in ${runs.length - 3} more stretches`);
  }
  return { marks, notes };
}
