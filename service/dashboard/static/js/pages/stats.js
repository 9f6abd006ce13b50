// Database statistics (GET /stats): workloads, records per target, models, jobs by status.

import { api, AuthError } from "../api.js";
import { badge, errorBox, fill, h, stat, table } from "../dom.js";
import * as fmt from "../format.js";

export function mount(view, _params, app) {
  const problem = h("div");
  const body = h("div", { id: "stats" });
  const refreshButton = h("button", { type: "button", class: "secondary", onclick: () => load() }, "Refresh");
  view.append(h("div", { class: "page-head" }, h("h1", {}, "Tuning database"),
    h("div", { class: "actions" }, refreshButton)), problem, body);

  function cpu(fingerprintJson) {
    try {
      const fp = JSON.parse(fingerprintJson);
      return fp.gpu ?? [fp.cpu_model, fp.mcpu, fp.cores && `${fp.cores} cores`].filter(Boolean).join(" · ");
    } catch (_) {
      return fmt.DASH;
    }
  }

  async function load() {
    try {
      const s = await api("/stats");
      fill(problem);
      const perTarget = table([
        { label: "Target", cell: (t) => h("code", {}, t.key) },
        { label: "Kind", cell: (t) => t.kind },
        { label: "Hardware", cell: (t) => cpu(t.fingerprint_json) },
        { label: "TVM", cell: (t) => t.tvm_version },
        { label: "Workloads", class: "num", cell: (t) => fmt.count(t.workloads) },
        { label: "Valid records", class: "num", cell: (t) => fmt.count(t.records.valid) },
        { label: "Failed records", class: "num", cell: (t) => fmt.count(t.records.failed) },
      ], s.per_target, { empty: "no targets yet", attrs: { class: "per-target" } });
      const statuses = Object.entries(s.jobs_by_status);
      const byStatus = table([
        { label: "Status", cell: ([status]) => badge(status) },
        { label: "Jobs", class: "num", cell: ([, n]) => fmt.count(n) },
      ], statuses, { attrs: { class: "by-status" } });
      fill(body,
        h("div", { class: "stats" },
          stat("Records", fmt.count(s.records.valid + s.records.failed), { id: "stat-records" }),
          stat("Valid", fmt.count(s.records.valid)),
          stat("Failed", fmt.count(s.records.failed)),
          stat("Workloads", fmt.count(s.workloads)),
          stat("Targets", fmt.count(s.targets)),
          stat("Models", fmt.count(s.models)),
          stat("Jobs", fmt.count(s.jobs))),
        h("div", { class: "two-col wide-left" },
          h("section", { class: "card" }, h("h2", {}, "Records per target"), perTarget),
          h("section", { class: "card" }, h("h2", {}, "Jobs by status"), byStatus)),
        h("p", { class: "muted" }, "Schema revision ", h("code", {}, s.schema_revision ?? fmt.DASH)));
    } catch (error) {
      if (error instanceof AuthError) app.signIn(error.message);
      else fill(problem, errorBox(error));
    }
  }

  load();
  return () => {};
}
