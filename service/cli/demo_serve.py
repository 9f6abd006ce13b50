"""``tunehub demo --serve``: the README's main job through the service, as most users meet it.

Starts ``tunehub serve`` on the embedded default (API + one worker process, SQLite in
``$TUNEHUB_HOME``), uploads a bundled example over HTTP, queues a tuning job and prints its URL,
follows it to a verified artifact, downloads ``model.so`` + ``manifest.json`` (checking the
sha256), and compares the tuned latency with ONNX Runtime. Then it stops, or keeps serving with
``--keep-serving`` until Ctrl-C. Running it again reuses every tuned task (zero measurements).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

from service.cli.errors import CliError

FINAL = ("succeeded", "failed", "cancelled")


def run_demo_serve(args: argparse.Namespace) -> int:
    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    import db
    from examples.export import export_onnx
    from examples.networks import EXAMPLES
    from service.cli.serve_command import print_banner
    from service.serve import Service, port_in_use
    from service.settings import Settings

    if args.example not in EXAMPLES:
        raise CliError(f"unknown example {args.example!r}; choose from {sorted(EXAMPLES)}")
    settings = Settings(**({"port": args.port} if args.port else {}))
    if port_in_use(settings.host, settings.port):
        raise CliError(
            f"{settings.host}:{settings.port} is in use (a `tunehub serve` already running?); "
            "stop it or pass --port"
        )
    console = Console()
    home = settings.home_dir()
    model_path = home / "examples" / f"{args.example}.onnx"
    if not model_path.exists():
        console.print(f"exporting example [bold]{args.example}[/] to {model_path}")
        export_onnx(args.example, model_path)
    try:
        service = Service(settings, workers=1, log_level="warning")
    except db.StorageError as err:
        raise CliError(str(err)) from None
    service.start_in_thread()
    try:
        print_banner(service, 1)
        headers = {"Authorization": f"Bearer {service.token}"}
        with httpx.Client(base_url=f"{service.url}/api/v1", headers=headers, timeout=300) as client:
            with open(model_path, "rb") as handle:
                response = client.post(
                    "/models",
                    files={"file": (model_path.name, handle, "application/octet-stream")},
                )
            if response.status_code not in (200, 201):
                raise CliError(f"upload refused: {response.json().get('detail')}", exit_code=1)
            model = response.json()
            table = Table(
                title=f"model {model['id']} ({model['filename']}): "
                f"{len(model['tasks'])} tuning tasks"
            )
            for column in ("key", "name", "MFLOPs", "weight", "summary"):
                table.add_column(column, overflow="fold")
            for task in model["tasks"]:
                table.add_row(
                    task["key"],
                    task["name"],
                    f"{(task['flops'] or 0) / 1e6:.3f}",
                    str(task["weight"]),
                    task["summary"],
                )
            console.print(table)
            job = client.post(
                "/jobs", json={"model_id": model["id"], "trial_budget": args.trials}
            ).json()
            console.print(f"job {job['id']} queued: [bold]{service.url}{job['url']}[/]")
            job = _follow(
                client,
                job,
                args.trials,
                Progress(
                    TextColumn("[bold]tuning"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("{task.fields[status]}"),
                ),
            )
            if job["status"] != "succeeded":
                raise CliError(f"job {job['id']} {job['status']}: {job.get('error')}", exit_code=1)
            out = home / "demo" / f"job-{job['id']}"
            out.mkdir(parents=True, exist_ok=True)
            artifact = job["artifact"]
            library = client.get(f"/jobs/{job['id']}/artifacts/model.so").content
            if hashlib.sha256(library).hexdigest() != artifact["sha256"]:
                raise CliError("downloaded model.so does not match its sha256", exit_code=1)
            (out / "model.so").write_bytes(library)
            manifest = client.get(f"/jobs/{job['id']}/artifacts/manifest.json")
            (out / "manifest.json").write_bytes(manifest.content)
            _print_latencies(console, model_path, job, manifest.json())
            console.print(f"verification: {manifest.json()['verification']['message']}")
            console.print(f"artifact downloaded to {out} (sha256 {artifact['sha256'][:16]}...)")
        if args.keep_serving:
            console.print(f"serving at {service.url} (docs {service.url}/docs); Ctrl-C to stop")
            _wait_for_interrupt()
    finally:
        service.shutdown()
    return 0


def _follow(client, job: dict, trials: int, progress) -> dict:
    with progress:
        bar = progress.add_task("tune", total=max(trials, 1), status="queued")
        while job["status"] not in FINAL:
            time.sleep(1.0)
            job = client.get(f"/jobs/{job['id']}").json()
            best = job.get("best_latency_ms")
            est = job.get("estimated_latency_ms")
            status = job["status"]
            if job["status"] == "running" and job["trials_done"] >= trials:
                status = "compiling and verifying"
            elif best is not None:
                status += f" | best task {best * 1e3:.1f} us"
            if est is not None:
                status += f" | model est. {est:.3f} ms"
            progress.update(bar, completed=min(job["trials_done"], trials), status=status)
        progress.update(bar, status=job["status"])
    return job


def _print_latencies(console, model_path: Path, job: dict, manifest: dict) -> None:
    from rich.table import Table

    from compiler.build.verify import time_reference
    from compiler.frontends.loader import load_model

    threads = len(os.sched_getaffinity(0))
    reference = time_reference(load_model(model_path), threads=threads)
    reused = sum(1 for s in manifest.get("schedules", []) if s.get("action") == "reuse")
    table = Table(title=f"{model_path.stem}: median latency")
    table.add_column("build")
    table.add_column("ms", justify="right")
    table.add_row(f"ONNX Runtime ({threads} threads)", f"{reference * 1e3:.4f}")
    table.add_row(
        f"TuneHub tuned (job {job['id']}: {manifest.get('trials_measured', 0)} trials, "
        f"{reused} tasks reused)",
        f"{job['measured_latency_ms']:.4f}",
    )
    console.print(table)


def _wait_for_interrupt() -> None:
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
