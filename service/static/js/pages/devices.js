// The RPC devices registered at the service's tracker, and which running job measures on which server,
// refreshed every 5 s.

import { api } from "../api.js";
import { fmtAge, h, keepFilled, loadingCard } from "../dom.js";

export function devicesPage(view) {
  view.append(h("h1", {}, "Devices"));
  return keepFilled(loadingCard(view), () => api("devices"), devicesBody, 5000);
}

function devicesBody(d) {
  const uses = d.devices.flatMap((x) => x.in_use.map((u) => ({ key: x.key, ...u })));
  return [
    h("p", {}, d.tracker ? `RPC tracker ${d.tracker}` : d.message),
    d.tracker && !d.devices.length ? h("p", { class: "muted" }, `No server registered; start one with kiln rpc server --tracker ${d.tracker} --key KEY`) : null,
    d.devices.length ? h("table", { id: "devices-table" }, h("thead", {}, h("tr", {}, ...["Key", "Servers", "Free", "Pending", "Running jobs"].map((t) => h("th", {}, t)))),
      h("tbody", {}, d.devices.map((x) => h("tr", {}, h("td", {}, x.key), h("td", { class: "num" }, x.total), h("td", { class: "num" }, x.free), h("td", { class: "num" }, x.pending),
        h("td", { class: "num" }, new Set(x.in_use.map((u) => u.job_id ?? "other")).size))))) : null,
    d.devices.length ? h("h2", {}, "Servers in use") : null,
    d.devices.length && !uses.length ? h("p", { class: "muted" }, "No running job is measuring on these devices.") : null,
    uses.length ? h("table", { id: "server-use-table" }, h("thead", {}, h("tr", {}, ...["Key", "Server", "Job", "Candidates measured", "Last candidate"].map((t) => h("th", {}, t)))),
      h("tbody", {}, uses.map((u) => h("tr", {}, h("td", {}, u.key), h("td", {}, u.server),
        h("td", {}, u.job_id ? h("a", { href: `#/jobs/${u.job_id}` }, u.job_id.slice(0, 8)) : h("span", { class: "muted" }, "another user's job")),
        h("td", { class: "num" }, u.candidates), h("td", {}, fmtAge(u.last_used_at)))))) : null,
  ];
}
