// Models: upload one (POST /models), see their tuning tasks, start a tuning job (POST /jobs).

import { api, AuthError } from "../api.js";
import { errorBox, fill, h, table } from "../dom.js";
import * as fmt from "../format.js";

export function mount(view, _params, app) {
  const problem = h("div");
  const file = h("input", { type: "file", id: "model-file", name: "file", accept: ".onnx,.pt2", required: true });
  const uploadButton = h("button", { type: "submit", id: "upload-button" }, "Upload");
  const buckets = h("input", { type: "text", id: "model-buckets", name: "buckets", maxlength: 1000,
    placeholder: "seq=16,64,128", title: "shape buckets of symbolic dimensions: NAME=V1,V2,... or a histogram of expected sizes NAME~SIZE:COUNT,...[/BUCKETS], separated by ';'" });
  const uploadNote = h("div", { class: "muted", id: "upload-note" });
  const upload = h("form", { class: "card", id: "upload-form" },
    h("h2", {}, "Upload a model"),
    h("p", { class: "muted" }, "An ONNX file or a torch.export program saved as .pt2. ",
      "The server validates it and splits it into tuning tasks. A model with symbolic ",
      "dimensions is compiled once per shape bucket (default: powers of two from 16 to 128)."),
    h("div", { class: "row" }, file, uploadButton),
    h("label", {}, "Shape buckets (optional)", buckets), uploadNote);

  const modelSelect = h("select", { id: "job-model", name: "model_id", required: true });
  const budget = h("input", { type: "number", id: "job-budget", name: "trial_budget", min: 0, max: 1000000, value: 64, required: true });
  const targetSelect = h("select", { id: "job-target", name: "target" }, h("option", { value: "cpu" }, "cpu (this server's CPU)"));
  const priority = h("input", { type: "number", id: "job-priority", name: "priority", min: -1000, max: 1000, value: 0 });
  const start = h("form", { class: "card", id: "job-form" },
    h("h2", {}, "Start a tuning job"),
    h("div", { class: "form-grid" },
      h("label", {}, "Model", modelSelect),
      h("label", {}, "Trial budget", budget),
      h("label", {}, "Target", targetSelect),
      h("label", {}, "Priority", priority)),
    h("div", { class: "row" }, h("button", { type: "submit", id: "start-job" }, "Start job")));

  const list = h("div", { id: "models-table" });
  const detail = h("div", { id: "model-detail" });
  view.append(h("div", { class: "page-head" }, h("h1", {}, "Models")), problem,
    h("div", { class: "two-col" }, upload, start),
    h("section", { class: "card" }, h("h2", {}, "Your models"), list), detail);

  function fail(error) {
    if (error instanceof AuthError) app.signIn(error.message);
    else fill(problem, errorBox(error));
  }

  async function refresh(selectId) {
    const [models, targets] = await Promise.all([api("/models"), api("/targets")]);
    const chosen = selectId ?? Number(modelSelect.value);
    fill(modelSelect, models.data.map((m) =>
      h("option", { value: m.id, selected: m.id === chosen }, `#${m.id} ${m.filename}`)));
    const target = targetSelect.value;
    fill(targetSelect, h("option", { value: "cpu" }, "cpu (this server's CPU)"),
      targets.data.map((t) => h("option", { value: t.key, selected: t.key === target }, `${t.key} ${t.description}`)));
    const columns = [
      { label: "Model", cell: (m) => `#${m.id}` },
      { label: "File", cell: (m) => m.filename },
      { label: "Format", cell: (m) => m.format },
      { label: "Size", class: "num", cell: (m) => fmt.bytes(m.size) },
      { label: "sha256", cell: (m) => h("code", { title: m.sha256 }, m.sha256.slice(0, 12)) },
      { label: "Uploaded", cell: (m) => fmt.datetime(m.created_at) },
      {
        label: "", cell: (m) => h("div", { class: "actions" },
          h("button", { type: "button", class: "secondary", onclick: () => showTasks(m) }, "Tasks"),
          h("button", { type: "button", class: "secondary", onclick: () => { modelSelect.value = String(m.id); budget.focus(); } }, "Tune"),
          h("button", { type: "button", class: "secondary danger", onclick: () => remove(m) }, "Delete")),
      },
    ];
    fill(list, table(columns, models.data, {
      empty: "no models yet", attrs: { class: "models" },
      rowAttrs: (m) => ({ dataset: { modelId: String(m.id) } }),
    }));
  }

  async function showTasks(model) {
    try {
      const full = await api(`/models/${model.id}`);
      const columns = [
        { label: "Task", cell: (t) => t.name },
        { label: "Weight", class: "num", cell: (t) => String(t.weight) },
        { label: "FLOPs", class: "num", cell: (t) => fmt.flops(t.flops) },
        { label: "Workload", cell: (t) => h("code", {}, t.key) },
        { label: "Shapes", cell: (t) => t.summary },
      ];
      fill(detail, h("section", { class: "card" },
        h("h2", {}, `${full.filename}: ${full.tasks.length} tuning tasks`),
        full.buckets ? h("p", { class: "muted" }, `shape buckets: ${full.buckets.description}`) : null,
        table(columns, full.tasks)));
    } catch (error) {
      fail(error);
    }
  }

  async function remove(model) {
    if (!confirm(`Delete model #${model.id} ${model.filename}?`)) return;
    try {
      await api(`/models/${model.id}`, { method: "DELETE" });
      fill(detail);
      await refresh();
    } catch (error) {
      fail(error);
    }
  }

  upload.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files.length) return;
    const body = new FormData();
    body.append("file", file.files[0]);
    if (buckets.value.trim()) body.append("buckets", buckets.value.trim());
    uploadButton.disabled = true;
    fill(uploadNote, `uploading and validating ${file.files[0].name}…`);
    try {
      const model = await api("/models", { method: "POST", body });
      const shapes = model.buckets ? `, shape buckets ${model.buckets.description}` : "";
      fill(uploadNote, `model #${model.id}: ${model.tasks.length} tuning tasks${shapes}`);
      fill(problem);
      upload.reset();
      await refresh(model.id);
      showTasks(model);
    } catch (error) {
      fill(uploadNote);
      fail(error);
    } finally {
      uploadButton.disabled = false;
    }
  });

  start.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const job = await api("/jobs", {
        method: "POST",
        json: {
          model_id: Number(modelSelect.value),
          trial_budget: Number(budget.value),
          target: targetSelect.value,
          priority: Number(priority.value || 0),
        },
      });
      app.navigate(`/dashboard/jobs/${job.id}`);
    } catch (error) {
      fail(error);
    }
  });

  refresh().catch(fail);
  return () => {};
}
