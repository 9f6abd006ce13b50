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
    serve.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="tuning database URL (default: $TUNEHUB_DATABASE_URL or embedded)",
    )
    serve.add_argument(
        "--workers", type=int, default=1, help="embedded worker processes (default 1)"
    )
    serve.add_argument(
        "--no-worker",
        action="store_true",
        help="API only (workers run elsewhere: `tunehub worker`)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(handler=run_serve)

    worker = subparsers.add_parser(
        "worker",
        help="lease tuning work (a task's trial batch or a job's finalize step) and run it",
        description="Lease work for this machine's target from a TuneHub server (--server, with a "
        "worker token) or straight from the database (--db / $TUNEHUB_DATABASE_URL / embedded), "
        "tune it with MetaSchedule, upload the measurements, heartbeat while working.",
    )
    worker.add_argument("--name", default=None, help="worker name (default: <hostname>-0)")
    where = worker.add_mutually_exclusive_group()
    where.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="TuneHub server to lease work from over HTTP (e.g. http://host:8470)",
    )
    where.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="tuning database URL (default: $TUNEHUB_DATABASE_URL or embedded)",
    )
    worker.add_argument(
        "--token", default=None, help="worker token for --server (default: $TUNEHUB_WORKER_TOKEN)"
    )
    worker.add_argument(
        "--target",
        default="cpu",
        help="'cpu' (this machine), 'cuda' (this machine's GPU) or the 16-hex key of one of them",
    )
    worker.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="worker processes to run (named <name>-0, <name>-1, ...)",
    )
    worker.add_argument(
        "--once",
        "--exit-when-idle",
        dest="once",
        action="store_true",
        help="exit 0 once no job for this target is queued or running (CI)",
    )
    worker.add_argument("--max-leases", type=int, default=None, help="exit after this many leases")
    worker.add_argument(
        "--rpc-tracker",
        default=None,
        metavar="HOST:PORT",
        help="measure on the devices of this TVM RPC tracker (needs --rpc-key)",
    )
    worker.add_argument("--rpc-key", default=None, help="device key at the RPC tracker")
    worker.add_argument(
        "--nice",
        type=int,
        default=0,
        help="lower this worker's CPU priority (serve's embedded workers use 10, "
        "so the API stays responsive while they tune)",
    )
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
    print(
        f"TuneHub serving {service.url}  (API {service.url}/api/v1, docs {service.url}/docs, "
        f"metrics {service.url}/metrics)",
        file=file,
    )
    print(f"dashboard: {service.url}/dashboard/ (asks for a user token once)", file=file)
    print(f"database: {service.storage.url}", file=file)
    print(f"storage:  {settings.resolved_storage_dir()}", file=file)
    token_file = settings.resolved_token_file()
    if service.token_created:
        print(
            f"created the local user token (kept in {token_file}, mode 0600): {service.token}",
            file=file,
        )
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
    import os

    import db
    from service.worker import run_worker

    if args.concurrency < 1:
        raise CliError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.max_leases is not None and args.max_leases < 1:
        raise CliError(f"--max-leases must be >= 1, got {args.max_leases}")
    token = args.token or os.environ.get("TUNEHUB_WORKER_TOKEN")
    if args.server is not None:
        if not args.server.startswith(("http://", "https://")):
            raise CliError(f"--server must be an http(s) URL, got {args.server!r}")
        if not token:
            raise CliError(
                "--server needs a worker token: --token or $TUNEHUB_WORKER_TOKEN "
                "(`tunehub token create --name NAME --kind worker`)"
            )
    rpc = None
    if (args.rpc_tracker is None) != (args.rpc_key is None):
        raise CliError("--rpc-tracker and --rpc-key go together")
    if args.rpc_tracker is not None:
        from tuner.measuring.builder_runner import RpcConfig

        try:
            rpc = RpcConfig.parse(args.rpc_tracker, args.rpc_key)
        except ValueError as err:
            raise CliError(str(err)) from None
    settings = settings_from_args(args)
    if args.concurrency > 1:
        return _run_worker_processes(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    if args.nice:
        os.nice(args.nice)
    try:
        done = run_worker(
            settings,
            name=args.name,
            server=args.server,
            token=token,
            target_name=args.target,
            rpc=rpc,
            once=args.once,
            max_leases=args.max_leases,
        )
    except ValueError as err:  # a target this machine is not
        raise CliError(str(err)) from None
    except db.StorageError as err:
        raise CliError(str(err)) from None
    except Exception as err:
        from service.worker_client import ServerUnavailable, WorkerApiError

        if isinstance(err, (ServerUnavailable, WorkerApiError)):
            print(f"tunehub: error: {err}", file=sys.stderr)
            return 1
        raise
    logging.getLogger("tunehub.worker").info("worker stopped after %d lease(s)", done)
    return 0


def _run_worker_processes(args: argparse.Namespace) -> int:
    """``--concurrency N``: N worker processes (names ``<name>-<i>``), signals passed on."""
    import signal
    import subprocess

    from service.worker import default_worker_name

    base = args.name or default_worker_name().rsplit("-", 1)[0]
    command = [
        sys.executable,
        "-m",
        "service.cli",
        "worker",
        "--target",
        args.target,
        "--nice",
        str(args.nice),
    ]
    import os

    env = dict(os.environ)
    if args.token:  # children read it from the environment, never from their command line
        env["TUNEHUB_WORKER_TOKEN"] = args.token
    for flag, value in (
        ("--server", args.server),
        ("--db", args.db),
        ("--max-leases", args.max_leases),
        ("--rpc-tracker", args.rpc_tracker),
        ("--rpc-key", args.rpc_key),
    ):
        if value is not None:
            command += [flag, str(value)]
    if args.once:
        command.append("--once")
    children = [
        subprocess.Popen([*command, "--name", f"{base}-{i}"], env=env)
        for i in range(args.concurrency)
    ]

    def forward(signum, _frame) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    codes = [child.wait() for child in children]
    return next((code for code in codes if code != 0), 0)
