// Entry point: theme, the two views (/ chat, /dashboard) switched without reloading (so a reply
// keeps streaming while the dashboard is shown), and an API key from the URL hash.
"use strict";

import { Chat } from "./chat.js";
import { Dashboard } from "./dashboard.js";
import { Store } from "./store.js";

const $ = (id) => document.getElementById(id);
const store = new Store();

// ---- theme: follows prefers-color-scheme until the toggle picks one ---------------------------
const darkQuery = matchMedia("(prefers-color-scheme: dark)");

function effectiveTheme() {
  return Store.theme() || (darkQuery.matches ? "dark" : "light");
}

function applyTheme() {
  const chosen = Store.theme();
  if (chosen) document.documentElement.dataset.theme = chosen;
  else delete document.documentElement.dataset.theme;
  const t = $("theme-toggle");
  t.title = `Theme: ${chosen || "system"} (click for ${effectiveTheme() === "dark" ? "light" : "dark"})`;
  t.setAttribute("aria-pressed", String(effectiveTheme() === "dark"));
  dashboard?.themeChanged();
}

// ---- API key from the URL hash (#api_key=…): kept in settings, then removed from the URL ------
function takeKeyFromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("api_key");
  if (key === null) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return key;
}

const hashKey = takeKeyFromHash();
if (hashKey !== null) store.saveSettings({ api_key: hashKey });

const chat = new Chat(store);
const dashboard = new Dashboard(store);
applyTheme();

$("theme-toggle").onclick = () => {
  Store.setTheme(effectiveTheme() === "dark" ? "light" : "dark");
  applyTheme();
};
darkQuery.addEventListener("change", applyTheme);
$("set-api_key").addEventListener("change", () => dashboard.restart());

// ---- views ------------------------------------------------------------------------------------
function viewOf(path) {
  return path.replace(/\/+$/, "") === "/dashboard" ? "dashboard" : "chat";
}

function show(view) {
  $("view-chat").hidden = view !== "chat";
  $("view-dashboard").hidden = view !== "dashboard";
  for (const a of document.querySelectorAll(".tabs a")) {
    a.setAttribute("aria-selected", String(a.dataset.view === view));
  }
  document.title = view === "dashboard" ? "brook · dashboard" : "brook · chat";
  document.body.dataset.view = view;
  if (view === "dashboard") dashboard.show();
  else dashboard.hide();
}

for (const a of document.querySelectorAll(".tabs a")) {
  a.addEventListener("click", (e) => {
    if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return; // new tab: let it load
    e.preventDefault();
    if (viewOf(location.pathname) !== a.dataset.view) history.pushState(null, "", a.getAttribute("href"));
    show(a.dataset.view);
  });
}
window.addEventListener("popstate", () => show(viewOf(location.pathname)));

$("menu-toggle").onclick = () => document.body.classList.toggle("sidebar-open");
$("settings-toggle").onclick = () => document.body.classList.toggle("settings-open");
$("settings-close").onclick = () => document.body.classList.remove("settings-open");
$("sidebar-scrim").onclick = () => document.body.classList.remove("sidebar-open", "settings-open");

// uPlot loads with `defer`, before this module runs; build charts if the dashboard is first.
show(viewOf(location.pathname));

// For the browser test and for debugging from the console; read-only views of the state.
window.brook = { store, chat, dashboard };
