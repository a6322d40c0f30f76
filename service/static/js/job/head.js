// The job page's header (status, progress, actions) and its before/after latency bars.

import { api, download } from "../api.js";
import { badge, errorBox, fill, fmt, fmtDuration, h, jobProgress } from "../dom.js";

export function jobHead() {
  const el = h("div", { class: "card", id: "job-head" }, h("p", { class: "muted" }, "Loading…"));
  function render(job) {
    const busy = job.status === "queued" || job.status === "running";
    const actions = h("div", { class: "actions" },
      busy ? h("button", { class: "danger", id: "cancel-job", disabled: job.cancel_requested, onclick: async (e) => {
        e.target.disabled = true;
        try { await api(`jobs/${job.id}/cancel`, { method: "POST" }); } catch (err) { el.append(errorBox(err)); }
      } }, job.cancel_requested ? "Cancelling…" : "Cancel") : null,
      h("button", { id: "download-artifact", disabled: job.status !== "succeeded", onclick: () => download(`jobs/${job.id}/artifact`, "artifact.tar.gz").catch((err) => el.append(errorBox(err))) }, "Download artifact"),
      h("button", { id: "download-records", disabled: !job.progress.trials_done, onclick: () => download(`jobs/${job.id}/records`, "records.tar.gz").catch((err) => el.append(errorBox(err))) }, "Download records"));
    const stat = (label, value) => h("div", { class: "stat" }, h("div", { class: "v" }, value), h("div", { class: "l" }, label));
    fill(el,
      h("div", { class: "jobhead" }, h("h1", {}, `Job ${job.id.slice(0, 8)}`), badge(job.status), job.stage ? h("span", { class: "muted", id: "job-stage" }, job.stage) : null,
        h("span", { class: "muted" }, `${job.model_name} on ${job.target_key}`)),
      h("div", { style: "margin-top: 10px" }, jobProgress(job, true)),
      h("div", { class: "stats" },
        stat("trials", `${job.progress.trials_done} / ${job.trials ?? "no limit"}`),
        h("div", { class: "stat", id: "tuning-time" },
          h("div", { class: "v" }, fmtDuration(job.tuning_s)),
          h("div", { class: "l" }, job.time_budget_s ? `tuning, of ${fmtDuration(job.time_budget_s)}` : "tuning")),
        job.time_budget_s ? h("div", { class: "stat", id: "tuning-remaining" },
          h("div", { class: "v" }, fmtDuration(job.tuning_remaining_s)),
          h("div", { class: "l" }, "time left")) : null,
        stat("tasks measured", `${job.progress.tasks_done} / ${job.progress.tasks_total}`),
        stat("tuned", job.tuned_latency_ms ? `${fmt(job.tuned_latency_ms)} ms` : "–"),
        job.peer ? stat(job.peer, `${fmt(job.reference_latency_ms[job.peer])} ms`) : null,
        h("div", { class: "stat", id: "headline-speedup" },
          h("div", { class: "v" }, job.peer_speedup ? `${job.peer_speedup.toFixed(2)}×` : "–"),
          h("div", { class: "l" }, job.peer ? `speedup over ${job.peer}` : "no peer runtime measured")),
        stat("untuned TVM", job.baseline_latency_ms ? `${fmt(job.baseline_latency_ms)} ms` : "–"),
        stat("vs untuned TVM", job.speedup ? `${job.speedup.toFixed(1)}×` : "–"),
        stat("worker", job.worker || "–")),
      job.error ? errorBox({ kind: job.status, message: job.error }) : null,
      job.trials_note ? h("p", { class: "notice", id: "trials-note" }, job.trials_note) : null,
      taskGroups(job),
      actions);
  }
  return { el, render, fail: (err) => fill(el, errorBox(err)) };
}

