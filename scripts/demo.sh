#!/usr/bin/env bash
# The main job: write a store of a few thousand durable mutations and show it with ferry-dump.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
swift build -c release --product ferry-demo >/dev/null
swift build -c release --product ferry-dump >/dev/null
bin=$(swift build -c release --show-bin-path)
store=${FERRY_DEMO_STORE:-${TMPDIR:-/tmp}/ferry-demo-store}
"$bin/ferry-demo" "$store" --mutations "${FERRY_DEMO_MUTATIONS:-5000}"
echo; echo "\$ ferry-dump list $store";            "$bin/ferry-dump" list "$store"
echo; echo "\$ ferry-dump stats $store";           "$bin/ferry-dump" stats "$store"
echo; echo "\$ ferry-dump verify $store";          "$bin/ferry-dump" verify "$store"
echo; echo "\$ ferry-dump records $store --to 3";  "$bin/ferry-dump" records "$store" --to 3
