// The tuned model's profile: a roofline (log-log: FLOP/byte against GFLOP/s) with this machine's measured
// fp32 FMA peak and memory bandwidth, each profiled kernel a point under it; and the kernels in a table
// sortable by any column, Kiln's time beside onnxruntime's matched nodes. Loaded once the job has one.

import { api } from "../api.js";
import { errorBox, fill, h } from "../dom.js";

const COLUMNS = [
  ["name", "Kernel", (k) => k.name],
  ["calls", "Calls", (k) => k.calls],
  ["total_us", "µs", (k) => k.total_us],
  ["share", "Share", (k) => k.share],
  ["gflops", "GFLOP/s", (k) => k.gflops],
  ["intensity", "FLOP/B", (k) => k.intensity],
  ["roof_fraction", "Of roof", (k) => k.roof_fraction],
  ["bound", "Bound", (k) => k.bound],
  ["tuned_best_us", "Tuned best µs / call", (k) => k.tuned_best_us],
  ["onnxruntime_us", "onnxruntime µs", (k) => k.onnxruntime_us],
  ["ratio", "ort / Kiln", (k) => ratio(k)],
];

function ratio(k) {
  return k.compared && k.total_us > 0 ? k.onnxruntime_us / k.total_us : null;
}

function num(value, digits) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function cell(key, k) {
  switch (key) {
    case "name": return h("td", { class: "name" }, k.name);
    case "share": return h("td", { class: "num" }, `${(100 * k.share).toFixed(1)} %`);
    case "roof_fraction": return h("td", { class: "num" }, k.roof_fraction === null ? "–" : `${(100 * k.roof_fraction).toFixed(0)} %`);
    case "bound": return h("td", {}, k.bound || "–");
    case "calls": return h("td", { class: "num" }, String(k.calls));
    case "onnxruntime_us": {
      const text = num(k.onnxruntime_us, 1);
      const partial = k.onnxruntime_us !== null && !k.compared ? ` (${k.matched_calls}/${k.calls} calls)` : "";
      return h("td", { class: "num", title: k.onnxruntime_nodes.join(", ") }, text + partial);
    }
    case "ratio": {
      const r = ratio(k);
      return h("td", { class: `num ${r === null ? "" : r >= 1 ? "win" : "loss"}` }, num(r, 2));
    }
    default: return h("td", { class: "num" }, num(k[key], key === "intensity" ? 2 : 1));
  }
}

// Points (intensity, GFLOP/s) of the kernels the roofline can place, each with its own x (a shared x is
// nudged, since uPlot's series share one x array).
function kernelPoints(kernels) {
  const placed = kernels.filter((k) => k.intensity > 0 && k.gflops > 0);
  const seen = new Set();
  return placed.map((k) => {
    let x = k.intensity;
    while (seen.has(x)) x *= 1.001;
    seen.add(x);
    return { x, y: k.gflops, name: k.name };
  }).sort((a, b) => a.x - b.x);
}

export function rooflineChart(container, hover, limits, kernels) {
  fill(container);
  const points = kernelPoints(kernels);
  if (!points.length) {
    container.append(h("p", { class: "muted" }, "No kernel with known FLOPs and bytes to place."));
    return null;
  }
  const ridge = limits.peak_gflops / limits.bandwidth_gbs;
  const lo = Math.min(points[0].x, ridge) / 4, hi = Math.max(points[points.length - 1].x, ridge) * 4;
  const roofX = [];
  for (let x = lo; x <= hi * 1.0001; x *= Math.pow(hi / lo, 1 / 48)) roofX.push(x);
  roofX.push(ridge);
  const xs = [...new Set([...roofX, ...points.map((p) => p.x)])].sort((a, b) => a - b);
  const byX = new Map(points.map((p) => [p.x, p]));
  const roof = xs.map((x) => Math.min(limits.peak_gflops, limits.bandwidth_gbs * x));
  const peak = xs.map(() => limits.peak_gflops);
  const bandwidth = xs.map((x) => (limits.bandwidth_gbs * x <= limits.peak_gflops * 4 ? limits.bandwidth_gbs * x : null));
  const measured = xs.map((x) => (byX.has(x) ? byX.get(x).y : null));
  // The int8 and bf16 dot products' peaks, where the CPU has them: the roofs of the kernels in those precisions.
  const dotPeaks = [["int8", limits.int8_gops, "#7c3aed"], ["bf16", limits.bf16_gflops, "#0f766e"]].filter(([, v]) => v);
  const topPeak = Math.max(limits.peak_gflops, ...dotPeaks.map(([, v]) => v));
  const minY = Math.min(...points.map((p) => p.y), limits.bandwidth_gbs * lo) / 2;
  const opts = {
    width: Math.max(360, container.clientWidth || 640),
    height: 320,
    scales: { x: { time: false, distr: 3 }, y: { distr: 3, range: [minY, topPeak * 2] } },
    legend: { live: false },  // the series' names; a kernel under the cursor is named in the line below
    axes: [{ label: "arithmetic intensity (FLOP / byte)" }, { label: "GFLOP/s", size: 70 }],
    series: [
      { label: "FLOP/B", value: (u, v) => (v === null ? "–" : v.toFixed(2)) },
      { label: "roofline", stroke: "#111827", width: 2, points: { show: false } },
      { label: `FMA peak ${limits.peak_gflops.toFixed(0)} GFLOP/s`, stroke: "#c2410c", width: 1, dash: [6, 4], points: { show: false } },
      { label: `bandwidth ${limits.bandwidth_gbs.toFixed(1)} GB/s`, stroke: "#1d4ed8", width: 1, dash: [6, 4], points: { show: false }, spanGaps: false },
      { label: "kernels", stroke: "#15803d", width: 0, paths: () => null, points: { show: true, size: 9, fill: "#15803d" } },
      ...dotPeaks.map(([name, value, color]) => ({ label: `${name} peak ${value.toFixed(0)} GOP/s`, stroke: color, width: 1, dash: [2, 3], points: { show: false } })),
    ],
    hooks: {
      setCursor: [(u) => {
        const i = u.cursor.idx;
        const p = i === null || i === undefined ? null : byX.get(xs[i]);
        fill(hover, p ? `${p.name}: ${p.y.toFixed(1)} GFLOP/s at ${p.x.toFixed(2)} FLOP/B` : "Point at a kernel to name it.");
      }],
    },
  };
  const dotLines = dotPeaks.map(([, value]) => xs.map(() => value));
  return new window.uPlot(opts, [xs, roof, peak, bandwidth, measured, ...dotLines], container);
}

