"""``tunehub db ...``: schema upgrades, statistics, and MetaSchedule JSON import/export.

``tunehub db upgrade`` is the explicit schema step for shared databases (the service and the
workers refuse an old schema and print this command); the embedded default SQLite file is
created/upgraded on first use by any command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from service.cli.errors import CliError
from service.cli.options import (
    add_db_option,
    add_target_options,
    open_storage_from_args,
    print_json,
    target_from_args,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("db", help="manage the tuning database")
    commands = group.add_subparsers(dest="db_command", metavar="SUBCOMMAND", required=True)

    upgrade = commands.add_parser("upgrade", help="create or migrate the schema to this version")
    add_db_option(upgrade)
    upgrade.set_defaults(handler=run_upgrade)

    stats = commands.add_parser("stats", help="count workloads, targets and records")
    add_db_option(stats)
    stats.add_argument("--json", action="store_true", help="print JSON instead of tables")
    stats.set_defaults(handler=run_stats)

    import_ = commands.add_parser(
        "import", help="merge a MetaSchedule JSON database (best-of, no duplicates)"
    )
    import_.add_argument("directory", type=Path, metavar="DIR")
    add_target_options(import_)
    import_.add_argument(
        "--any-target",
        action="store_true",
        help="also import records tuned for another target (stored under --target)",
    )
    add_db_option(import_)
    import_.add_argument("--json", action="store_true", help="print the report as JSON")
    import_.set_defaults(handler=run_import)

    export = commands.add_parser("export", help="write one target's records as a JSON database")
    export.add_argument("directory", type=Path, metavar="DIR")
    add_target_options(export)
    export.add_argument("--valid-only", action="store_true", help="leave failed candidates out")
    add_db_option(export)
    export.add_argument("--json", action="store_true", help="print the report as JSON")
    export.set_defaults(handler=run_export)

    quarantine = commands.add_parser(
        "quarantine",
        help="hold (or --delete) tuning records by worker, job or id; best records follow",
    )
    which = quarantine.add_mutually_exclusive_group(required=True)
    which.add_argument("--worker", metavar="W", help="every record measured by worker W")
    which.add_argument("--job", type=int, metavar="J", help="every record measured for job J")
    which.add_argument(
        "--record",
        type=int,
        action="append",
        metavar="ID",
        help="the record with this id (repeatable)",
    )
    quarantine.add_argument(
        "--delete", action="store_true", help="delete the records instead of holding them"
    )
    quarantine.add_argument("--reason", default="quarantined by an operator")
    add_db_option(quarantine)
    quarantine.add_argument("--json", action="store_true", help="print the count as JSON")
    quarantine.set_defaults(handler=run_quarantine)


def run_upgrade(args: argparse.Namespace) -> int:
    import db
    from db.engine import create_storage_engine, display_url

    url, embedded = db.resolve_database_url(args.db)
    if embedded:
        db.tunehub_home().mkdir(parents=True, exist_ok=True)
    try:
        engine = create_storage_engine(url)
        try:
            before = db.current_revision(engine)
            head = db.head_revision()
            if before == head:
                print(f"{display_url(url)}: schema already at {head}")
                return 0
            if before is not None and before not in db.schema.known_revisions():
                db.check_schema(engine)  # raises: newer than this TuneHub
            after = db.upgrade(engine)
        finally:
            engine.dispose()
    except db.StorageError as err:
        raise CliError(str(err)) from None
    print(f"{display_url(url)}: schema {before or '(empty)'} -> {after}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    import db

    storage = open_storage_from_args(args)
    try:
        stats = storage.stats()
    except db.StorageError as err:
        raise CliError(str(err)) from None
    finally:
        storage.close()
    if args.json:
        print_json(stats.as_dict())
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    summary = Table(title=f"Tuning database {stats.url}", show_header=False)
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_row("schema", stats.schema_revision or "-")
    summary.add_row("workloads", str(stats.workloads))
    summary.add_row("targets", str(stats.targets))
    summary.add_row("records (valid)", str(stats.records_valid))
    summary.add_row("records (failed)", str(stats.records_failed))
    summary.add_row("models", str(stats.models))
    summary.add_row("jobs", str(stats.jobs))
    console.print(summary)
    if stats.per_target:
        per = Table(title="Per target")
        for name in ("key", "target", "tvm", "workloads", "valid", "failed"):
            numeric = name in ("workloads", "valid", "failed")
            per.add_column(name, justify="right" if numeric else "left", no_wrap=name == "key")
        for item in stats.per_target:
            per.add_row(
                item.target.key,
                item.target.spec().describe(),
                item.target.tvm_version,
                str(item.workloads),
                str(item.records_valid),
                str(item.records_failed),
            )
        console.print(per)
    return 0


def run_import(args: argparse.Namespace) -> int:
    import dataclasses

    import db

    target = target_from_args(args)
    storage = open_storage_from_args(args)
    try:
        report = db.import_json_database(
            storage, args.directory, target, any_target=args.any_target
        )
    except (FileNotFoundError, ValueError) as err:
        raise CliError(str(err)) from None
    except db.StorageError as err:
        raise CliError(str(err)) from None
    finally:
        storage.close()
    if args.json:
        print_json(dataclasses.asdict(report))
    else:
        print(
            f"imported {args.directory} into {target.describe()}: "
            f"{report.workloads_read} workloads ({report.workloads_new} new), "
            f"{report.records_read} records read, {report.records_new} new, "
            f"{report.records_other_target} skipped (tuned for another target)"
        )
    return 0


def run_export(args: argparse.Namespace) -> int:
    import dataclasses

    import db

    target = target_from_args(args)
    storage = open_storage_from_args(args)
    try:
        report = db.export_json_database(
            storage, args.directory, target, valid_only=args.valid_only
        )
    except OSError as err:
        raise CliError(f"cannot write {args.directory}: {err}") from None
    except db.StorageError as err:
        raise CliError(str(err)) from None
    finally:
        storage.close()
    if args.json:
        print_json(dataclasses.asdict(report))
    else:
        print(
            f"exported {report.workloads} workloads and {report.records} records of "
            f"{target.describe()} to {report.directory}"
        )
    return 0


def run_quarantine(args: argparse.Namespace) -> int:
    """Held records stay stored (``quarantined``, never a best record); ``--delete`` removes
    them. Each workload's best is a query over valid records, so it is the next one at once."""
    selection = {"worker": args.worker, "job_id": args.job, "record_ids": args.record}
    storage = open_storage_from_args(args)
    try:
        if args.delete:
            count = storage.delete_records(**selection)
        else:
            count = storage.quarantine_records(**selection, reason=args.reason)
    finally:
        storage.close()
    action = "deleted" if args.delete else "quarantined"
    if args.json:
        print_json({action: count})
    else:
        print(f"{count} record(s) {action}")
    return 0
