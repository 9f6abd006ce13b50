"""The server's review of an artifact a remote worker uploads: what users download, and why.

A worker token may upload records (evidence, checked one by one) and, for a finalize or preview
lease, an artifact. The artifact's ``model.so`` is native code: whatever it claims, the server
never loads it in its own trust. :func:`review_artifact` decides what is published:

1. **The server builds it itself** wherever it can build for the job's target (every CPU target;
   a CUDA target where ``nvcc`` is installed), in a child process
   (:mod:`tuner.final_build.rebuild`), from the server's own stored records following the worker's
   reported choices (:mod:`tuner.final_build.rebuild_plan`). The server's build is what users
   download (``built_by`` ``server``); the worker's library is never loaded, only its hash is
   compared with the server's (TVM builds the same inputs to the same bytes). The server's build is
   verified against the reference framework when this machine can run the target's code
   (``server_build``); otherwise it is published as verified only when its bytes equal the
   worker's, which the worker verified (``server_build_same_as_worker``), and unverified (not
   downloadable) when they differ (``server_build_only``).
2. **Otherwise the worker's library is checked in a sandbox** (:mod:`tuner.final_build.sandbox`): a
   trusted child computes the reference's outputs on seeded inputs (one case per shape bucket or
   program), the sandboxed child runs the worker's library on the same inputs and writes its
   outputs, and this process compares them (:func:`compiler.build.verify.compare`). No line the
   library prints is a verdict (``sandbox_reference``). A CUDA library on a server without a
   GPU can only be loaded there; it is published unverified (``sandbox_load_only``). A bucketed
   model's padding between buckets is not allowed for a library the server did not build.

``TUNEHUB_SERVER_BUILD=0`` makes the server always take the second way (it spends no CPU on
builds). Either way the manifest's ``server_review`` (:class:`Review`) and the job's artifact
say which happened and who built the library.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.final_build.process_limits import child_limits
from tuner.final_build.rebuild import RebuildFailed, RebuildSpec, rebuild_in_child
from tuner.final_build.rebuild_plan import RebuildPlan, plan_rebuild
from tuner.final_build.sandbox import SandboxLimits, SandboxUnavailable, run_sandboxed

LIBRARY = "model.so"
MANIFEST = "manifest.json"


class ArtifactRefused(Exception):
    """The server will not publish the uploaded artifact (the message says why)."""


@dataclass(frozen=True)
class Review:
    """What the server did with an uploaded artifact: who built the library users download
    (``server`` or ``worker``), whether the server verified it, how (``kind``: see the module
    docstring), the worker's library's sha256, whether the server's build has the same bytes
    (``None``: the server did not build) and notes (choices it did not follow, why a check could
    not run)."""

    built_by: str
    verified: bool
    kind: str
    worker_sha256: str
    same_as_worker: bool | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}


@dataclass(frozen=True)
class ReviewContext:
    """What the review reads: the job's model file and its row's format and buckets, the
    target (:class:`compiler.target.TargetSpec`), the model limits, the job's tasks (the
    finalize offer's :class:`tuner.jobs.protocol.JobTaskInfo` JSON), its trials, the folders a
    sandbox hides (home, storage, database), and the limits of the children."""

    model_path: Path
    model_format: str | None
    buckets_json: str | None
    target: Any
    limits: Mapping[str, Any]
    job_id: int
    trials_measured: int
    tasks: Sequence[Mapping[str, Any]]
    hide: Sequence[Path]
    server_build: bool = True
    timeout_secs: float = 600.0
    memory_bytes: int = 8 << 30


def reviewer(
    storage: Any,
    *,
    model_path: Callable[[str], Path],
    hide: Sequence[Path],
    model_limits: Any,
    server_build: bool = True,
    timeout_secs: float = 600.0,
    memory_bytes: int = 8 << 30,
) -> Callable[[Any, Path, Mapping[str, Any]], Review]:
    """The ``review`` of :func:`tuner.jobs.coordinator.accept_artifact` for the REST route:
    ``review(lease, staged, manifest)`` runs :func:`review_artifact` on the lease's job (its
    model file from ``model_path(content hash)``, its target and tasks from ``storage``) and
    raises :class:`db.ConflictError` for a refusal. ``hide``: the folders a sandbox covers."""
    from db import ConflictError  # noqa: PLC0415
    from tuner.jobs.coordinator import job_task_infos  # noqa: PLC0415

    def review(lease: Any, staged: Path, manifest: Mapping[str, Any]) -> Review:
        job = storage.get_job(lease.job_id)
        model = None if job is None or job.model_id is None else storage.get_model(job.model_id)
        target = None if job is None else storage.get_target_by_id(job.target_id)
        if model is None or target is None:
            raise ConflictError("the job's model is gone: nothing to build or check it with")
        context = ReviewContext(
            model_path=model_path(model.content_hash),
            model_format=model.format,
            buckets_json=model.buckets_json,
            target=target.spec(),
            limits=asdict(model_limits),
            job_id=job.id,
            trials_measured=job.trials_done,
            tasks=[t.model_dump(mode="json") for t in job_task_infos(storage, job.id)],
            hide=hide,
            server_build=server_build,
            timeout_secs=timeout_secs,
            memory_bytes=memory_bytes,
        )
        plan = plan_rebuild(storage, job, manifest) if lease.kind == "finalize" else None
        try:
            return review_artifact(context, lease.kind, staged, plan)
        except ArtifactRefused as err:
            raise ConflictError(str(err)) from None

    return review


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def review_artifact(
    context: ReviewContext, kind: str, staged: Path, plan: RebuildPlan | None
) -> Review:
    """Review the worker's artifact in ``staged`` (``model.so`` + ``manifest.json``) of a
    ``finalize`` (``plan``: what to rebuild it from) or ``preview`` lease, as the module
    docstring says. On return ``staged`` holds what is to be published: the server's own build
    (library and manifest) or the worker's, with its manifest's padding claim withdrawn. Raises
    :class:`ArtifactRefused` when the server's build or check fails."""
    from compiler.target import not_buildable_here, not_runnable_here  # noqa: PLC0415

    worker_sha = _sha256(staged / LIBRARY)
    target = context.target
    cannot_build = None if context.server_build else "server builds are off"
    cannot_build = cannot_build or not_buildable_here(target)
    not_run = not_runnable_here(target)
    if cannot_build is None:
        return _server_build(context, kind, staged, plan, worker_sha, not_run)
    return _sandbox_check(context, staged, worker_sha, not_run, cannot_build)