// A split job's groups of tasks: which worker tunes (or tuned) each, its share of the trials, and why a
// group was requeued or gave up.
function taskGroups(job) {
  if (!job.task_groups || !job.task_groups.length) {
    return job.workers > 1 ? h("p", { class: "muted", id: "task-groups" }, `Split over up to ${job.workers} workers once its tasks are known.`) : null;
  }
  return h("div", { id: "task-groups" },
    h("h3", {}, `Tasks split over ${job.task_groups.length} groups`),
    h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Group"), h("th", {}, "Tasks"), h("th", { class: "num" }, "Trials"), h("th", {}, "Status"), h("th", {}, "Worker"), h("th", { class: "num" }, "Attempts"), h("th", {}, "Note"))),
      h("tbody", {}, job.task_groups.map((g) => h("tr", { dataset: { group: g.index } },
        h("td", {}, `#${g.index}`),
        h("td", {}, g.task_indices.map((i) => `#${i}`).join(", ")),
        h("td", { class: "num" }, g.trials ?? "time budget"),
        h("td", {}, badge(g.status)),
        h("td", {}, g.worker || "–"),
        h("td", { class: "num" }, String(g.attempts)),
        h("td", { class: "muted" }, g.error || ""))))));
}

export function latencyBars() {
  const el = h("div", { class: "bars", id: "latency-bars" });
  function render(job) {
    const report = job.latency_report;
    const entries = [["untuned TVM", job.baseline_latency_ms, "", "untuned TVM"], ["Kiln (tuned)", job.tuned_latency_ms, "tuned", "Kiln"]];
    for (const [peer, ms] of Object.entries(job.reference_latency_ms || {})) entries.push([peer, ms, "peer", peer]);
    const known = entries.filter(([, ms]) => ms);
    if (!known.length) {
      fill(el, h("p", { class: "muted" }, "Measured once the job has compiled its artifact."));
      return;
    }
    const max = Math.max(...known.map(([, ms]) => ms));
    const range = (key) => {
      const t = report && report.timings[key];
      return t && t.rounds_ms.length > 1 ? ` (${fmt(t.min_ms)}–${fmt(t.max_ms)})` : "";
    };
    const rounds = report ? Math.max(...Object.values(report.timings).map((t) => t.rounds_ms.length)) : 1;
    fill(el, ...known.map(([name, ms, cls, key]) => {
      const bar = h("span", { class: "fill" });
      bar.style.width = `${Math.max(0.5, (220 * ms) / max)}px`;
      return h("div", { class: `bar ${cls}`, dataset: { name } }, h("span", { class: "name" }, name), bar, h("span", { class: "val" }, `${fmt(ms)} ms${range(key)}`));
    }),
    h("p", { class: "hint" }, rounds > 1
      ? `Median of ${rounds} interleaved rounds (range in brackets); each round times every implementation once, in a fresh process, same inputs.`
      : "Median wall time in a fresh process per implementation, same inputs."),
    report && report.warnings.length
      ? h("div", { class: "error", role: "alert", id: "latency-warnings" }, h("div", { class: "kind" }, "busy machine?"), h("ul", {}, report.warnings.map((w) => h("li", {}, w))))
      : null,
    accuracyTable(job.accuracy));
  }
  return { el, render };
}

// A quantized or reduced-precision job's outputs against its reference: per output, the largest difference
// (in quantization steps, LSB, for a quantized output), the share of elements beyond one step, the
// norm-wise relative error and the cosine similarity (null for a float job).
function accuracyTable(accuracy) {
  if (!accuracy) return null;
  const steps = (v) => (v === null || v === undefined ? "–" : v.toFixed(2));
  const allowed = accuracy.tolerance === null || accuracy.tolerance === undefined ? "" : `, relative error allowed ${accuracy.tolerance.toExponential(2)}`;
  const top1 = accuracy.float_model ? [h("th", { class: "num" }, `Top-1 vs ${accuracy.float_model}`)] : [];
  return h("div", { id: "accuracy" },
    h("h3", {}, `Accuracy against ${accuracy.reference} (${accuracy.inputs} seeded inputs${allowed})`),
    h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Output"), h("th", { class: "num" }, "Max Δ (steps)"), h("th", { class: "num" }, "Beyond 1 step"), h("th", { class: "num" }, "Relative error"), h("th", { class: "num" }, "Cosine"), ...top1)),
      h("tbody", {}, accuracy.outputs.map((o) => h("tr", {},
        h("td", {}, o.name),
        h("td", { class: "num" }, o.step ? steps(o.max_steps) : `${o.max_abs.toExponential(2)} (float)`),
        h("td", { class: "num" }, o.beyond_one_step === null ? "–" : `${(100 * o.beyond_one_step).toFixed(2)} %`),
        h("td", { class: "num" }, o.relative_error === null || o.relative_error === undefined ? "–" : o.relative_error.toExponential(2)),
        h("td", { class: "num" }, o.cosine.toFixed(6)),
        ...(accuracy.float_model ? [h("td", { class: "num" }, o.top1_agreement === null ? "–" : `${(100 * o.top1_agreement).toFixed(1)} %`)] : []))))),
    quantizationTable(accuracy.quantization));
}

