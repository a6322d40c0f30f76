// The RPC devices registered at the service's tracker, refreshed every 5 s.

import { api } from "../api.js";
import { h, keepFilled, loadingCard } from "../dom.js";

export function devicesPage(view) {
  view.append(h("h1", {}, "Devices"));
  return keepFilled(loadingCard(view), () => api("devices"), devicesBody, 5000);
}

function devicesBody(d) {
  return [
    h("p", {}, d.tracker ? `RPC tracker ${d.tracker}` : d.message),
    d.tracker && !d.devices.length ? h("p", { class: "muted" }, `No server registered; start one with kiln rpc server --tracker ${d.tracker} --key KEY`) : null,
    d.devices.length ? h("table", { id: "devices-table" }, h("thead", {}, h("tr", {}, ...["Key", "Servers", "Free", "Pending"].map((t) => h("th", {}, t)))),
      h("tbody", {}, d.devices.map((x) => h("tr", {}, h("td", {}, x.key), h("td", { class: "num" }, x.total), h("td", { class: "num" }, x.free), h("td", { class: "num" }, x.pending))))) : null,
  ];
}
