// The job's task table, sortable by any column.

import { fill, fmt, fmtFlops, fmtUs, h } from "../dom.js";

const COLUMNS = [
  ["name", "Task", (t) => t.name, false],
  ["weight", "Weight", (t) => t.weight, true],
  ["flops", "FLOPs", (t) => fmtFlops(t.flops), true],
  ["trials", "Trials", (t) => t.trials, true],
  ["best_latency_us", "Best", (t) => fmtUs(t.best_latency_us), true],
  ["gflops", "GFLOP/s", (t) => fmt(t.gflops, 1), true],
  ["share", "Share of time", (t) => (t.share === null ? "–" : `${(100 * t.share).toFixed(1)} %`), true],
  ["schedule_source", "Schedule", (t) => t.schedule_source ?? "–", false],
];

// What each schedule source means, as the Schedule cell's tooltip.
const SOURCES = {
  tuned: "the best measured record of this kernel on this target",
  similar: "the best record of the same operator at another shape on this target, its tiles adapted to this one; not measured at this shape",
  rule: "a default rule's schedule (reductions, GEMV, transposes), not measured",
  analytic: "the register-tiled schedule of a float32 matmul or convolution, sized from this CPU's vector registers; not measured",
  model: "the polyhedral model's best-ranked tiling, not measured",
  sampled: "a sample of MetaSchedule's design space, parallel and vectorised, not measured",
  none: "unscheduled: serial loops",
};

function sorted(tasks, { key, desc }) {
  if (!key) return tasks;
  return [...tasks].sort((a, b) => {
    const va = a[key], vb = b[key];
    if (va === vb) return 0;
    if (va === null || va === undefined) return 1;
    if (vb === null || vb === undefined) return -1;
    return (va < vb ? -1 : 1) * (desc ? -1 : 1);
  });
}

export function taskTable() {
  const el = h("div", { id: "task-table" });
  let sort = { key: null, desc: false };
  let tasks = [];
  function render(next = tasks) {
    tasks = next;
    const { key, desc } = sort;
    const header = COLUMNS.map(([k, label, , num]) => h("th", {
      class: `sortable${num ? " num" : ""}${key === k ? (desc ? " sorted-desc" : " sorted-asc") : ""}`,
      dataset: { key: k },
      onclick: () => { sort = { key: k, desc: sort.key === k ? !sort.desc : num }; render(); },
    }, label));
    fill(el, h("table", {}, h("thead", {}, h("tr", {}, header)),
      h("tbody", {}, sorted(tasks, sort).map((t) => h("tr", { dataset: { task: t.id } }, COLUMNS.map(([k, , get, num]) =>
        k === "name" ? h("td", { class: "name", title: t.name }, get(t))
          : k === "schedule_source" ? h("td", { class: "source", title: SOURCES[t.schedule_source] ?? "not compiled yet" }, get(t))
            : h("td", { class: num ? "num" : "" }, get(t))))))));
  }
  return { el, render };
}

// A <select> of the job's tasks, refilled when their number changes.
export function taskPicker(id, onChange) {
  const el = h("select", { id });
  el.addEventListener("change", () => onChange(Number(el.value)));
  function render(tasks) {
    if (el.options.length !== tasks.length) fill(el, ...tasks.map((t) => h("option", { value: t.id }, t.name)));
  }
  return { el, render };
}
