// New job: upload (or pick) a model, preview its tasks on the chosen target, and start tuning.

import { api } from "../api.js";
import { errorBox, fill, h, planTable, quantizationNote, skippedPassesNote } from "../dom.js";

export function submitPage(view) {
  view.append(h("h1", {}, "New tuning job"));
  const job = jobForm();
  const model = modelForm((chosen) => job.select(chosen));
  view.append(h("div", { class: "row" },
    h("div", { class: "card" }, h("h2", {}, "1. Model"), model.form, model.info),
    h("div", { class: "card" }, h("h2", {}, "2. Job"), job.form, h("h2", {}, "Tasks to tune"), job.preview)));
  return () => {};
}

// Step 1: upload a model file, or pick one uploaded before; onSelect gets the stored model.
function modelForm(onSelect) {
  const uploadError = h("div", {});
  const info = h("div", {});
  const shapes = h("textarea", { id: "input-shapes", rows: 2, placeholder: '{"x": [1, 3, 224, 224]}' });
  const values = h("textarea", { id: "input-values", rows: 2, placeholder: '{"axes": [0, 1], "k": 3}' });
  const file = h("input", { type: "file", id: "model-file", accept: ".onnx,.pt2,.jax,.mlir", required: true });
  const name = h("input", { type: "text", id: "model-name", placeholder: "default: the file name" });
  const existing = h("select", { id: "existing-model" }, h("option", { value: "" }, "— or pick an uploaded model —"));

  function select(model) {
    const tensorRows = (list, kind) => list.map((t) => h("tr", {}, h("td", {}, kind), h("td", {}, t.name), h("td", {}, `[${t.shape.join(", ")}]`), h("td", {}, t.dtype)));
    fill(info,
      h("div", { class: "notice", id: "model-ready" }, `Model “${model.name}” (${model.format}, ${(model.size_bytes / 1e6).toFixed(2)} MB, sha256 ${model.sha256.slice(0, 12)}) is ready.`),
      h("table", {}, h("thead", {}, h("tr", {}, ...["", "Name", "Shape", "Type"].map((t) => h("th", {}, t)))),
        h("tbody", {}, tensorRows(model.inputs, "input"), tensorRows(model.outputs, "output"),
          (model.bound_inputs || []).map((b) => h("tr", {}, h("td", {}, "bound"), h("td", {}, b.name), h("td", {}, `[${b.shape.join(", ")}] = ${JSON.stringify(b.values)}`), h("td", {}, b.dtype))))));
    onSelect(model);
  }

  async function upload(e) {
    e.preventDefault();
    fill(uploadError);
    if (!file.files.length) return;
    const body = new FormData();
    body.append("file", file.files[0]);
    if (name.value.trim()) body.append("name", name.value.trim());
    if (shapes.value.trim()) body.append("input_shapes", shapes.value.trim());
    if (values.value.trim()) body.append("input_values", values.value.trim());
    const button = form.querySelector("button");
    button.disabled = true;
    button.textContent = "Importing…";
    try {
      select(await api("models", { method: "POST", form: body }));
    } catch (err) {
      fill(uploadError, errorBox(err));
      if (err.kind === "missing_input_shape") shapes.focus();
    } finally {
      button.disabled = false;
      button.textContent = "Upload";
    }
  }

  const form = h("form", { class: "stack", id: "upload-form", onsubmit: upload },
    h("label", {}, "Model file (ONNX, torch.export .pt2, jax.export .jax or StableHLO .mlir)", file),
    h("label", {}, "Name", name),
    h("label", {}, "Input shapes, for inputs with dynamic dimensions (JSON)", shapes),
    h("label", {}, "Input values, for inputs that are a graph's parameters: its axes, sizes, scales, shape or k, made constants (JSON)", values),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Upload")),
    uploadError,
    h("div", { class: "field" }, existing));

  api("models").then((models) => {
    for (const m of models) existing.append(h("option", { value: m.id }, `${m.name} (${m.id.slice(0, 8)})`));
    existing.addEventListener("change", () => {
      const m = models.find((x) => x.id === existing.value);
      if (m) select(m);
    });
  }).catch(() => {});
  return { form, info };
}

