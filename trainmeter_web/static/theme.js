// Light and dark: the reader's saved choice, else their system's preference. Printing always uses the light theme
// (dark ink on white paper), and goes back to the chosen one afterwards; ``onChange`` redraws what a theme colours.

import { remember, remembered } from "./prefs.js";

export function currentTheme() {
  return document.documentElement.dataset.theme;
}

export function setupTheme(button, onChange) {
  const apply = (theme) => {
    document.documentElement.dataset.theme = theme;
    button.textContent = theme === "dark" ? "Light theme" : "Dark theme";
    onChange();
  };
  const prefersDark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  let chosen = remembered("tm-theme") || (prefersDark ? "dark" : "light");
  apply(chosen);
  button.addEventListener("click", () => {
    chosen = currentTheme() === "dark" ? "light" : "dark";
    remember("tm-theme", chosen);
    apply(chosen);
  });
  const toPaper = () => {
    if (currentTheme() !== "light") apply("light");
  };
  const back = () => {
    if (currentTheme() !== chosen) apply(chosen);
  };
  window.addEventListener("beforeprint", toPaper);
  window.addEventListener("afterprint", back);
  const print = window.matchMedia ? window.matchMedia("print") : null;
  if (print && print.addEventListener) print.addEventListener("change", (e) => (e.matches ? toPaper() : back()));
}