def _server_build(
    context: ReviewContext,
    kind: str,
    staged: Path,
    plan: RebuildPlan | None,
    worker_sha: str,
    not_run: str | None,
) -> Review:
    worker_manifest = json.loads((staged / MANIFEST).read_text(encoding="utf-8"))
    spec = RebuildSpec(
        kind=kind,
        model_path=str(context.model_path),
        model_format=context.model_format,
        buckets_json=context.buckets_json,
        target=asdict(context.target),
        limits=dict(context.limits),
        job_id=context.job_id,
        trials_measured=context.trials_measured,
        tasks=list(context.tasks),
        plan=(plan or RebuildPlan()).to_json(),
        not_run_because=not_run,
    )
    out = staged / "server-build"
    try:
        rebuild_in_child(spec, out, timeout=context.timeout_secs, memory_bytes=context.memory_bytes)
    except RebuildFailed as err:
        raise ArtifactRefused(str(err)) from None
    same = _sha256(out / LIBRARY) == worker_sha
    worker_passed = bool((worker_manifest.get("verification") or {}).get("passed"))
    if not_run is None:
        verified, how = True, "server_build"
    elif same and worker_passed:
        verified, how = True, "server_build_same_as_worker"
    else:
        verified, how = False, "server_build_only"
    notes = [*(plan.notes if plan else ())]
    if not_run is not None:
        notes.append(f"the server did not run its build: {not_run}")
    os.replace(out / LIBRARY, staged / LIBRARY)
    os.replace(out / MANIFEST, staged / MANIFEST)
    shutil.rmtree(out, ignore_errors=True)
    return Review("server", verified, how, worker_sha, same, tuple(notes))


def _sandbox_check(
    context: ReviewContext,
    staged: Path,
    worker_sha: str,
    not_run: str | None,
    cannot_build: str,
) -> Review:
    from compiler.build.verify import compare  # noqa: PLC0415

    notes = [f"the server did not build it: {cannot_build}"]
    device = context.target.device
    with tempfile.TemporaryDirectory(prefix="tunehub-check-") as tmp:
        work = Path(tmp)
        shutil.copyfile(staged / LIBRARY, work / LIBRARY)
        if not_run is None:
            cases = _reference_cases(context, work)
        else:
            cases = []
            notes.append(f"the library could not be run here: {not_run}")
        limits = SandboxLimits(
            timeout_secs=context.timeout_secs,
            memory_bytes=context.memory_bytes,
            cpu_secs=int(context.timeout_secs * (os.cpu_count() or 1)),
        )
        try:
            done = run_sandboxed(
                "tuner.final_build.sandbox_runner",
                [LIBRARY, "cases", device if not_run is None else "cuda"],
                workdir=work,
                hide=context.hide,
                limits=limits,
            )
        except SandboxUnavailable as err:
            raise ArtifactRefused(
                f"the server can neither build this artifact ({cannot_build}) nor check it "
                f"in a sandbox ({err})"
            ) from None
        except subprocess.TimeoutExpired:
            raise ArtifactRefused(
                f"the server's check ran past {context.timeout_secs:.0f} s"
            ) from None
        if not_run is not None:
            if done.returncode != 0 or not (work / "loaded.json").is_file():
                raise ArtifactRefused(
                    "the artifact failed the server's check: the library does not load"
                    + _tail(done.stderr)
                )
            kind, verified = "sandbox_load_only", False
        else:
            actual = _outputs(work / "outputs.npz", cases)
            if actual is None:
                raise ArtifactRefused(
                    "the artifact failed the server's check: the library wrote no outputs"
                    + _tail(done.stderr)
                )
            problems = [
                f"{case['function']}: {result.message}"
                for case, result in (
                    (case, compare(got, case["expected"], case["reference"]))
                    for case, got in zip(cases, actual)
                )
                if not result.passed
            ]
            if problems:
                raise ArtifactRefused(
                    "the artifact failed the server's check: the library " + "; ".join(problems)
                )
            kind, verified = "sandbox_reference", True
    _withdraw_padding(staged / MANIFEST)
    return Review("worker", verified, kind, worker_sha, None, tuple(notes))


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return f" ({lines[-1][:300]})" if lines else ""


