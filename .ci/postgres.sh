#!/usr/bin/env bash
# A throw-away PostgreSQL server for tests, on a free loopback port, with trust auth.
#
#   line=$(bash .ci/postgres.sh start DIR)  # prints: export KILN_TEST_DATABASE_URL=postgresql+psycopg://...
#   eval "$line"
#   bash .ci/postgres.sh stop DIR
#
# DIR holds the cluster, its socket and its log; it is created if missing and must be empty or absent.
# As root the server runs as the `postgres` user (PostgreSQL refuses to run as root).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
action=$1
dir=$2

pg_bin() {
    if [[ -n "${PG_BIN:-}" ]]; then echo "$PG_BIN"; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -z "$found" ]]; then
        found=$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/pg_ctl)")
    fi
    [[ -x "$found/pg_ctl" ]] || { echo "PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 1; }
    echo "$found"
}

# Run a command as the cluster owner, from a directory that owner can read.
as_owner() {
    if [[ $EUID -eq 0 ]]; then
        (cd "$dir" && runuser -u postgres -- "$@")
    else
        (cd "$dir" && "$@")
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
    local bin port
    bin=$(pg_bin)
    mkdir -p "$dir"
    chmod 700 "$dir"
    if [[ $EUID -eq 0 ]]; then chown postgres:postgres "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    port=$(free_port)
    echo "$port" >"$dir/port"
    # Durability is pointless for a test cluster; fsync off makes schema churn much faster.
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-k $dir -h 127.0.0.1 -p $port -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    for _ in $(seq 1 60); do
        if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; then break; fi
        sleep 0.5
    done
    "$bin/pg_isready" -h 127.0.0.1 -p "$port" -U postgres >&2
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres kiln_test
    echo "export KILN_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$port/kiln_test"
}

stop() {
    local bin
    [[ -f "$dir/data/postmaster.pid" ]] || return 0
    bin=$(pg_bin)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
