"""Inside the sandbox (:mod:`tuner.final_build.sandbox`): run a worker's library on given inputs.

``python -m tuner.final_build.sandbox_runner LIBRARY CASES DEVICE`` reads ``CASES.json`` (a list of
``{"function": name, "inputs": n}``) and ``CASES.npz`` (``case<i>_in<j>`` arrays), loads the
library with TVM's runtime, calls each case's Relax VM function on its inputs and writes every
output as ``case<i>_out<j>`` to ``outputs.npz`` in the working folder, written under a temporary
name and renamed when complete. It decides nothing: the server compares the outputs with the
reference's (:mod:`tuner.final_build.artifact_review`). ``DEVICE`` ``cuda`` on a machine without a
GPU only loads the library (``loaded.json``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _flatten(value: Any) -> list[Any]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out: list[Any] = []
    for item in value:
        out.extend(_flatten(item))
    return out


def main(library: str, cases: str, device: str) -> None:
    import numpy as np  # noqa: PLC0415 - imported inside the sandbox, after its limits
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    module = tvm.runtime.load_module(library)
    if device == "cuda" and not tvm.cuda(0).exist:
        with open("loaded.json", "w") as out:
            json.dump({"loaded": True}, out)
        return
    dev = tvm.device(device, 0)
    vm = relax.VirtualMachine(module, dev)
    with open(f"{cases}.json") as handle:
        plan = json.load(handle)
    arrays = np.load(f"{cases}.npz")
    outputs: dict[str, Any] = {}
    for i, case in enumerate(plan):
        inputs = [tvm.runtime.tensor(arrays[f"case{i}_in{j}"], dev) for j in range(case["inputs"])]
        for j, value in enumerate(_flatten(vm[case["function"]](*inputs))):
            outputs[f"case{i}_out{j}"] = value
    np.savez("outputs.tmp.npz", **outputs)
    os.replace("outputs.tmp.npz", "outputs.npz")


if __name__ == "__main__":  # pragma: no cover - runs in the sandbox
    main(*sys.argv[1:4])
