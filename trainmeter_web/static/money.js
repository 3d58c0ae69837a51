// Money, a view: what the price whoever looks gave makes of the run (the server's money document, model/money.py).
// Without a price the card says why; money is never guessed, and the page holds the price only while it is open.

import { $, el, setText, stat, state } from "./page.js";

const FIGURES = [
  ["spent", "spent so far"],
  ["per_1m_tokens", "per 1M tokens"],
  ["lost", "lost to badput"],
  ["to_finish", "to finish"],
  ["projected", "projected in all"],
  ["plan", "planned (--plan-hours)"],
];

export function moneyText(value, currency) {
  if (!Number.isFinite(value)) return "n/a";
  if (Math.abs(value) >= 1) return `${value.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })} ${currency}`;
  return `${Number(value.toPrecision(3))} ${currency}`;
}

function figureStat(key, title, figure) {
  const value = figure && "value" in figure ? moneyText(figure.value, figure.unit) : "n/a";
  return stat(title, `money.${key}`, value, figure && figure.absent ? figure.absent : null);
}

function lostRows(split) {
  const rows = Object.entries(split || {})
    .filter(([, e]) => !e.productive && "value" in e && e.inputs && e.inputs.seconds > 0)
    .sort((a, b) => b[1].value - a[1].value)
    .map(([part, e]) => el("tr", { "data-part": part }, el("td", {}, part.replaceAll("_", " ")),
      el("td", { class: "num" }, moneyText(e.value, e.unit)),
      el("td", { class: "num muted" }, `${Number(e.inputs.seconds.toPrecision(3))} s`)));
  if (!rows.length) return null;
  const head = el("tr", {}, el("th", {}, "lost to each part of the time split"), el("th", {}, ""), el("th", {}, "wall time"));
  return el("table", { id: "money-lost" }, head, ...rows);
}

export function renderMoney() {
  const doc = (state.doc && state.doc.money) || {};
  const body = $("money-body");
  if (!body) return;
  if (!doc.figures) {
    setText($("money-sub"), `n/a: ${doc.absent || "no price given"}`);
    body.replaceChildren();
    return;
  }
  setText($("money-sub"), `${doc.price.words}${doc.scope ? ` · for ${doc.scope}` : ""}`);
  const stats = el("div", { class: "stats" }, ...FIGURES.map(([key, title]) => figureStat(key, title, doc.figures[key])));
  body.replaceChildren(stats, ...[lostRows(doc.split)].filter(Boolean));
}
