"""Dashboard benchmark: the job page with 10^5 records, loaded in headless Chromium.

    .venv/bin/python bench/bench_dashboard.py [--records 100000] [--loads 7] [--model resnet18]

Starts ``tunehub serve`` (API only, no worker; SQLite in a temporary home) on a free loopback
port, uploads the example model (``--model``, exported to ONNX at run time), queues a job and
writes ``--records`` tuning records for it through the storage API, in batches of 64 of one
task each with task and job progress after each batch, as a worker does
(``tests/dashboard/job_records.py``; latencies follow a tuning curve, nothing is measured).

Then loads ``/dashboard/jobs/<id>`` ``--loads`` times in headless Chromium (Debian's package),
each in a fresh browser context (empty cache: the page's files are fetched every time), and reads
the Performance API: first paint and first contentful paint, the time the task table was
filled and the time the four best-latency charts were drawn from the whole history (marks
``tunehub:task-table`` and ``tunehub:plot`` set by the page), and the history request's own
duration. Goal: median time until the charts are filled under 1 s. The first load after the
server started is reported on its own: the server then reads the whole history from the
database; later whole reads start from the copy it kept (``service/history_cache.py``).

Also times the API alone with httpx (median of 20): the whole history (``?after=0``), the whole
history read from the database (a limit one short of it, which the kept copy cannot answer),
and a poll for what is new (``?after=<last record id>``) after 64 more records.

Writes ``bench/results/dashboard_<date>.md`` (machine, date, settings, numbers).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_db import machine  # noqa: E402
from tests.dashboard.browser import launch  # noqa: E402
from tests.dashboard.job_records import RecordWriter  # noqa: E402
from tests.service.conftest import start_server, stop_server, upload  # noqa: E402

GOAL_MS = 1000.0
READ_TIMINGS = """() => {
  const at = (name) => performance.getEntriesByName(name)[0]?.startTime ?? null;
  const nav = performance.getEntriesByType("navigation")[0];
  const history = performance.getEntriesByType("resource")
    .find((r) => r.name.includes("/api/v1/jobs/") && r.name.includes("/history"));
  return {
    first_paint: at("first-paint"),
    first_contentful_paint: at("first-contentful-paint"),
    dom_content_loaded: nav.domContentLoadedEventEnd,
    task_table: at("tunehub:task-table"),
    plot: at("tunehub:plot"),
    history_request: history ? history.responseEnd - history.startTime : null,
    history_bytes: history ? history.encodedBodySize : null,
  };
}"""


def _chromium_version() -> str:
    from tests.dashboard.browser import chromium_path

    done = subprocess.run([str(chromium_path()), "--version"], capture_output=True, text=True)
    return done.stdout.strip() or "Chromium (version unknown)"


def fill_records(server, job_id: int, records: int) -> tuple[RecordWriter, float]:
    started = time.monotonic()
    storage = server.storage()
    writer = RecordWriter(storage, job_id, batch_size=64, seed=1)
    writer.start()
    done = 0
    while done < records:
        step = min(10_000, records - done)
        writer.commit(step)
        done += step
        print(f"  {done} records", flush=True)
    return writer, time.monotonic() - started


def load_page(browser, url: str, token: str, trials: int) -> dict:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.add_init_script(f"localStorage.setItem('tunehub.token', {token!r});")
    page = context.new_page()
    try:
        page.goto(url)
        page.wait_for_selector(f"#charts[data-trials='{trials}']", timeout=60_000)
        page.wait_for_function("() => performance.getEntriesByName('tunehub:plot').length > 0")
        return page.evaluate(READ_TIMINGS)
    finally:
        context.close()


def time_api(client: httpx.Client, path: str, params: dict, repeat: int = 20) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path, params=params)
        samples.append((time.perf_counter() - start) * 1e3)
        response.raise_for_status()
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--model", default="resnet18", help="an example network (examples/)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from examples.export import export_onnx

    with tempfile.TemporaryDirectory(prefix="tunehub-bench-dashboard-") as tmp:
        home = Path(tmp) / "home"
        model_path = export_onnx(args.model, Path(tmp) / f"{args.model}.onnx")
        server = start_server(home, workers=0, env={"TUNEHUB_MAX_UPLOAD_BYTES": str(1 << 30)})
        try:
            token = server.local_token()
            with server.client(token) as client:
                response = upload(client, model_path)
                response.raise_for_status()
                model = response.json()
                job = client.post(
                    "/jobs", json={"model_id": model["id"], "trial_budget": args.records}
                ).json()
            print(
                f"{args.model}: {len(model['tasks'])} tasks; writing {args.records} records "
                f"for job {job['id']}",
                flush=True,
            )
            writer, fill_secs = fill_records(server, job["id"], args.records)
            url = f"{server.url}/dashboard/jobs/{job['id']}"
            loads = []
            with sync_playwright() as playwright:
                browser = launch(playwright)
                # The first load: the server reads the whole history from the database (and
                # keeps it); the browser is fresh. Reported on its own.
                first = load_page(browser, url, token, args.records)
                print(f"  first load: {first}", flush=True)
                for i in range(args.loads):
                    loads.append(load_page(browser, url, token, args.records))
                    print(f"  load {i + 1}: {loads[-1]}", flush=True)
                browser.close()
            with server.client(token) as client:
                history_path = f"/jobs/{job['id']}/history"
                full_ms = time_api(client, history_path, {})
                full = client.get(history_path).json()
                # One record short of everything: the kept prefix cannot answer, a full scan.
                scan_ms = time_api(client, history_path, {"limit": args.records - 1}, repeat=5)
                writer.commit(64)
                poll_ms = time_api(client, history_path, {"after": full["last_id"]})
            writer.storage.close()
        finally:
            stop_server(server)

    def med(key: str) -> float:
        return statistics.median(load[key] for load in loads)

    def spread(key: str) -> str:
        values = [load[key] for load in loads]
        return f"{statistics.median(values):.0f} | {min(values):.0f} | {max(values):.0f}"

    info = machine()
    now = dt.datetime.now(dt.UTC)
    load1, load5, load15 = os.getloadavg()
    plot = med("plot")
    lines = [
        f"# Dashboard: job page with {args.records:,} records ({now.date()})",
        "",
        f"- machine: {info['cpu']}, {info['cores']} usable cores, {info['memory']}, "
        f"Python {info['python']}; {_chromium_version()}",
        f"- date: {now.isoformat(timespec='seconds')}; load average after the run (1/5/15 min): "
        f"{load1:.1f} / {load5:.1f} / {load15:.1f} (other processes on this shared machine "
        "included)",
        f"- command: `.venv/bin/python bench/bench_dashboard.py --records {args.records} "
        f"--loads {args.loads} --model {args.model}`",
        f"- server: `tunehub serve --workers 0`, SQLite; model {args.model} ({len(model['tasks'])} "
        f"tasks); one job with {args.records:,} records ({writer.serial} batches of 64 written "
        f"in {fill_secs:.0f} s through the storage API), {len(full['points'])} best-so-far points",
        f"- browser: headless Chromium, 1200x800, a fresh context per load (nothing cached); "
        f"times from navigation start (Performance API), {args.loads} loads after the first",
        "",
        "| job page, ms from navigation start | median | min | max |",
        "|---|---:|---:|---:|",
        f"| first paint | {spread('first_paint')} |",
        f"| first contentful paint | {spread('first_contentful_paint')} |",
        f"| DOM content loaded | {spread('dom_content_loaded')} |",
        f"| task table filled | {spread('task_table')} |",
        f"| best-latency charts filled (whole history) | {spread('plot')} |",
        "| history request (`GET /jobs/{id}/history`, in the page) | "
        f"{spread('history_request')} |",
        "",
        "The first load after the server started (the server scans the whole history, then keeps "
        f"it): first contentful paint {first['first_contentful_paint']:.0f} ms, task table "
        f"{first['task_table']:.0f} ms, charts {first['plot']:.0f} ms, history request "
        f"{first['history_request']:.0f} ms.",
        "",
        "| API alone (httpx, median of 20) | ms |",
        "|---|---:|",
        f"| whole history, `?after=0` ({args.records:,} records, "
        f"{loads[0]['history_bytes']:,} bytes; kept prefix + new records) | {full_ms:.1f} |",
        f"| whole history read from the database (`?limit={args.records - 1}`: the kept prefix "
        f"cannot answer; median of 5) | {scan_ms:.1f} |",
        f"| poll, `?after=<last id>` (64 new records) | {poll_ms:.1f} |",
        "",
        f"Goal, charts filled under {GOAL_MS:.0f} ms (median): "
        f"{'met' if plot < GOAL_MS else 'NOT met'} ({plot:.0f} ms).",
        "",
    ]
    out = args.output or REPO / "bench" / "results" / f"dashboard_{now.date()}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