// precision auto: each int8 operator timed alone in int8 and in the precision it would return to.
function speedTable(q) {
  const speeds = q.speeds || [];
  if (!speeds.length) return q.speed_note ? h("p", { class: "hint", id: "speed-note" }, q.speed_note) : null;
  const faster = speeds.filter((s) => s.chosen === "int8").length;
  return h("details", { id: "core-speeds" },
    h("summary", {}, `Timed alone: ${faster} of ${speeds.length} operators faster in int8 than in ${speeds[0].other}`),
    q.speed_note ? h("p", { class: "hint" }, q.speed_note) : null,
    h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Operator"), h("th", {}, "int8 ms"), h("th", {}, `${speeds[0].other} ms`), h("th", {}, "Chosen"))),
      h("tbody", {}, speeds.map((s) => h("tr", {},
        h("td", {}, s.name), h("td", {}, s.int8_ms.toFixed(3)), h("td", {}, s.other_ms.toFixed(3)), h("td", {}, s.chosen))))));
}

// precision int8: how Kiln quantized the float model: the samples, the budget, the metric with every
// operator in int8 and as compiled, what returned to bf16 or float32, and each operator's precision.
function quantizationTable(q) {
  if (!q) return null;
  const metric = (m) => [
    m.top1_changed === null ? null : `top-1 changed on ${(100 * m.top1_changed).toFixed(1)} %`,
    ...Object.entries(m.relative_error).map(([name, e]) => `${name}: relative error ${e.toExponential(2)}`),
  ].filter(Boolean).join(", ");
  const ints = Object.values(q.precision).filter((p) => p === "int8").length;
  return h("div", { id: "quantization" },
    h("h3", {}, `Quantized by Kiln: ${ints} of ${Object.keys(q.precision).length} convolutions/matmuls in int8`),
    h("p", {}, `${q.weight_bits}-bit weights${q.weight_bits === 7 ? " (this CPU has no VNNI: vpmaddubsw is exact on them)" : ""}${q.float_outputs ? ", the convolutions' and matmuls' outputs kept in float (rounded to 8 bits, they broke the budget)" : ""}, ${q.method} calibration on ${q.samples}. Budget: top-1 changed on at most ${(100 * q.budget.max_top1_changed).toFixed(1)} % of validation samples, relative error at most ${q.budget.max_relative_error} — ${q.within_budget ? "held" : "not held"}.`),
    q.synthetic ? h("p", { class: "hint", id: "synthetic-calibration" }, "No calibration inputs were given: the ranges and the budget were judged on seeded synthetic inputs, which need not resemble the model's real inputs.") : null,
    h("table", {},
      h("tbody", {},
        h("tr", {}, h("th", {}, "All int8"), h("td", {}, metric(q.before))),
        h("tr", {}, h("th", {}, "As compiled"), h("td", {}, metric(q.after))),
        h("tr", {}, h("th", {}, `Returned to ${q.returned_precision || "float32"}`), h("td", { id: "returned" }, q.returned.length ? q.returned.join(", ") : "none")),
        (q.returned_for_speed || []).length
          ? h("tr", {}, h("th", {}, "No faster in int8"), h("td", { id: "returned-for-speed" }, q.returned_for_speed.join(", ")))
          : null)),
    speedTable(q),
    h("details", {}, h("summary", {}, "Precision of each operator"),
      h("table", { id: "precision-map" }, h("tbody", {}, Object.entries(q.precision).map(([name, p]) => h("tr", {}, h("td", {}, name), h("td", {}, p)))))));
}
