// The tiles' sparklines: one small area chart of a series, no axes and no text, drawn on the page's palette.
// It reads only the points it is given.

import { alpha, setupCanvas } from "./chart.js";
import { finite } from "./format.js";

export function spark(canvas, points, color) {
  const { ctx, w, h } = setupCanvas(canvas);
  const pts = (points || []).filter((p) => finite(p[0]) && finite(p[1]));
  canvas.dataset.points = String(pts.length);
  if (pts.length < 2) return;
  let x0 = pts[0][0];
  let x1 = pts[pts.length - 1][0];
  let y0 = Infinity;
  let y1 = -Infinity;
  for (const p of pts) {
    y0 = Math.min(y0, p[1]);
    y1 = Math.max(y1, p[1]);
  }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) {
    y0 -= 1;
    y1 += 1;
  }
  const sx = (x) => ((x - x0) / (x1 - x0)) * (w - 2) + 1;
  const sy = (y) => h - 2 - ((y - y0) / (y1 - y0)) * (h - 4);
  ctx.beginPath();
  ctx.moveTo(sx(pts[0][0]), h);
  for (const p of pts) ctx.lineTo(sx(p[0]), sy(p[1]));
  ctx.lineTo(sx(pts[pts.length - 1][0]), h);
  ctx.closePath();
  ctx.fillStyle = alpha(color, 0.16);
  ctx.fill();
  ctx.beginPath();
  pts.forEach((p, k) => (k ? ctx.lineTo(sx(p[0]), sy(p[1])) : ctx.moveTo(sx(p[0]), sy(p[1]))));
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.stroke();
}
