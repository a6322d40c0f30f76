// Kiln dashboard: plain JavaScript, no build step. Talks to the REST API under /api/v1.
"use strict";

const API = "/api/v1";
const TOKEN_KEY = "kiln-token";

// ---- small DOM helpers -------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Like replaceChildren, but skips null/false children (conditional parts of a view).
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

function fmtUs(us) {
  if (us === null || us === undefined) return "–";
  return us >= 1000 ? `${(us / 1000).toFixed(2)} ms` : `${us.toFixed(1)} µs`;
}

function fmtFlops(flops) {
  if (!flops) return "–";
  if (flops >= 1e9) return `${(flops / 1e9).toFixed(2)} G`;
  if (flops >= 1e6) return `${(flops / 1e6).toFixed(2)} M`;
  return `${(flops / 1e3).toFixed(1)} k`;
}

function fmtAge(iso) {
  if (!iso) return "–";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

function badge(status) {
  return h("span", { class: `badge ${status}`, dataset: { status } }, status);
}

function progressBar(done, total, wide = false) {
  const pct = total ? Math.min(100, (100 * done) / total) : 0;
  const bar = h("span", {});
  bar.style.width = `${pct}%`;
  return h("span", { class: `progress${wide ? " wide" : ""}`, title: `${done} / ${total} trials` }, bar);
}

function errorBox(err) {
  if (!err) return null;
  const kind = err.kind || "error";
  return h("div", { class: "error", role: "alert" }, h("span", { class: "kind" }, kind), err.message || String(err));
}

// ---- API access --------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, kind, message) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function asApiError(response) {
  let kind = "http_error";
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ kind, message } = body.error);
  } catch (_) { /* not JSON */ }
  if (response.status === 401) askForToken(message);
  return new ApiError(response.status, kind, message);
}

async function api(path, { method = "GET", json, form } = {}) {
  const headers = authHeaders();
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  const response = await fetch(path.startsWith("/") ? path : `${API}/${path}`, { method, headers, body });
  if (!response.ok) throw await asApiError(response);
  const type = response.headers.get("content-type") || "";
  return type.includes("application/json") ? response.json() : response;
}

async function download(path, fallbackName) {
  const response = await fetch(`${API}/${path}`, { headers: authHeaders() });
  if (!response.ok) throw await asApiError(response);
  const disposition = response.headers.get("content-disposition") || "";
  const match = /filename="?([^";]+)"?/.exec(disposition);
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: match ? match[1] : fallbackName });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// Server-Sent Events over fetch (EventSource cannot send an Authorization header).
async function streamEvents(path, onEvent, signal) {
  const response = await fetch(`${API}/${path}`, { headers: authHeaders(), signal });
  if (!response.ok) throw await asApiError(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer = (buffer + decoder.decode(value, { stream: true })).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(event, JSON.parse(data.join("\n")));
    }
  }
}

// ---- token dialog ------------------------------------------------------------------------------

function askForToken(message) {
  const dialog = document.getElementById("login");
  const had = sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("login-message").textContent = had
    ? `The server refused the token: ${message}`
    : `This Kiln server requires an API token. (${message})`;
  document.getElementById("token-button").hidden = false;
  if (!dialog.open) dialog.showModal();
}

