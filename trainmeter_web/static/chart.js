// Flat translucent area charts on <canvas>, written for this page: the server already thinned each
// series to about the page's width, so a chart draws at most a few thousand points and needs no library. Text (titles,
// labels, tooltips) is always set with textContent, never parsed as HTML.

import { finite, sig } from "./format.js";
import { remember, remembered } from "./prefs.js";
import { highest, logTicks, lowest, nearest, robustLimits, ticks } from "./scale.js";

export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export function palette(i) {
  return cssVar(`--c${(i % 8) + 1}`) || "#888";
}

export function alpha(color, a) {
  // #rrggbb -> rgba(); anything else is used as it is
  const m = /^#([0-9a-f]{6})$/i.exec(color);
  if (!m) return color;
  const n = parseInt(m[1], 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

export function setupCanvas(canvas) {
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
    this.notesEl = document.createElement("div");
    this.notesEl.className = "chart-notes";
    this.root.append(head, this.subEl, this.canvas, this.xLabelEl, this.legendEl, this.notesEl);
    parent.append(this.root);
    this.lines = [];
    this.hover = null;
    this.log = false;
    if (opts.logToggle) {
      // A loss spans orders of magnitude: a log scale shows its early fall and its late creep at once.
      this.logButton = document.createElement("button");
      this.logButton.type = "button";
      this.logButton.className = "scale-toggle";
      this.logButton.textContent = "log scale";
      this.log = remembered(`tm-log-${opts.id}`) === "1";
      this.logButton.addEventListener("click", () => {
        this.log = !this.log;
        remember(`tm-log-${opts.id}`, this.log ? "1" : "0");
        this.draw();
      });
      head.append(this.logButton);
    }
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
    // the latest value; a latest value that is not a number says so rather than showing the one before
    this.now.textContent = last ? (finite(last[1]) ? this.opts.yFormat(last[1]) : "NaN") : "";
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
    this.callerNotes = data.notes || [];
    this.draw();
  }

  // The values a y range is made of: each point's value, and its bucket's min and max.
  yValues() {
    const out = [];
    for (const line of this.lines) {
      for (const p of line.points) {
        if (!finite(p[0])) continue;
        for (const v of [p[1], p[2], p[3]]) if (finite(v) && (!this.log || v > 0)) out.push(v);
      }
    }
    return out;
  }

  // With opts.robust, the y range follows the bulk of the values (scale.js robustLimits); a log scale shows them all.
  limits(values) {
    return this.opts.robust && !this.log ? robustLimits(values) : null;
  }

  bounds() {
    let x0 = Infinity;
    let x1 = -Infinity;
    let y0 = Infinity;
    let y1 = -Infinity;
    const limits = this.limits(this.yValues());
    for (const line of this.lines) {
      for (const p of line.points) {
        if (!finite(p[0])) continue;
        if (p[0] < x0) x0 = p[0];
        if (p[0] > x1) x1 = p[0];
        for (const v of [p[1], p[2], p[3]]) {
          if (finite(v) && (!this.log || v > 0) && (!limits || (v >= limits.lo && v <= limits.hi))) {
            if (v < y0) y0 = v;
            if (v > y1) y1 = v;
          }
        }
      }
    }
    this.clip = limits;
    if (this.log) {
      if (!finite(x0) || !finite(y0)) return null;
      if (x1 === x0) {
        x0 -= 1;
        x1 += 1;
      }
      // log10 space, padded by a twentieth of a decade; a flat line gets half a decade each way
      let l0 = Math.log10(y0);
      let l1 = Math.log10(y1);
      if (l1 - l0 < 1e-9) {
        l0 -= 0.5;
        l1 += 0.5;
      }
      return { x0, x1, y0: l0 - 0.05, y1: l1 + 0.05, log: true };
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
    if (y0 >= 0 && y0 < 0.35 * y1 && !limits) y0 = 0; // grounded areas read better when the floor is near zero anyway
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
    const canLog = this.opts.logToggle && this.lines.some((l) => l.points.some((p) => finite(p[1]) && p[1] > 0));
    if (this.logButton) {
      // a log scale needs positive values; without any, the toggle waits for them
      if (!canLog) this.log = false;
      this.logButton.disabled = !canLog;
      this.logButton.title = canLog ? "switch between a linear and a logarithmic y axis" : "a log scale needs positive values";
      this.logButton.setAttribute("aria-pressed", this.log ? "true" : "false");
      this.root.dataset.scale = this.log ? "log" : "linear";
    }
    const b = this.bounds();
    this.renderNotes();
    // what a test (or a curious reader of the DOM) can check: the y range drawn, where NaN stretches start and where
    // a resumed run was down (or went back to its checkpoint)
    const marks = this.data.marks || [];
    this.root.dataset.nan = marks.filter((m) => m.kind !== "gap").map((m) => m.from).join(",");
    this.root.dataset.gaps = marks.filter((m) => m.kind === "gap").map((m) => `${m.from}..${m.to}`).join(",");
    if (!b) return;
    this.root.dataset.yRange = b.log ? `${10 ** b.y0},${10 ** b.y1}` : `${b.y0},${b.y1}`;
    ctx.font = "11px ui-sans-serif, system-ui, sans-serif";
    const yTicks = b.log ? logTicks(b.y0, b.y1) : ticks(b.y0, b.y1, 3);
    const yLabels = yTicks.map((v) => this.opts.yFormat(b.log ? 10 ** v : v));
    // room for the widest y label, so "1980 MHz" is never cut
    const left = Math.ceil(Math.max(28, ...yLabels.map((t) => ctx.measureText(t).width)) + 10);
    const right = 8;
    const top = 10;
    const bottom = 18;
    const pw = Math.max(10, w - left - right);
    const ph = Math.max(10, h - top - bottom);
    const sx = (x) => left + ((x - b.x0) / (b.x1 - b.x0)) * pw;
    const syRaw = (y) => top + (1 - (y - b.y0) / (b.y1 - b.y0)) * ph;
    // a value as the axis places it: its log10 on a log scale (where a value ≤ 0 has no place)
    const sy = b.log ? (y) => syRaw(Math.log10(y)) : syRaw;
    const drawable = (v) => finite(v) && (!b.log || v > 0);
    this.scale = { sx, b, left, pw };
    const muted = cssVar("--muted");
    ctx.fillStyle = muted;
    ctx.strokeStyle = cssVar("--grid");
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    yTicks.forEach((v, k) => {
      const y = Math.round(syRaw(v)) + 0.5;
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
    const floor = b.log ? top + ph : syRaw(Math.max(b.y0, Math.min(0, b.y1)));
    // one translucent area per chart reads calmly; with many lines (one per GPU) the areas would stack into mud
    const fillAlpha = this.lines.length > 2 ? 0 : this.lines.length > 1 ? 0.08 : 0.16;
    const gaps = marks.filter((m) => m.kind === "gap" && m.to > m.from);
    ctx.save();
    // lines that leave a clipped range leave the plot at its edge instead of running over the labels
    ctx.beginPath();
    ctx.rect(left, top - 2, pw, ph + 4);
    ctx.clip();
    this.lines.forEach((line, i) => {
      const color = line.color || palette(i);
      const pts = line.points;
      // the min..max band where points are buckets of several
      if (pts.some((p) => p[4] > 1 && drawable(p[2]) && drawable(p[3]) && p[3] > p[2])) {
        ctx.beginPath();
        let started = false;
        for (const p of pts) {
          if (!finite(p[0]) || !drawable(p[3])) continue;
          if (!started) ctx.moveTo(sx(p[0]), sy(p[3]));
          else ctx.lineTo(sx(p[0]), sy(p[3]));
          started = true;
        }
        for (let k = pts.length - 1; k >= 0; k -= 1) {
          const p = pts[k];
          if (!finite(p[0]) || !drawable(p[2])) continue;
          ctx.lineTo(sx(p[0]), sy(p[2]));
        }
        ctx.closePath();
        ctx.fillStyle = alpha(color, 0.14);
        ctx.fill();
      }
      // the area under the line, in segments broken where a value is not a number, and for a resumed run where it
      // was down (wall time) or went back to an earlier step: no line is drawn through time nothing was measured in
      const segments = [];
      let seg = [];
      for (const p of pts) {
        const last = seg[seg.length - 1];
        if (last && finite(p[0]) && (p[0] < last[0] || gaps.some((g) => last[0] <= g.from && p[0] >= g.to))) {
          segments.push(seg);
          seg = [];
        }
        if (finite(p[0]) && drawable(p[1])) seg.push(p);
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
    ctx.restore();
    if (this.clip) {
      // each point beyond the range: a small triangle on the edge it left by, pointing the way it went
      this.lines.forEach((line, i) => {
        ctx.fillStyle = line.color || palette(i);
        for (const p of line.points) {
          const side = finite(p[0]) ? this.outside(p) : null;
          if (!side) continue;
          const above = side === "above";
          const x = sx(p[0]);
          const y = above ? top : top + ph;
          const d = above ? -1 : 1;
          ctx.beginPath();
          ctx.moveTo(x, y + d * 6);
          ctx.lineTo(x - 4, y);
          ctx.lineTo(x + 4, y);
          ctx.closePath();
          ctx.fill();
        }
      });
    }
    for (const mark of this.data.marks || []) {
      // a stretch where a line is not a number (or a resumed run was down): a dashed rule where it starts and a
      // shaded band to where it ends
      if (!finite(mark.from)) continue;
      const x0 = sx(mark.from);
      const x1 = finite(mark.to) ? sx(mark.to) : x0;
      const bad = mark.color || cssVar("--bad") || "#b91c1c"; // NaN stretches by default; profiled steps say theirs
      ctx.fillStyle = alpha(bad, 0.1);
      ctx.fillRect(x0, top, Math.max(1, x1 - x0), ph);
      ctx.save();
      ctx.setLineDash([3, 3]);
      ctx.strokeStyle = bad;
      ctx.beginPath();
      ctx.moveTo(Math.round(x0) + 0.5, top);
      ctx.lineTo(Math.round(x0) + 0.5, top + ph);
      ctx.stroke();
      ctx.restore();
      ctx.fillStyle = bad;
      ctx.textAlign = x0 > left + pw - 30 ? "right" : "left";
      ctx.textBaseline = "top";
      ctx.fillText(mark.label ?? "NaN", x0 + (ctx.textAlign === "left" ? 3 : -3), top);
    }
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
        if (k < 0 || !drawable(p[1])) return;
        const y = this.clip ? Math.min(this.clip.hi, Math.max(this.clip.lo, p[1])) : p[1];
        ctx.beginPath();
        ctx.arc(sx(p[0]), sy(y), 3, 0, Math.PI * 2);
        ctx.fillStyle = line.color || palette(i);
        ctx.fill();
      });
    }
  }

  // Whether a point (or its bucket's min or max) lies beyond the clipped range: "above", "below" or null.
  outside(p) {
    if (!this.clip) return null;
    const hi = highest(p);
    const lo = lowest(p);
    if (finite(hi) && hi > this.clip.hi) return "above";
    if (finite(lo) && lo < this.clip.lo) return "below";
    return null;
  }

  // Below the legend: what the caller wants said (a stretch of NaN), and what this chart left out of its y range.
  renderNotes() {
    const notes = [...(this.callerNotes || [])];
    let clipped = 0;
    let extreme = null;
    if (this.clip) {
      for (const line of this.lines) {
        for (const p of line.points) {
          const side = this.outside(p);
          if (!side) continue;
          clipped += 1;
          const v = side === "above" ? highest(p) : lowest(p);
          if (extreme === null || Math.abs(v) > Math.abs(extreme)) extreme = v;
        }
      }
      const where = extreme > this.clip.hi ? "above" : "below";
      const word = clipped === 1 ? "point lies" : "points lie";
      notes.push(
        `${clipped} ${word} ${where} this range (${extreme > this.clip.hi ? "up to" : "down to"} ` +
          `${this.opts.yFormat(extreme)}), marked ${extreme > this.clip.hi ? "▲" : "▼"}: the y axis follows ` +
          `the bulk of the values${this.logButton ? "; the log scale shows them all" : ""}`,
      );
    }
    this.root.dataset.clipped = String(clipped);
    const text = notes.join("\n");
    if (this.notesText !== text) {
      this.notesText = text;
      this.notesEl.replaceChildren(...notes.map((n) => {
        const line = document.createElement("div");
        line.textContent = n;
        return line;
      }));
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
