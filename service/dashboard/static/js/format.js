// Number and time formatting. A value that is not known shows as DASH, never as a guess.

export const DASH = "—";

const known = (x) => x !== null && x !== undefined && Number.isFinite(x);

/** Milliseconds with 3-4 significant digits, in the unit that reads best (µs, ms, s). */
export function ms(value) {
  if (!known(value)) return DASH;
  if (value < 1) return `${(value * 1e3).toPrecision(3)} µs`;
  if (value < 1000) return `${value.toPrecision(3)} ms`;
  return `${(value / 1e3).toPrecision(3)} s`;
}

/** Floating-point operations (FLOPs) with an SI prefix. */
export function flops(value) {
  if (!known(value)) return DASH;
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [scale, unit] of units) {
    if (value >= scale) return `${(value / scale).toPrecision(3)} ${unit}`;
  }
  return String(Math.round(value));
}

/** Throughput of `flopCount` operations in `latencyMs` milliseconds, in GFLOP/s. */
export function gflops(flopCount, latencyMs) {
  if (!known(flopCount) || !known(latencyMs) || latencyMs <= 0) return DASH;
  return (flopCount / (latencyMs * 1e-3) / 1e9).toPrecision(3);
}

/** `a / b` as "12.3×", or DASH when either is unknown. */
export function ratio(a, b) {
  if (!known(a) || !known(b) || b <= 0) return DASH;
  const r = a / b;
  return `${r.toPrecision(r < 10 ? 2 : 3)}×`;
}

export function bytes(value) {
  if (!known(value)) return DASH;
  if (value < 1024) return `${value} B`;
  if (value < 1024 ** 2) return `${(value / 1024).toFixed(1)} KiB`;
  if (value < 1024 ** 3) return `${(value / 1024 ** 2).toFixed(1)} MiB`;
  return `${(value / 1024 ** 3).toFixed(2)} GiB`;
}

export function count(value) {
  return known(value) ? value.toLocaleString("en-US") : DASH;
}

/** An ISO timestamp as local "YYYY-MM-DD HH:MM:SS". */
export function datetime(iso) {
  if (!iso) return DASH;
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return DASH;
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A duration in seconds as "1 h 02 min", "3 min 05 s", "12 s". */
export function duration(secs) {
  if (!known(secs) || secs < 0) return DASH;
  const s = Math.round(secs);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** How long ago an ISO timestamp was, from this browser's clock ("12 s ago"). */
export function ago(iso, now = Date.now()) {
  if (!iso) return DASH;
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return DASH;
  return `${duration(Math.max(0, (now - t) / 1e3))} ago`;
}

/** Seconds between two ISO timestamps (the second defaults to now). */
export function elapsed(startIso, endIso) {
  if (!startIso) return null;
  const end = endIso ? Date.parse(endIso) : Date.now();
  return (end - Date.parse(startIso)) / 1e3;
}
