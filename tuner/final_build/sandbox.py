"""Run untrusted native code (a worker's ``model.so``) in a sandboxed child process.

Where the server cannot build a remote worker's artifact itself
(:mod:`tuner.final_build.artifact_review`), it runs the worker's library, but never in its own
trust. :func:`run_sandboxed` starts a Python module in a child that has:

- **no inherited environment**: a fresh ``PATH`` and locale, nothing else (no database URL, no
  token, no ``TUNEHUB_*`` setting); Python in isolated mode (``-I``);
- **its own namespaces** (util-linux ``unshare``): a user namespace, a network namespace with
  only a downed loopback (no network), a PID namespace with its own ``/proc`` (the server's
  processes and their environments are invisible) and a mount namespace in which the server's
  home, storage and database folders, ``/run``, ``/dev/shm`` and the temporary folders are
  covered by empty tmpfs mounts, and only the child's own working folder is mounted back. A
  second user and mount namespace is entered before any untrusted code runs, so those mounts are
  locked: the code cannot unmount them (``mount_namespaces(7)``, "locked mounts");
- **rlimits**: address space, CPU time, file size, open files, no core dumps;
- ``PR_SET_NO_NEW_PRIVS``; it is killed with the server (``PR_SET_PDEATHSIG`` on ``unshare``,
  ``--kill-child`` for what runs inside) and when it runs past its time limit.

The child only writes files into its own working folder; the caller reads them and decides. No
line the child prints is a verdict. Where the kernel refuses the namespaces,
:func:`run_sandboxed` raises :class:`SandboxUnavailable` rather than run the code unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.final_build.process_limits import die_with_parent

REPO = Path(__file__).resolve().parents[2]
UNSHARE = ("--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--mount-proc")
#: Folders covered by an empty tmpfs besides the caller's (secrets and sockets live there).
SYSTEM_HIDDEN = ("/run", "/var/run", "/dev/shm", "/tmp", "/var/tmp")

# Runs first in the child, as root of the outer user namespace, single-threaded: cover the
# hidden folders, enter a second user + mount namespace (locking those mounts), set limits, then
# run the module. Written against libc directly: nothing else is imported before the limits.
_BOOTSTRAP = r"""
import ctypes, json, os, resource, runpy, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND = 2, 4, 8, 4096
def mount(source, target, kind, flags, data):
    if libc.mount(source, target.encode(), kind, flags, data) != 0:
        sys.exit("sandbox: cannot mount %s (errno %d)" % (target, ctypes.get_errno()))
work = os.open(cfg["workdir"], os.O_RDONLY | os.O_DIRECTORY)
for path in cfg["hide"]:
    if os.path.isdir(path) and not os.path.islink(path):
        mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=64k,mode=755")
def visible(path):
    try:
        return os.path.samestat(os.fstat(work), os.stat(path))
    except OSError:
        return False
if not visible(cfg["workdir"]):  # covered: mount the working folder back in its place
    os.makedirs(cfg["workdir"], exist_ok=True)
    mount(b"/proc/self/fd/%d" % work, cfg["workdir"], None, MS_BIND, None)
os.close(work)
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
    sys.exit("sandbox: cannot lock the mounts (errno %d)" % ctypes.get_errno())
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
for name, value in cfg["limits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.chdir(cfg["workdir"])
sys.path.insert(0, cfg["repo"])
sys.argv = [cfg["module"], *cfg["args"]]
runpy.run_module(cfg["module"], run_name="__main__", alter_sys=True)
"""


class SandboxUnavailable(RuntimeError):
    """This machine cannot start the sandbox (no ``unshare``, or the kernel refuses user
    namespaces); untrusted code is then not run at all."""


@dataclass(frozen=True)
class SandboxLimits:
    """What a sandboxed child may use: seconds of wall time (it is killed then), bytes of
    address space, CPU seconds, bytes of any file it writes, and open files."""

    timeout_secs: float = 300.0
    memory_bytes: int = 8 << 30
    cpu_secs: int = 600
    file_bytes: int = 1 << 30
    open_files: int = 256

    def rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_CPU": self.cpu_secs,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_CORE": 0,
        }


def _hidden(paths: Sequence[Path], workdir: Path) -> list[str]:
    """``paths`` and :data:`SYSTEM_HIDDEN`, less any that holds what the child needs (the
    interpreter, TuneHub's code). A covered working folder is mounted back in its place."""
    needed = [Path(p).resolve() for p in (sys.prefix, sys.base_prefix, REPO)]
    out = []
    for path in [*map(Path, SYSTEM_HIDDEN), *paths]:
        resolved = path.resolve()
        if any(n == resolved or resolved in n.parents for n in needed):
            continue
        out.append(str(resolved))
    return sorted(set(out))


def run_sandboxed(
    module: str,
    args: Sequence[str],
    *,
    workdir: Path,
    hide: Sequence[Path] = (),
    limits: SandboxLimits = SandboxLimits(),
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args...`` (a TuneHub module that loads untrusted code) sandboxed
    as the module docstring says, in ``workdir`` (the only folder it should write), with the
    folders ``hide`` (the server's home, storage, database) covered. Returns the finished
    process (its output is for logs only). Raises :class:`SandboxUnavailable` when the sandbox
    cannot be set up here, ``subprocess.TimeoutExpired`` after ``limits.timeout_secs`` (the
    child is killed)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable("util-linux's unshare is not installed")
    config = {
        "hide": _hidden(hide, workdir),
        "limits": limits.rlimits(),
        "workdir": str(workdir),
        "repo": str(REPO),
        "module": module,
        "args": list(args),
    }
    parent = os.getpid()
    done = subprocess.run(
        [
            unshare,
            *UNSHARE,
            "--kill-child",
            "--",
            sys.executable,
            "-I",
            "-c",
            _BOOTSTRAP,
            json.dumps(config),
        ],
        cwd=str(workdir),
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=limits.timeout_secs,
        preexec_fn=lambda: die_with_parent(parent),
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        raise SandboxUnavailable(f"the kernel refused the sandbox's namespaces: {done.stderr}")
    if done.returncode != 0 and done.stderr.startswith("sandbox: "):
        raise SandboxUnavailable(done.stderr.strip())
    return done
