"""A rich progress bar for ``tunehub tune``: trials, the current task's best, model estimate."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RichTuneProgress:
    """Progress listener (see :mod:`tuner.measure_callback.progress`) drawing one bar on stderr."""

    def __init__(self, total_trials: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]tuning"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            transient=False,
            console=Console(stderr=True),
        )
        self.bar = self.progress.add_task("tune", total=max(total_trials, 1), status="")

    def __enter__(self) -> RichTuneProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_batch(self, update) -> None:
        best = "-" if update.task_best_secs is None else f"{update.task_best_secs * 1e6:.1f} us"
        estimate = (
            "n/a (unmeasured tasks)"
            if update.estimated_model_secs is None
            else f"{update.estimated_model_secs * 1e3:.3f} ms"
        )
        status = (
            f"{update.task.name[:28]}: best {best} "
            f"({update.batch_valid}/{update.batch_trials} valid) | model est. {estimate}"
        )
        self.progress.update(self.bar, completed=update.total_trials, status=status)
