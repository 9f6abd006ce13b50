// Step charts of best latency (uPlot, vendored in /dashboard/static/vendor, a global `uPlot`).

import { h } from "./dom.js";
import { ms } from "./format.js";

const PALETTE = [
  "#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5",
  "#9c6b4e", "#9498a0", "#1f77b4", "#d62728", "#2ca02c", "#8c564b", "#e377c2", "#17becf",
];

/** The colour of the i-th task, shared by the task table and the per-task charts. */
export function taskColor(i) {
  return PALETTE[i % PALETTE.length];
}

const HEIGHT = 220;

/** The x range of the data, at least `minSpan` wide (a single batch would span nothing). */
function xRange(xs, minSpan) {
  if (!xs || !xs.length) return [0, minSpan];
  let lo = xs[0];
  let hi = xs[xs.length - 1];
  if (hi - lo < minSpan) {
    const mid = (lo + hi) / 2;
    [lo, hi] = [mid - minSpan / 2, mid + minSpan / 2];
  }
  return [lo, hi];
}

/** Log-axis labels and grid lines: 1, 2, 5 x 10^k over two decades or less, else 10^k only. */
function sparseLogTicks(u, splits) {
  const { min, max } = u.scales.y;
  const decades = min > 0 && max > 0 ? Math.log10(max / min) : 0;
  const keep = decades > 2 ? [1] : [1, 2, 5];
  return splits.map((v) => {
    const mantissa = v / 10 ** Math.floor(Math.log10(v) + 1e-9);
    return keep.some((k) => Math.abs(mantissa - k) < 1e-6) ? v : null;
  });
}

/**
 * A chart in `container`: `title`, x axis `"trial"` or `"time"`, `series` [{label, color}].
 * Returns {update(data), focus(index|null), destroy()}; `data` is uPlot's aligned arrays.
 */
export function stepChart(container, { title, axis, series, legend = true }) {
  const frame = h("figure", { class: "chart" }, h("figcaption", {}, title));
  const plot = h("div", { class: "chart-plot" });
  const empty = h("div", { class: "chart-empty" }, "no measurements yet");
  frame.append(plot, empty);
  container.append(frame);
  const steps = uPlot.paths.stepped({ align: 1 });
  const options = {
    width: Math.max(200, plot.clientWidth || container.clientWidth || 400),
    height: HEIGHT,
    legend: { show: legend, live: legend },
    focus: { alpha: 0.25 },
    cursor: { focus: { prox: 16 }, drag: { x: true, y: false } },
    scales: {
      x: { time: axis === "time", range: (u) => xRange(u.data[0], axis === "time" ? 60 : 2) },
      y: { distr: 3 },
    },
    axes: [
      { label: axis === "time" ? undefined : "trials", size: axis === "time" ? 40 : 46 },
      {
        label: "latency", size: 70, values: (_u, ticks) => ticks.map((v) => (v === null ? "" : ms(v))),
        filter: sparseLogTicks, ticks: { show: false }, grid: { filter: sparseLogTicks },
      },
    ],
    series: [
      { label: axis === "time" ? "time" : "trial", value: axis === "time" ? undefined : (_u, v) => v },
      ...series.map((s) => ({
        label: s.label,
        stroke: s.color,
        width: 1.5,
        spanGaps: true,
        paths: steps,
        // Points only when there is a single x (no line to draw yet).
        points: { show: (u) => u.data[0].length === 1 },
        value: (_u, v) => (v === null || v === undefined ? "" : ms(v)),
      })),
    ],
  };
  const chart = new uPlot(options, [[], ...series.map(() => [])], plot);
  const resize = new ResizeObserver(() => {
    const width = plot.clientWidth;
    if (width > 0 && width !== chart.width) chart.setSize({ width, height: HEIGHT });
  });
  resize.observe(plot);
  return {
    update(data) {
      const points = data[0].length;
      empty.hidden = points > 0;
      frame.dataset.points = String(points);
      chart.setData(data);
    },
    focus(index) {
      chart.setSeries(index === null ? null : index + 1, { focus: true });
    },
    destroy() {
      resize.disconnect();
      chart.destroy();
    },
  };
}