export function profileView(jobId) {
  const machine = h("p", { id: "profile-machine", class: "hint" });
  const chart = h("div", { id: "roofline" });
  const hover = h("p", { id: "roofline-hover", class: "muted" }, "Point at a kernel to name it.");
  const table = h("div", { id: "profile-table-wrap" });
  const totals = h("p", { id: "profile-totals" });
  const disturbed = h("div", { id: "profile-disturbed" });
  let profile = null;
  let sortKey = "total_us";
  let descending = true;

  function renderTable() {
    const get = COLUMNS.find(([key]) => key === sortKey)[2];
    const rows = [...profile.kernels].sort((a, b) => {
      const x = get(a), y = get(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      const order = x < y ? -1 : 1;
      return descending ? -order : order;
    });
    fill(table, h("table", { id: "profile-table" },
      h("thead", {}, h("tr", {}, COLUMNS.map(([key, label]) => h("th", {
        class: key === "name" || key === "bound" ? "" : "num",
        dataset: { key },
        "aria-sort": key === sortKey ? (descending ? "descending" : "ascending") : "none",
        onclick: () => { descending = key === sortKey ? !descending : key !== "name" && key !== "bound"; sortKey = key; renderTable(); },
      }, label)))),
      h("tbody", {}, rows.map((k) => h("tr", { class: k.kind }, COLUMNS.map(([key]) => cell(key, k)))))));
  }

  async function show() {
    try {
      profile = await api(`jobs/${jobId}/profile`);
    } catch (err) {
      fill(table, errorBox(err));
      return;
    }
    const l = profile.limits;
    fill(machine, l ? `This machine (${l.host}): fp32 FMA peak ${l.peak_gflops.toFixed(1)} GFLOP/s on ${l.threads} thread(s), STREAM triad ${l.bandwidth_gbs.toFixed(1)} GB/s, ridge at ${l.ridge_intensity.toFixed(1)} FLOP/B${l.int8_gops ? `, int8 peak ${l.int8_gops.toFixed(1)} GOP/s (${l.int8_instruction})` : ""}${l.bf16_gflops ? `, bf16 peak ${l.bf16_gflops.toFixed(1)} GFLOP/s (${l.bf16_instruction})` : ""}. ${l.how}.${l.disturbed ? ` Other processes used ${(100 * l.other_cpu_share).toFixed(0)} % of the CPUs through every try: these roofs may be low (best of ${l.measurements} measurement(s); the next jobs measure them again).` : ""}` : "This machine's limits were not measured.");
    if (l) rooflineChart(chart, hover, l, profile.kernels);
    const beside = profile.run_us ? `; the kernels ${profile.kernels_us.toFixed(1)} µs, ${(100 * profile.kernels_us / profile.run_us).toFixed(0)} % of the run timed beside them (${profile.run_us.toFixed(1)} µs)` : "";
    const measured = profile.latency_ms ? `; the job measured ${(profile.latency_ms * 1e3).toFixed(1)} µs` : "";
    const ort = profile.onnxruntime_total_us !== null
      ? ` onnxruntime: ${profile.onnxruntime_total_us.toFixed(1)} µs per run by its own profiler${profile.onnxruntime_latency_ms ? ` (${(profile.onnxruntime_latency_ms * 1e3).toFixed(1)} µs unprofiled: its profiler adds a cost per node)` : ""}, ${profile.onnxruntime_unmatched_us.toFixed(1)} µs of it in nodes no Kiln kernel matched; ort / Kiln above 1: Kiln's kernel is faster.`
      : ` onnxruntime: ${profile.onnxruntime_note}`;
    fill(totals, `Profiled total ${profile.total_us.toFixed(1)} µs over ${profile.kernels.length} rows (${profile.runs} runs)${beside}${measured}.${ort}`);
    // Figures that disagree are shown as measured, under a plain statement that they were disturbed.
    fill(disturbed, profile.disturbed
      ? h("div", { class: "error", role: "alert" }, h("div", { class: "kind" }, "These figures disagree with each other: a measurement was disturbed"),
        h("ul", {}, profile.warnings.map((w) => h("li", {}, w))))
      : null);
    renderTable();
  }

  return {
    el: h("div", { class: "card", id: "profile" },
      h("h2", {}, "Profile of the tuned model"),
      machine, chart, hover,
      h("p", { class: "hint" }, "Each kernel timed in place in a run of the model; bytes are its arguments, each read or written once. A point above the bandwidth line moved its data from the caches, faster than memory; one far below both roofs is neither compute- nor bandwidth-bound: the schedule leaves speed on the table. Click a column to sort."),
      disturbed, totals, table),
    show,
  };
}
