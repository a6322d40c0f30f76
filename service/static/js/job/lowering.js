// The lowering of a job, level by level: a stepper over the program as imported and after each graph
// pass (with what the pass changed), then one kernel's levels (its TIR before scheduling, its tuned TIR,
// its assembly), and the chosen level side by side with the level before it, the lines removed and added
// marked. Each level is loaded when it is opened.

import { api } from "../api.js";
import { errorBox, fill, h } from "../dom.js";

// Beyond this many line pairs the diff is not computed (the quadratic table would be too large).
const MAX_DIFF_CELLS = 4e6;

// The lines of a and b as aligned rows [left, right, kind], kind "same", "del" or "add" (longest common
// subsequence of lines); null when the texts are too long to compare here.
export function lineDiff(a, b) {
  const x = a.split("\n"), y = b.split("\n");
  const n = x.length, m = y.length;
  if (n * m > MAX_DIFF_CELLS) return null;
  const lcs = new Int32Array((n + 1) * (m + 1));
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      lcs[i * (m + 1) + j] = x[i] === y[j]
        ? lcs[(i + 1) * (m + 1) + j + 1] + 1
        : Math.max(lcs[(i + 1) * (m + 1) + j], lcs[i * (m + 1) + j + 1]);
    }
  }
  const edits = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] === y[j]) { edits.push([x[i], y[j], "same"]); i++; j++; }
    else if (j < m && (i === n || lcs[i * (m + 1) + j + 1] >= lcs[(i + 1) * (m + 1) + j])) { edits.push(["", y[j], "add"]); j++; }
    else { edits.push([x[i], "", "del"]); i++; }
  }
  return pairChanges(edits);
}

// Side by side, a run of removed lines and the run of added lines next to it share rows (kind "change":
// left removed, right added), as a replaced line reads in any side-by-side diff; the rest stay alone.
function pairChanges(edits) {
  const rows = [];
  for (let k = 0; k < edits.length;) {
    if (edits[k][2] === "same") { rows.push(edits[k++]); continue; }
    const dels = [], adds = [];
    while (k < edits.length && edits[k][2] !== "same") {
      if (edits[k][2] === "del") dels.push(edits[k][0]); else adds.push(edits[k][1]);
      k++;
    }
    for (let r = 0; r < Math.max(dels.length, adds.length); r++) {
      const left = r < dels.length ? dels[r] : "", right = r < adds.length ? adds[r] : "";
      rows.push([left, right, r < dels.length && r < adds.length ? "change" : r < dels.length ? "del" : "add"]);
    }
  }
  return rows;
}

function changeText(level) {
  if (level.position === 0) return `${level.operators_after} operators as imported`;
  if (!level.changed) return "no change";
  const kinds = Object.entries(level.delta).map(([op, d]) => `${op.replace(/^relax\./, "")} ${d > 0 ? "+" : ""}${d}`);
  const counts = `${level.operators_before} → ${level.operators_after} operators`;
  return kinds.length ? `${counts}: ${kinds.join(", ")}` : `${counts}; the program changed`;
}

// A kernel's levels below the graph: what each shows, loaded from the task's routes.
const KERNEL_LEVELS = [
  ["tir", "TIR (before scheduling)"],
  ["tuned", "Tuned TIR"],
  ["asm", "Assembly"],
];

function diffTable(beforeName, afterName, rows) {
  return h("table", { class: "diff", id: "lowering-diff" },
    h("thead", {}, h("tr", {}, h("th", {}, `before: ${beforeName}`), h("th", {}, `after: ${afterName}`))),
    h("tbody", {}, rows.map(([left, right, kind]) => h("tr", { class: kind },
      h("td", { class: kind === "del" || kind === "change" ? "del" : "" }, left),
      h("td", { class: kind === "add" || kind === "change" ? "add" : "" }, right)))));
}

function diffCounts(rows) {
  const added = rows.filter((r) => r[2] === "add" || r[2] === "change").length;
  const removed = rows.filter((r) => r[2] === "del" || r[2] === "change").length;
  return h("p", { class: "hint" }, `${removed} lines removed, ${added} added`);
}

// The level a reader wants first: the pass that changed the most operators (fusion, layout), not the
// last pass that changed anything (often one that only renames).
function mostChanged(levels) {
  const weight = (lv) => Object.values(lv.delta || {}).reduce((sum, d) => sum + Math.abs(d), 0);
  const changed = levels.filter((lv) => lv.changed && lv.position > 0);
  if (!changed.length) return null;
  return changed.reduce((best, lv) => (weight(lv) >= weight(best) ? lv : best));
}

