#!/usr/bin/env bash
# The README's second command: an app's offline run of the database (durable writes from 8 tasks,
# a live query, an update, a transaction, a reopen), then the store shown with ferry-dump.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
swift build -c release --product ferry-demo >/dev/null
swift build -c release --product ferry-dump >/dev/null
bin=$(swift build -c release --show-bin-path)
store=${FERRY_DEMO_STORE:-${TMPDIR:-/tmp}/ferry-demo-store}
"$bin/ferry-demo" "$store" --posts "${FERRY_DEMO_POSTS:-2000}"
echo; echo "\$ ferry-dump list $store";            "$bin/ferry-dump" list "$store"
echo; echo "\$ ferry-dump stats $store";           "$bin/ferry-dump" stats "$store"
echo; echo "\$ ferry-dump verify $store";          "$bin/ferry-dump" verify "$store"
echo; echo "\$ ferry-dump records $store --to 3";  "$bin/ferry-dump" records "$store" --to 3
echo; echo "\$ ferry-dump at $store --path /stats";  "$bin/ferry-dump" at "$store" --path /stats
