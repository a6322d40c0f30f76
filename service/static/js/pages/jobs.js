// The job list, refreshed every 2 s.

import { api } from "../api.js";
import { badge, fmt, fmtAge, fmtDuration, h, jobProgress, keepFilled, loadingCard } from "../dom.js";

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
      h("td", {}, job.model_name),
      h("td", { class: "muted" }, job.target_key),
      h("td", {}, badge(job.status), job.stage ? h("span", { class: "muted" }, ` ${job.stage}`) : null),
      h("td", {}, jobProgress(job), ` ${job.progress.trials_done} / ${job.trials ?? "–"}`, job.time_budget_s ? ` · ${fmtDuration(job.tuning_s)} / ${fmtDuration(job.time_budget_s)}` : ""),
      h("td", { class: "num" }, job.baseline_latency_ms ? `${fmt(job.baseline_latency_ms)} → ${fmt(job.tuned_latency_ms)} ms` : "–"),
      h("td", { class: "num" }, job.speedup ? `${job.speedup.toFixed(1)}×` : "–"),
      h("td", { class: "muted" }, fmtAge(job.created_at)),
    ));
  return h("table", { id: "jobs-table" },
    h("thead", {}, h("tr", {}, ...["Job", "Model", "Target", "Status", "Trials", "Untuned → tuned", "Speedup", "Submitted"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows),
    page.total > page.items.length ? h("caption", { class: "muted" }, `${page.items.length} of ${page.total} shown`) : null);
}
