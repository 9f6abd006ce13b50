// A job's tuning history as the dashboard keeps it: the pages of
// GET /api/v1/jobs/{id}/history merged into best-so-far curves, and the aligned arrays uPlot draws.
//
// Each page lists the records that lowered their task's best *within that page*; keeping the
// minimum per task across pages leaves exactly the job-wide improvements (see the API docs).

const toSecs = (iso) => (iso ? Date.parse(iso) / 1e3 : null);

export class JobHistory {
  constructor() {
    this.lastId = 0; // pass as ?after= for the next page
    this.trials = 0; // the job's records read so far (valid and failed)
    this.failed = 0;
    this.firstAt = null; // seconds since the epoch
    this.lastAt = null;
    this.more = true; // a page was cut at its limit (or nothing was read yet)
    /** Job-wide improvements in record order: {trial, t, workload, best} (best in ms). */
    this.points = [];
    /** workload id -> best latency (ms) among the job's records read so far. */
    this.best = new Map();
  }

  /** Merge the next page (its `after` must be this.lastId). Returns whether anything changed. */
  apply(page) {
    if (page.after !== this.lastId) {
      throw new Error(`history page after=${page.after} does not follow ${this.lastId}`);
    }
    let changed = false;
    for (const p of page.points) {
      const best = this.best.get(p.workload_id);
      if (best === undefined || p.best_ms < best) {
        this.best.set(p.workload_id, p.best_ms);
        this.points.push({ trial: p.trial, t: toSecs(p.measured_at), workload: p.workload_id, best: p.best_ms });
        changed = true;
      }
    }
    if (page.records > 0) {
      this.trials = page.trials_before + page.records;
      this.failed += page.failed;
      this.firstAt ??= toSecs(page.first_measured_at);
      this.lastAt = toSecs(page.last_measured_at);
      changed = true;
    }
    this.lastId = page.last_id;
    this.more = page.more;
    return changed;
  }
}

/** The x value of a point on an axis ("trial" or "time"), and the right edge of the axis. */
function axisOf(history, axis) {
  return axis === "time"
    ? { x: (p) => p.t, end: history.lastAt }
    : { x: (p) => p.trial, end: history.trials };
}

/**
 * Best latency of each task against trials or time: uPlot's aligned data
 * [xs, ys(task 0), ys(task 1), ...] with null where a task has no new value (drawn as steps
 * holding the previous best). Every curve reaches the right edge of the axis.
 */
export function taskSeries(history, workloadIds, axis) {
  const { x, end } = axisOf(history, axis);
  const column = new Map(workloadIds.map((id, i) => [id, i]));
  const xs = [];
  const ys = workloadIds.map(() => []);
  const put = (at, col, value) => {
    if (!xs.length || xs[xs.length - 1] !== at) {
      xs.push(at);
      for (const y of ys) y.push(null);
    }
    ys[col][xs.length - 1] = value;
  };
  for (const p of history.points) {
    const col = column.get(p.workload);
    if (col !== undefined && x(p) !== null) put(x(p), col, p.best);
  }
  // Every task's current best at the right edge (a new x, or the last one when the last
  // improvement is as recent as the last record: timestamps have one-second resolution).
  if (end !== null && xs.length && end >= xs[xs.length - 1]) {
    workloadIds.forEach((id, col) => {
      if (history.best.has(id)) put(end, col, history.best.get(id));
    });
  }
  return [xs, ...ys];
}

/**
 * The estimated model latency, sum over the job's tasks of weight x best latency, after every
 * improvement: [xs, ys]. A task the job reused without measuring (trial budget 0) counts with its
 * stored best; the curve starts once every task has a value.
 */
export function overallSeries(history, tasks, axis) {
  const { x, end } = axisOf(history, axis);
  const weight = new Map(tasks.map((t) => [t.workload_id, t.weight]));
  const current = new Map();
  for (const t of tasks) {
    if (t.trial_budget === 0 && t.best_latency_ms !== null) current.set(t.workload_id, t.best_latency_ms);
  }
  const estimate = () => {
    if (current.size < tasks.length) return null;
    let sum = 0;
    for (const [id, best] of current) sum += weight.get(id) * best;
    return sum;
  };
  const xs = [];
  const ys = [];
  for (const p of history.points) {
    if (!weight.has(p.workload) || x(p) === null) continue;
    current.set(p.workload, p.best);
    const value = estimate();
    if (value === null) continue;
    if (xs.length && xs[xs.length - 1] === x(p)) ys[ys.length - 1] = value;
    else { xs.push(x(p)); ys.push(value); }
  }
  if (xs.length && end !== null && end > xs[xs.length - 1]) {
    xs.push(end);
    ys.push(ys[ys.length - 1]);
  }
  return [xs, ys];
}
