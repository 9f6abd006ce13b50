"""Verification of a decoder's artifact by generation: greedy tokens equal to torch's.

A stateful decoder (:mod:`compiler.llm.state`) is verified like any model, one call against the
reference from an empty cache (:func:`compiler.build.verify.verify`), and then by what its users do
with it: :func:`verify_generation` feeds a seeded prompt and decodes greedily with the library
(:class:`compiler.llm.generate.Generator`) and with the exported program itself
(:class:`compiler.llm.generate.TorchDecoder`), both driven the same way (the same chunks of the
prompt, the same positions). The library is fed the reference's tokens at every step (teacher
forcing), so one near-tie cannot make the rest of the comparison meaningless. It passes when
every logit is within the dtype's tolerance (:func:`compiler.build.verify.tolerance_for`) of the
reference's, and every greedy token is the reference's, or the reference's own top two logits at
that step are closer than that tolerance (a tie: either token is torch's answer within
rounding). The manifest records the tokens, the largest logit error and the tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.build.verify import tolerance_for
from compiler.errors import ModelError
from compiler.llm.generate import (
    Generator,
    TorchDecoder,
    decoder_signature,
    reference_programs,
)

PROMPT_TOKENS = 5
NEW_TOKENS = 16


@dataclass(frozen=True)
class GenerationCheck:
    """The outcome of :func:`verify_generation` (see the module docstring)."""

    passed: bool
    prompt: list[int]
    expected: list[int]
    actual: list[int]
    ties: int
    max_logit_error: float
    tolerance: float
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "prompt": self.prompt,
            "expected_tokens": self.expected,
            "tokens": self.actual,
            "ties": self.ties,
            "max_logit_error": self.max_logit_error,
            "tolerance": self.tolerance,
            "message": self.message,
        }


def verify_generation(
    model: Any, library: Any, *, new_tokens: int = NEW_TOKENS, seed: int = 0
) -> GenerationCheck | None:
    """Compare ``library``'s greedy generation with the exported program's (see the module
    docstring); ``None`` for a model that is not a stateful decoder. The prompt and the new
    tokens are cut to fit the cache. Never raises for a mismatch (``passed`` says).

    An ONNX decoder that takes its cache as ``past_key_values`` inputs and returns it as
    ``present`` outputs is compared with ONNX Runtime on the same file instead
    (:func:`compiler.llm.past_present.verify_past_present`)."""
    if getattr(model, "past_present", None) is not None:
        from compiler.llm.past_present import verify_past_present  # noqa: PLC0415 - a cycle

        return verify_past_present(
            model, library, prompt_tokens=PROMPT_TOKENS, new_tokens=new_tokens, seed=seed
        )
    try:
        signature = decoder_signature(model.describe())
    except ModelError:
        return None
    # The logits are as precise as the decoder: its KV cache's dtype (float32, or half
    # precision for a bfloat16/float16 export, whose logits carry that rounding).
    precision = str(model.state[0].dtype) if model.state else "float32"
    prompt_len = min(PROMPT_TOKENS, max(1, signature.capacity // 2))
    new_tokens = max(1, min(new_tokens, signature.capacity - prompt_len))
    prompt = np.random.default_rng(seed).integers(0, 16, size=prompt_len).tolist()
    ours = Generator(library, signature)
    theirs = TorchDecoder(reference_programs(model), signature)
    ours.reset()
    theirs.reset()
    feed: Any = prompt
    expected, actual, ties, worst, tolerance = [], [], 0, 0.0, 0.0
    for _ in range(new_tokens):
        want = theirs.prefill(feed)[0].astype(np.float64)
        got = ours.prefill(feed)[0].astype(np.float64)
        tol = tolerance_for(precision)
        bound = tol.atol * max(1.0, float(np.abs(want).max())) + tol.rtol * np.abs(want).max()
        tolerance = max(tolerance, float(bound))
        worst = max(worst, float(np.abs(got - want).max()))
        token, mine = int(want.argmax()), int(got.argmax())
        expected.append(token)
        actual.append(mine)
        if mine != token:
            top = np.sort(want)[-2:]
            ties += bool(top[1] - top[0] <= bound)
        feed = [token]
    mismatched = sum(a != e for a, e in zip(actual, expected))
    passed = worst <= tolerance and mismatched == ties
    message = (
        f"greedy tokens match torch's ({len(expected)} tokens, {ties} near-ties; max logit "
        f"error {worst:.3g}, tolerance {tolerance:.3g})"
        if passed
        else f"greedy generation differs from torch's: {mismatched} of {len(expected)} tokens "
        f"differ ({ties} near-ties), max logit error {worst:.3g} (tolerance {tolerance:.3g})"
    )
    ours.reset()
    return GenerationCheck(passed, prompt, expected, actual, ties, worst, tolerance, message)
