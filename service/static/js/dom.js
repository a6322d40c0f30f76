// Small DOM helpers and formatters shared by every page.

export function h(tag, attrs, ...children) {
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
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

export function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

export function fmtUs(us) {
  if (us === null || us === undefined) return "–";
  if (us >= 1000) return `${(us / 1000).toFixed(2)} ms`;
  if (us >= 10) return `${us.toFixed(1)} µs`;
  if (us >= 1) return `${us.toFixed(2)} µs`;
  return `${(us * 1000).toFixed(us >= 0.1 ? 0 : 1)} ns`;
}

// A job's target in a few words ("llvm znver4 · 2 cores"); the full canonical key goes in a title.
export function shortTarget(job) {
  const t = job.target || {};
  const cores = t["num-cores"] ? ` · ${t["num-cores"]} cores` : "";
  return `${t.kind || "?"}${t.mcpu ? ` ${t.mcpu}` : ""}${t.arch ? ` ${t.arch}` : ""}${cores}`;
}

// The headline figure: the tuned model against the runtime the user would otherwise use (onnxruntime),
// untuned TVM second.
export function speedupText(job) {
  if (job.peer_speedup) return `${job.peer_speedup.toFixed(2)}× ${job.peer}`;
  return job.speedup ? `${job.speedup.toFixed(1)}× untuned TVM` : "–";
}

export function fmtFlops(flops) {
  if (!flops) return "–";
  if (flops >= 1e9) return `${(flops / 1e9).toFixed(2)} G`;
  if (flops >= 1e6) return `${(flops / 1e6).toFixed(2)} M`;
  return `${(flops / 1e3).toFixed(1)} k`;
}

// Seconds as "45 s", "12 min 05 s" or "1 h 02 min".
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

// How far a job is through its budget: its trials, or its time when it has no trial limit.
export function jobProgress(job, wide = false) {
  if (job.trials === null && job.time_budget_s) {
    const bar = progressBar(job.tuning_s, job.time_budget_s, wide);
    bar.title = `${fmtDuration(job.tuning_s)} of ${fmtDuration(job.time_budget_s)} tuning`;
    return bar;
  }
  return progressBar(job.progress.trials_done, job.trials, wide);
}

export function fmtAge(iso) {
  if (!iso) return "–";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

export function badge(status) {
  return h("span", { class: `badge ${status}`, dataset: { status } }, status);
}

export function progressBar(done, total, wide = false) {
  const pct = total ? Math.min(100, (100 * done) / total) : 0;
  const bar = h("span", {});
  bar.style.width = `${pct}%`;
  return h("span", { class: `progress${wide ? " wide" : ""}`, title: `${done} / ${total} trials` }, bar);
}

export function errorBox(err) {
  if (!err) return null;
  const kind = err.kind || "error";
  return h("div", { class: "error", role: "alert" }, h("span", { class: "kind" }, kind), err.message || String(err));
}

// A card with a "Loading…" placeholder, appended to the view.
export function loadingCard(view) {
  const card = h("div", { class: "card" }, h("p", { class: "muted" }, "Loading…"));
  view.append(card);
  return card;
}

// Fills card with render(await load()) now and then every intervalMs (an error box when loading fails);
// returns the page's cleanup, which stops it.
export function keepFilled(card, load, render, intervalMs) {
  let timer = null;
  async function refresh() {
    try {
      fill(card, render(await load()));
    } catch (err) {
      fill(card, errorBox(err));
    }
    timer = setTimeout(refresh, intervalMs);
  }
  refresh();
  return () => clearTimeout(timer);
}

// The task list of a model plan as a table: name, weight, FLOPs.
export function planTable(tasks, { head = true, weightPrefix = "" } = {}) {
  return h("table", {},
    head ? h("thead", {}, h("tr", {}, h("th", {}, "Task"), h("th", { class: "num" }, "Weight"), h("th", { class: "num" }, "FLOPs"))) : null,
    h("tbody", {}, tasks.map((t) => h("tr", {}, h("td", {}, t.name), h("td", { class: "num" }, `${weightPrefix}${t.weight}`), h("td", { class: "num" }, fmtFlops(t.flops))))));
}

// For a quantized model: how many convolutions/matmuls run in integers, and each one kept in float with
// its reason (null for a float model).
export function quantizationNote(fusion) {
  const ints = fusion.integer_ops || [], floats = fusion.kept_float || [];
  if (!ints.length && !floats.length) return null;
  return h("div", { class: "quantization", id: "quantization" },
    h("p", {}, `Quantized: ${ints.length} convolution/matmul${ints.length === 1 ? "" : "s"} computed in integers (u8 × s8 → int32)`
      + (floats.length ? `, ${floats.length} kept in float:` : "")),
    floats.length ? h("ul", {}, floats.map((k) => h("li", {}, `${k.op} ${k.shapes}: ${k.reason}`))) : null,
    integerKernelsNote(fusion));
}

// The graph passes Kiln left out on this model (each failed on some operator; the model compiles without),
// or null when every pass ran.
export function skippedPassesNote(fusion) {
  const notes = fusion.skipped_passes || [];
  if (!notes.length) return null;
  return h("div", { class: "skipped-passes", id: "skipped-passes" },
    h("p", {}, `Graph passes left out (the model compiles without them):`),
    h("ul", {}, notes.map((note) => h("li", {}, note))));
}

// For a job with a precision policy: the operators on bf16/fp16 operands and how the CPU computes them
// (under auto, what it chose and why; null for as-is).
export function precisionNote(fusion) {
  const choice = fusion.precision_choice ? h("p", { id: "precision-choice" }, fusion.precision_choice) : null;
  const reduced = fusion.reduced_ops || [];
  if ((!fusion.precision || fusion.precision === "as-is") && !reduced.length) return choice;
  // Under as-is and int8, bf16 operands are the model's own rounding (operators returned to bf16).
  const low = ["bf16", "fp16"].includes(fusion.precision) ? fusion.precision : "bf16";
  const onAvx512Bf16 = [...(fusion.avx512_bf16_matmuls || []), ...(fusion.avx512_bf16_convolutions || [])];
  if (!reduced.length) return h("p", { id: "precision" }, `Precision ${fusion.precision}: no float matmul or convolution to reduce.`);
  return h("div", { class: "precision", id: "precision" },
    choice,
    h("p", {}, `Precision ${fusion.precision}: ${reduced.length} matmul/convolution${reduced.length === 1 ? "" : "s"} on ${low} operands with fp32 accumulation, `
      + `${fusion.precision_compute}: ${fusion.precision_note}`),
    h("ul", {}, reduced.map((op) => h("li", {}, op))),
    (fusion.amx_bf16_matmuls || []).length
      ? h("p", { id: "amx-bf16" }, `On AMX-BF16 tiles (tdpbf16ps): ${fusion.amx_bf16_matmuls.join("; ")}`)
      : null,
    onAvx512Bf16.length ? h("p", { id: "avx512-bf16" }, `On AVX512-BF16 (vdpbf16ps): ${onAvx512Bf16.join("; ")}`) : null,
    (fusion.bf16_unpacked || []).length
      ? h("p", { id: "bf16-unpacked" }, `On no bf16 instruction: ${fusion.bf16_unpacked.join("; ")}`)
      : null);
}

function integerKernelsNote(fusion) {
  if (fusion.integer_kernels === "plain") return h("p", {}, "Integer kernels: plain tiled loops (this CPU has no vector integer dot product).");
  const forms = { vnni: "VNNI (vpdpbusd", amx: "VNNI (vpdpbusd", "avx-vnni": "VNNI (vpdpbusd ymm, AVX-VNNI", avx2: "vpmaddubsw/vpmaddwd ymm (no VNNI", avx512: "vpmaddubsw/vpmaddwd zmm (no VNNI" };
  if (!forms[fusion.integer_kernels]) return null;
  const packed = fusion.vnni_packed || [], unpacked = fusion.vnni_unpacked || [], amx = fusion.amx_matmuls || [];
  const seven = (fusion.seven_bit_packed || []).length;
  return h("div", {},
    h("p", {}, `On ${forms[fusion.integer_kernels]}, weights packed at compile time): ${packed.length} of ${(fusion.integer_ops || []).length}`
      + (fusion.integer_kernels === "amx" ? `, of which ${amx.length} matmuls on AMX tiles (tdpbusd)` : "")
      + (["avx2", "avx512"].includes(fusion.integer_kernels) ? `, of which ${seven} over 7-bit weights on vpmaddubsw, ${packed.length - seven} on exact int16 products (vpmaddwd)` : "")
      + (unpacked.length ? "; on plain integer kernels:" : "")),
    unpacked.length ? h("ul", {}, unpacked.map((why) => h("li", {}, why))) : null);
}
