#!/usr/bin/env bash
# A throw-away PostgreSQL cluster on loopback, for the tests and the bench.
#   scripts/postgres.sh start DIR   creates a cluster in DIR (initdb), starts it on a free port and
#                                   prints its address (postgres://ferry@127.0.0.1:PORT/postgres?sslmode=disable)
#   scripts/postgres.sh stop DIR    stops it (the files stay; remove DIR)
#   scripts/postgres.sh restart DIR starts a stopped cluster again, on its port
# As root, the server runs as the user postgres (PostgreSQL refuses to run as root).
set -euo pipefail
cmd=${1:?start or stop}
dir=${2:?a directory}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
[ -n "$bin" ] || { echo "PostgreSQL is not installed (scripts/deps.sh installs it)" >&2; exit 1; }
as_server() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
# Starts the cluster in $dir on port $1 (loopback only, its socket in $dir).
serve() {
  as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-p $1 -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
}
case $cmd in
start)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
  as_server "$bin/initdb" --no-sync -D "$dir/data" -U ferry --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  # A free port: the kernel picks one, which the server then takes (a race lost is retried).
  for _ in 1 2 3 4 5; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if serve "$port"; then
      echo "$port" >"$dir/port"
      echo "postgres://ferry@127.0.0.1:$port/postgres?sslmode=disable"
      exit 0
    fi
  done
  cat "$dir/server.log" >&2
  exit 1
  ;;
restart)
  dir=$(cd "$dir" && pwd)
  serve "$(cat "$dir/port")"
  ;;
stop)
  as_server "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
  ;;
*)
  echo "usage: scripts/postgres.sh start|stop|restart DIR" >&2
  exit 2
  ;;
esac
