"""Builder and runner set-up for MetaSchedule measurements (STACK.md, "Builder and runner").

The default builder imports ``tvm.s_tir.tensor_intrin`` (~11 s) in every fresh popen worker, and
LocalBuilder starts fresh workers for every batch; on a loaded 2-core machine that hits the build
timeout and silently loses candidates. :func:`fast_build` does the same lowering without that
import. It is a module-level function of an importable module, so popen workers unpickle it by
reference. Even without that import, a fresh worker spends ~2.5 s of CPU importing TVM: with one
pool per batch, a MobileNetV2 run of 68 trials spent a quarter of its CPU time on imports
(py-spy, 2026-12-02). :class:`PooledBuilder` keeps its workers across batches and recycles each
after :data:`BUILDS_PER_WORKER` builds (LocalBuilder restarts its pool because of "a known memory
leak issue with the PopenPool workers after a couple times of usage").

One process, one set of measurement workers: :func:`make_builder` and :func:`make_runner` hand
out builders and runners over popen workers the process keeps (one builder pool per build
setting, one runner worker per run timeout), so a job's search, its final re-measure and a
worker's next lease start no fresh process. Each fresh worker spent ~4 s importing TVM and
checking its functions: a ``tunehub tune`` of a small decoder spent 16 of its 74 s starting the
four pools its search and re-measure made (cProfile, 2026-12-07). Closing a builder ends its
workers; the next build starts new ones.

Evaluator settings: each candidate is timed ``repeat`` times, each repeat running for at least
``min_repeat_ms``; the stored ``run_secs`` are those repeats, and TuneHub ranks by their mean.
``bench/bench_measure_spread.py`` measures how far repeated measurements of one schedule drift.

GPU targets (:data:`GPU_MEASURE`, picked by :meth:`MeasureConfig.for_target`): a good kernel runs
for microseconds to a millisecond, so each repeat runs it for at least ``min_repeat_ms`` (TVM
raises ``number`` until it does), with no CPU cache flush; ``number`` starts at 1 so that a bad
candidate (hundreds of ms per call, common in the first random batches) costs three calls rather
than thirty (with ``number=10`` such candidates ran into the runner timeout on an H200). The build
timeout covers an NVRTC compile of a large unrolled kernel (up to ~100 s seen for candidates that
spill registers) on a host building 16 candidates at once.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import local_builder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, local_runner
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from compiler.peers import load_peers


def fast_build(mod: Any, target: Any, _params: Any) -> Any:
    """Lower and build one scheduled workload (MetaSchedule's default minus tensor_intrin)."""
    from tvm.driver import build as tvm_build  # noqa: PLC0415 - in the builder's worker
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: PLC0415 - as above

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are built and timed.

    ``number``/``repeat``/``min_repeat_ms`` go to TVM's ``EvaluatorConfig``. CPU cache flushing
    is off, as in MetaSchedule's ``tune_relax``: repeats after the first find the task's inputs
    and weights in cache, so a task's time can be shorter than inside the model, where other
    layers evict them (every record in a database was measured this way; turning it on makes
    new records incomparable with old ones).
    """

    build_timeout_sec: float = 60.0
    run_timeout_sec: float = 30.0
    number: int = 1
    repeat: int = 5
    min_repeat_ms: int = 40
    enable_cpu_cache_flush: bool = False
    builder_workers: int | None = None

    @staticmethod
    def for_target(target_kind: str) -> MeasureConfig:
        """The default measurement settings of a target kind (``"cpu"`` or ``"cuda"``)."""
        return GPU_MEASURE if target_kind == "cuda" else MeasureConfig()

    def evaluator(self) -> EvaluatorConfig:
        return EvaluatorConfig(
            number=self.number,
            repeat=self.repeat,
            min_repeat_ms=self.min_repeat_ms,
            enable_cpu_cache_flush=self.enable_cpu_cache_flush,
        )


GPU_MEASURE = MeasureConfig(
    build_timeout_sec=60.0, run_timeout_sec=15.0, number=1, repeat=3, min_repeat_ms=10
)


def _check_build_functions(f_build: Any, f_export: Any) -> None:
    """In a builder worker: both functions resolve (LocalBuilder's sanity check)."""
    local_builder.get_global_func_with_default_on_worker(name=f_build, default=None)
    local_builder.get_global_func_with_default_on_worker(name=f_export, default=None)


def _build_in_worker(job: tuple[Any, ...]) -> str:
    """In a builder worker: build and export one candidate; the artifact's path."""
    return local_builder._worker_func(*job)  # noqa: SLF001 - LocalBuilder's own worker body


#: Builds a pooled builder worker runs before it is replaced by a fresh process.
BUILDS_PER_WORKER = 200


@derived_object
class PooledBuilder(local_builder.LocalBuilder._cls):  # noqa: SLF001 - derived_object's rule
    """MetaSchedule's LocalBuilder whose popen workers live across batches (each recycled after
    :data:`BUILDS_PER_WORKER` builds, or when a build times out). The same results and error
    messages as LocalBuilder; :meth:`close` ends the workers (also done when it is collected)."""

    def __init__(self, **kwargs: Any) -> None:
        self._pool: PopenPoolExecutor | None = None
        super().__init__(**kwargs)

    def _workers(self) -> PopenPoolExecutor:
        if self._pool is None:
            self._pool = PopenPoolExecutor(
                max_workers=self.max_workers,
                timeout=self.timeout_sec,
                initializer=self.initializer,
                maximum_process_uses=BUILDS_PER_WORKER,
            )
        return self._pool

    def _sanity_check(self) -> None:
        self._workers().submit(_check_build_functions, self.f_build, self.f_export).result()

    def build(self, build_inputs: list[Any]) -> list[Any]:
        jobs = [
            (
                self.f_build,
                self.f_export,
                item.mod,
                item.target,
                local_builder._serialize_params(item.params),  # noqa: SLF001 - as LocalBuilder
            )
            for item in build_inputs
        ]
        results = []
        for outcome in self._workers().map_with_error_catching(_build_in_worker, jobs):
            if outcome.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(outcome.value, None))
            elif outcome.status == StatusKind.TIMEOUT:
                results.append(
                    ms.builder.BuilderResult(
                        None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"
                    )
                )
            else:
                results.append(
                    ms.builder.BuilderResult(
                        None, "LocalBuilder: An exception occurred\n" + str(outcome.value)
                    )
                )
        return results

    def close(self) -> None:
        """End the workers (a later :meth:`build` starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


#: Candidates a runner worker times before it is replaced by a fresh process: a bound on what a
#: long-lived worker (``tunehub worker`` runs for days) accumulates, as for the builder's.
RUNS_PER_WORKER = 1000


@derived_object
class PooledRunner(local_runner.LocalRunner._cls):  # noqa: SLF001 - derived_object's rule
    """MetaSchedule's LocalRunner (its run, results and error messages) over a popen worker it
    is given rather than one it starts: :func:`make_runner` gives every runner of a run timeout
    the same worker, whatever its evaluator settings."""

    def __init__(
        self, pool: PopenPoolExecutor, timeout_sec: float, evaluator_config: EvaluatorConfig
    ) -> None:
        # LocalRunner.__init__ would start a worker of its own: set its fields instead.
        self.timeout_sec = timeout_sec
        self.evaluator_config = EvaluatorConfig._normalized(evaluator_config)  # noqa: SLF001
        self.cooldown_sec = 0.0
        self.alloc_repeat = 1
        self.f_alloc_argument = None
        self.f_run_evaluator = None
        self.f_cleanup = None
        self.pool = pool


_pools_lock = threading.Lock()
_builders: dict[tuple[int | None, float], PooledBuilder] = {}
_runner_pools: dict[float, PopenPoolExecutor] = {}


def make_builder(config: MeasureConfig) -> PooledBuilder:
    """The process's builder for ``config``'s build settings (workers, timeout): :func:`fast_build`
    in pooled workers, made on first use and kept. ``close()`` ends its workers; its next build
    starts new ones."""
    key = (config.builder_workers, config.build_timeout_sec)
    with _pools_lock:
        builder = _builders.get(key)
        if builder is None:
            builder = _builders[key] = PooledBuilder(
                max_workers=config.builder_workers,
                timeout_sec=config.build_timeout_sec,
                f_build=fast_build,
            )
        return builder


def _runner_pool(timeout_sec: float) -> PopenPoolExecutor:
    """The process's runner worker for ``timeout_sec``: one popen worker with the library peers
    loaded (:func:`compiler.peers.load_peers`), started and checked on first use, replaced after
    :data:`RUNS_PER_WORKER` candidates or a timeout."""
    with _pools_lock:
        pool = _runner_pools.get(timeout_sec)
        if pool is None:
            pool = PopenPoolExecutor(
                max_workers=1,
                timeout=timeout_sec,
                initializer=load_peers,  # library peers' calls resolve in the worker
                maximum_process_uses=RUNS_PER_WORKER,
            )
            pool.submit(_started).result()
            _runner_pools[timeout_sec] = pool
        return pool


def _started() -> None:
    """In a runner worker: nothing. Submitted once so that the worker starts (imports TVM, loads
    the peers) before the first candidate, whose timeout would otherwise include that."""


@atexit.register
def _shutdown_pools() -> None:
    """End the process's measurement workers at exit."""
    with _pools_lock:
        for builder in _builders.values():
            builder.close()
        for pool in _runner_pools.values():
            pool.shutdown(wait=False)
        _builders.clear()
        _runner_pools.clear()


@dataclass(frozen=True)
class RpcConfig:
    """Measure on remote devices through a TVM RPC tracker (``tunehub worker --rpc-tracker``).

    ``session_timeout_sec`` bounds both the wait for a free device of ``key`` at the tracker and
    one measurement session; ``max_sessions`` measurements of a batch run at once.
    """

    tracker_host: str
    tracker_port: int
    key: str
    session_timeout_sec: int = 120
    max_sessions: int = 1

    @classmethod
    def parse(cls, tracker: str, key: str, **kwargs: Any) -> RpcConfig:
        """From ``HOST:PORT`` and a device key; raises ``ValueError`` for a malformed address."""
        host, sep, port = tracker.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--rpc-tracker must be HOST:PORT, got {tracker!r}")
        if not key:
            raise ValueError("--rpc-key must not be empty")
        return cls(host.strip("[]"), int(port), key, **kwargs)

    def ms_config(self) -> ms.runner.RPCConfig:
        return ms.runner.RPCConfig(
            tracker_host=self.tracker_host,
            tracker_port=self.tracker_port,
            tracker_key=self.key,
            session_timeout_sec=self.session_timeout_sec,
        )


def create_rpc_session(rpc_config: ms.runner.RPCConfig) -> Any:
    """``f_create_session`` for ``RPCRunner`` that cannot hang: ``TrackerSession.request`` waits
    forever for a server with the key (STACK.md); here the tracker socket times out after the
    session timeout and the candidate fails with that error instead."""
    from tvm import rpc  # noqa: PLC0415 - RPC runs only

    tracker = rpc.connect_tracker(rpc_config.tracker_host, rpc_config.tracker_port)
    tracker._sock.settimeout(float(rpc_config.session_timeout_sec))  # noqa: SLF001
    try:
        return tracker.request(
            rpc_config.tracker_key,
            priority=rpc_config.session_priority,
            session_timeout=rpc_config.session_timeout_sec,
            max_retry=1,
        )
    except (OSError, RuntimeError) as err:
        raise RuntimeError(
            f"no RPC server with key {rpc_config.tracker_key!r} became free at "
            f"{rpc_config.tracker_host}:{rpc_config.tracker_port} within "
            f"{rpc_config.session_timeout_sec} s: {err}"
        ) from err


def make_runner(config: MeasureConfig, rpc: RpcConfig | None = None) -> ms.runner.Runner:
    """A local runner with ``config``'s evaluator settings over the process's runner worker for
    its run timeout, or an ``RPCRunner`` through the tracker in ``rpc``."""
    if rpc is not None:
        return ms.runner.RPCRunner(
            rpc_config=rpc.ms_config(),
            evaluator_config=config.evaluator(),
            f_create_session=create_rpc_session,
            max_workers=rpc.max_sessions,
        )
    return PooledRunner(
        _runner_pool(config.run_timeout_sec), config.run_timeout_sec, config.evaluator()
    )
