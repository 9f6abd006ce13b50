"""CLI error type: a message for stderr and the exit code to leave with."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing CLI failure; ``exit_code`` is 2 for bad input or usage."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
