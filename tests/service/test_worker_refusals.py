"""Issue 31 (case 7): a worker holds one lease at a time and is offered it again while it is
active, so a lease the coordinator refused (a 4xx) must not stay active: the worker ends it
``failed`` with the refusal, instead of walking away from it (it would be offered again and
again). A lease already gone stays lost."""

from __future__ import annotations

from service.settings import Settings
from service.worker import Worker
from service.worker_client import WorkerApiError
from tuner.jobs.protocol import LeaseEnd, TargetInfo, WorkOffer


class _RefusingClient:
    """A coordinator that refuses the lease's context and records how leases end."""

    def __init__(self, finish_status: int | None = None) -> None:
        self.finish_status = finish_status
        self.ended: list[tuple[int, str, str | None]] = []

    def context(self, lease_id: int, k: int, task_id: int | None = None):
        raise WorkerApiError(403, "forbidden", f"task lease {lease_id} is held by another worker")

    def finish(self, lease_id: int, outcome: str, error=None, search=None) -> LeaseEnd:
        if self.finish_status is not None:
            raise WorkerApiError(self.finish_status, "lease_lost", "the lease expired")
        self.ended.append((lease_id, outcome, error))
        return LeaseEnd(lease_status=outcome, job_status="running")


def _offer(target) -> WorkOffer:
    return WorkOffer(
        lease_id=7,
        kind="tune",
        job_id=1,
        target=TargetInfo.of(target),
        expires_at=None,
        trials=8,
        batch_size=4,
        mod_json="{}",
    )


def test_a_refused_lease_is_ended_failed() -> None:
    from compiler.target import cpu_target

    target = cpu_target(1)
    client = _RefusingClient()
    worker = Worker(Settings(), client, name="w", target=target)  # type: ignore[arg-type]
    assert worker.work(_offer(target)) == "failed"
    assert client.ended == [
        (7, "failed", "refused by the server: task lease 7 is held by another worker")
    ]

    gone = _RefusingClient(finish_status=409)
    worker = Worker(Settings(), gone, name="w", target=target)  # type: ignore[arg-type]
    assert worker.work(_offer(target)) == "lost" and gone.ended == []