export function loweringView(jobId) {
  const steps = h("ol", { class: "stepper", id: "lowering-steps" });
  const kernelSteps = h("ol", { class: "stepper", id: "lowering-kernel-steps" },
    KERNEL_LEVELS.map(([stage, label]) => h("li", {},
      h("button", { dataset: { key: `kernel:${stage}` }, onclick: () => openKernel(stage) }, label))));
  const kernelPick = h("select", { id: "lowering-task", "aria-label": "Kernel", onchange: () => openKernel(current.startsWith("kernel:") ? current.slice(7) : "tir") });
  const detail = h("div", { id: "lowering-level" });
  let levels = [];
  let current = "";

  function mark(key) {
    current = key;
    for (const b of [...steps.querySelectorAll("button"), ...kernelSteps.querySelectorAll("button")]) {
      b.setAttribute("aria-current", b.dataset.key === key ? "step" : "false");
    }
  }

  function setTasks(tasks) {
    const chosen = kernelPick.value;
    fill(kernelPick, tasks.map((t, i) => h("option", { value: String(t.id) }, `#${i} ${t.name}`)));
    if (chosen) kernelPick.value = chosen;
  }

  async function openKernel(stage) {
    mark(`kernel:${stage}`);
    const taskId = kernelPick.value;
    if (!taskId) { fill(detail, h("p", { class: "muted" }, "No kernel yet.")); return; }
    const name = kernelPick.selectedOptions[0]?.textContent || "";
    fill(detail, h("p", { class: "muted" }, "Loading…"));
    try {
      if (stage === "asm") {
        const asm = await api(`jobs/${jobId}/tasks/${taskId}/asm`);
        const fma = Object.entries(asm.mix.fma).filter(([, n]) => n).map(([width, n]) => `${n} ${width}`).join(", ") || "none";
        fill(detail, h("p", { id: "lowering-summary" }, `${name}: assembly as compiled into the model — ${asm.mix.instructions} instructions; FMAs: ${fma}; widest vector register ${asm.mix.widest_vector_bits} bits`),
          h("pre", { class: "code diff", id: "lowering-text" }, asm.text));
        return;
      }
      const best = await api(`jobs/${jobId}/tasks/${taskId}/best`);
      if (stage === "tir") {
        fill(detail, h("p", { id: "lowering-summary" }, `${name}: its TIR as fusion left it, before scheduling`),
          h("pre", { class: "code diff", id: "lowering-text" }, best.tir_before));
        return;
      }
      const summary = h("p", { id: "lowering-summary" }, `${name}: tuned TIR, the best schedule applied (${best.latency_us.toFixed(1)} µs${best.gflops ? `, ${best.gflops.toFixed(1)} GFLOP/s` : ""})`);
      const rows = lineDiff(best.tir_before, best.tir);
      if (rows === null) { fill(detail, summary, h("pre", { class: "code diff", id: "lowering-text" }, best.tir)); return; }
      fill(detail, summary, diffCounts(rows), h("div", { class: "diff-scroll" }, diffTable("TIR before scheduling", "tuned TIR", rows)));
    } catch (err) {
      fill(detail, errorBox(err));
    }
  }

  async function open(position) {
    mark(`graph:${position}`);
    const level = levels[position];
    fill(detail, h("p", { class: "muted" }, "Loading…"));
    try {
      const here = await api(`jobs/${jobId}/ir/${position}`);
      const summary = h("p", { id: "lowering-summary" },
        `Level ${here.position}: ${here.name} — ${changeText(level)}; ${here.kernels} kernel calls, ${here.prim_funcs} TIR functions`,
        here.position ? `; the pass took ${here.seconds.toFixed(2)} s` : "");
      if (position === 0 || !here.changed) {
        fill(detail, summary, h("pre", { class: "code diff", id: "lowering-text" }, here.text));
        return;
      }
      const before = await api(`jobs/${jobId}/ir/${position - 1}`);
      const rows = lineDiff(before.text, here.text);
      if (rows === null) {
        fill(detail, summary, h("p", { class: "muted" }, "Too long to compare here; the program after the pass:"),
          h("pre", { class: "code diff", id: "lowering-text" }, here.text));
        return;
      }
      fill(detail, summary, diffCounts(rows), h("div", { class: "diff-scroll" }, diffTable(before.name, here.name, rows)));
    } catch (err) {
      fill(detail, errorBox(err));
    }
  }

  async function show() {
    try {
      levels = await api(`jobs/${jobId}/ir`);
      fill(steps, levels.map((level) => h("li", { class: level.changed ? "changed" : "unchanged" },
        h("button", { dataset: { key: `graph:${level.position}` }, onclick: () => open(level.position) }, `${level.position} ${level.name}`),
        h("span", { class: "muted" }, ` ${changeText(level)}`))));
      const first = mostChanged(levels);
      if (first) open(first.position);
    } catch (err) {
      fill(steps, errorBox(err));
    }
  }

  return {
    el: h("div", { class: "card", id: "lowering" },
      h("h2", {}, "Lowering, pass by pass"),
      h("p", { class: "hint" }, "The program as imported, then after each graph pass, then one kernel down to the code the CPU runs; pick a level to see it beside the level before it."),
      h("div", { class: "lowering" },
        h("div", {}, steps,
          h("h3", {}, "Then one kernel"), kernelPick, kernelSteps),
        detail)),
    show,
    setTasks,
  };
}
