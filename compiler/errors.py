"""Errors raised on the model path.

Every problem with a user's model surfaces as a :class:`ModelError` whose message is written for
the user (the CLI prints it and exits 2; the service answers 4xx with it). ``code`` is a short,
stable, machine-readable reason that tests and API clients can match on.
"""

from __future__ import annotations


class ModelError(ValueError):
    """A model file or request that TuneHub refuses, with a user-facing message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class UnsupportedOperatorsError(ModelError):
    """The model uses operators the Relax importer cannot translate; ``ops`` lists all of them."""

    def __init__(self, ops: list[str], fmt: str) -> None:
        self.ops = sorted(set(ops))
        super().__init__(
            "unsupported_ops",
            f"{fmt} model uses {len(self.ops)} unsupported operator(s): {', '.join(self.ops)}",
        )


class CompileError(RuntimeError):
    """TVM failed to build a model that passed validation (a TuneHub or TVM bug, not bad input)."""


class VerificationError(RuntimeError):
    """A built library's outputs do not match the reference framework within tolerance."""
