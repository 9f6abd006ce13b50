"""``tunehub token create|list|revoke``: API tokens for users and workers.

The token is printed once, on stdout; the database keeps only its sha256. A user token's name is
the user: models and jobs belong to it, and several tokens may share one name.
"""

from __future__ import annotations

import argparse
import re
import sys

from service.cli.errors import CliError
from service.cli.options import add_db_option, open_storage_from_args, print_json

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser("token", help="create, list and revoke API tokens")
    commands = group.add_subparsers(dest="token_command", metavar="SUBCOMMAND", required=True)

    create = commands.add_parser("create", help="create a token and print it (once)")
    create.add_argument(
        "--name", required=True, help="user name (owner of models and jobs) or worker name"
    )
    create.add_argument("--kind", choices=["user", "worker"], default="user")
    add_db_option(create)
    create.set_defaults(handler=run_create)

    list_ = commands.add_parser("list", help="list tokens (never the tokens themselves)")
    add_db_option(list_)
    list_.add_argument("--json", action="store_true")
    list_.set_defaults(handler=run_list)

    revoke = commands.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", type=int, metavar="ID")
    add_db_option(revoke)
    revoke.set_defaults(handler=run_revoke)


def run_create(args: argparse.Namespace) -> int:
    import db
    from service.auth import create_token

    if not NAME.match(args.name):
        raise CliError(f"invalid name {args.name!r}: letters, digits and ._@- (at most 128)")
    storage = open_storage_from_args(args)
    try:
        token, token_id = create_token(storage, name=args.name, kind=args.kind)
    except db.StorageError as err:
        raise CliError(str(err)) from None
    finally:
        storage.close()
    print(token)
    print(
        f"created {args.kind} token {token_id} for {args.name!r}; it is shown only now",
        file=sys.stderr,
    )
    return 0


def run_list(args: argparse.Namespace) -> int:
    storage = open_storage_from_args(args)
    try:
        tokens = storage.list_api_tokens()
    finally:
        storage.close()
    rows = [
        {
            "id": t.id,
            "name": t.name,
            "kind": t.kind,
            "revoked": t.revoked,
            "created_at": t.created_at.isoformat() if t.created_at else None,
        }
        for t in tokens
    ]
    if args.json:
        print_json(rows)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="API tokens")
    for column in ("id", "name", "kind", "revoked", "created_at"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row[c]) for c in ("id", "name", "kind", "revoked", "created_at")))
    Console().print(table)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    import db

    storage = open_storage_from_args(args)
    try:
        storage.revoke_api_token(args.token_id)
    except db.NotFoundError as err:
        raise CliError(str(err)) from None
    finally:
        storage.close()
    print(f"revoked token {args.token_id}")
    return 0
