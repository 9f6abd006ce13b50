// Workers: hardware, status, last heartbeat, current job or lease.
//
// Shows what GET /workers returns: the known fields in their own columns, any other field the
// API adds in "More" (so a newer API shows up without a dashboard change). A worker's current
// job comes from the worker's current lease (``current_lease`` in GET /workers) when it holds one,
// otherwise from your running jobs (GET /jobs?status=running), matched on the job's worker name.

import { api, AuthError } from "../api.js";
import { badge, errorBox, fill, h, table } from "../dom.js";
import * as fmt from "../format.js";
import { poll } from "../poll.js";

const POLL_MS = 5000;
const SHOWN = new Set(["id", "name", "status", "target_id", "target_key", "hardware", "fingerprint",
  "last_heartbeat", "current_job_id", "job_id", "lease", "current_lease", "lease_expires_at",
  "created_at"]);

export function mount(view, _params, app) {
  const problem = h("div");
  const body = h("div", { id: "workers-table" });
  view.append(h("div", { class: "page-head" }, h("h1", {}, "Workers")), problem,
    h("section", { class: "card" }, body,
      h("p", { class: "muted" }, "Heartbeats use the database clock; ages use this browser's clock.")));

  function hardware(worker, targets) {
    const described = worker.hardware ?? worker.fingerprint;
    const target = targets.get(worker.target_id) ?? [...targets.values()].find((t) => t.key === worker.target_key);
    const parts = [];
    if (target) parts.push(target.description);
    if (described && typeof described === "object") {
      parts.push(Object.entries(described).map(([k, v]) => `${k}: ${v}`).join(", "));
    } else if (described) {
      parts.push(String(described));
    }
    return parts.length ? parts.join(" · ") : fmt.DASH;
  }

  function currentWork(worker, running) {
    const lease = worker.current_lease ?? worker.lease;
    const jobId = worker.current_job_id ?? worker.job_id ?? lease?.job_id;
    const job = jobId ?? running.get(worker.name);
    const pieces = [];
    if (job !== undefined && job !== null) pieces.push(app.link(`/dashboard/jobs/${job}`, `job #${job}`));
    if (lease && typeof lease === "object") {
      const what = [`${lease.kind ?? "lease"} lease #${lease.id ?? "?"}`];
      if (lease.kind === "tune") what.push(`${lease.trials_done ?? 0} / ${lease.trials ?? "?"} trials`);
      pieces.push(" ", h("span", { class: "muted" }, what.join(", ")));
    }
    const expires = lease?.expires_at ?? worker.lease_expires_at;
    if (expires) pieces.push(" ", h("span", { class: "muted" }, `lease until ${fmt.datetime(expires)}`));
    return pieces.length ? pieces : fmt.DASH;
  }

  function extra(worker) {
    const rest = Object.entries(worker).filter(([k]) => !SHOWN.has(k));
    if (!rest.length) return fmt.DASH;
    return rest.map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
  }

  async function step() {
    const [workers, targets, running] = await Promise.all([
      api("/workers"), api("/targets"), api("/jobs?status=running&limit=1000"),
    ]);
    const byId = new Map(targets.data.map((t) => [t.id, t]));
    const jobs = new Map(running.data.filter((j) => j.worker).map((j) => [j.worker, j.id]));
    const columns = [
      { label: "Worker", cell: (w) => w.name },
      { label: "Status", cell: (w) => badge(w.status) },
      { label: "Hardware", cell: (w) => hardware(w, byId) },
      { label: "Current job / lease", cell: (w) => currentWork(w, jobs) },
      { label: "Last heartbeat", cell: (w) => h("span", { title: fmt.datetime(w.last_heartbeat) }, fmt.ago(w.last_heartbeat)) },
      { label: "More", cell: (w) => extra(w) },
    ];
    fill(problem);
    fill(body, table(columns, workers.data, {
      empty: "no workers registered", attrs: { class: "workers" },
      rowAttrs: (w) => ({ dataset: { worker: w.name } }),
    }));
  }

  return poll(step, POLL_MS, (error) => {
    if (error instanceof AuthError) {
      app.signIn(error.message);
      return false;
    }
    fill(problem, errorBox(error));
    return true;
  });
}
