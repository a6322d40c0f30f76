// The job list, refreshed every 2 s.

import { api } from "../api.js";
import { badge, fmt, fmtAge, fmtDuration, h, jobProgress, keepFilled, loadingCard, shortTarget } from "../dom.js";

export function jobsPage(view) {
  view.append(h("h1", {}, "Jobs"));
  return keepFilled(loadingCard(view), () => api("jobs?limit=100"), jobsTable, 2000);
}

function jobsTable(page) {
  if (!page.items.length) {
    return h("p", {}, "No job yet. ", h("a", { href: "#/submit" }, "Upload a model and start one."));
  }
  const rows = page.items.map((job) =>
    h("tr", { class: "clickable", dataset: { job: job.id }, onclick: () => (location.hash = `#/jobs/${job.id}`) },
      h("td", {}, h("a", { href: `#/jobs/${job.id}` }, job.id.slice(0, 8))),
      // Two uploads of one name are told apart by their model id.
      h("td", { class: "clip", title: `${job.model_name} (model ${job.model_id})` }, job.model_name, h("span", { class: "muted" }, ` ${job.model_id.slice(0, 6)}`)),
      h("td", { class: "muted clip", title: job.target_key }, shortTarget(job)),
      h("td", { class: "status" }, badge(job.status), job.stage ? h("span", { class: "muted" }, ` ${job.stage}`) : null,
        job.error ? h("div", { class: "reason clip", title: job.error }, job.error) : null),
      h("td", {}, jobProgress(job), ` ${job.progress.trials_done} / ${job.trials ?? "–"}`, job.time_budget_s ? h("div", { class: "muted" }, `${fmtDuration(job.tuning_s)} / ${fmtDuration(job.time_budget_s)}`) : null),
      h("td", { class: "num" }, job.tuned_latency_ms ? `${fmt(job.tuned_latency_ms)} ms` : "–",
        job.peer ? h("div", { class: "muted" }, `${job.peer} ${fmt(job.reference_latency_ms[job.peer])} ms`) : null),
      h("td", { class: "num speedup" }, job.peer_speedup ? `${job.peer_speedup.toFixed(2)}×` : "–",
        job.speedup ? h("div", { class: "muted" }, `${job.speedup.toFixed(1)}× untuned`) : null),
      h("td", { class: "muted" }, fmtAge(job.created_at)),
    ));
  const head = ["Job", "Model", "Target", "Status", "Trials", "Tuned latency", "Speedup", "Submitted"];
  return h("table", { id: "jobs-table" },
    h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { class: t === "Tuned latency" || t === "Speedup" ? "num" : "" }, t)))),
    h("tbody", {}, rows),
    h("caption", { class: "muted" }, page.total > page.items.length ? `${page.items.length} of ${page.total} shown. ` : "",
      "Speedup: the runtime the job measured beside Kiln (onnxruntime for ONNX models) over Kiln's tuned latency; below it, over untuned TVM."));
}
