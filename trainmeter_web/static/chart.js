// Flat translucent area charts and sparklines on <canvas>, written for this page: the server already thinned each
// series to about the page's width, so a chart draws at most a few thousand points and needs no library. Text (titles,
// labels, tooltips) is always set with textContent, never parsed as HTML.

import { finite, sig } from "./format.js";

export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export function palette(i) {
  return cssVar(`--c${(i % 8) + 1}`) || "#888";
}

function alpha(color, a) {
  // #rrggbb -> rgba(); anything else is used as it is
  const m = /^#([0-9a-f]{6})$/i.exec(color);
  if (!m) return color;
  const n = parseInt(m[1], 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

function niceStep(range, count) {
  const raw = range / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1;
  return step * mag;
}

function ticks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

function nearest(points, x) {
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

function setupCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300;
  const h = canvas.clientHeight || 150;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

export class Chart {
  // opts: {id, title, sub, yFormat(v) -> text}
  constructor(parent, opts) {
    this.opts = opts;
    this.root = document.createElement("div");
    this.root.className = "card chart";
    this.root.id = opts.id;
    const head = document.createElement("h3");
    this.now = document.createElement("span");
    this.now.className = "now num";
    this.titleEl = document.createElement("span");
    head.append(this.titleEl, this.now);
    this.subEl = document.createElement("p");
    this.subEl.className = "sub";
    this.canvas = document.createElement("canvas");
    this.canvas.setAttribute("role", "img");
    this.xLabelEl = document.createElement("div");
    this.xLabelEl.className = "x-label";
    this.legendEl = document.createElement("div");
    this.legendEl.className = "legend";
    this.root.append(head, this.subEl, this.canvas, this.xLabelEl, this.legendEl);
    parent.append(this.root);
    this.lines = [];
    this.hover = null;
    this.setText(opts.title, opts.sub);
    this.canvas.addEventListener("mousemove", (e) => this.onMove(e));
    this.canvas.addEventListener("mouseleave", () => this.onLeave());
    if (window.ResizeObserver) {
      this.resize = new ResizeObserver(() => this.draw());
      this.resize.observe(this.canvas);
    }
  }

  setText(title, sub) {
    if (this.titleEl.textContent !== title) this.titleEl.textContent = title;
    if (this.subEl.textContent !== (sub || "")) this.subEl.textContent = sub || "";
    this.canvas.setAttribute("aria-label", title);
  }

  // data: {lines: [{name, label, points: [[x, v, min, max, count]]}], xAxis, xLabel, xFormat, hline: {value, label}}
  set(data) {
    this.data = data;
    this.lines = data.lines.filter((l) => l.points && l.points.length);
    const first = this.lines[0];
    this.root.dataset.points = String(first ? first.points.length : 0);
    this.root.dataset.series = this.lines.map((l) => l.name).join(" ");
    this.root.dataset.xAxis = data.xAxis;
    if (this.xLabelEl.textContent !== data.xLabel) this.xLabelEl.textContent = data.xLabel;
    const last = first ? first.points[first.points.length - 1] : null;
    this.now.textContent = last && finite(last[1]) ? this.opts.yFormat(last[1]) : "";
    this.legendEl.replaceChildren();
    if (this.lines.length > 1 || data.hline) {
      this.lines.forEach((line, i) => {
        const key = document.createElement("span");
        key.className = "key";
        key.style.setProperty("--swatch", line.color || palette(i));
        key.textContent = line.label;
        this.legendEl.append(key);
      });
      if (data.hline) {
        const key = document.createElement("span");
        key.className = "key";
        key.textContent = data.hline.label;
        this.legendEl.append(key);
      }
    }
    this.draw();
  }

  bounds() {
    let x0 = Infinity;
    let x1 = -Infinity;
    let y0 = Infinity;
    let y1 = -Infinity;
    for (const line of this.lines) {
      for (const p of line.points) {
        if (!finite(p[0])) continue;
        if (p[0] < x0) x0 = p[0];
        if (p[0] > x1) x1 = p[0];
        for (const v of [p[1], p[2], p[3]]) {
          if (finite(v)) {
            if (v < y0) y0 = v;
            if (v > y1) y1 = v;
          }
        }
      }
    }
    const hv = this.data && this.data.hline ? this.data.hline.value : null;
    if (finite(hv)) {
      y0 = Math.min(y0, hv);
      y1 = Math.max(y1, hv);
    }
    if (!finite(x0)) return null;
    if (x1 === x0) {
      x0 -= 1;
      x1 += 1;
    }
    if (!finite(y0)) {
      y0 = 0;
      y1 = 1;
    }
    if (y0 >= 0 && y0 < 0.35 * y1) y0 = 0; // grounded areas read better when the floor is near zero anyway
    if (y1 === y0) {
      // a flat line: from zero up to a little above it (or down, for a negative one), never around zero both ways
      if (y0 === 0) y1 = 1;
      else if (y0 > 0) {
        y0 = 0;
        y1 *= 1.25;
      } else {
        y1 = 0;
        y0 *= 1.25;
      }
    }
    const pad = (y1 - y0) * 0.06;
    return { x0, x1, y0: y0 === 0 ? 0 : y0 - pad, y1: y1 + pad };
  }

  draw() {
    if (!this.data || !this.canvas.isConnected) return;
    const { ctx, w, h } = setupCanvas(this.canvas);
    const b = this.bounds();
    if (!b) return;
    ctx.font = "11px ui-sans-serif, system-ui, sans-serif";
    const yTicks = ticks(b.y0, b.y1, 3);
    const yLabels = yTicks.map((v) => this.opts.yFormat(v));
    // room for the widest y label, so "1980 MHz" is never cut
    const left = Math.ceil(Math.max(28, ...yLabels.map((t) => ctx.measureText(t).width)) + 10);
    const right = 8;
    const top = 6;
    const bottom = 18;
    const pw = Math.max(10, w - left - right);
    const ph = Math.max(10, h - top - bottom);
    const sx = (x) => left + ((x - b.x0) / (b.x1 - b.x0)) * pw;
    const sy = (y) => top + (1 - (y - b.y0) / (b.y1 - b.y0)) * ph;
    this.scale = { sx, b, left, pw };
    const muted = cssVar("--muted");
    ctx.fillStyle = muted;
    ctx.strokeStyle = cssVar("--grid");
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    yTicks.forEach((v, k) => {
      const y = Math.round(sy(v)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(left, y);
      ctx.lineTo(w - right, y);
      ctx.stroke();
      ctx.fillText(yLabels[k], left - 6, y);
    });
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const xf = this.data.xFormat || ((v) => sig(v));
    const xt = ticks(b.x0, b.x1, 4);
    for (const v of xt) {
      const x = sx(v);
      if (x < left + 12 || x > w - right - 12) continue;
      ctx.fillText(xf(v), x, h - bottom + 4);
    }
    const floor = sy(Math.max(b.y0, Math.min(0, b.y1)));
    // one translucent area per chart reads calmly; with many lines (one per GPU) the areas would stack into mud
    const fillAlpha = this.lines.length > 2 ? 0 : this.lines.length > 1 ? 0.08 : 0.16;
    this.lines.forEach((line, i) => {
      const color = line.color || palette(i);
      const pts = line.points;
      // the min..max band where points are buckets of several
      if (pts.some((p) => p[4] > 1 && finite(p[2]) && finite(p[3]) && p[3] > p[2])) {
        ctx.beginPath();
        let started = false;
        for (const p of pts) {
          if (!finite(p[0]) || !finite(p[3])) continue;
          if (!started) ctx.moveTo(sx(p[0]), sy(p[3]));
          else ctx.lineTo(sx(p[0]), sy(p[3]));
          started = true;
        }
        for (let k = pts.length - 1; k >= 0; k -= 1) {
          const p = pts[k];
          if (!finite(p[0]) || !finite(p[2])) continue;
          ctx.lineTo(sx(p[0]), sy(p[2]));
        }
        ctx.closePath();
        ctx.fillStyle = alpha(color, 0.14);
        ctx.fill();
      }
      // the area under the line, in segments broken where a value is not a number
      const segments = [];
      let seg = [];
      for (const p of pts) {
        if (finite(p[0]) && finite(p[1])) seg.push(p);
        else if (seg.length) {
          segments.push(seg);
          seg = [];
        }
      }
      if (seg.length) segments.push(seg);
      for (const s of segments) {
        ctx.beginPath();
        ctx.moveTo(sx(s[0][0]), floor);
        for (const p of s) ctx.lineTo(sx(p[0]), sy(p[1]));
        ctx.lineTo(sx(s[s.length - 1][0]), floor);
        ctx.closePath();
        if (fillAlpha) {
          ctx.fillStyle = alpha(color, fillAlpha);
          ctx.fill();
        }
        ctx.beginPath();
        s.forEach((p, k) => (k ? ctx.lineTo(sx(p[0]), sy(p[1])) : ctx.moveTo(sx(p[0]), sy(p[1]))));
        if (s.length === 1) ctx.arc(sx(s[0][0]), sy(s[0][1]), 2, 0, Math.PI * 2);
        ctx.strokeStyle = color;
        ctx.lineWidth = 1.5;
        ctx.stroke();
      }
    });
    const hl = this.data.hline;
    if (hl && finite(hl.value)) {
      ctx.save();
      ctx.setLineDash([5, 4]);
      ctx.strokeStyle = muted;
      ctx.beginPath();
      ctx.moveTo(left, sy(hl.value));
      ctx.lineTo(w - right, sy(hl.value));
      ctx.stroke();
      ctx.restore();
    }
    if (this.hover !== null) {
      const x = sx(this.hover);
      ctx.strokeStyle = muted;
      ctx.beginPath();
      ctx.moveTo(x + 0.5, top);
      ctx.lineTo(x + 0.5, top + ph);
      ctx.stroke();
      this.lines.forEach((line, i) => {
        const k = nearest(line.points, this.hover);
        const p = line.points[k];
        if (k < 0 || !finite(p[1])) return;
        ctx.beginPath();
        ctx.arc(sx(p[0]), sy(p[1]), 3, 0, Math.PI * 2);
        ctx.fillStyle = line.color || palette(i);
        ctx.fill();
      });
    }
  }

  onMove(e) {
    if (!this.scale || !this.lines.length) return;
    const rect = this.canvas.getBoundingClientRect();
    const { b, left, pw } = this.scale;
    const x = b.x0 + ((e.clientX - rect.left - left) / pw) * (b.x1 - b.x0);
    const first = this.lines[0].points;
    const k = nearest(first, x);
    if (k < 0) return;
    this.hover = first[k][0];
    this.draw();
    const xf = this.data.xFormat || ((v) => sig(v));
    const rows = [`${this.data.xLabel} ${xf(this.hover)}`];
    for (const line of this.lines) {
      const p = line.points[nearest(line.points, this.hover)];
      let text = `${line.label}: ${finite(p[1]) ? this.opts.yFormat(p[1]) : "not a number"}`;
      if (p[4] > 1 && finite(p[2]) && finite(p[3])) {
        text += ` (${p[4]} points, ${this.opts.yFormat(p[2])} to ${this.opts.yFormat(p[3])})`;
      }
      rows.push(text);
    }
    if (this.onHover) this.onHover(rows, e.clientX, e.clientY);
  }

  onLeave() {
    this.hover = null;
    this.draw();
    if (this.onHover) this.onHover(null);
  }

  remove() {
    if (this.resize) this.resize.disconnect();
    this.root.remove();
  }
}

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
