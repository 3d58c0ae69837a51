// The reader's choices (theme, x axis, log scales), kept in localStorage where the browser allows it. A page opened
// from a file in a sandboxed viewer (a mail client, a CI artifact's preview) may refuse storage: then nothing is kept
// and nothing breaks.

export function remembered(key) {
  try {
    return window.localStorage.getItem(key);
  } catch (err) {
    return null;
  }
}

export function remember(key, value) {
  try {
    window.localStorage.setItem(key, value);
  } catch (err) {
    // storage refused: the choice lasts as long as the page
  }
}