document.getElementById("login-form").addEventListener("submit", () => {
  const token = document.getElementById("login-token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  route();
});
document.getElementById("token-button").addEventListener("click", () => askForToken("enter a token"));

// ---- charts ------------------------------------------------------------------------------------

function lineChart(container, { xLabel, yLabel, series, x, ys, points = false }) {
  fill(container);
  container.dataset.points = String(x.length);
  if (!x.length) {
    container.append(h("p", { class: "muted" }, "No measured trial yet."));
    return null;
  }
  const colors = ["#c2410c", "#1d4ed8", "#15803d", "#7c3aed"];
  const width = Math.max(320, container.clientWidth || 600);
  const opts = {
    width,
    height: 260,
    scales: { x: { time: false } },
    axes: [{ label: xLabel }, { label: yLabel, size: 70 }],
    series: [
      { label: xLabel },
      ...series.map((s, i) => ({
        label: s.label,
        stroke: colors[i % colors.length],
        width: s.points ? 0 : 2,
        paths: s.points ? () => null : undefined,
        points: { show: s.points || points, size: s.points ? 5 : 3, fill: colors[i % colors.length] },
        spanGaps: true,
      })),
    ],
  };
  return new uPlot(opts, [x, ...ys], container);
}

// ---- pages -------------------------------------------------------------------------------------

const pages = {};

pages.jobs = (view) => {
  view.append(h("h1", {}, "Jobs"));
  const card = h("div", { class: "card" }, h("p", { class: "muted" }, "Loading…"));
  view.append(card);
  let timer = null;
  async function refresh() {
    try {
      const page = await api("jobs?limit=100");
      fill(card, jobsTable(page));
    } catch (err) {
      fill(card, errorBox(err));
    }
    timer = setTimeout(refresh, 2000);
  }
  refresh();
  return () => clearTimeout(timer);
};

function jobsTable(page) {
  if (!page.items.length) {
    return h("p", {}, "No job yet. ", h("a", { href: "#/submit" }, "Upload a model and start one."));
  }
  const rows = page.items.map((job) =>
    h("tr", { class: "clickable", dataset: { job: job.id }, onclick: () => (location.hash = `#/jobs/${job.id}`) },
      h("td", {}, h("a", { href: `#/jobs/${job.id}` }, job.id.slice(0, 8))),
      h("td", {}, job.model_name),
      h("td", { class: "muted" }, job.target_key),
      h("td", {}, badge(job.status), job.stage ? h("span", { class: "muted" }, ` ${job.stage}`) : null),
      h("td", {}, progressBar(job.progress.trials_done, job.trials), ` ${job.progress.trials_done} / ${job.trials}`),
      h("td", { class: "num" }, job.baseline_latency_ms ? `${fmt(job.baseline_latency_ms)} → ${fmt(job.tuned_latency_ms)} ms` : "–"),
      h("td", { class: "num" }, job.speedup ? `${job.speedup.toFixed(1)}×` : "–"),
      h("td", { class: "muted" }, fmtAge(job.created_at)),
    ));
  return h("table", { id: "jobs-table" },
    h("thead", {}, h("tr", {}, ...["Job", "Model", "Target", "Status", "Trials", "Untuned → tuned", "Speedup", "Submitted"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows),
    page.total > page.items.length ? h("caption", { class: "muted" }, `${page.items.length} of ${page.total} shown`) : null);
}

pages.submit = (view) => {
  view.append(h("h1", {}, "New tuning job"));
  const uploadError = h("div", {});
  const modelInfo = h("div", {});
  const shapes = h("textarea", { id: "input-shapes", rows: 2, placeholder: '{"x": [1, 3, 224, 224]}' });
  const file = h("input", { type: "file", id: "model-file", accept: ".onnx,.pt2", required: true });
  const name = h("input", { type: "text", id: "model-name", placeholder: "default: the file name" });
  const existing = h("select", { id: "existing-model" }, h("option", { value: "" }, "— or pick an uploaded model —"));
  let chosen = null;

  const uploadForm = h("form", { class: "stack", id: "upload-form", onsubmit: async (e) => {
    e.preventDefault();
    fill(uploadError);
    if (!file.files.length) return;
    const form = new FormData();
    form.append("file", file.files[0]);
    if (name.value.trim()) form.append("name", name.value.trim());
    if (shapes.value.trim()) form.append("input_shapes", shapes.value.trim());
    const button = uploadForm.querySelector("button");
    button.disabled = true;
    button.textContent = "Importing…";
    try {
      select(await api("models", { method: "POST", form }));
    } catch (err) {
      fill(uploadError, errorBox(err));
      if (err.kind === "missing_input_shape") shapes.focus();
    } finally {
      button.disabled = false;
      button.textContent = "Upload";
    }
  } },
    h("label", {}, "Model file (ONNX or torch.export .pt2)", file),
    h("label", {}, "Name", name),
    h("label", {}, "Input shapes, for inputs with dynamic dimensions (JSON)", shapes),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary" }, "Upload")),
    uploadError,
    h("div", { class: "field" }, existing));

  const target = h("select", { id: "target" }, h("option", { value: "host" }, "host (the workers' CPU)"), h("option", { value: "custom" }, "custom TVM target (JSON)"));
  const customTarget = h("textarea", { id: "custom-target", rows: 2, hidden: true, placeholder: '{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}' });
  target.addEventListener("change", () => { customTarget.hidden = target.value !== "custom"; previewTasks(); });
  const trials = h("input", { type: "number", id: "trials", min: 0, value: 64 });
  const perTask = h("input", { type: "number", id: "per-task", min: 1, placeholder: "no cap" });
  const seed = h("input", { type: "number", id: "seed", min: 0, value: 0 });
  const runner = h("select", { id: "runner" }, h("option", { value: "local" }, "local (measure on the worker)"));
  const costModel = h("select", { id: "cost-model" }, h("option", { value: "xgb" }, "XGBoost"), h("option", { value: "random" }, "random"));
  const jobError = h("div", {});
  const preview = h("div", { id: "task-preview" });
  const start = h("button", { type: "submit", class: "primary", id: "start-job", disabled: true }, "Start tuning");

  const jobForm = h("form", { class: "stack", id: "job-form", onsubmit: async (e) => {
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
    const body = { model_id: chosen.id, target: targetValue, trials: Number(trials.value), seed: Number(seed.value || 0), cost_model: costModel.value };
    if (perTask.value) body.max_trials_per_task = Number(perTask.value);
    if (runner.value.startsWith("rpc:")) {
      const [, tracker, key] = runner.value.split("|");
      body.runner = { kind: "rpc", tracker, key };
    }
    start.disabled = true;
    try {
      const job = await api("jobs", { method: "POST", json: body });
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      fill(jobError, errorBox(err));
      start.disabled = false;
    }
  } },
    h("label", {}, "Target", target, customTarget),
    h("div", { class: "row" },
      h("label", {}, "Trials (total budget)", trials),
      h("label", {}, "At most per task", perTask),
      h("label", {}, "Seed", seed)),
    h("div", { class: "row" }, h("label", {}, "Runner", runner), h("label", {}, "Cost model", costModel)),
    h("div", { class: "actions" }, start),
    jobError);

  view.append(h("div", { class: "row" },
    h("div", { class: "card" }, h("h2", {}, "1. Model"), uploadForm, modelInfo),
    h("div", { class: "card" }, h("h2", {}, "2. Job"), jobForm, h("h2", {}, "Tasks to tune"), preview)));

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
        h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Task"), h("th", { class: "num" }, "Weight"), h("th", { class: "num" }, "FLOPs"))),
          h("tbody", {}, plan.tasks.map((t) => h("tr", {}, h("td", {}, t.name), h("td", { class: "num" }, t.weight), h("td", { class: "num" }, fmtFlops(t.flops)))))));
    } catch (err) {
      fill(preview, errorBox(err));
    }
  }
  customTarget.addEventListener("change", previewTasks);

  function select(model) {
    chosen = model;
    start.disabled = false;
    const tensorRows = (list, kind) => list.map((t) => h("tr", {}, h("td", {}, kind), h("td", {}, t.name), h("td", {}, `[${t.shape.join(", ")}]`), h("td", {}, t.dtype)));
    fill(modelInfo, 
      h("div", { class: "notice", id: "model-ready" }, `Model “${model.name}” (${model.format}, ${(model.size_bytes / 1e6).toFixed(2)} MB, sha256 ${model.sha256.slice(0, 12)}) is ready.`),
      h("table", {}, h("thead", {}, h("tr", {}, ...["", "Name", "Shape", "Type"].map((t) => h("th", {}, t)))),
        h("tbody", {}, tensorRows(model.inputs, "input"), tensorRows(model.outputs, "output"))));
    previewTasks();
  }

  api("models").then((models) => {
    for (const m of models) existing.append(h("option", { value: m.id }, `${m.name} (${m.id.slice(0, 8)})`));
    existing.addEventListener("change", () => {
      const m = models.find((x) => x.id === existing.value);
      if (m) select(m);
    });
  }).catch(() => {});
  api("devices").then((d) => {
    for (const dev of d.devices) runner.append(h("option", { value: `rpc:|${d.tracker}|${dev.key}` }, `RPC: ${dev.key} (${dev.free} free, ${dev.pending} pending)`));
  }).catch(() => {});
  return () => {};
};

