"""One tuning engine: a job submitted over REST (run by the service's lease worker) and a
``tunehub tune`` run of the same model on the same database state get the same search features
and leave the same job rows.

The database holds the small CNN tuned without seeds (``tuned_small_cnn``, tests/conftest.py:
one tuning shared with other modules, copied per run); the MLP's last layer (``matmul + add``) is
a sibling of the CNN's classifier, so both runs must measure sibling seeds taken from the
database (the lease worker gets them from the server with its lease context).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import db
from tests.service.conftest import start_server, stop_server, upload, wait_for_job
from tuner.final_build.remeasure import RemeasureConfig

REPO = Path(__file__).resolve().parents[2]
TRIALS = 12  # the MLP's 3 tasks: one batch of 4 each
POPULATION = 16


def _job_rows(url: str, job_id: int) -> tuple[dict, list[tuple]]:
    storage = db.open_storage(url)
    try:
        job = storage.get_job(job_id)
        tasks = sorted(
            (t.name, t.weight, t.status, t.trial_budget) for t in storage.list_job_tasks(job_id)
        )
        fields = {"status": job.status, "trial_budget": job.trial_budget, "model_tasks": len(tasks)}
        return fields, tasks
    finally:
        storage.close()


@pytest.mark.slow
def test_rest_job_and_cli_run_share_the_engine(tuned_small_cnn, example_model, tmp_path) -> None:
    mlp = example_model("mlp", "onnx")

    # `tunehub tune` on one copy of the database, in the background while the REST job runs
    # (separate copies: the two runs never see each other's records).
    cli_db = tmp_path / "cli.db"
    tuned_small_cnn.copy(cli_db)
    stdout, stderr = tmp_path / "cli.out", tmp_path / "cli.err"
    with open(stdout, "wb") as out, open(stderr, "wb") as err:  # files: no pipe to fill up
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "tune",
                str(mlp),
                "--trials",
                str(TRIALS),
                "--population",
                str(POPULATION),
                "--cost-model",
                "cold",
                "--db",
                f"sqlite:///{cli_db}",
                "-o",
                str(tmp_path / "cli-out"),
                "--json",
            ],
            cwd=REPO,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        # A REST job, run by the service's embedded lease worker, on another copy.
        home = tmp_path / "home"
        home.mkdir()
        tuned_small_cnn.copy(home / "tunehub.db")
        server = start_server(
            home,
            workers=1,
            env={
                "TUNEHUB_SEARCH_POPULATION": str(POPULATION),
                "TUNEHUB_COST_MODEL_RETRAIN_SECS": "100000",
            },
        )
        try:
            with server.client(server.local_token()) as client:
                model = upload(client, mlp).json()
                job = client.post(
                    "/jobs", json={"model_id": model["id"], "trial_budget": TRIALS}
                ).json()
                rest = wait_for_job(
                    client, job["id"], {"succeeded", "failed", "cancelled"}, timeout=900
                )
        finally:
            stop_server(server)
        run.wait(timeout=900)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert run.returncode == 0, stderr.read_text()[-3000:]
    cli = json.loads(stdout.read_text())
    assert rest["status"] == "succeeded", rest

    # The same search features in both summaries.
    for search in (cli["search"], rest["search"]):
        assert search["seeds_measured"] >= 1 and search["seeds_valid"] >= 1
        assert search["cost_model"] == "cold"
        assert search["skipped_stored"] >= 0 and search["default_schedules"] == 0
        # Fewer trials than the cold model's warm-up: every batch drawn without evolution.
        assert search["cold_batches"] >= 1 and search["evolved_batches"] == 0
    assert set(cli["search"]) == set(rest["search"])

    # The same job rows: status, budget and the planner's tasks with their allotments.
    cli_job, cli_tasks = _job_rows(f"sqlite:///{cli_db}", cli["job_id"])
    rest_job, rest_tasks = _job_rows(f"sqlite:///{home / 'tunehub.db'}", rest["id"])
    assert cli_job == rest_job
    assert cli_tasks == rest_tasks

    # Both final builds re-measured the tasks' top records and stored the re-measurements
    # (the REST job's through its artifact's manifest, checked by the server).
    for url, job_id in (
        (f"sqlite:///{cli_db}", cli["job_id"]),
        (f"sqlite:///{home / 'tunehub.db'}", rest["id"]),
    ):
        storage = db.open_storage(url)
        try:
            stored = storage.list_remeasurements(job_id=job_id)
            library = storage.list_library_records(job_id=job_id)
        finally:
            storage.close()
        assert stored, url
        assert all(len(r.rounds_secs) == RemeasureConfig.from_env().rounds for r in stored)
        # every task's winner is stored: a chosen schedule, or its peer's or default's library
        # record (the MLP's three GEMMs have peers, which can beat a few-trial search on all)
        assert any(r.chosen for r in stored) or library, url
