"""docker/compose.yaml cannot run here (no Docker): parse it and check the services, their
commands (parsed by the real ``tunehub`` argument parser), dependencies and health checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from service.cli import build_parser

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _parse(command: list[str]):
    assert command[0] == "tunehub", command
    return build_parser().parse_args(command[1:])


def test_services_and_commands(compose) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert _parse(services["migrate"]["command"]).db_command == "upgrade"
    api = _parse(services["api"]["command"])
    assert (api.command, api.host, api.port, api.no_worker) == ("serve", "0.0.0.0", 8470, True)
    assert _parse(services["worker"]["command"]).command == "worker"
    # One image for every TuneHub role, one database URL, one shared file store.
    roles = [services[name] for name in ("migrate", "api", "worker")]
    assert {r["image"] for r in roles} == {"tunehub:latest"}
    assert {r["build"]["dockerfile"] for r in roles} == {"docker/Dockerfile"}
    urls = {r["environment"]["TUNEHUB_DATABASE_URL"] for r in roles}
    assert len(urls) == 1 and urls.pop().startswith("postgresql+psycopg://tunehub:")
    for role in roles:
        assert "storage:/data/storage" in role["volumes"]
    assert re.fullmatch(
        r"\$\{TUNEHUB_WORKERS:-\d+\}", str(services["worker"]["deploy"]["replicas"])
    )
    # Published on the host's loopback only.
    assert services["api"]["ports"] == ["127.0.0.1:8470:8470"]


def test_start_order_and_health_checks(compose) -> None:
    services = compose["services"]
    postgres_check = services["postgres"]["healthcheck"]["test"]
    assert postgres_check[:2] == ["CMD", "pg_isready"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert services["migrate"]["restart"] == "no"
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    worker_deps = services["worker"]["depends_on"]
    assert worker_deps["migrate"]["condition"] == "service_completed_successfully"
    assert worker_deps["api"]["condition"] == "service_healthy"
    check = services["api"]["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-c"]
    compile(check["test"][3], "<healthcheck>", "exec")  # valid Python
    assert "/api/v1/ready" in check["test"][3] and ":8470/" in check["test"][3]
    assert set(compose["volumes"]) == {"pgdata", "storage"}


def test_dockerfile_installs_the_package_and_runs_the_api() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert "pip install --no-cache-dir ." in text and "g++" in text
    for package in ("service", "compiler", "tuner", "db", "examples", "cost_model"):
        assert f"COPY {package} ./{package}" in text
        assert (DOCKER.parent / package).is_dir()
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M).group(1)
    import json

    parsed = _parse(json.loads(cmd))
    assert parsed.command == "serve" and parsed.no_worker
    assert "USER tunehub" in text
