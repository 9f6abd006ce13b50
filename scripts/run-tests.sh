#!/usr/bin/env bash
# Runs the whole test suite from the repository root, inside .venv.
# Starts a throwaway PostgreSQL server (scripts/postgres.sh) so storage tests run on both backends,
# and installs Debian's chromium (for the dashboard tests) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
# The dashboard's tests drive Debian's Chromium (tests/dashboard/browser.py): install it once.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "run-tests.sh: installing chromium for the dashboard tests" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "run-tests.sh: could not install chromium; the dashboard tests will fail" >&2
fi
if [ -f scripts/postgres.sh ]; then
  eval "$(bash scripts/postgres.sh start)"
  trap 'bash scripts/postgres.sh stop >/dev/null 2>&1 || true' EXIT
fi
# Two pytest-xdist workers (TUNEHUB_TEST_WORKERS to change; 0 runs in this process): most tests
# wait on servers, subprocesses and compilers, so two share CI's two cores well. The tests that
# share a session's tuning database run on one worker (tests/conftest.py: SHARED_DATABASES).
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 -n "${TUNEHUB_TEST_WORKERS:-2}" \
  --dist loadgroup "$@"
