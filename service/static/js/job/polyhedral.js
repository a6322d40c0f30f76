// The compiler view's "Polyhedral" tab: a task's loop nest as isl sees it (domain, dependences and their
// summary), what they allow per loop (the legality grid), fusion depths, and the best schedule's tiles
// as bars against the cache sizes. Loaded only when the tab is opened.

import { api } from "../api.js";
import { errorBox, fill, h } from "../dom.js";

const yes = (v) => (v ? "✓" : "–");

function kib(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  return bytes >= 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`;
}

function table(id, headers, rows) {
  return h("table", { id, style: "width: auto" },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))));
}

// One bar per cut of the best tiling: its footprint against the cache level the pruner holds it to.
function footprintBars(tiling, caches) {
  const largest = Math.max(...caches.levels.map((c) => c.bytes), ...tiling.cuts.map((c) => c.total_bytes), 1);
  // Log scale: the cuts of one tiling span bytes to megabytes.
  const scale = (b) => (100 * Math.log2(1 + b)) / Math.log2(1 + largest);
  return h("div", { class: "bars footprints", dataset: { statement: tiling.statement } },
    h("p", { class: "muted" }, `${tiling.statement} (${tiling.structure}), factors ${tiling.factors.map((f) => f.join("·")).join(" | ")}: `,
      tiling.inside_feasible_set === null ? "cache sizes unknown" : tiling.inside_feasible_set ? "inside the predicted-feasible set" : `outside it (${tiling.overflows.join("; ")})`),
    tiling.cuts.map((cut) => {
      const over = cut.cache_bytes !== null && cut.total_bytes > cut.cache_bytes;
      return h("div", { class: `bar${over ? " over" : ""}`, dataset: { cut: cut.cut } },
        h("span", { class: "name" }, `below ${cut.cut}`),
        h("span", { class: "track" },
          h("span", { class: "fill", style: `width: ${scale(cut.total_bytes).toFixed(1)}%` }),
          caches.levels.map((c) => h("span", { class: "limit", title: `${c.name} ${kib(c.bytes)}`, style: `left: ${scale(c.bytes).toFixed(1)}%` }, c.name))),
        h("span", { class: "val" }, `${kib(cut.total_bytes)}${cut.cache_level ? ` vs ${cut.cache_level} ${kib(cut.cache_bytes)}` : ""}`));
    }));
}

export function polyhedralTab(jobId) {
  const el = h("div", { id: "poly-view" });

  async function show(taskId) {
    fill(el, h("p", { class: "muted" }, "Analysing…"));
    try {
      const p = await api(`jobs/${jobId}/tasks/${taskId}/polyhedral`);
      const search = p.search && p.search.examined !== null && p.search.examined !== undefined
        ? `${p.search.space}: ${p.search.rejected} of ${p.search.examined} candidates rejected, ${p.search.passed_through} passed through anyway, ${p.search.seeds} seeds measured`
        : `space ${p.search ? p.search.space : "–"}: no pruning statistics`;
      const best = p.best_schedule;
      fill(el,
        p.exact ? null : h("div", { class: "notice" }, p.fallback, h("ul", {}, p.inexact.map((x) => h("li", {}, x)))),
        h("p", { class: "muted", id: "poly-search" }, search),
        h("h3", {}, "Iteration domain"), h("pre", { class: "code isl", id: "poly-domain" }, p.domain),
        h("h3", {}, "Dependences per statement"),
        table("poly-summary", ["Statement", "isl", "Loops", "Dependences"],
          p.statements.map((s) => [s.name, s.isl_name, s.loops.map((l) => `${l.name}:${l.extent}${l.kind === "reduction" ? "ʳ" : ""}`).join(" "), s.dependence_summary])),
        h("h3", {}, "Legality of each loop"),
        table("poly-legality", ["Statement", "Loop", "Extent", "Kind", "Parallel", "Band", "Permutable", "Reduction (rfactor)", "Vectorizable", "Carries"],
          p.loops.map((l) => [l.statement, l.loop, l.extent, l.kind, yes(l.parallel), l.band, yes(l.permutable), yes(l.reduction), yes(l.vectorizable), l.carries.join(", ") || "–"])),
        h("details", {}, h("summary", {}, `Dependences (${p.dependences.length}, memory-based) and access relations`),
          table("poly-dependences", ["Kind", "Source → sink", "Tensor", "Distance", "Carried by"],
            p.dependences.map((d) => [d.kind, `${d.source} → ${d.sink}`, d.tensor, d.distance || "–", d.carried_by.join(", ") || "textual order"])),
          table("poly-accesses", ["Statement", "Tensor", "Access", "Relation", "Reuse along"],
            p.accesses.map((a) => [a.statement, a.tensor, a.kind + (a.exact ? "" : " (box)") + (a.clamped ? " (clamped)" : ""), a.relation, a.reuse.map((v) => `(${v.join(", ")})`).join(" ") || "–"]))),
        p.fusion.length ? h("div", {}, h("h3", {}, "Fusion depths (compute_at)"),
          table("poly-fusion", ["Producer", "Consumer", "Tensor", "Depth", "Under"],
            p.fusion.map((f) => [f.producer, f.consumer, f.tensor, f.depth, f.shared_loops.join(", ") || "–"]))) : null,
        h("h3", {}, `Best schedule's tiles against the caches (${p.caches.source}: ${p.caches.levels.map((c) => `${c.name} ${kib(c.bytes)}`).join(", ") || "unknown"})`),
        best && best.tilings.length
          ? best.tilings.map((t) => footprintBars(t, p.caches))
          : h("p", { class: "muted", id: "poly-no-tiles" }, (best && best.note) || "No measured schedule yet."));
    } catch (err) {
      fill(el, errorBox(err));
    }
  }

  return { el, show };
}
