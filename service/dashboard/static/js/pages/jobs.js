// Your jobs, newest first: status, model, target, progress, latencies and speedups.
//
// GET /jobs gives a page of jobs; the latencies come from each job's GET /jobs/{id}, read once
// for a finished job and on every poll for a queued or running one.

import { api, AuthError } from "../api.js";
import { badge, errorBox, fill, h, progress, table } from "../dom.js";
import * as fmt from "../format.js";
import { poll } from "../poll.js";

const PAGE = 20;
const POLL_MS = 3000;
const ACTIVE = new Set(["queued", "running"]);
const FINAL = new Set(["succeeded", "failed", "cancelled"]);

export function mount(view, _params, app) {
  const problem = h("div");
  const status = h("select", { id: "status-filter", "aria-label": "status" },
    ["", "queued", "running", "succeeded", "failed", "cancelled"].map((s) =>
      h("option", { value: s }, s || "all statuses")));
  const pager = h("div", { class: "pager" });
  const body = h("div", { id: "jobs-table" });
  view.append(
    h("div", { class: "page-head" }, h("h1", {}, "Jobs"),
      h("div", { class: "actions" }, status, app.link("/dashboard/models", h("span", { class: "button" }, "Upload a model")))),
    problem,
    h("section", { class: "card" }, body, pager));

  let offset = 0;
  let total = 0;
  const details = new Map(); // job id -> JobDetail (finished ones never change)
  const names = { models: new Map(), targets: new Map() };

  async function loadNames() {
    const [models, targets] = await Promise.all([api("/models"), api("/targets")]);
    names.models = new Map(models.data.map((m) => [m.id, m.filename]));
    names.targets = new Map(targets.data.map((t) => [t.key, t.description]));
  }

  function render(jobs) {
    const columns = [
      { label: "Job", cell: (j) => app.link(`/dashboard/jobs/${j.id}`, `#${j.id}`) },
      { label: "Status", cell: (j) => badge(j.status) },
      { label: "Model", cell: (j) => (j.model_id === null ? fmt.DASH : names.models.get(j.model_id) ?? `model ${j.model_id}`) },
      { label: "Target", cell: (j) => names.targets.get(j.target_key) ?? j.target_key ?? fmt.DASH },
      { label: "Progress", cell: (j) => progress(j.trials_done, j.trial_budget) },
      { label: "Est. latency", class: "num", title: "sum of weight x best latency over the tasks", cell: (j) => fmt.ms(details.get(j.id)?.estimated_latency_ms) },
      { label: "Measured", class: "num", title: "median latency of the verified library", cell: (j) => fmt.ms(details.get(j.id)?.measured_latency_ms) },
      { label: "vs untuned", class: "num", title: "jobs do not time the untuned build", cell: (j) => speedup(details.get(j.id), "untuned_latency_ms") },
      {
        label: "vs ONNX Runtime", class: "num", title: "reference framework latency / measured latency",
        cell: (j) => {
          const detail = details.get(j.id);
          const value = speedup(detail, "reference_latency_ms");
          return detail?.reference_framework === "torch" && value !== fmt.DASH ? `${value} (torch)` : value;
        },
      },
      { label: "Created", cell: (j) => fmt.datetime(j.created_at) },
      { label: "Duration", class: "num", cell: (j) => fmt.duration(fmt.elapsed(j.started_at, j.finished_at)) },
    ];
    fill(body, table(columns, jobs, {
      empty: "no jobs yet: upload a model and start one",
      attrs: { class: "jobs" },
      rowAttrs: (j) => ({ dataset: { jobId: String(j.id) } }),
    }));
    const prev = h("button", { type: "button", class: "secondary", disabled: offset === 0, onclick: () => move(-PAGE) }, "Newer");
    const next = h("button", { type: "button", class: "secondary", disabled: offset + PAGE >= total, onclick: () => move(PAGE) }, "Older");
    fill(pager, prev, h("span", { class: "muted" }, total ? `${offset + 1}–${Math.min(total, offset + PAGE)} of ${total}` : ""), next);
  }

  function speedup(detail, field) {
    return fmt.ratio(detail?.[field], detail?.measured_latency_ms);
  }

  async function step() {
    const query = new URLSearchParams({ limit: PAGE, offset });
    if (status.value) query.set("status", status.value);
    const page = await api(`/jobs?${query}`);
    total = page.count;
    const stale = page.data.filter((j) => !FINAL.has(details.get(j.id)?.status) || ACTIVE.has(j.status));
    await Promise.all(stale.map(async (j) => details.set(j.id, await api(`/jobs/${j.id}`))));
    fill(problem);
    render(page.data);
  }

  let stop = () => {};
  function restart() {
    stop();
    stop = poll(step, POLL_MS, (error) => {
      if (error instanceof AuthError) {
        app.signIn(error.message);
        return false;
      }
      fill(problem, errorBox(error));
      return true;
    });
  }
  function move(delta) {
    offset = Math.max(0, offset + delta);
    restart();
  }
  status.addEventListener("change", () => {
    offset = 0;
    restart();
  });
  loadNames().then(restart, (error) => {
    if (error instanceof AuthError) app.signIn(error.message);
    else {
      fill(problem, errorBox(error));
      restart();
    }
  });
  return () => stop();
}