// Step 2: the job's target, budget, runner and cost model, with the tasks the target gives.
function jobForm() {
  let chosen = null;
  const target = h("select", { id: "target" }, h("option", { value: "host" }, "host (the workers' CPU)"), h("option", { value: "custom" }, "custom TVM target (JSON)"));
  const customTarget = h("textarea", { id: "custom-target", rows: 2, hidden: true, placeholder: '{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}' });
  const trials = h("input", { type: "number", id: "trials", min: 0, value: 64 });
  const minutes = h("input", { type: "number", id: "time-budget", min: 0, step: "any", placeholder: "no time limit" });
  const perTask = h("input", { type: "number", id: "per-task", min: 1, placeholder: "no cap" });
  const seed = h("input", { type: "number", id: "seed", min: 0, value: 0 });
  const workers = h("input", { type: "number", id: "workers", min: 1, max: 64, value: 1 });
  const runner = h("select", { id: "runner" }, h("option", { value: "local" }, "local (measure on the worker)"));
  const costModel = h("select", { id: "cost-model" }, h("option", { value: "xgb" }, "XGBoost"), h("option", { value: "random" }, "random"));
  const space = h("select", { id: "space" },
    h("option", { value: "" }, "the target's default"),
    h("option", { value: "cpu" }, "cpu: MetaSchedule's rules"),
    h("option", { value: "cpu-poly" }, "cpu-poly: shaped by the polyhedral analysis"),
    h("option", { value: "gpu" }, "gpu (CUDA targets)"));
  // Short option labels (the select sits in a row of four: a long label overflows the card), and the
  // chosen policy explained in a line below the row.
  const precision = h("select", { id: "precision" },
    h("option", { value: "auto", selected: true }, "auto"),
    h("option", { value: "as-is" }, "as-is"),
    h("option", { value: "bf16" }, "bf16"),
    h("option", { value: "fp16" }, "fp16"),
    h("option", { value: "int8" }, "int8"));
  const PRECISION_LINES = {
    "as-is": "as-is: the model's own precision.",
    auto: "auto: with calibration inputs, int8 for each operator that runs faster in it, within the accuracy budget; else bf16 where this CPU multiplies it natively and the outputs stay within its tolerance; else the model's own.",
    bf16: "bf16: matmuls and convolutions on bf16 operands, fp32 accumulation, checked against the float32 model.",
    fp16: "fp16: matmuls and convolutions on fp16 operands, fp32 accumulation, checked against the float32 model.",
    int8: "int8: the float ONNX model quantized (u8 activations, per-channel s8 weights) on your calibration inputs; operators that break the accuracy budget return to bf16 where this CPU multiplies it natively, else float32.",
  };
  const precisionLine = h("p", { class: "hint", id: "precision-line" }, PRECISION_LINES.auto);
  const calibration = h("input", { type: "file", id: "calibration-file", accept: ".npz" });
  const method = h("select", { id: "calibration-method" },
    h("option", { value: "minmax" }, "MinMax"), h("option", { value: "percentile" }, "percentile"), h("option", { value: "entropy" }, "entropy"));
  const maxTop1 = h("input", { type: "number", id: "max-top1-changed", min: 0, max: 100, step: "any", value: 1 });
  const maxError = h("input", { type: "number", id: "max-relative-error", min: 0, step: "any", value: 0.05 });
  const int8Fields = h("div", { class: "stack", id: "int8-fields" },
    h("label", {}, "Calibration inputs for int8 (.npz: one array per model input, named after it, samples stacked along the first axis; auto without them stays float; int8 without them uses seeded synthetic inputs)", calibration),
    h("div", { class: "row" },
      h("label", {}, "Calibration", method),
      h("label", { title: "Share of validation rows of a [batch, classes] output whose top-1 class may change" }, "Top-1 changed at most (%)", maxTop1),
      h("label", { title: "Norm-wise relative error allowed on every other output" }, "Relative error at most", maxError)));
  precision.addEventListener("change", () => {
    precisionLine.textContent = PRECISION_LINES[precision.value];
    int8Fields.hidden = !["int8", "auto"].includes(precision.value);
  });
  const jobError = h("div", {});
  const preview = h("div", { id: "task-preview" });
  const start = h("button", { type: "submit", class: "primary", id: "start-job", disabled: true }, "Start tuning");

  async function previewTasks() {
    if (!chosen) return;
    let targetParam = "host";
    if (target.value === "custom") {
      if (!customTarget.value.trim()) return;
      targetParam = customTarget.value.trim();
    }
    fill(preview, h("p", { class: "muted" }, "Extracting tasks…"));
    try {
      const plan = await api(`models/${chosen.id}/tasks?target=${encodeURIComponent(targetParam)}`);
      fill(preview,
        h("p", { class: "muted" }, `${plan.fusion.operators_before} operators → ${plan.fusion.kernels_after} fused kernels, ${plan.tasks.length} tasks on ${plan.target_key}`),
        quantizationNote(plan.fusion),
        skippedPassesNote(plan.fusion),
        planTable(plan.tasks));
    } catch (err) {
      fill(preview, errorBox(err));
    }
  }
  target.addEventListener("change", () => { customTarget.hidden = target.value !== "custom"; previewTasks(); });
  customTarget.addEventListener("change", previewTasks);

  async function submit(e) {
    e.preventDefault();
    fill(jobError);
    if (!chosen) return;
    let targetValue = "host";
    if (target.value === "custom") {
      try { targetValue = JSON.parse(customTarget.value); } catch (err) {
        fill(jobError, errorBox({ kind: "invalid_target", message: `not valid JSON: ${err.message}` }));
        return;
      }
    }
    const body = { model_id: chosen.id, target: targetValue, seed: Number(seed.value || 0), cost_model: costModel.value };
    // Trials and a time budget may be given together (whichever ends first) or alone.
    if (trials.value !== "") body.trials = Number(trials.value);
    if (minutes.value !== "" && Number(minutes.value) > 0) body.time_budget_s = Number(minutes.value) * 60;
    if (perTask.value) body.max_trials_per_task = Number(perTask.value);
    if (Number(workers.value) > 1) body.workers = Number(workers.value);
    if (space.value) body.space = space.value;
    body.precision = precision.value;
    if (runner.value.startsWith("rpc:")) {
      const [, tracker, key] = runner.value.split("|");
      body.runner = { kind: "rpc", tracker, key };
    }
    start.disabled = true;
    try {
      if (["int8", "auto"].includes(precision.value)) {
        body.calibration_method = method.value;
        body.accuracy_budget = { max_top1_changed: Number(maxTop1.value || 1) / 100, max_relative_error: Number(maxError.value || 0.05) };
        if (calibration.files.length) {
          const file = new FormData();
          file.append("file", calibration.files[0]);
          body.calibration_id = (await api("calibrations", { method: "POST", form: file })).id;
        }
      }
      const job = await api("jobs", { method: "POST", json: body });
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      fill(jobError, errorBox(err));
      start.disabled = false;
    }
  }

  const form = h("form", { class: "stack", id: "job-form", onsubmit: submit },
    h("label", {}, "Target", target, customTarget),
    h("div", { class: "row" },
      h("label", {}, "Trials (total budget; empty: no limit)", trials),
      h("label", {}, "Time budget (minutes)", minutes),
      h("label", {}, "At most per task", perTask),
      h("label", {}, "Seed", seed),
      h("label", { title: "Split the job's tasks over this many workers: idle workers tune a group each" }, "Workers", workers)),
    h("div", { class: "row" }, h("label", {}, "Runner", runner), h("label", {}, "Cost model", costModel), h("label", {}, "Schedule space", space), h("label", {}, "Precision", precision)),
    precisionLine,
    int8Fields,
    h("div", { class: "actions" }, start),
    jobError);

  api("devices").then((d) => {

    for (const dev of d.devices) runner.append(h("option", { value: `rpc:|${d.tracker}|${dev.key}` }, `RPC: ${dev.key} (${dev.free} free, ${dev.pending} pending)`));
  }).catch(() => {});

  function select(model) {
    chosen = model;
    start.disabled = false;
    previewTasks();
  }
  return { form, preview, select };
}
