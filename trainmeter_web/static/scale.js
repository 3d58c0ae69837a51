// How a chart places its values: tick positions on a linear or a log10 axis, the point nearest an x, and the highest
// and lowest value a (possibly merged) point stands for. Pure arithmetic: no DOM, no canvas.

import { finite } from "./format.js";

function niceStep(range, count) {
  const raw = range / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1;
  return step * mag;
}

export function ticks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

export const highest = (p) => (finite(p[3]) ? p[3] : p[1]);
export const lowest = (p) => (finite(p[2]) ? p[2] : p[1]);

// Ticks on a log10 axis (in log10 units): each power of ten in range, with 2 and 5 between when there are few.
export function logTicks(l0, l1) {
  const out = [];
  const steps = l1 - l0 < 1.5 ? [1, 2, 5] : [1];
  for (let e = Math.floor(l0); e <= Math.ceil(l1); e += 1) {
    for (const m of steps) {
      const v = e + Math.log10(m);
      if (v >= l0 && v <= l1) out.push(v);
    }
  }
  return out.length ? out : [l0, l1];
}

export function nearest(points, x) {
  let lo = 0;
  let hi = points.length - 1;
  if (hi < 0) return -1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] < x) lo = mid;
    else hi = mid;
  }
  return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? lo : hi;
}

// The range that holds the bulk of the values: a value further than 1.5 × the 10th–90th percentile spread beyond it
// (the first losses of a run, far above the rest) falls outside, to be clipped and marked rather than scaled to.
// {lo, hi}, or null when every value fits (or there are too few to tell a bulk from its outliers).
export function robustLimits(values) {
  if (values.length < 8) return null;
  const sorted = Float64Array.from(values).sort();
  const q = (f) => sorted[Math.round(f * (sorted.length - 1))];
  const q10 = q(0.1);
  const q90 = q(0.9);
  const spread = q90 - q10 || Math.abs(q90) * 0.1 || 1;
  const lo = q10 - 1.5 * spread;
  const hi = q90 + 1.5 * spread;
  if (sorted[0] >= lo && sorted[sorted.length - 1] <= hi) return null;
  return { lo, hi };
}
