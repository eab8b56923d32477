#!/usr/bin/env bash
# The README's first command: sync, end to end, with real processes on loopback.
#   1. starts ferry-server in the background (a free port, a new data directory);
#   2. ferry-sync-demo offline: an app writes 3 posts and 3 increments with no connection;
#   3. ferry-sync-demo online: the app, restarted on the same store, listens, goes online and
#      watches its writes reach the server (listener events with their metadata, the cursor);
#      a second client reads the server;
#   4. ferry-dump shows the client's store; 5. the server is stopped with SIGTERM.
# Exits non-zero as soon as a step fails; the server is stopped on any exit. The stores are left
# in a new directory under ${TMPDIR:-/tmp} (printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
if ! command -v curl >/dev/null; then   # the story reads the server with plain REST too
  echo "installing: curl" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq curl >/dev/null
fi

section() { printf '\n== %s ==\n' "$*"; }
fail() { echo "sync-story: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-sync-story.XXXXXX")
echo "building ferry-server, ferry-sync-demo and ferry-dump (the first build takes several minutes)..."
for product in ferry-server ferry-sync-demo ferry-dump; do
  swift build --product "$product" > "$work/build.log" 2>&1 || { grep -E 'error' "$work/build.log" >&2 || true; fail "the build failed (log: $work/build.log)"; }
done
bin=$(swift build --show-bin-path)

server_pid=""
stop_server() {   # on any exit: a server still running is stopped (SIGTERM, then SIGKILL after 10 s)
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$server_pid" 2>/dev/null || true
}
trap stop_server EXIT

section "1. ferry-server starts in the background"
echo "\$ ferry-server --port 0 --data $work/server &"
"$bin/ferry-server" --port 0 --data "$work/server" > "$work/server.out" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 300); do
  grep -q '^listening on ' "$work/server.out" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; fail "ferry-server did not start"; }
  sleep 0.1
done
grep '^listening on ' "$work/server.out" || fail "ferry-server did not say where it listens within 30 s"
port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$work/server.out")
url="http://127.0.0.1:$port?ns=story"

section "2. The app writes while offline"
echo "\$ ferry-sync-demo offline $work/client '$url'"
"$bin/ferry-sync-demo" offline "$work/client" "$url" || fail "the offline step failed"
echo "\$ curl -s 'http://127.0.0.1:$port/.json?ns=story'      # the server has nothing yet"
curl -sS --max-time 10 "http://127.0.0.1:$port/.json?ns=story" || fail "the server did not answer"; echo

section "3. The app restarts on the same store and goes online"
echo "\$ ferry-sync-demo online $work/client '$url'"
"$bin/ferry-sync-demo" online "$work/client" "$url" || fail "the online step failed"
echo "\$ curl -s 'http://127.0.0.1:$port/.json?ns=story'      # the server's data, over plain REST"
curl -sS --max-time 10 "http://127.0.0.1:$port/.json?ns=story" || fail "the server did not answer"; echo

section "4. The client's store, read by ferry-dump"
echo "\$ ferry-dump stats $work/client"
"$bin/ferry-dump" stats "$work/client" || fail "ferry-dump stats failed"
last=$("$bin/ferry-dump" stats "$work/client" --json | sed -n 's/.*"lastLSN" *: *\([0-9][0-9]*\).*/\1/p' | head -1)
from=$(( ${last:-8} > 8 ? ${last:-8} - 7 : 1 ))
echo; echo "\$ ferry-dump records $work/client --from $from      # the last records"
"$bin/ferry-dump" records "$work/client" --from "$from" || fail "ferry-dump records failed"

section "5. ferry-server stops (SIGTERM)"
kill -TERM "$server_pid"
for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$server_pid" 2>/dev/null && fail "ferry-server did not stop within 30 s of SIGTERM (the trap kills it)"
status=0
wait "$server_pid" || status=$?
server_pid=""
echo "ferry-server exited with status $status (0: stopped cleanly, its store closed)"
[ "$status" -eq 0 ] || { tail -20 "$work/server.log" >&2; fail "ferry-server did not stop cleanly"; }
echo
echo "The stores are in $work (client/, server/); the server's log is $work/server.log."
