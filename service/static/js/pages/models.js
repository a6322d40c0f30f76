// The stored models, each with its tuning tasks on this host on demand.

import { api } from "../api.js";
import { errorBox, fill, fmtAge, h, loadingCard, planTable } from "../dom.js";

export function modelsPage(view) {
  view.append(h("h1", {}, "Models"));
  const card = loadingCard(view);
  api("models").then((models) => {
    if (!models.length) {
      fill(card, h("p", {}, "No model yet. ", h("a", { href: "#/submit" }, "Upload one.")));
      return;
    }
    fill(card, h("table", { id: "models-table" },
      h("thead", {}, h("tr", {}, ...["Name", "Format", "Inputs", "Outputs", "Size", "sha256", "Uploaded", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, models.map(modelRows))));
  }).catch((err) => fill(card, errorBox(err)));
  return () => {};
}

const signature = (list) => list.map((t) => `${t.name} [${t.shape.join(", ")}] ${t.dtype}`).join("; ");

function modelRows(m) {
  const detail = h("td", { colspan: 8 });
  const detailRow = h("tr", { hidden: true }, detail);
  async function toggleTasks() {
    detailRow.hidden = !detailRow.hidden;
    if (detailRow.hidden || detail.childElementCount) return;
    detail.append(h("p", { class: "muted" }, "Extracting tasks…"));
    try {
      const plan = await api(`models/${m.id}/tasks?target=host`);
      fill(detail, h("p", { class: "muted" }, `${plan.fusion.operators_before} operators → ${plan.fusion.kernels_after} kernels on ${plan.target_key}`),
        planTable(plan.tasks, { head: false, weightPrefix: "×" }));
    } catch (err) { fill(detail, errorBox(err)); }
  }
  const row = h("tr", {},
    h("td", {}, m.name), h("td", {}, m.format), h("td", {}, signature(m.inputs)), h("td", {}, signature(m.outputs)),
    h("td", { class: "num" }, `${(m.size_bytes / 1e6).toFixed(2)} MB`), h("td", { class: "muted" }, m.sha256.slice(0, 12)),
    h("td", { class: "muted" }, fmtAge(m.created_at)),
    h("td", {}, h("button", { onclick: toggleTasks }, "Tasks")));
  return [row, detailRow];
}
