"""Schemathesis fuzzes every operation of the OpenAPI schema against a real server (no worker,
so nothing tunes): examples, coverage scenarios (boundary and invalid values of every parameter)
and random generation, positive and negative, with a user token. Asserts no server error and that
documented responses match their schemas. Bounded in examples per operation and in time.

(Schemathesis's pytest plugin does not run on pytest 9, so its CLI runs the engine here.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.service.request_helpers import tmp_leftovers

EXAMPLES_PER_OPERATION = 10
MAX_SECONDS = 60


@pytest.fixture(scope="module")
def fuzz_server(serve):
    return serve(workers=0)


def test_fuzz_no_server_errors(fuzz_server, tmp_path) -> None:
    token = fuzz_server.token("fuzzer")
    st = Path(sys.executable).with_name("st")
    started = time.monotonic()
    result = subprocess.run(
        [
            str(st),
            "run",
            f"{fuzz_server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--max-examples",
            str(EXAMPLES_PER_OPERATION),
            "--seed",
            "20261130",
            "--max-time",
            str(MAX_SECONDS),
            "--request-timeout",
            "60",
            "--phases",
            "examples,coverage,fuzzing",
            "--generation-database",
            "none",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=MAX_SECONDS + 120,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    print(output[-3000:])
    print(f"fuzzing took {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, output[-8000:]
    assert "No issues found" in output or "passed" in output.lower(), output[-3000:]
    assert fuzz_server.alive()
    # Nothing the fuzzer sent left a file behind.
    assert tmp_leftovers(fuzz_server.storage_dir) == []
    assert list((fuzz_server.storage_dir / "models").iterdir()) == []
