// How numbers read on the page: fractions as percentages, SI prefixes, durations. Formatting happens here only, at the
// edge; the API carries raw numbers. A value that is not a finite number never becomes "0": it reads "n/a".

export const FRACTIONS = new Set([
  "mfu", "mfu_avg", "ofu", "mfu_ofu_gap", "goodput", "progress", "util_gpu", "sm_active", "tensor_active",
  "dram_active", "plan_mfu", "straggler_spread", "node_cpu_iowait", "profile_mfu", "profile_idle",
  "profile_exposed_communication",
]);

const SI = [
  [1e18, "E"], [1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"],
];

export function finite(v) {
  return typeof v === "number" && Number.isFinite(v);
}

// Three significant digits, without a trailing ".0" soup: 41.2, 0.0123, 1230.
export function sig(v, digits = 3) {
  if (!finite(v)) return "n/a";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) {
    const [m, e] = v.toExponential(digits - 1).split("e");
    return `${m}e${Number(e)}`;
  }
  const decimals = Math.max(0, digits - 1 - Math.floor(Math.log10(a)));
  const text = v.toFixed(Math.min(decimals, 6));
  // 0.00200 reads 0.002 and 20.0 reads 20: the digits that are left are the significant ones
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}

export function percent(v) {
  if (!finite(v)) return "n/a";
  return `${sig(v * 100)}%`;
}

export function si(v, unit = "") {
  if (!finite(v)) return "n/a";
  const a = Math.abs(v);
  for (const [scale, prefix] of SI) {
    if (a >= scale) return unit ? `${sig(v / scale)} ${prefix}${unit}` : `${sig(v / scale)}${prefix}`;
  }
  return unit ? `${sig(v)} ${unit}` : sig(v);
}

export function bytes(v) {
  if (!finite(v)) return "n/a";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let x = v;
  while (Math.abs(x) >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  return `${sig(x)} ${units[i]}`;
}

export function duration(s) {
  if (!finite(s)) return "n/a";
  if (Math.abs(s) < 1) return `${sig(s * 1000)} ms`;
  if (Math.abs(s) < 60) return `${sig(s)} s`;
  const total = Math.round(s);
  const d = Math.floor(total / 86400);
  const h = Math.floor((total % 86400) / 3600);
  const m = Math.floor((total % 3600) / 60);
  const sec = total % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  return `${m}m ${String(sec).padStart(2, "0")}s`;
}

export function clock(wall) {
  if (!finite(wall)) return "n/a";
  const date = new Date(wall * 1000);
  return date.toLocaleString(undefined, { hour12: false });
}

// A number in the unit the engine gave it (the metric key decides fractions, which carry no unit).
export function byUnit(v, unit, key = "") {
  if (!finite(v)) return "n/a";
  const base = key.split(".")[0];
  if (FRACTIONS.has(base)) return percent(v);
  switch (unit) {
    case "s":
      return duration(v);
    case "tokens/s":
      return `${si(v)} tok/s`;
    case "tokens":
      return si(v);
    case "FLOP/token":
      return si(v, "FLOP");
    case "FLOP":
      return si(v, "FLOP");
    case "FLOP/s":
      return si(v, "FLOP/s");
    case "FLOP/byte":
      return `${sig(v)} FLOP/B`;
    case "B":
      return bytes(v);
    case "J":
      return si(v, "J");
    case "h":
      return `${sig(v)} h`;
    case "W":
      return `${sig(v)} W`;
    case "MHz":
      return `${sig(v)} MHz`;
    case "cores":
      return `${sig(v)} cores`;
    case "B/s":
      return `${bytes(v)}/s`;
    default:
      return unit ? `${sig(v)} ${unit}` : sig(v);
  }
}

// A metric as the page shows it: one value, a range ("low–high") where it is one per convention, or "n/a". Ends that
// read the same are one number, shown once (the tile's line says which conventions agree on it).
export function metricText(metric, key) {
  if (!metric) return "n/a";
  if (finite(metric.value)) return byUnit(metric.value, metric.unit, key);
  if (finite(metric.low) && finite(metric.high)) {
    const low = byUnit(metric.low, metric.unit, key);
    const high = byUnit(metric.high, metric.unit, key);
    return low === high ? low : `${low} – ${high}`;
  }
  return "n/a";
}

export function axisValue(v, axis, startWall) {
  if (!finite(v)) return "";
  if (axis === "wall") return duration(v - (startWall || 0));
  if (axis === "step") return Math.abs(v) >= 1e4 ? si(v) : String(Math.round(v));
  if (axis === "flop") return si(v, "FLOP");
  return si(v);
}

const COUNT_UNITS = new Set(["tokens", "steps", "layers", "params", "ranks"]);

// A whole number as a person writes it: 19,210.
export function count(v) {
  return finite(v) ? Math.round(v).toLocaleString("en-US") : "n/a";
}

// A fact's value as a person reads it: numbers rounded in their unit, the device and peak objects in words, other
// objects as "key value" pairs; never raw JSON, never an unrounded float. A fact with no value reads "n/a".
export function factText(fact) {
  const v = fact.value;
  if (v === null || v === undefined) return "n/a";
  if (typeof v === "number") {
    // a declared count is shown whole (1,024 tokens per step, not 1.02k); rates and sizes in their unit
    if (Number.isInteger(v) && (!fact.unit || COUNT_UNITS.has(fact.unit))) return `${count(v)}${fact.unit ? ` ${fact.unit}` : ""}`;
    return fact.unit ? byUnit(v, fact.unit) : sig(v);
  }
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "string") return v;
  if (Array.isArray(v)) return v.map((x) => factText({ value: x })).join(", ");
  if (fact.name === "device") {
    const index = v.index !== null && v.index !== undefined ? `:${v.index}` : "";
    const threads = Number.isInteger(v.threads) ? `${v.threads} thread${v.threads === 1 ? "" : "s"}` : null;
    const computes = [v.uuid, v.dtype, threads].filter(Boolean).join(", ");
    return `${v.type || "unknown"}${index}${computes ? ` (${computes})` : ""}`;
  }
  if (fact.name === "peak") {
    const rate = finite(v.flop_per_s) ? v.flop_per_s : v.flops; // schema 1 called it flops
    // a measured peak says what it was measured with: it scores only a rank that computes the same way
    const threads = Number.isInteger(v.threads) ? `${v.threads} thread${v.threads === 1 ? "" : "s"}` : null;
    const label = [v.label, v.device_type, v.dtype, threads].filter(Boolean).join(", ");
    return `${si(rate, "FLOP/s")}${label ? ` (${label})` : ""}`;
  }
  if (fact.name === "gpu") {
    const peak = finite(v.dense_bf16_flop_per_s) ? `, ${si(v.dense_bf16_flop_per_s, "FLOP/s")} dense BF16` : "";
    return `${v.display_name || v.name || "GPU"}${finite(v.index) ? ` (index ${v.index})` : ""}${peak}`;
  }
  return Object.entries(v)
    .filter(([, x]) => x !== null && x !== undefined && x !== "")
    .map(([k, x]) => `${k.replaceAll("_", " ")} ${factText({ value: x })}`)
    .join(" · ");
}
