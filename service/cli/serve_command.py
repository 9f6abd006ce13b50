"""``tunehub serve`` (the REST API plus embedded workers) and ``tunehub worker`` (one worker)."""
from __future__ import annotations

import argparse
import sys

from service.cli.errors import CliError


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve", help="run the REST API (and embedded workers) on this machine"
    )
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8470)")
    serve.add_argument("--db", default=None, metavar="URL",
                       help="tuning database URL (default: $TUNEHUB_DATABASE_URL or embedded)")
    serve.add_argument("--workers", type=int, default=1,
                       help="embedded worker processes (default 1)")
    serve.add_argument("--no-worker", action="store_true",
                       help="API only (workers run elsewhere: `tunehub worker`)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(handler=run_serve)

    worker = subparsers.add_parser(
        "worker", help="claim and run queued tuning jobs from the database"
    )
    worker.add_argument("--name", default=None, help="worker name (default: <hostname>-0)")
    worker.add_argument("--db", default=None, metavar="URL",
                        help="tuning database URL (default: $TUNEHUB_DATABASE_URL or embedded)")
    worker.add_argument("--target", default="cpu",
                        help="the target this worker tunes for: cpu, or cuda (this machine's GPU)")
    worker.add_argument("--max-jobs", type=int, default=None, help="exit after this many jobs")
    worker.add_argument("--exit-when-idle", action="store_true",
                        help="exit when no job is queued (instead of waiting)")
    worker.add_argument("--nice", type=int, default=0,
                        help="lower this worker's CPU priority (serve's embedded workers use 10, "
                        "so the API stays responsive while they tune)")
    worker.set_defaults(handler=run_worker_command)


def settings_from_args(args: argparse.Namespace):
    from pydantic import ValidationError

    from service.settings import Settings

    overrides = {}
    for key in ("host", "port"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    if getattr(args, "db", None):
        overrides["database_url"] = args.db
    try:
        return Settings(**overrides)
    except ValidationError as err:
        raise CliError(f"invalid settings: {err}") from None


def run_serve(args: argparse.Namespace) -> int:
    import logging

    import db
    from service.serve import Service, port_in_use

    settings = settings_from_args(args)
    workers = 0 if args.no_worker else args.workers
    if workers < 0:
        raise CliError(f"--workers must be >= 0, got {workers}")
    if port_in_use(settings.host, settings.port):
        raise CliError(
            f"{settings.host}:{settings.port} is in use (another `tunehub serve`?); "
            "stop it or pass --port"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        service = Service(settings, workers=workers, log_level=args.log_level)
    except db.StorageError as err:
        raise CliError(str(err)) from None
    print_banner(service, workers)
    service.serve_forever()
    return 0


def print_banner(service, workers: int, file=sys.stdout) -> None:
    settings = service.settings
    print(f"TuneHub serving {service.url}  (API {service.url}/api/v1, docs {service.url}/docs, "
          f"metrics {service.url}/metrics)", file=file)
    print(f"database: {service.storage.url}", file=file)
    print(f"storage:  {settings.resolved_storage_dir()}", file=file)
    token_file = settings.resolved_token_file()
    if service.token_created:
        print(f"created the local user token (kept in {token_file}, mode 0600): {service.token}",
              file=file)
    elif service.token is not None:
        print(f"local user token: {token_file}", file=file)
    else:
        print("tokens: `tunehub token create --name NAME` (user) / `--kind worker`", file=file)
    if workers:
        logs = settings.home_dir() / "logs"
        print(f"workers:  {workers} embedded (logs in {logs})", file=file)
    else:
        print("workers:  none here (run `tunehub worker` against the same database)", file=file)
    file.flush()


def run_worker_command(args: argparse.Namespace) -> int:
    import logging

    import db
    from compiler.errors import ModelError
    from compiler.target import resolve_target
    from service.worker import run_worker

    settings = settings_from_args(args)
    try:
        target = resolve_target(args.target)
    except ModelError as err:
        raise CliError(str(err)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.nice:
        import os

        os.nice(args.nice)
    try:
        done = run_worker(
            settings, name=args.name, max_jobs=args.max_jobs, exit_when_idle=args.exit_when_idle,
            target=target,
        )
    except db.StorageError as err:
        raise CliError(str(err)) from None
    logging.getLogger("tunehub.worker").info("worker stopped after %d job(s)", done)
    return 0
