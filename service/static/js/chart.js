// Line charts with the vendored uPlot (loaded as a classic script before the modules run).

import { fill, h } from "./dom.js";

const COLORS = ["#c2410c", "#1d4ed8", "#15803d", "#7c3aed"];

// Trial numbers are whole: the x axis ticks only at these steps (uPlot would otherwise pick 0.5, 2.5...).
const WHOLE_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000];

export function lineChart(container, { xLabel, yLabel, series, x, ys, points = false, empty = "No measured trial yet." }) {
  fill(container);
  container.dataset.points = String(x.length);
  if (!x.length) {
    container.append(h("p", { class: "muted" }, empty));
    return null;
  }
  const width = Math.max(320, container.clientWidth || 600);
  const opts = {
    width,
    height: 260,
    scales: { x: { time: false } },
    // The legend names the series; values under the cursor would read "--" until one hovers the plot.
    legend: { live: false },
    axes: [{ label: xLabel, incrs: WHOLE_STEPS }, { label: yLabel, size: 70 }],
    series: [
      { label: xLabel },
      ...series.map((s, i) => ({
        label: s.label,
        stroke: COLORS[i % COLORS.length],
        width: s.points ? 0 : 2,
        paths: s.points ? () => null : undefined,
        points: { show: s.points || points, size: s.points ? 5 : 3, fill: COLORS[i % COLORS.length] },
        spanGaps: true,
      })),
    ],
  };
  return new window.uPlot(opts, [x, ...ys], container);
}

// A block of code, highlighted by the vendored highlight.js when it is there.
export function code(text) {
  const el = h("code", { class: "language-python" }, text);
  if (window.hljs) window.hljs.highlightElement(el);
  return h("pre", { class: "code" }, el);
}
