// Where the page's documents come from: the dashboard's JSON API, or, in a file written by tm report or tm compare,
// the answers the file carries in its own <script type="application/json" id="tm-data"> (it never uses the network).
// Every part of the page asks through getJson, so a part reads the same document served or carried.

let offline = null;

// The document a file carries, or null on a page the dashboard serves.
export function carried() {
  const node = document.getElementById("tm-data");
  return node ? JSON.parse(node.textContent) : null;
}

// From now on every question is answered by answer(path) (a file's own data) instead of the server.
export function answerFrom(answer) {
  offline = answer;
}

export function isOffline() {
  return offline !== null;
}

export async function getJson(path) {
  if (offline) return offline(path);
  const response = await fetch(path, { credentials: "same-origin" });
  return response.ok ? response.json() : null;
}

// The points of one carried series on one axis, as the history API gives them: [[x, value, min, max, count], ...].
// A file carries each series' values once with one x column per axis (tm report, tm compare); an axis whose points
// are other ones carries its own columns; min, max and count are left out where they are the value and 1.
export function pointsOn(entry, axis) {
  const own = entry.own && entry.own[axis];
  const cols = own || entry;
  const xs = own ? own.x : entry.x && entry.x[axis];
  if (!xs) return null;
  return xs.map((x, i) => [
    x,
    cols.v[i],
    cols.lo ? cols.lo[i] : cols.v[i],
    cols.hi ? cols.hi[i] : cols.v[i],
    cols.n ? cols.n[i] : 1,
  ]);
}
