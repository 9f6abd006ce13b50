"""``tunehub demo``: the README's main job on the embedded default.

Exports a bundled example network to ONNX, shows its tuning tasks, tunes it with a small budget
into the embedded SQLite database, compiles a verified artifact from the best schedules and
compares it with the untuned build and ONNX Runtime. Running it twice reuses every tuned task.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from service.cli.errors import CliError


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser("demo", help="tune and compile a bundled example end to end")
    demo.add_argument("--example", default="mlp", help="example network (default: mlp)")
    demo.add_argument("--trials", type=int, default=48, help="trial budget (default: 48)")
    demo.add_argument(
        "--serve",
        action="store_true",
        help="through the service: start `tunehub serve`, upload over HTTP, follow the job",
    )
    demo.add_argument(
        "--keep-serving",
        action="store_true",
        help="with --serve: keep serving after the job until Ctrl-C",
    )
    demo.add_argument("--port", type=int, default=None, help="with --serve: port (default 8470)")
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if args.trials < 0:
        raise CliError(f"--trials must be >= 0, got {args.trials}")
    if args.serve:
        from service.cli.demo_serve import run_demo_serve

        return run_demo_serve(args)
    from rich.console import Console
    from rich.table import Table

    import db
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs, time_reference
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx
    from examples.networks import EXAMPLES
    from service.cli.model_commands import print_task_table
    from service.cli.progress_display import RichTuneProgress
    from tuner.jobs.job import default_artifact_dir, tune_model

    if args.example not in EXAMPLES:
        raise CliError(f"unknown example {args.example!r}; choose from {sorted(EXAMPLES)}")
    console = Console()
    home = db.tunehub_home()
    model_path = home / "examples" / f"{args.example}.onnx"
    if not model_path.exists():
        console.print(f"exporting example [bold]{args.example}[/] to {model_path}")
        export_onnx(args.example, model_path)
    target = cpu_target()
    prepared = prepare_model(model_path, target)
    print_task_table(prepared, f"{args.example}: {len(prepared.partition.tasks)} tuning tasks")
    storage = db.open_storage(db.default_database_url(), upgrade=_ensure_home(home))
    try:
        with RichTuneProgress(args.trials) as progress:
            summary = tune_model(
                storage,
                prepared,
                trials=args.trials,
                filename=model_path.name,
                listeners=[progress],
                force=True,
            )
    finally:
        storage.close()
    inputs = random_inputs(prepared.model.inputs)
    untuned = LoadedLibrary.from_executable(build(prepared.mod, target)).time(inputs)
    threads = len(os.sched_getaffinity(0))
    onnxruntime_secs = time_reference(prepared.model, threads=threads)
    table = Table(title=f"{args.example} on {target.describe()} (median latency)")
    table.add_column("build")
    table.add_column("ms", justify="right")
    table.add_row(f"ONNX Runtime ({threads} threads)", f"{onnxruntime_secs * 1e3:.4f}")
    table.add_row("TVM untuned", f"{untuned.median_secs * 1e3:.4f}")
    tuned_ms = summary.measured.median_secs * 1e3 if summary.measured else float("nan")
    table.add_row(
        f"TuneHub tuned ({summary.trials_measured} trials, {summary.tasks_reused} tasks reused)",
        f"{tuned_ms:.4f}",
    )
    console.print(table)
    console.print(f"verification: {summary.verification['message']}")
    console.print(f"artifact: {Path(summary.artifact_dir or default_artifact_dir(summary.job_id))}")
    return 0


def _ensure_home(home: Path) -> bool:
    home.mkdir(parents=True, exist_ok=True)
    return True
