// The compiler view: per task, its TIR before scheduling, tuned TIR and trace ("Schedule"), its
// polyhedral analysis ("Polyhedral") or its kernel as compiled into the model ("Assembly", with its
// instruction mix), each loaded when opened; and the fused Relax program.

import { api } from "../api.js";
import { code } from "../chart.js";
import { errorBox, fill, fmtUs, h, precisionNote, quantizationNote, skippedPassesNote } from "../dom.js";
import { polyhedralTab } from "./polyhedral.js";
import { taskPicker } from "./tasks.js";

export function compilerView(jobId) {
  const kernel = h("div", { id: "compiler-view" });
  const assembly = h("div", { id: "asm-view", hidden: true });
  const poly = polyhedralTab(jobId);
  const graph = h("div", { class: "graph", id: "graph-view" });
  let tab = "schedule";
  const tabs = h("div", { class: "tabs", role: "tablist" },
    [["schedule", "Schedule"], ["polyhedral", "Polyhedral"], ["assembly", "Assembly"]].map(([key, label]) => h("button", {
      role: "tab", dataset: { tab: key }, "aria-selected": key === tab ? "true" : "false",
      onclick: () => { tab = key; openTab(); },
    }, label)));

  function openTab() {
    for (const b of tabs.children) b.setAttribute("aria-selected", b.dataset.tab === tab ? "true" : "false");
    kernel.hidden = tab !== "schedule";
    poly.el.hidden = tab !== "polyhedral";
    assembly.hidden = tab !== "assembly";
    const taskId = Number(picker.el.value);
    if (!taskId) return;
    if (tab === "polyhedral") poly.show(taskId);
    else if (tab === "assembly") showAssembly(taskId);
    else showSchedule(taskId);
  }

  const picker = taskPicker("compiler-task", () => openTab());

  function showTask(taskId) {
    picker.el.value = String(taskId);
    openTab();
  }

  async function showSchedule(taskId) {
    fill(kernel, h("p", { class: "muted" }, "Loading…"));
    try {
      const best = await api(`jobs/${jobId}/tasks/${taskId}/best`);
      fill(kernel,
        h("p", { class: "muted" }, `Best: ${fmtUs(best.latency_us)}${best.gflops ? `, ${best.gflops.toFixed(1)} GFLOP/s` : ""}`),
        h("div", { class: "codes" },
          h("div", { id: "tir-before" }, h("h3", {}, "TIR before scheduling"), code(best.tir_before)),
          h("div", { id: "tir-tuned" }, h("h3", {}, "Tuned TIR"), code(best.tir)),
          h("div", { id: "trace" }, h("h3", {}, "Schedule trace"), code(best.trace))));
    } catch (err) {
      fill(kernel, errorBox(err));
    }
  }

  async function showAssembly(taskId) {
    fill(assembly, h("p", { class: "muted" }, "Loading…"));
    try {
      const asm = await api(`jobs/${jobId}/tasks/${taskId}/asm`);
      const fma = Object.entries(asm.mix.fma).filter(([, n]) => n).map(([width, n]) => `${n} ${width}`).join(", ") || "none";
      const dots = Object.entries(asm.mix.dot_products).map(([name, n]) => `${n} ${name}`).join(", ");
      fill(assembly,
        h("p", { id: "asm-mix" }, `${asm.mix.instructions} instructions; FMAs: ${fma}`,
          dots ? `; dot products: ${dots}` : "", `; widest vector register ${asm.mix.widest_vector_bits} bits`),
        h("pre", { class: "code", id: "asm-code" }, asm.text));
    } catch (err) {
      fill(assembly, errorBox(err));
    }
  }

  async function showGraph() {
    try {
      const g = await api(`jobs/${jobId}/graph`);
      const hist = Object.entries(g.fusion.operator_histogram).sort((a, b) => b[1] - a[1]);
      // The kernels the fused program calls, by how often: read from its text (R.call_tir(cls.NAME, ...)).
      const calls = {};
      for (const m of g.graph.matchAll(/R\.call_tir\(cls\.([\w.]+)/g)) calls[m[1]] = (calls[m[1]] || 0) + 1;
      const kernels = Object.entries(calls).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
      const countTable = (id, title, rows) => h("table", { id, style: "width: auto" },
        h("thead", {}, h("tr", {}, h("th", {}, title), h("th", { class: "num" }, "Count"))),
        h("tbody", {}, rows.map(([name, n]) => h("tr", {}, h("td", {}, name), h("td", { class: "num" }, n)))));
      fill(graph, h("details", { id: "graph-details" },
        h("summary", {}, `Model after fusion: ${g.fusion.operators_before} operators → ${g.fusion.kernels_after} kernels (${g.fusion.distinct_tasks} distinct tasks)`),
        quantizationNote(g.fusion),
        precisionNote(g.fusion),
        skippedPassesNote(g.fusion),
        h("div", { class: "row" },
          h("div", {}, h("h3", {}, `Before fusion: ${g.fusion.operators_before} operators`), countTable("fusion-before", "Operator", hist)),
          h("div", {}, h("h3", {}, `After fusion: ${g.fusion.kernels_after} kernel calls`), countTable("fusion-after", "Kernel", kernels))),
        h("h3", {}, "Relax program after fusion"), code(g.graph)));
    } catch (err) {
      fill(graph, errorBox(err));
    }
  }

  return {
    el: h("div", { class: "card" }, h("h2", {}, "Compiler view"), h("p", {}, "Task ", picker.el, " ", tabs), kernel, poly.el, assembly, graph),
    setTasks: picker.render,
    selectedTask: () => Number(picker.el.value),
    showTask,
    showGraph,
  };
}
