"""Workers download the target's transferred cost model over HTTP (``GET /workers/cost-model``).

The blob is what :mod:`cost_model.store` persists; here it is stored through the storage contract
and fetched with the real worker HTTP client against a real server, which must hand out only a
model of the worker's feature layout and TVM version.
"""

from __future__ import annotations

import tvm

from compiler.target import cpu_target
from cost_model.version import FEATURE_VERSION
from service.worker_client import HttpClient


def test_worker_downloads_only_a_matching_cost_model(serve) -> None:
    server = serve(workers=0)
    target = cpu_target()
    token = server.token("ci-runner", kind="worker")
    client = HttpClient(server.url, token, retry_secs=5)
    try:
        assert client.cost_model(target.key, tvm.__version__) is None  # no such target yet
        with server.storage() as storage:
            row = storage.ensure_target(target)
            old = storage.save_cost_model(
                target_id=row.id,
                blob=b"older",
                n_samples=1,
                feature_version=FEATURE_VERSION,
                tvm_version=tvm.__version__,
            )
            new = storage.save_cost_model(
                target_id=row.id,
                blob=b"\x00booster\xff",
                n_samples=2,
                feature_version=FEATURE_VERSION,
                tvm_version=tvm.__version__,
            )
            storage.save_cost_model(
                target_id=row.id,
                blob=b"other layout",
                n_samples=3,
                feature_version="some-other-features",
                tvm_version=tvm.__version__,
            )
        assert new.id > old.id
        assert client.cost_model(target.key, tvm.__version__) == (new.id, b"\x00booster\xff")
        assert client.cost_model(target.key, "0.0.1") is None  # another TVM: never mixed
        # A user token cannot reach worker routes.
        with server.client(server.local_token()) as user:
            reply = user.get(
                "/workers/cost-model", params={"target": target.key, "tvm_version": tvm.__version__}
            )
            assert reply.status_code == 403, reply.text
    finally:
        client.close()
