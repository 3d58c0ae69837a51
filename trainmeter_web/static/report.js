// A report file (tm report): the dashboard's page with the run's documents carried in the file itself. The same parts
// draw it as on the live page (render.js); only where the state comes from differs. Each series is carried on every
// x axis (source.js pointsOn reads it), at most the page's resolution.

import { clock } from "./format.js";
import { $, axisAvailable, AXES, charts, state } from "./page.js";
import { renderDetails, renderPassport } from "./panels.js";
import { renderNow, startPage } from "./render.js";
import { answerFrom, carried, pointsOn } from "./source.js";

const data = carried();

function seriesOn(axis) {
  const out = {};
  for (const [name, entry] of Object.entries(data.series || {})) {
    const points = pointsOn(entry, axis);
    if (points && points.length) out[name] = points;
  }
  return out;
}

// What the live page would have fetched, answered from the file: the run, its passport, a series on another axis.
function answer(path) {
  const url = new URL(path, "https://report.invalid/");
  if (url.pathname === "/api/run") return data.run;
  if (url.pathname === "/api/passport") return data.passport;
  if (url.pathname === "/api/history") {
    const axis = url.searchParams.get("x") || "step";
    const series = {};
    for (const name of url.searchParams.getAll("series")) {
      const entry = data.series[name];
      const points = entry ? pointsOn(entry, axis) : null;
      if (points) series[name] = points;
    }
    return { x_axis: axis, series };
  }
  return null;
}

function showAxis(axis) {
  state.series = seriesOn(axis);
  for (const chart of charts.values()) chart.remove();
  charts.clear();
  renderNow();
}

function init() {
  // Without scripts the reader saw the file's static view (report_static.py); the dashboard takes its place.
  $("static-view")?.remove();
  document.documentElement.classList.remove("static");
  answerFrom(answer);
  state.doc = data.doc;
  state.run = data.run;
  state.passport = data.passport;
  state.connected = true;
  state.asOf = `report written ${clock(data.written_wall)}`;
  // An axis this run cannot offer (FLOPs without a convention) would leave every chart empty: steps instead.
  if (!(state.axis in AXES) || axisAvailable(state.axis)) state.axis = "step";
  state.series = seriesOn(state.axis);
  // A report is read whole (and printed): the run details and the model card start open.
  $("details").open = true;
  $("model-card").open = true;
  startPage({ onAxis: showAxis, onModelCard: renderPassport });
  renderDetails();
  renderPassport();
  renderNow();
}

init();
