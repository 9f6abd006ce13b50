"""``tunehub token create|list|revoke`` and the local token of the embedded default."""

from __future__ import annotations

import json
import os
import stat

import db
from service.auth import LOCAL_USER, ensure_local_token, hash_token
from service.cli import main


def test_token_create_list_revoke(tmp_path, capsys) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert main(["db", "upgrade", "--db", url]) == 0
    capsys.readouterr()
    assert main(["token", "create", "--name", "alice", "--db", url]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert token.startswith("th_") and len(token) > 40 and "shown only now" in out.err
    assert main(["token", "create", "--name", "w1", "--kind", "worker", "--db", url]) == 0
    capsys.readouterr()
    assert main(["token", "create", "--name", "bad name!", "--db", url]) == 2
    assert "invalid name" in capsys.readouterr().err
    assert main(["token", "list", "--json", "--db", url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(t["name"], t["kind"], t["revoked"]) for t in listed] == [
        ("alice", "user", False),
        ("w1", "worker", False),
    ]
    assert token not in json.dumps(listed)
    with db.open_storage(url) as storage:  # only the hash is stored
        assert storage.find_api_token(hash_token(token)).name == "alice"
    assert main(["token", "revoke", str(listed[0]["id"]), "--db", url]) == 0
    assert main(["token", "revoke", "999", "--db", url]) == 2
    capsys.readouterr()
    with db.open_storage(url) as storage:
        assert storage.find_api_token(hash_token(token)) is None


def test_local_token_file_is_private_and_reused(tmp_path) -> None:
    with db.open_storage(f"sqlite:///{tmp_path / 'l.db'}", upgrade=True) as storage:
        path = tmp_path / "home" / "token"
        token, created = ensure_local_token(storage, path)
        assert created and path.read_text().strip() == token
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert ensure_local_token(storage, path) == (token, False)
        row = storage.find_api_token(hash_token(token))
        assert row.name == LOCAL_USER and row.kind == "user"
        storage.revoke_api_token(row.id)  # a revoked local token is replaced
        fresh, created = ensure_local_token(storage, path)
        assert created and fresh != token and path.read_text().strip() == fresh
