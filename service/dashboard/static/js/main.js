// The dashboard's shell: client-side routes, navigation, and asking for the API token.
//
// Each page module exports mount(view, params, app) and returns a cleanup function (timers,
// charts). `app` gives pages navigate(path), link(href, ...children) and signIn(message).

import { adoptTokenFromFragment, api, AuthError, forgetToken, getToken, setToken } from "./api.js";
import { errorBox, fill, h } from "./dom.js";

const ROUTES = [
  { path: /^\/dashboard\/?$/, section: "jobs", page: () => import("./pages/jobs.js") },
  {
    path: /^\/dashboard\/jobs\/(\d+)$/, section: "jobs", page: () => import("./pages/job.js"),
    params: (m) => ({ jobId: Number(m[1]) }),
  },
  { path: /^\/dashboard\/models$/, section: "models", page: () => import("./pages/models.js") },
  { path: /^\/dashboard\/workers$/, section: "workers", page: () => import("./pages/workers.js") },
  { path: /^\/dashboard\/stats$/, section: "stats", page: () => import("./pages/stats.js") },
];

const view = document.getElementById("view");
let cleanup = () => {};
let generation = 0;

const app = {
  navigate(path) {
    if (path !== location.pathname) history.pushState(null, "", path);
    render();
  },
  link(href, ...children) {
    return h("a", { href, "data-nav": true }, ...children);
  },
  signIn(message) {
    showSignIn(message);
  },
};

function showSignIn(message) {
  cleanup();
  cleanup = () => {};
  document.getElementById("sign-out").hidden = true;
  const input = h("input", {
    type: "password", id: "token-input", name: "token", autocomplete: "off", required: true,
    placeholder: "API token", "aria-label": "API token",
  });
  const problem = h("div");
  const form = h("form", { class: "card sign-in", id: "sign-in" },
    h("h1", {}, "Sign in"),
    h("p", {}, "The dashboard reads the TuneHub API with your API token. ",
      "It stays in this browser (localStorage) and is sent only to this server."),
    h("p", { class: "muted" }, "Make one with ", h("code", {}, "tunehub token create --name you"),
      "; on the embedded default, ", h("code", {}, "tunehub serve"), " keeps one in ",
      h("code", {}, "$TUNEHUB_HOME/token"), "."),
    message ? errorBox(new Error(message)) : null,
    h("div", { class: "row" }, input, h("button", { type: "submit" }, "Use token")),
    problem);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    setToken(input.value);
    try {
      await api("/jobs?limit=1");
      render();
    } catch (error) {
      forgetToken();
      fill(problem, errorBox(error instanceof AuthError ? new Error(`token refused: ${error.message}`) : error));
    }
  });
  fill(view, form);
  input.focus();
}

async function render() {
  const mine = ++generation;
  cleanup();
  cleanup = () => {};
  const route = ROUTES.find((r) => r.path.test(location.pathname));
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", route !== undefined && a.dataset.section === route.section);
  }
  if (!route) {
    fill(view, h("div", { class: "card" }, h("h1", {}, "Not found"), app.link("/dashboard/", "Jobs")));
    return;
  }
  if (!getToken()) {
    showSignIn();
    return;
  }
  document.getElementById("sign-out").hidden = false;
  const module = await route.page();
  if (mine !== generation) return; // navigated again meanwhile
  fill(view);
  const params = route.params ? route.params(route.path.exec(location.pathname)) : {};
  cleanup = module.mount(view, params, app) || (() => {});
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-nav]");
  if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
  event.preventDefault();
  app.navigate(new URL(link.href).pathname);
});
window.addEventListener("popstate", render);
document.getElementById("sign-out").addEventListener("click", () => {
  forgetToken();
  showSignIn();
});

adoptTokenFromFragment();
render();