def _withdraw_padding(manifest_path: Path) -> None:
    """A library the server did not build may not pad inputs between buckets: its manifest's
    claim that it may is replaced by a refusal."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    buckets = (manifest.get("model") or {}).get("buckets")
    if isinstance(buckets, dict) and buckets.get("padding"):
        buckets["padding"] = {
            "allowed": False,
            "reason": "not measured by the server (it did not build this library)",
        }
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")


def _outputs(path: Path, cases: list[dict[str, Any]]) -> list[list[Any]] | None:
    """Each case's outputs from the sandbox's ``outputs.npz`` (no pickles), or ``None``."""
    import numpy as np  # noqa: PLC0415

    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            out = []
            for i, case in enumerate(cases):
                count = len(case["expected"])
                out.append([arrays[f"case{i}_out{j}"] for j in range(count)])
                if f"case{i}_out{count}" in arrays.files:  # more outputs than the reference's
                    out[-1].append(arrays[f"case{i}_out{count}"])
            return out
    except (OSError, ValueError, KeyError):
        return None


def _reference_cases(context: ReviewContext, work: Path) -> list[dict[str, Any]]:
    """The seeded inputs and the reference's outputs of every function of the model (one per
    shape bucket or program; ``main`` otherwise), computed by a trusted child that loads the
    model (never the library); the inputs are also written to ``work/cases.{json,npz}``."""
    import numpy as np  # noqa: PLC0415

    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tuner.final_build.artifact_review",
                str(context.model_path),
                context.model_format or "",
                context.buckets_json or "",
                context.target.device,
                str(work),
                context.target.compile_options.weights,
            ],
            cwd=str(Path(__file__).resolve().parents[2]),
            capture_output=True,
            text=True,
            timeout=context.timeout_secs,
            check=True,
            preexec_fn=child_limits(context.memory_bytes, context.timeout_secs),
        )
    except subprocess.TimeoutExpired:
        raise ArtifactRefused("the reference run ran past its time limit") from None
    except subprocess.CalledProcessError as err:
        raise ArtifactRefused(f"the reference run failed{_tail(err.stderr)}") from None
    plan = json.loads((work / "cases.json").read_text())
    with np.load(work / "expected.npz", allow_pickle=False) as expected:
        for i, case in enumerate(plan):
            case["expected"] = [expected[f"case{i}_out{j}"] for j in range(case["outputs"])]
    (work / "expected.npz").unlink()  # the sandbox sees only inputs
    return plan


def _reference_main() -> None:  # pragma: no cover - runs in the trusted child
    import numpy as np  # noqa: PLC0415

    from compiler.build.verify import model_inputs, reference_name, reference_outputs  # noqa: PLC0415
    from compiler.frontends.loader import load_model  # noqa: PLC0415
    from compiler.shapes.buckets import bucket_values  # noqa: PLC0415

    model_path, model_format, buckets_json, device, work, weights = sys.argv[1:7]
    model = load_model(
        Path(model_path),
        allow_external_data=False,
        buckets=bucket_values(buckets_json or None),
        expected_format=model_format or None,  # type: ignore[arg-type]
        weights=weights,  # the job's target's: the reference is the model quantized the same way
    )
    parts = [(b.function, b.model) for b in model.buckets] or [("main", model)]
    plan, inputs, expected = [], {}, {}
    for i, (function, part) in enumerate(parts):
        arrays = model_inputs(part)
        outputs = reference_outputs(part, arrays, device)
        plan.append(
            {
                "function": function,
                "inputs": len(arrays),
                "outputs": len(outputs),
                "reference": reference_name(part, device),
            }
        )
        inputs.update({f"case{i}_in{j}": a for j, a in enumerate(arrays)})
        expected.update({f"case{i}_out{j}": np.asarray(a) for j, a in enumerate(outputs)})
    np.savez(Path(work) / "cases.npz", **inputs)
    np.savez(Path(work) / "expected.npz", **expected)
    (Path(work) / "cases.json").write_text(json.dumps(plan))


if __name__ == "__main__":  # pragma: no cover
    _reference_main()
