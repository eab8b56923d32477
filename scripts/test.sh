#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, then builds and tests
# (the server's PostgreSQL backend against a throw-away cluster, stopped at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
swift build --build-tests
pgdir=$(mktemp -d /tmp/ferry-test-postgres.XXXXXX)
trap 'scripts/postgres.sh stop "$pgdir" || true; rm -rf "$pgdir"' EXIT
FERRY_TEST_POSTGRES=$(scripts/postgres.sh start "$pgdir")
export FERRY_TEST_POSTGRES
swift test --skip-build
