#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, then builds and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
swift build --build-tests
swift test --skip-build
