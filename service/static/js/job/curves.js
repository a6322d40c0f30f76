// The job's tuning curves: estimated end-to-end latency over tuning time against the peer's, and one
// task's trials and best.

import { api } from "../api.js";
import { lineChart } from "../chart.js";
import { errorBox, fill, h } from "../dom.js";
import { taskPicker } from "./tasks.js";

export function tuningCurves(jobId) {
  const jobChart = h("div", { class: "chart", id: "curve-chart" });
  const taskChart = h("div", { class: "chart", id: "task-chart" });
  let selectedTask = null;
  let tasks = [];
  let lastDrawnAt = 0;
  let timer = null;
  const picker = taskPicker("task-select", (taskId) => { selectedTask = taskId; drawTask(); });

  async function drawJob() {
    lastDrawnAt = Date.now();
    try {
      const curve = await api(`jobs/${jobId}/curve`);
      const pts = curve.points.filter((p) => p.estimate_us !== null);
      const measured = tasks.filter((t) => t.best_latency_us !== null && t.best_latency_us !== undefined).length;
      const empty = curve.points.length
        ? `${curve.points.length} trials measured so far; the estimate is drawn once every task has a measured schedule (${measured} of ${tasks.length} tasks have one).`
        : "No measured trial yet.";
      // The curve a user judges a job by: its latency over tuning time against the peer's.
      const ys = [pts.map((p) => p.estimate_us / 1000)];
      const series = [{ label: "Kiln, estimated (Σ calls × best kernel)" }];
      if (curve.peer_ms !== null && curve.peer_ms !== undefined) {
        ys.push(pts.map(() => curve.peer_ms));
        series.push({ label: `${curve.peer} (measured)` });
      }
      lineChart(jobChart, { xLabel: "seconds since submitted", yLabel: "ms", x: pts.map((p) => Math.round(p.elapsed_s)), ys, series, empty });
      jobChart.dataset.trials = String(curve.points.length);
    } catch (err) {
      fill(jobChart, errorBox(err));
    }
    await drawTask();
  }

  async function drawTask() {
    if (selectedTask === null) return;
    try {
      const curve = await api(`jobs/${jobId}/tasks/${selectedTask}/curve`);
      lineChart(taskChart, {
        xLabel: "trial of this task", yLabel: "µs", x: curve.points.map((p) => p.index),
        ys: [curve.points.map((p) => p.latency_us), curve.points.map((p) => p.best_us)],
        series: [{ label: "measured", points: true }, { label: "best so far" }],
      });
    } catch (err) {
      fill(taskChart, errorBox(err));
    }
  }

  return {
    jobChart,
    taskChart,
    taskSelect: picker.el,
    setTasks(next) {
      tasks = next;
      picker.render(tasks);
      if (selectedTask === null && tasks.length) selectedTask = tasks[0].id;
    },
    // At most one redraw every 2 s while trials stream in; force redraws now.
    schedule(force) {
      clearTimeout(timer);
      const wait = force ? 0 : Math.max(0, 2000 - (Date.now() - lastDrawnAt));
      timer = setTimeout(drawJob, wait);
    },
    stop: () => clearTimeout(timer),
  };
}
