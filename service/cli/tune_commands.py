"""``tunehub tune``: tune a model's tasks into the database, then compile and verify it."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from service.cli.errors import CliError
from service.cli.options import add_db_option, add_model_options, open_storage_from_args, print_json

#: ``tuner.engine.search.SearchConfig.population_size``, spelled here so that ``--help`` does not
#: import TVM (tests/tuner/test_search_config.py checks that they agree).
DEFAULT_POPULATION = 128


def register(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser(
        "tune", help="tune a model with MetaSchedule, then build, verify and publish it"
    )
    add_model_options(tune)
    add_db_option(tune)
    tune.add_argument("--trials", type=int, required=True, help="global trial budget")
    tune.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="artifact directory (default: $TUNEHUB_HOME/artifacts/job-N)",
    )
    tune.add_argument(
        "--continue",
        dest="continue_tuning",
        action="store_true",
        help="tune tasks again even if the database already has them tuned",
    )
    tune.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    tune.add_argument("--seed", type=int, default=None, help="search seed (reproducible runs)")
    tune.add_argument(
        "--population",
        type=int,
        default=DEFAULT_POPULATION,
        help=f"evolutionary-search population per task (default {DEFAULT_POPULATION}; "
        "MetaSchedule's is 512; smaller is faster and searches less)",
    )
    tune.add_argument(
        "--no-sibling-seeds",
        dest="sibling_seeds",
        action="store_false",
        help="do not start tasks from the best schedules of their siblings (same fused "
        "operators on other shapes, from any model in the database)",
    )
    tune.add_argument(
        "--cost-model",
        choices=("auto", "transfer", "cold"),
        default="auto",
        help="auto (default): the target's trained model from the database if there is one, "
        "else MetaSchedule's cold XGBModel; transfer: require the trained model; cold: "
        "MetaSchedule's XGBModel",
    )
    tune.set_defaults(handler=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from compiler.errors import CompileError, ModelError, VerificationError
    from service.cli.model_commands import prepare_from_args
    from service.cli.progress_display import RichTuneProgress
    from tuner.engine.cost_models import CostModelUnavailable, choose_cost_model
    from tuner.engine.search import SearchConfig
    from tuner.final_build.remeasure import RemeasureConfig
    from tuner.jobs.job import tune_model

    if args.trials < 0:
        raise CliError(f"--trials must be >= 0, got {args.trials}")
    try:  # read again by the job; checked here so that a bad value is one line, exit 2
        RemeasureConfig.from_env()
    except ValueError as err:
        raise CliError(str(err)) from None
    if args.population < 4:
        raise CliError(f"--population must be >= 4, got {args.population}")
    search = dataclasses.replace(
        SearchConfig.of_population(args.population), sibling_seeds=args.sibling_seeds
    )
    prepared = prepare_from_args(args)
    storage = open_storage_from_args(args)
    try:
        try:  # chosen (and loaded) once, before the job row and the progress bar
            cost_model = choose_cost_model(storage, prepared.target, args.cost_model)
        except CostModelUnavailable as err:
            raise CliError(str(err)) from None
        with RichTuneProgress(args.trials) as progress:
            summary = tune_model(
                storage,
                prepared,
                trials=args.trials,
                output_dir=args.output,
                filename=Path(args.model).name,
                continue_tuning=args.continue_tuning,
                search=search,
                listeners=[progress],
                force=args.force,
                seed=args.seed,
                cost_model=cost_model,
            )
    except ModelError as err:
        raise CliError(str(err)) from None
    except (CompileError, VerificationError) as err:
        raise CliError(str(err), exit_code=1) from None
    finally:
        storage.close()
    if args.json:
        print_json(summary.to_json())
    else:
        _print_summary(summary)
    return 0


def _print_summary(summary) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"job {summary.job_id}: {summary.trials_measured} trials measured "
        f"({summary.trials_this_run} this run), {summary.tasks_reused} tasks reused"
    )
    for column in ("task", "action", "weight", "trials", "best (us)"):
        table.add_column(column, overflow="fold")
    for task in summary.tasks:
        best = "-" if task.best_secs is None else f"{task.best_secs * 1e6:.2f}"
        table.add_row(task.name, task.action, str(task.weight), str(task.trials), best)
    console = Console()
    console.print(table)
    est = "n/a" if summary.estimated_secs is None else f"{summary.estimated_secs * 1e3:.3f} ms"
    measured = "n/a" if summary.measured is None else f"{summary.measured.median_secs * 1e3:.3f} ms"
    console.print(f"estimated {est}, measured {measured}; {summary.verification['message']}")
    if summary.extra.get("search_time"):
        from tuner.engine.search_time import SearchTime

        console.print(SearchTime.from_json(summary.extra["search_time"]).describe())
    console.print(f"artifact: {summary.artifact_dir}")
