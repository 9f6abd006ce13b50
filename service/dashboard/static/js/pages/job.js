// One job: status, the per-task table and the best-latency curves, updated live.
//
// Reads GET /jobs/{id} (status, tasks) and GET /jobs/{id}/history?after=<last record id> (only
// what is new since the last poll) every POLL_MS while the job is queued or running.
// Marks "tunehub:task-table" and "tunehub:plot" (Performance API) when the table and the curves
// are first filled: bench/bench_dashboard.py reads them.

import { api, ApiError, AuthError, download } from "../api.js";
import { stepChart, taskColor } from "../charts.js";
import { badge, errorBox, fill, h, progress, stat, table } from "../dom.js";
import * as fmt from "../format.js";
import { JobHistory, overallSeries, taskSeries } from "../history.js";
import { poll } from "../poll.js";

const ACTIVE = new Set(["queued", "running"]);
const POLL_MS = 2000;

export function mount(view, { jobId }, app) {
  const head = h("div", { class: "page-head" });
  const problem = h("div");
  const summary = h("div", { class: "stats", id: "job-summary" });
  const taskBox = h("div", { id: "task-table" });
  const grid = h("div", { class: "chart-grid" });
  const chartsBox = h("section", { class: "card", id: "charts" },
    h("h2", {}, "Best latency so far"), grid);
  view.append(head, problem, summary,
    h("section", { class: "card" }, h("h2", {}, "Tasks"), taskBox), chartsBox);

  const history = new JobHistory();
  const names = { models: new Map(), targets: new Map() };
  let job = null;
  let charts = null;
  let chartTasks = "";
  let finalRead = false;
  let focused = null;

  async function readHistory() {
    do {
      history.apply(await api(`/jobs/${jobId}/history?after=${history.lastId}`));
    } while (history.more);
  }

  async function loadNames() {
    const [models, targets] = await Promise.all([api("/models"), api("/targets")]);
    for (const m of models.data) names.models.set(m.id, m.filename);
    for (const t of targets.data) names.targets.set(t.key, t.description);
    if (job) renderHead();
  }

  function renderHead() {
    const model = job.model_id === null ? fmt.DASH : names.models.get(job.model_id) ?? `model ${job.model_id}`;
    const target = names.targets.get(job.target_key) ?? job.target_key ?? fmt.DASH;
    const actions = [];
    if (ACTIVE.has(job.status)) {
      actions.push(h("button", { type: "button", class: "secondary", onclick: cancel }, "Cancel job"));
    }
    if (job.artifact) {
      actions.push(
        h("button", { type: "button", onclick: () => fetchFile("artifacts/model.so", `job-${job.id}-model.so`) }, "Download model.so"),
        h("button", { type: "button", class: "secondary", onclick: () => fetchFile("artifacts/manifest.json", `job-${job.id}-manifest.json`) }, "manifest.json"));
    } else if (job.preview) {
      // The zero-trial build a worker published while the job tunes (verified, not tuned).
      actions.push(
        h("button", { type: "button", class: "secondary", title: "library peers and TVM's default schedules, verified; the tuned library replaces it when the job ends",
          onclick: () => fetchFile("artifacts/preview/model.so", `job-${job.id}-preview-model.so`) }, "Download zero-trial preview"));
    }
    fill(head,
      h("div", {},
        h("h1", {}, `Job ${job.id} `, badge(job.status)),
        h("div", { class: "muted" }, model, " · ", target, " · priority ", String(job.priority))),
      h("div", { class: "actions" }, actions));
  }

  function renderSummary() {
    const measured = job.measured_latency_ms;
    const failedNote = history.trials ? `${fmt.count(history.failed)} failed` : "";
    fill(summary,
      stat("Trials", progress(job.trials_done, job.trial_budget), { title: "measured candidates / budget" }),
      stat("Estimated latency", fmt.ms(job.estimated_latency_ms),
        { title: "sum over tasks of weight x best latency (all tasks measured)" }),
      stat("Measured latency", fmt.ms(measured), { title: "median of the verified library" }),
      stat("Speedup vs untuned", fmt.ratio(job.untuned_latency_ms, measured),
        { title: "untuned build latency / measured latency: jobs do not time the untuned build" }),
      stat(`Speedup vs ${job.reference_framework === "torch" ? "torch" : "ONNX Runtime"}`,
        fmt.ratio(job.reference_latency_ms, measured), {
          title: job.reference_latency_ms
            ? `reference ${fmt.ms(job.reference_latency_ms)} / measured ${fmt.ms(measured)}`
            : "reference framework latency / measured latency, once the library is published",
        }),
      stat("Candidates", h("span", {}, fmt.count(history.trials), " ", h("small", { class: "muted" }, failedNote)),
        { title: "this job's records: distinct schedules measured" }),
      stat("Worker", job.worker ?? fmt.DASH),
      stat("Elapsed", fmt.duration(fmt.elapsed(job.started_at, job.finished_at)),
        { title: `created ${fmt.datetime(job.created_at)}` }));
    if (job.error) summary.append(h("div", { class: "error wide" }, job.error));
  }

  function renderTasks() {
    const total = job.estimated_latency_ms;
    const rows = job.tasks.map((t, i) => ({ ...t, index: i }));
    const columns = [
      { label: "Task", cell: (t) => [h("span", { class: "swatch", style: { background: taskColor(t.index) } }), t.name] },
      { label: "FLOPs", class: "num", cell: (t) => fmt.flops(t.flops) },
      { label: "Weight", class: "num", cell: (t) => String(t.weight) },
      { label: "GFLOP/s", class: "num", cell: (t) => fmt.gflops(t.flops, t.best_latency_ms) },
      { label: "Latency", class: "num", title: "best latency of one call", cell: (t) => fmt.ms(t.best_latency_ms) },
      {
        label: "Weighted", class: "num", title: "weight x latency (share of the estimate)",
        cell: (t) => {
          if (t.best_latency_ms === null) return fmt.DASH;
          const weighted = t.weight * t.best_latency_ms;
          const share = total ? ` (${((100 * weighted) / total).toFixed(0)} %)` : "";
          return `${fmt.ms(weighted)}${share}`;
        },
      },
      { label: "Trials", class: "num", title: "candidates measured for this task", cell: (t) => fmt.count(t.trials_done) },
      {
        label: "Done", cell: (t) => (t.trial_budget === 0 && t.status === "succeeded"
          ? h("span", { class: "badge badge-reused" }, "reused") : badge(t.status)),
      },
    ];
    fill(taskBox, table(columns, rows, {
      empty: job.status === "queued" ? "the tasks appear when a worker starts the job" : "no tasks",
      attrs: { class: "tasks" },
      rowAttrs: (t) => ({
        dataset: { workloadId: String(t.workload_id) },
        onmouseenter: () => focusTask(t.index),
        onmouseleave: () => focusTask(null),
      }),
    }));
  }

  function focusTask(index) {
    focused = index;
    if (charts) for (const c of charts.perTask) c.focus(index);
  }

  function ensureCharts() {
    const key = job.tasks.map((t) => t.workload_id).join(",");
    if (charts && key === chartTasks) return;
    if (charts) for (const c of [...charts.overall, ...charts.perTask]) c.destroy();
    grid.replaceChildren();
    chartTasks = key;
    const overall = [{ label: "estimate", color: "#222" }];
    const perTask = job.tasks.map((t, i) => ({ label: t.name, color: taskColor(i) }));
    charts = {
      overall: [
        stepChart(grid, { title: "Estimated model latency vs trials", axis: "trial", series: overall, legend: false }),
        stepChart(grid, { title: "Estimated model latency vs time", axis: "time", series: overall, legend: false }),
      ],
      perTask: [
        stepChart(grid, { title: "Per task vs trials", axis: "trial", series: perTask, legend: false }),
        stepChart(grid, { title: "Per task vs time", axis: "time", series: perTask, legend: false }),
      ],
    };
  }

  function renderCharts() {
    ensureCharts();
    const ids = job.tasks.map((t) => t.workload_id);
    const overall = overallSeries(history, job.tasks, "trial");
    charts.overall[0].update(overall);
    charts.overall[1].update(overallSeries(history, job.tasks, "time"));
    charts.perTask[0].update(taskSeries(history, ids, "trial"));
    charts.perTask[1].update(taskSeries(history, ids, "time"));
    if (focused !== null) focusTask(focused);
    Object.assign(chartsBox.dataset, {
      trials: String(history.trials), points: String(history.points.length), lastId: String(history.lastId),
      estimate: String(overall[1].at(-1) ?? ""),
    });
  }

  function mark(name) {
    if (!performance.getEntriesByName(name).length) performance.mark(name);
  }

  async function step() {
    const [detail] = await Promise.all([api(`/jobs/${jobId}`), readHistory()]);
    job = detail;
    fill(problem);
    renderHead();
    renderSummary();
    renderTasks();
    mark("tunehub:task-table");
    renderCharts();
    mark("tunehub:plot");
    if (ACTIVE.has(job.status)) return true;
    if (finalRead) return false;
    finalRead = true; // one more read: records committed just before the final status
    return true;
  }

  async function cancel() {
    if (!confirm(`Cancel job ${job.id}?`)) return;
    try {
      job = await api(`/jobs/${jobId}/cancel`, { method: "POST" });
      renderHead();
      renderSummary();
    } catch (error) {
      fill(problem, errorBox(error));
    }
  }

  async function fetchFile(path, filename) {
    try {
      await download(`/jobs/${jobId}/${path}`, filename);
    } catch (error) {
      fill(problem, errorBox(error));
    }
  }

  const stop = poll(step, POLL_MS, (error) => {
    if (error instanceof AuthError) {
      app.signIn(error.message);
      return false;
    }
    fill(problem, errorBox(error));
    return !(error instanceof ApiError && error.status === 404);
  });
  loadNames().catch(() => {}); // names are a nicety: the ids stay shown without them
  return () => {
    stop();
    if (charts) for (const c of [...charts.overall, ...charts.perTask]) c.destroy();
  };
}