pages.job = (view, jobId) => {
  const controller = new AbortController();
  const state = { job: null, tasks: [], selectedTask: null, sort: { key: null, desc: false }, lastCurveAt: 0, curveTimer: null };
  const head = h("div", { class: "card", id: "job-head" });
  const curveChart = h("div", { class: "chart", id: "curve-chart" });
  const taskChart = h("div", { class: "chart", id: "task-chart" });
  const taskSelect = h("select", { id: "task-select" });
  const taskTable = h("div", { id: "task-table" });
  const bars = h("div", { class: "bars", id: "latency-bars" });
  const compiler = h("div", { id: "compiler-view" });
  const graph = h("div", { class: "graph", id: "graph-view" });
  const compilerSelect = h("select", { id: "compiler-task" });
  taskSelect.addEventListener("change", () => { state.selectedTask = Number(taskSelect.value); drawTaskCurve(); });
  compilerSelect.addEventListener("change", () => showCompiler(Number(compilerSelect.value)));

  view.append(head,
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Tuning curve: estimated end-to-end latency"), h("p", { class: "hint" }, "Σ over tasks of weight × best latency so far, after each measured trial; drawn once every task has a measured (or earlier stored) schedule."), curveChart),
      h("div", { class: "card" }, h("h2", {}, "Per task: every trial and the best so far"), taskSelect, taskChart)),
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Tasks"), taskTable),
      h("div", { class: "card", style: "flex: 0 1 420px" }, h("h2", {}, "Before / after (end to end)"), bars)),
    h("div", { class: "card" }, h("h2", {}, "Compiler view"), h("p", {}, "Task ", compilerSelect), compiler, graph));

  function renderHead() {
    const job = state.job;
    const busy = job.status === "queued" || job.status === "running";
    const actions = h("div", { class: "actions" },
      busy ? h("button", { class: "danger", id: "cancel-job", disabled: job.cancel_requested, onclick: async (e) => {
        e.target.disabled = true;
        try { await api(`jobs/${job.id}/cancel`, { method: "POST" }); } catch (err) { head.append(errorBox(err)); }
      } }, job.cancel_requested ? "Cancelling…" : "Cancel") : null,
      h("button", { id: "download-artifact", disabled: job.status !== "succeeded", onclick: () => download(`jobs/${job.id}/artifact`, "artifact.tar.gz").catch((err) => head.append(errorBox(err))) }, "Download artifact"),
      h("button", { id: "download-records", disabled: !job.progress.trials_done, onclick: () => download(`jobs/${job.id}/records`, "records.tar.gz").catch((err) => head.append(errorBox(err))) }, "Download records"));
    const stat = (label, value) => h("div", { class: "stat" }, h("div", { class: "v" }, value), h("div", { class: "l" }, label));
    fill(head, 
      h("div", { class: "jobhead" }, h("h1", {}, `Job ${job.id.slice(0, 8)}`), badge(job.status), job.stage ? h("span", { class: "muted", id: "job-stage" }, job.stage) : null,
        h("span", { class: "muted" }, `${job.model_name} on ${job.target_key}`)),
      h("div", { style: "margin-top: 10px" }, progressBar(job.progress.trials_done, job.trials, true)),
      h("div", { class: "stats" },
        stat("trials", `${job.progress.trials_done} / ${job.trials}`),
        stat("tasks measured", `${job.progress.tasks_done} / ${job.progress.tasks_total}`),
        stat("untuned TVM", job.baseline_latency_ms ? `${fmt(job.baseline_latency_ms)} ms` : "–"),
        stat("tuned", job.tuned_latency_ms ? `${fmt(job.tuned_latency_ms)} ms` : "–"),
        stat("speedup", job.speedup ? `${job.speedup.toFixed(1)}×` : "–"),
        stat("worker", job.worker || "–")),
      job.error ? errorBox({ kind: job.status, message: job.error }) : null,
      actions);
  }

  function renderBars() {
    const job = state.job;
    const entries = [["untuned TVM", job.baseline_latency_ms, ""], ["Kiln (tuned)", job.tuned_latency_ms, "tuned"]];
    for (const [peer, ms] of Object.entries(job.reference_latency_ms || {})) entries.push([peer, ms, "peer"]);
    const known = entries.filter(([, ms]) => ms);
    if (!known.length) {
      fill(bars, h("p", { class: "muted" }, "Measured once the job has compiled its artifact."));
      return;
    }
    const max = Math.max(...known.map(([, ms]) => ms));
    fill(bars, ...known.map(([name, ms, cls]) => {
      const fill = h("span", { class: "fill" });
      fill.style.width = `${Math.max(0.5, (220 * ms) / max)}px`;
      return h("div", { class: `bar ${cls}`, dataset: { name } }, h("span", { class: "name" }, name), fill, h("span", { class: "val" }, `${fmt(ms)} ms`));
    }), h("p", { class: "hint" }, "Median wall time in a fresh process per implementation, same inputs."));
  }

  const columns = [
    ["name", "Task", (t) => t.name, false],
    ["weight", "Weight", (t) => t.weight, true],
    ["flops", "FLOPs", (t) => fmtFlops(t.flops), true],
    ["trials", "Trials", (t) => t.trials, true],
    ["best_latency_us", "Best", (t) => fmtUs(t.best_latency_us), true],
    ["gflops", "GFLOP/s", (t) => fmt(t.gflops, 1), true],
    ["share", "Share of time", (t) => (t.share === null ? "–" : `${(100 * t.share).toFixed(1)} %`), true],
  ];
  function renderTasks() {
    const tasks = [...state.tasks];
    const { key, desc } = state.sort;
    if (key) {
      tasks.sort((a, b) => {
        const va = a[key], vb = b[key];
        if (va === vb) return 0;
        if (va === null || va === undefined) return 1;
        if (vb === null || vb === undefined) return -1;
        return (va < vb ? -1 : 1) * (desc ? -1 : 1);
      });
    }
    const header = columns.map(([k, label, , num]) => h("th", {
      class: `sortable${num ? " num" : ""}${key === k ? (desc ? " sorted-desc" : " sorted-asc") : ""}`,
      dataset: { key: k },
      onclick: () => { state.sort = { key: k, desc: state.sort.key === k ? !state.sort.desc : num }; renderTasks(); },
    }, label));
    fill(taskTable, h("table", {}, h("thead", {}, h("tr", {}, header)),
      h("tbody", {}, tasks.map((t) => h("tr", { dataset: { task: t.id } }, columns.map(([, , get, num]) => h("td", { class: num ? "num" : "" }, get(t))))))));
    if (taskSelect.options.length !== state.tasks.length) {
      fill(taskSelect, ...state.tasks.map((t) => h("option", { value: t.id }, t.name)));
      fill(compilerSelect, ...state.tasks.map((t) => h("option", { value: t.id }, t.name)));
      if (state.selectedTask === null && state.tasks.length) state.selectedTask = state.tasks[0].id;
    }
  }

  async function drawCurves() {
    state.lastCurveAt = Date.now();
    try {
      const curve = await api(`jobs/${jobId}/curve`);
      const pts = curve.points.filter((p) => p.estimate_us !== null);
      lineChart(curveChart, { xLabel: "trial", yLabel: "µs (estimated)", x: pts.map((p) => p.index), ys: [pts.map((p) => p.estimate_us)], series: [{ label: "estimated latency" }] });
      curveChart.dataset.trials = String(curve.points.length);
    } catch (err) {
      fill(curveChart, errorBox(err));
    }
    await drawTaskCurve();
  }

  async function drawTaskCurve() {
    if (state.selectedTask === null) return;
    try {
      const curve = await api(`jobs/${jobId}/tasks/${state.selectedTask}/curve`);
      const x = curve.points.map((p) => p.index);
      lineChart(taskChart, {
        xLabel: "trial of this task", yLabel: "µs", x,
        ys: [curve.points.map((p) => p.latency_us), curve.points.map((p) => p.best_us)],
        series: [{ label: "measured", points: true }, { label: "best so far" }],
      });
    } catch (err) {
      fill(taskChart, errorBox(err));
    }
  }

  function scheduleCurves(force) {
    // At most one redraw every 2 s while trials stream in.
    clearTimeout(state.curveTimer);
    const wait = force ? 0 : Math.max(0, 2000 - (Date.now() - state.lastCurveAt));
    state.curveTimer = setTimeout(drawCurves, wait);
  }

  function code(text) {
    const el = h("code", { class: "language-python" }, text);
    if (window.hljs) window.hljs.highlightElement(el);
    return h("pre", { class: "code" }, el);
  }

  async function showCompiler(taskId) {
    fill(compiler, h("p", { class: "muted" }, "Loading…"));
    try {
      const best = await api(`jobs/${jobId}/tasks/${taskId}/best`);
      fill(compiler, 
        h("p", { class: "muted" }, `Best: ${fmtUs(best.latency_us)}${best.gflops ? `, ${best.gflops.toFixed(1)} GFLOP/s` : ""}`),
        h("div", { class: "codes" },
          h("div", { id: "tir-before" }, h("h3", {}, "TIR before scheduling"), code(best.tir_before)),
          h("div", { id: "tir-tuned" }, h("h3", {}, "Tuned TIR"), code(best.tir)),
          h("div", { id: "trace" }, h("h3", {}, "Schedule trace"), code(best.trace))));
    } catch (err) {
      fill(compiler, errorBox(err));
    }
  }

  async function showGraph() {
    try {
      const g = await api(`jobs/${jobId}/graph`);
      const hist = Object.entries(g.fusion.operator_histogram).sort((a, b) => b[1] - a[1]);
      fill(graph, h("details", { id: "graph-details" },
        h("summary", {}, `Model after fusion: ${g.fusion.operators_before} operators → ${g.fusion.kernels_after} kernels (${g.fusion.distinct_tasks} distinct tasks)`),
        h("table", { style: "width: auto" }, h("thead", {}, h("tr", {}, h("th", {}, "Operator"), h("th", { class: "num" }, "Count"))),
          h("tbody", {}, hist.map(([op, n]) => h("tr", {}, h("td", {}, op), h("td", { class: "num" }, n))))),
        h("h3", {}, "Relax program after fusion"), code(g.graph)));
    } catch (err) {
      fill(graph, errorBox(err));
    }
  }

  function apply(snapshot) {
    const firstTasks = !state.tasks.length && snapshot.tasks.length;
    state.job = snapshot.job;
    state.tasks = snapshot.tasks;
    renderHead();
    renderTasks();
    renderBars();
    if (firstTasks) {
      showGraph();
      if (state.tasks.some((t) => t.best_latency_us)) showCompiler(state.tasks[0].id);
    }
    scheduleCurves(false);
  }

  head.append(h("p", { class: "muted" }, "Loading…"));
  (async () => {
    try {
      const [job, tasks] = await Promise.all([api(`jobs/${jobId}`), api(`jobs/${jobId}/tasks`)]);
      apply({ job, tasks });
      await streamEvents(`jobs/${jobId}/events`, (event, data) => {
        apply(data);
        if (event === "end") {
          scheduleCurves(true);
          if (state.tasks.length) showCompiler(Number(compilerSelect.value || state.tasks[0].id));
        }
      }, controller.signal);
    } catch (err) {
      if (err.name !== "AbortError") fill(head, errorBox(err));
    }
  })();
  return () => { controller.abort(); clearTimeout(state.curveTimer); };
};

