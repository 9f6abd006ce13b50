"""Screenshots of the dashboard for docs/: a real tuning job, photographed in headless Chromium.

    .venv/bin/python scripts/dashboard_screenshots.py [--example small_cnn] [--trials 128]

Starts ``tunehub serve`` with one embedded worker in a temporary home, uploads the example
network (exported to ONNX at run time) and tunes it with ``--trials`` real measurements. When
that job has succeeded, a second job (the MLP example) starts; once it has measured a few
batches, takes 1200-pixel-wide PNGs of the jobs, job (the finished one), models, workers and
database pages into ``docs/screenshots/``, then cancels the second job. Takes several minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.dashboard.browser import launch  # noqa: E402
from tests.service.conftest import start_server, stop_server, upload, wait_for_job  # noqa: E402

OUT = REPO / "docs" / "screenshots"
PAGES = {
    "jobs": ("/dashboard/", "#jobs-table tbody tr[data-job-id]"),
    "job": (None, "#charts[data-points]"),
    "models": ("/dashboard/models", "#models-table tbody tr[data-model-id]"),
    "workers": ("/dashboard/workers", "#workers-table tbody tr[data-worker]"),
    "stats": ("/dashboard/stats", "#stat-records"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--example", default="small_cnn")
    parser.add_argument("--trials", type=int, default=128)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from examples.export import export_onnx

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tunehub-screenshots-") as tmp:
        model_path = export_onnx(args.example, Path(tmp) / f"{args.example}.onnx")
        server = start_server(
            Path(tmp) / "home", workers=1, env={"TUNEHUB_MAX_UPLOAD_BYTES": str(1 << 30)}
        )
        try:
            token = server.local_token()
            with server.client(token) as client:
                model = upload(client, model_path).json()
                job = client.post(
                    "/jobs", json={"model_id": model["id"], "trial_budget": args.trials}
                ).json()
                started = time.monotonic()
                job = wait_for_job(
                    client, job["id"], {"succeeded", "failed", "cancelled"}, timeout=3600
                )
                print(f"job {job['id']} {job['status']} in {time.monotonic() - started:.0f} s")
                if job["status"] != "succeeded":
                    print(job, file=sys.stderr)
                    return 1
                second = upload(client, export_onnx("mlp", Path(tmp) / "mlp.onnx")).json()
                running = client.post(
                    "/jobs", json={"model_id": second["id"], "trial_budget": 1000}
                ).json()
                while client.get(f"/jobs/{running['id']}").json()["trials_done"] < 48:
                    time.sleep(2)
            with sync_playwright() as playwright:
                browser = launch(playwright)
                context = browser.new_context(viewport={"width": 1200, "height": 800})
                context.add_init_script(f"localStorage.setItem('tunehub.token', {token!r});")
                page = context.new_page()
                for name, (path, ready) in PAGES.items():
                    page.goto(server.url + (path or f"/dashboard/jobs/{job['id']}"))
                    page.wait_for_selector(ready, timeout=30_000)
                    page.wait_for_timeout(300)  # let the charts' resize settle
                    if name == "models":
                        page.select_option("#job-model", str(model["id"]))
                        page.click(f"#models-table tr[data-model-id='{model['id']}'] button")
                        page.wait_for_selector("#model-detail table")
                    target = OUT / f"{name}.png"
                    page.screenshot(path=str(target), full_page=True)
                    print(f"{target.relative_to(REPO)}: {target.stat().st_size // 1024} KiB")
                browser.close()
            with server.client(token) as client:
                client.post(f"/jobs/{running['id']}/cancel")
        finally:
            stop_server(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
