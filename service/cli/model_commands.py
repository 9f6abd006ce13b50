"""``tunehub inspect`` and ``tunehub compile``: the model path without tuning."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from service.cli.errors import CliError
from service.cli.options import (
    add_db_option,
    add_model_options,
    open_storage_from_args,
    print_json,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    inspect = subparsers.add_parser("inspect", help="validate a model and print its tuning tasks")
    add_model_options(inspect)
    inspect.set_defaults(handler=run_inspect)

    compile_ = subparsers.add_parser(
        "compile", help="build, verify and write DIR/model.so + DIR/manifest.json"
    )
    add_model_options(compile_)
    compile_.add_argument("-o", "--output", required=True, type=Path, metavar="DIR")
    compile_.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    add_db_option(compile_)
    compile_.add_argument(
        "--tuned",
        action="store_true",
        help="use the best schedules of the tuning database (implied by --db)",
    )
    compile_.set_defaults(handler=run_compile)


def prepare_from_args(args: argparse.Namespace):
    """Load, validate and partition the model named on the command line (CliError on bad input)."""
    from compiler.errors import ModelError
    from compiler.prepare import prepare_model
    from compiler.shapes.buckets import merge_bucket_options
    from compiler.target import resolve_target
    from service.settings import Settings

    try:
        target = resolve_target(args.target, args.num_cores, weights=args.weights)
        return prepare_model(
            Path(args.model),
            target,
            limits=Settings().local_model_limits(),
            input_shapes=dict(args.input_shape),
            buckets=merge_bucket_options(args.buckets),
        )
    except ModelError as err:
        raise CliError(str(err)) from None


def task_rows(prepared) -> list[dict[str, Any]]:
    return [task.to_json() for task in prepared.partition.tasks]


def print_task_table(prepared, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("key", "name", "MFLOPs", "weight", "shapes"):
        table.add_column(
            column,
            justify="right" if column in ("MFLOPs", "weight") else "left",
            overflow="fold",
        )
    for task in prepared.partition.tasks:
        shapes = " ".join("x".join(map(str, shape)) for _, shape, _ in task.shapes)
        name = task.name if task.tunable else f"{task.name} (not tuned)"
        table.add_row(task.key, name, f"{task.flops / 1e6:.3f}", str(task.weight), shapes)
    Console().print(table)


def _summary(prepared) -> dict[str, Any]:
    return {
        "model": prepared.model.describe(),
        "target": {"key": prepared.target.key, "description": prepared.target.describe()},
        "total_mflops": prepared.partition.total_flops / 1e6,
        "tasks": task_rows(prepared),
    }


def run_inspect(args: argparse.Namespace) -> int:
    prepared = prepare_from_args(args)
    if args.json:
        print_json(_summary(prepared))
    else:
        print_task_table(prepared, f"{args.model}: {len(prepared.partition.tasks)} tuning tasks")
        if prepared.model.bucket_spec is not None:
            print(f"shape buckets: {prepared.model.bucket_spec.describe()}")
        if prepared.model.programs:
            print(
                "programs (one function each): "
                + "; ".join(
                    f"{b.function} takes "
                    + ", ".join(
                        f"{spec.name} {'x'.join(map(str, spec.shape))}" for spec in b.model.inputs
                    )
                    for b in prepared.model.buckets
                )
            )
    return 0


def run_compile(args: argparse.Namespace) -> int:
    """Without a database, the zero-trial build (library peers where a task has one, TVM's
    default schedules elsewhere); with one, each task's best record, or its stored library
    record (a peer's or TVM's default schedule's) where that measured faster
    (:func:`_implementations_from_records`)."""
    from compiler.build.artifact import check_output_dir, peers_extra, publish_artifact
    from compiler.build.builder import build
    from compiler.errors import CompileError, ModelError, VerificationError

    try:
        check_output_dir(args.output, force=args.force)
    except ModelError as err:
        raise CliError(str(err)) from None
    prepared = prepare_from_args(args)
    use_database = args.tuned or args.db is not None
    storage = open_storage_from_args(args) if use_database else None
    try:
        if storage is None:
            from tuner.final_build.finalize import publish_zero_trial

            manifest = publish_zero_trial(prepared, args.output, force=args.force)
        else:
            from db.metaschedule_database import MetaScheduleDatabase

            database = MetaScheduleDatabase(storage, prepared.target)
            schedules = _schedules_used(storage, database, prepared)
            peers, defaults = _implementations_from_records(storage, prepared, schedules)
            if defaults:  # those tasks build with their default schedule: without records
                from tuner.final_build.finalize import database_from_records, top_records

                best = top_records(prepared, database, 1)
                database = database_from_records(
                    prepared, {k: v for k, v in best.items() if k not in defaults}
                )
            extra: dict[str, Any] = {
                "tuned": True,
                "schedules": schedules,
                **peers_extra(peers, prepared.target),
            }
            manifest = publish_artifact(
                build(prepared.mod, prepared.target, database, peers=peers),
                prepared.model,
                prepared.target,
                args.output,
                tasks=task_rows(prepared),
                extra=extra,
                force=args.force,
                link_peers=bool(peers),
            )
    except (CompileError, VerificationError) as err:
        raise CliError(str(err), exit_code=1) from None
    finally:
        if storage is not None:
            storage.close()
    summary = {
        **_summary(prepared),
        "output": str(args.output),
        "tuned": manifest["tuned"],
        "schedules": manifest.get("schedules", []),
        "peers": manifest.get("peers"),
        "verification": manifest["verification"],
    }
    padding = (manifest["model"].get("buckets") or {}).get("padding")
    if padding is not None:
        summary["padding"] = padding
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {args.output / 'model.so'} ({manifest['verification']['message']})")
        if padding is not None:
            print(
                "inputs between buckets: "
                + (
                    "padded to the next bucket (checked: " + "; ".join(padding["probes"]) + ")"
                    if padding["allowed"]
                    else f"not padded ({padding['reason']})"
                )
            )
    return 0


def _implementations_from_records(
    storage, prepared, schedules: list[dict[str, Any]]
) -> tuple[dict[str, Any], frozenset[str]]:
    """The tasks whose best stored library record (:meth:`db.TuningStorage.best_library_records`)
    measured faster than their best schedule record, or that have no schedule record at all:
    ``(peers, default keys)``, ``peers`` mapping each key to the variant the record measured
    (:class:`compiler.peers.PeerCall`, by its ``algorithm``; a record without one was the
    convolution's ``im2col``), a ``tvm default`` record being TVM's default schedule (a task
    without any record gets it anyway). Their ``schedules`` rows get ``"implementation"``.
    Nothing on targets whose build has neither peers nor default schedules."""
    from compiler.peers import device_of, library_for, peer_variants, peers_supported

    if not peers_supported(prepared.target):
        return {}, frozenset()
    has_peers = library_for(prepared.target) is not None
    modules = {
        t.key: e.dispatched[0]
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    }
    library = storage.best_library_records(prepared.target.key, [row["key"] for row in schedules])
    peers: dict[str, Any] = {}
    defaults: set[str] = set()
    for row in schedules:
        best = library.get(row["key"])
        row["implementation"] = "schedule"
        faster = best is not None and (
            row["best_ms"] is None or best.median_secs * 1e3 < row["best_ms"]
        )
        if not faster:
            continue
        if best.library == "tvm" and best.call.get("kind") == "default":
            defaults.add(row["key"])
            row["implementation"] = "default"
        elif has_peers:
            wanted = best.call.get(
                "algorithm", "im2col" if best.call.get("kind") == "conv2d_nhwc" else ""
            )
            variant = next(
                (
                    v
                    for v in peer_variants(modules[row["key"]], device_of(prepared.target))
                    if v.algorithm == wanted
                ),
                None,
            )
            if variant is None:  # not a variant this build has (another shim): no peer
                continue
            peers[row["key"]] = variant
            row["implementation"] = f"{best.library} {best.call.get('kind', '')}".strip()
        else:
            continue
        row["library_ms"] = best.median_secs * 1e3
    return peers, frozenset(defaults)


def _schedules_used(storage, database, prepared) -> list[dict[str, Any]]:
    """Per task: the best record the database holds for this target (or none: default lowering)."""
    ids = storage.workload_ids([task.key for task in prepared.partition.tasks])
    target_id = database.target_record.id
    rows = []
    for task in prepared.partition.tasks:
        best = storage.best_record(ids[task.key], target_id) if task.key in ids else None
        rows.append(
            {
                "key": task.key,
                "name": task.name,
                "best_ms": None if best is None else best.mean_secs * 1e3,
                "trace_hash": None if best is None else best.trace_hash,
            }
        )
    return rows
