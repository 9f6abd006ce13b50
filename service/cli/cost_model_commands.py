"""``tunehub cost-model train|eval``: the transferred cost model of a target.

``train`` extracts features of every record of the target (only the records newer than the
stored model's training set), trains an XGBoost booster and stores it in the database, where the
next tuning job of that target loads it (``tunehub tune --cost-model auto``). ``eval`` holds out
workloads and compares the transferred model's ranking with MetaSchedule's cold XGBModel
(:mod:`cost_model.evaluate`); it stores nothing.
"""

from __future__ import annotations

import argparse

from service.cli.errors import CliError
from service.cli.options import (
    add_db_option,
    add_target_options,
    open_storage_from_args,
    print_json,
    target_from_args,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("cost-model", help="train or evaluate the transferred cost model")
    commands = group.add_subparsers(dest="cost_model_command", metavar="COMMAND", required=True)
    train = commands.add_parser("train", help="train on every record of the target and store it")
    evaluate = commands.add_parser(
        "eval", help="held-out-workload ranking quality vs MetaSchedule's cold XGBModel"
    )
    for parser in (train, evaluate):
        add_target_options(parser)
        add_db_option(parser)
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
    train.add_argument(
        "--objective",
        choices=("rank", "throughput"),
        default="rank",
        help="ranking within each workload (default) or normalized throughput",
    )
    train.add_argument(
        "--full",
        action="store_true",
        help="re-extract every record's features instead of reusing the stored set",
    )
    train.set_defaults(handler=run_train)
    evaluate.add_argument("--folds", type=int, default=4, help="workload folds (default 4)")
    evaluate.add_argument(
        "--min-records",
        type=int,
        default=40,
        help="hold out only workloads with at least this many records",
    )
    evaluate.set_defaults(handler=run_eval)


def _load_training_set(storage, spec, *, reuse: bool):
    from cost_model.dataset import extend_training_set
    from cost_model.store import load_model

    target = storage.get_target(spec.key)
    if target is None:
        raise CliError(f"the database has no records for target {spec.describe()}")
    previous = load_model(storage, spec) if reuse else None
    return target, extend_training_set(storage, target, previous.training_set if previous else None)


def run_train(args: argparse.Namespace) -> int:
    from cost_model.booster import BoosterConfig
    from cost_model.store import save_model, train

    spec = target_from_args(args)
    storage = open_storage_from_args(args)
    try:
        _, training_set = _load_training_set(storage, spec, reuse=not args.full)
        try:
            model = train(training_set, BoosterConfig(objective=args.objective))
        except ValueError as err:
            raise CliError(f"cannot train for {spec.describe()}: {err}") from None
        model_id = save_model(storage, spec, model)
    finally:
        storage.close()
    summary = {
        "model_id": model_id,
        "target": spec.describe(),
        "objective": model.objective,
        "records": model.n_samples,
        "workloads": len(set(training_set.groups.tolist())),
        "train_secs": round(model.train_secs, 2),
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"cost model {model_id} for {summary['target']}: {summary['objective']} objective, "
            f"{summary['records']} records of {summary['workloads']} workloads, "
            f"trained in {summary['train_secs']} s"
        )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from cost_model.evaluate import evaluate

    if args.folds < 2:
        raise CliError(f"--folds must be >= 2, got {args.folds}")
    spec = target_from_args(args)
    storage = open_storage_from_args(args)
    try:
        target, training_set = _load_training_set(storage, spec, reuse=True)
        try:
            rows = evaluate(
                storage, target, training_set, folds=args.folds, min_records=args.min_records
            )
        except ValueError as err:
            raise CliError(str(err)) from None
    finally:
        storage.close()
    if args.json:
        print_json([row.__dict__ for row in rows])
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Held-out workloads, {spec.describe()}")
    for column in ("model", "seen records", "workloads", "pairwise acc", "top-1", "top-5"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in rows:
        table.add_row(
            row.model,
            str(row.seen),
            str(row.workloads),
            f"{row.pairwise:.3f}",
            f"{row.top1:.3f}",
            f"{row.top5:.3f}",
        )
    Console().print(table)
    return 0
