// The dashboard's parts drawn from the page's state, and the controls every copy of the page shares: the theme, the
// x axis, the model card and the tooltips. The live dashboard (app.js) and a report file (report.js) differ only in
// where their state comes from; nothing here knows which one it serves.

import { $, charts, hideTip, onFocus, onPointer, state } from "./page.js";
import { remember } from "./prefs.js";
import { renderAxisButtons, renderConnection, renderHeader, renderProgress, renderTiles, renderTraining } from "./parts.js";
import { renderAlerts, renderEfficiency, renderGpus, renderNode } from "./panels.js";
import { renderJob } from "./job.js";
import { renderMoney } from "./money.js";
import { renderCommunication } from "./communication.js";
import { renderProfile } from "./profile.js";
import { setupTheme } from "./theme.js";

// Every part, now (printing needs the charts redrawn before the page is laid out on paper).
export function renderNow() {
  if (!state.doc) return;
  renderHeader();
  renderConnection();
  renderProgress();
  renderMoney();
  renderTiles();
  renderAxisButtons();
  renderTraining();
  renderJob();
  renderCommunication();
  renderEfficiency();
  renderNode();
  renderGpus();
  renderProfile();
  renderAlerts();
}

// Every part, at the next frame: many changes in one frame draw once.
export function render() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => {
    state.renderQueued = false;
    renderNow();
  });
}

// The controls. ``onAxis(axis)`` brings the series on the chosen axis; ``onModelCard()`` the passport, once opened.
export function startPage({ onAxis, onModelCard }) {
  setupTheme($("theme-toggle"), () => {
    for (const chart of charts.values()) chart.draw();
    renderNow();
  });
  for (const button of document.querySelectorAll("#x-axis button")) {
    button.addEventListener("click", () => {
      if (button.dataset.axis === state.axis) return;
      state.axis = button.dataset.axis;
      remember("tm-axis", state.axis);
      onAxis(state.axis);
    });
  }
  $("model-card").addEventListener("toggle", () => {
    if ($("model-card").open) onModelCard();
  });
  $("copy-passport").addEventListener("click", async () => {
    const text = state.passport && state.passport.markdown;
    if (!text) return;
    try {
      await navigator.clipboard.writeText(text);
      $("copy-state").textContent = "copied";
    } catch (err) {
      $("copy-state").textContent = "the browser refused the clipboard: select the text instead";
    }
  });
  document.addEventListener("mouseover", onPointer);
  document.addEventListener("focusin", onFocus);
  document.addEventListener("focusout", hideTip);
  document.addEventListener("scroll", hideTip, { passive: true });
}
