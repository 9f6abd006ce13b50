#!/usr/bin/env bash
# A throwaway PostgreSQL server for the storage tests and benchmarks.
#
#   eval "$(bash scripts/postgres.sh start)"   # prints: export TUNEHUB_TEST_POSTGRES_URL=...
#   bash scripts/postgres.sh stop
#
# start: installs Debian's postgresql if initdb/pg_ctl are missing (needs root and apt), runs
# initdb on a temporary cluster owned by the `postgres` user (initdb refuses root), listens on a
# free port on 127.0.0.1 only with its unix socket inside the cluster directory, creates the
# database `tunehub_test`, and prints the export line on stdout. Everything else goes to stderr.
# If PostgreSQL cannot be installed or started, it prints nothing and exits 0: the PostgreSQL
# tests are then skipped with a visible reason.
# stop: stops the server and removes the directory. State lives in $TUNEHUB_PG_STATE (default: a
# file in /tmp named after this checkout). A second `start` while one runs reuses it and counts
# users; the server stops at the last `stop`.
set -uo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE_FILE="${TUNEHUB_PG_STATE:-/tmp/tunehub-postgres-$(printf '%s' "$REPO_ROOT" | cksum | cut -d' ' -f1).state}"
log() { echo "postgres.sh: $*" >&2; }

find_bin() {
  local name=$1 dir
  for dir in /usr/lib/postgresql/*/bin; do
    if [ -x "$dir/$name" ]; then echo "$dir/$name"; return 0; fi
  done
  command -v "$name" 2>/dev/null && return 0
  return 1
}

install_postgres() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL is not installed and cannot be installed here (need root and apt-get)"
    return 1
  fi
  log "installing PostgreSQL (apt-get)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || return 1
  apt-get install -y -qq --no-install-recommends postgresql >&2 || return 1
}

as_owner() {
  # Run a command as the cluster owner (postgres when we are root, ourselves otherwise).
  if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else
    "$@"
  fi
}

free_port() {
  python3 - <<'PY' 2>/dev/null || echo 54329
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

start() {
  if [ -f "$STATE_FILE" ]; then
    # shellcheck disable=SC1090
    . "$STATE_FILE"
    if [ -n "${PGDATA_DIR:-}" ] && as_owner "$PG_CTL" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
      log "already running on port $PGPORT_NUM"
      echo $(( ${USERS:-1} + 1 )) >"$STATE_FILE.users.tmp"
      sed -i "/^USERS=/d" "$STATE_FILE"; echo "USERS=$(cat "$STATE_FILE.users.tmp")" >>"$STATE_FILE"
      rm -f "$STATE_FILE.users.tmp"
      echo "export TUNEHUB_TEST_POSTGRES_URL=$URL"
      return 0
    fi
    rm -f "$STATE_FILE"
  fi
  local initdb pg_ctl psql
  initdb=$(find_bin initdb) && pg_ctl=$(find_bin pg_ctl) && psql=$(find_bin psql)
  if [ -z "${initdb:-}" ] || [ -z "${pg_ctl:-}" ] || [ -z "${psql:-}" ]; then
    install_postgres || return 0
    initdb=$(find_bin initdb) && pg_ctl=$(find_bin pg_ctl) && psql=$(find_bin psql) || {
      log "PostgreSQL binaries not found after installation"; return 0; }
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres >&2 || {
      log "cannot create the postgres user"; return 0; }
  fi
  local dir port
  dir=$(mktemp -d /tmp/tunehub-pg.XXXXXX)
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  port=$(free_port)
  if ! as_owner "$initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1; then
    log "initdb failed:"; cat "$dir/initdb.log" >&2; rm -rf "$dir"; return 0
  fi
  if ! as_owner "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=100 -c fsync=on" start >&2; then
    log "server did not start:"; cat "$dir/server.log" >&2; rm -rf "$dir"; return 0
  fi
  if ! as_owner "$psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -q \
      -c "CREATE DATABASE tunehub_test" >&2; then
    log "createdb failed"; as_owner "$pg_ctl" -D "$dir/data" -m fast stop >&2; rm -rf "$dir"; return 0
  fi
  local url="postgresql+psycopg://postgres@127.0.0.1:$port/tunehub_test"
  {
    echo "PGDATA_DIR=$dir/data"
    echo "PG_DIR=$dir"
    echo "PG_CTL=$pg_ctl"
    echo "PGPORT_NUM=$port"
    echo "URL=$url"
    echo "USERS=1"
  } >"$STATE_FILE"
  log "PostgreSQL running on 127.0.0.1:$port (data in $dir)"
  echo "export TUNEHUB_TEST_POSTGRES_URL=$url"
}

stop() {
  [ -f "$STATE_FILE" ] || return 0
  # shellcheck disable=SC1090
  . "$STATE_FILE"
  if [ "${USERS:-1}" -gt 1 ]; then
    sed -i "/^USERS=/d" "$STATE_FILE"; echo "USERS=$(( USERS - 1 ))" >>"$STATE_FILE"
    log "still in use ($(( USERS - 1 )) left)"; return 0
  fi
  as_owner "$PG_CTL" -D "$PGDATA_DIR" -m fast -w stop >&2 || true
  rm -rf "$PG_DIR"
  rm -f "$STATE_FILE"
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
exit 0
