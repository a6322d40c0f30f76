// The RPC devices registered at the service's tracker, refreshed every 5 s.

import { api } from "../api.js";
import { errorBox, fill, h, loadingCard } from "../dom.js";

export function devicesPage(view) {
  view.append(h("h1", {}, "Devices"));
  const card = loadingCard(view);
  let timer = null;
  async function refresh() {
    try {
      const d = await api("devices");
      fill(card,
        h("p", {}, d.tracker ? `RPC tracker ${d.tracker}` : d.message),
        d.tracker && !d.devices.length ? h("p", { class: "muted" }, `No server registered; start one with kiln rpc server --tracker ${d.tracker} --key KEY`) : null,
        d.devices.length ? h("table", { id: "devices-table" }, h("thead", {}, h("tr", {}, ...["Key", "Servers", "Free", "Pending"].map((t) => h("th", {}, t)))),
          h("tbody", {}, d.devices.map((x) => h("tr", {}, h("td", {}, x.key), h("td", { class: "num" }, x.total), h("td", { class: "num" }, x.free), h("td", { class: "num" }, x.pending))))) : null);
    } catch (err) {
      fill(card, errorBox(err));
    }
    timer = setTimeout(refresh, 5000);
  }
  refresh();
  return () => clearTimeout(timer);
}
