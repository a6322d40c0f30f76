// One job: header, tuning curves, tasks, before/after latency, the compiler view, the lowering and the
// profile of the tuned model, kept live by the job's event stream.

import { api, streamEvents } from "../api.js";
import { h } from "../dom.js";
import { compilerView } from "../job/compiler.js";
import { tuningCurves } from "../job/curves.js";
import { jobHead, latencyBars } from "../job/head.js";
import { loweringView } from "../job/lowering.js";
import { profileView } from "../job/profile.js";
import { taskTable } from "../job/tasks.js";

export function jobPage(view, jobId) {
  const controller = new AbortController();
  const head = jobHead();
  const curves = tuningCurves(jobId);
  const tasks = taskTable();
  const bars = latencyBars();
  const compiler = compilerView(jobId);
  const lowering = loweringView(jobId);
  const profile = profileView(jobId);
  let known = [];
  let profiled = false;

  view.append(head.el,
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Tuning curve: estimated end-to-end latency"), h("p", { class: "hint" }, "Σ over tasks of weight × best latency so far, after each measured trial; drawn once every task has a measured (or earlier stored) schedule."), curves.jobChart),
      h("div", { class: "card" }, h("h2", {}, "Per task: every trial and the best so far"), curves.taskSelect, curves.taskChart)),
    h("div", { class: "row" },
      h("div", { class: "card" }, h("h2", {}, "Tasks"), tasks.el),
      h("div", { class: "card", style: "flex: 0 1 420px" }, h("h2", {}, "Before / after (end to end)"), bars.el)),
    compiler.el,
    lowering.el,
    profile.el);

  function apply(snapshot) {
    const firstTasks = !known.length && snapshot.tasks.length;
    known = snapshot.tasks;
    head.render(snapshot.job);
    tasks.render(known);
    curves.setTasks(known);
    compiler.setTasks(known);
    lowering.setTasks(known);
    bars.render(snapshot.job);
    if (firstTasks) {
      compiler.showGraph();
      lowering.show();
      if (known.some((t) => t.best_latency_us)) compiler.showTask(known[0].id);
    }
    if (!profiled && snapshot.job.status === "succeeded") {  // a job profiles its model as it measures it
      profiled = true;
      profile.show();
    }
    curves.schedule(false);
  }

  (async () => {
    try {
      const [job, taskList] = await Promise.all([api(`jobs/${jobId}`), api(`jobs/${jobId}/tasks`)]);
      apply({ job, tasks: taskList });
      await streamEvents(`jobs/${jobId}/events`, (event, data) => {
        apply(data);
        if (event === "end") {
          curves.schedule(true);
          if (known.length) compiler.showTask(compiler.selectedTask() || known[0].id);
        }
      }, controller.signal);
    } catch (err) {
      if (err.name !== "AbortError") head.fail(err);
    }
  })();
  return () => { controller.abort(); curves.stop(); };
}
