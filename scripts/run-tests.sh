#!/usr/bin/env bash
# Runs the whole test suite from the repository root, inside .venv.
# Starts a throwaway PostgreSQL server (scripts/postgres.sh) so storage tests run on both backends.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f scripts/postgres.sh ]; then
  eval "$(bash scripts/postgres.sh start)"
  trap 'bash scripts/postgres.sh stop >/dev/null 2>&1 || true' EXIT
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
