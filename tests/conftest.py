"""Shared fixtures: example models exported once per test session, at run time."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def example_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``example_model(name, fmt)`` → path of the example network exported as ``onnx``/``pt2``."""
    from examples.export import export_onnx, export_pt2

    folder = tmp_path_factory.mktemp("examples")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, fmt: str) -> Path:
        if (name, fmt) not in cache:
            path = folder / f"{name}.{fmt}"
            cache[(name, fmt)] = export_onnx(name, path) if fmt == "onnx" else export_pt2(name, path)
        return cache[(name, fmt)]

    return get