pages.models = (view) => {
  view.append(h("h1", {}, "Models"));
  const card = h("div", { class: "card" }, h("p", { class: "muted" }, "Loading…"));
  view.append(card);
  api("models").then((models) => {
    if (!models.length) {
      fill(card, h("p", {}, "No model yet. ", h("a", { href: "#/submit" }, "Upload one.")));
      return;
    }
    const sig = (list) => list.map((t) => `${t.name} [${t.shape.join(", ")}] ${t.dtype}`).join("; ");
    fill(card, h("table", { id: "models-table" },
      h("thead", {}, h("tr", {}, ...["Name", "Format", "Inputs", "Outputs", "Size", "sha256", "Uploaded", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, models.map((m) => {
        const detail = h("td", { colspan: 8 });
        const detailRow = h("tr", { hidden: true }, detail);
        const row = h("tr", {},
          h("td", {}, m.name), h("td", {}, m.format), h("td", {}, sig(m.inputs)), h("td", {}, sig(m.outputs)),
          h("td", { class: "num" }, `${(m.size_bytes / 1e6).toFixed(2)} MB`), h("td", { class: "muted" }, m.sha256.slice(0, 12)),
          h("td", { class: "muted" }, fmtAge(m.created_at)),
          h("td", {}, h("button", { onclick: async () => {
            detailRow.hidden = !detailRow.hidden;
            if (detailRow.hidden || detail.childElementCount) return;
            detail.append(h("p", { class: "muted" }, "Extracting tasks…"));
            try {
              const plan = await api(`models/${m.id}/tasks?target=host`);
              fill(detail, h("p", { class: "muted" }, `${plan.fusion.operators_before} operators → ${plan.fusion.kernels_after} kernels on ${plan.target_key}`),
                h("table", {}, h("tbody", {}, plan.tasks.map((t) => h("tr", {}, h("td", {}, t.name), h("td", { class: "num" }, `×${t.weight}`), h("td", { class: "num" }, fmtFlops(t.flops)))))));
            } catch (err) { fill(detail, errorBox(err)); }
          } }, "Tasks")));
        return [row, detailRow];
      }))));
  }).catch((err) => fill(card, errorBox(err)));
  return () => {};
};

pages.devices = (view) => {
  view.append(h("h1", {}, "Devices"));
  const card = h("div", { class: "card" }, h("p", { class: "muted" }, "Loading…"));
  view.append(card);
  let timer = null;
  async function refresh() {
    try {
      const d = await api("devices");
      fill(card, 
        h("p", {}, d.tracker ? `RPC tracker ${d.tracker}` : d.message),
        d.tracker && !d.devices.length ? h("p", { class: "muted" }, `No server registered; start one with kiln rpc server --tracker ${d.tracker} --key KEY`) : null,
        d.devices.length ? h("table", { id: "devices-table" }, h("thead", {}, h("tr", {}, ...["Key", "Servers", "Free", "Pending"].map((t) => h("th", {}, t)))),
          h("tbody", {}, d.devices.map((x) => h("tr", {}, h("td", {}, x.key), h("td", { class: "num" }, x.total), h("td", { class: "num" }, x.free), h("td", { class: "num" }, x.pending))))) : null);
    } catch (err) {
      fill(card, errorBox(err));
    }
    timer = setTimeout(refresh, 5000);
  }
  refresh();
  return () => clearTimeout(timer);
};

// ---- router ------------------------------------------------------------------------------------

let cleanup = () => {};

function route() {
  cleanup();
  const view = document.getElementById("view");
  fill(view);
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  const [section = "jobs", id] = parts;
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === section && !id);
  if (section === "jobs" && id) cleanup = pages.job(view, id);
  else if (pages[section]) cleanup = pages[section](view);
  else cleanup = pages.jobs(view);
}

window.addEventListener("hashchange", route);
if (sessionStorage.getItem(TOKEN_KEY)) document.getElementById("token-button").hidden = false;
route();
