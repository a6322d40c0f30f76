// Kiln dashboard: plain JavaScript ES modules, no build step. Talks to the REST API under /api/v1.
//
// This entry module is the router: the part of the URL after '#' picks a page, and each page is a
// function (view, ...args) -> cleanup, in js/pages/. Shared pieces: js/dom.js (elements, formatting),
// js/api.js (REST calls, downloads, the event stream), js/token.js (the API token dialog),
// js/chart.js (uPlot charts, highlighted code) and js/job/ (the parts of the job page).

import { fill } from "./js/dom.js";
import { devicesPage } from "./js/pages/devices.js";
import { jobPage } from "./js/pages/job.js";
import { jobsPage } from "./js/pages/jobs.js";
import { modelsPage } from "./js/pages/models.js";
import { submitPage } from "./js/pages/submit.js";
import { setUpTokenDialog } from "./js/token.js";

// #/<section>: a page of its own; #/jobs/<id> is one job.
const pages = {
  jobs: jobsPage,
  submit: submitPage,
  models: modelsPage,
  devices: devicesPage,
};

let cleanup = () => {};

function route() {
  cleanup();
  const view = document.getElementById("view");
  fill(view);
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  const [section = "jobs", id] = parts;
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === section && !id);
  if (section === "jobs" && id) cleanup = jobPage(view, id);
  else if (pages[section]) cleanup = pages[section](view);
  else cleanup = jobsPage(view);
}

setUpTokenDialog(route);
window.addEventListener("hashchange", route);
route();
