#!/usr/bin/env bash
# Runs a script of Tests/Firestore (google-cloud-firestore from PyPI) against a running
# ferry-server's Firestore port.
#   scripts/firestore-python.sh HOST:PORT SCRIPT.py [ARGS...]
# Creates a virtualenv under .build/ (ignored) and installs the client into it once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.build/firestore-venv
mkdir -p .build
# Tests run this script concurrently: one makes the virtualenv, the others wait for it.
exec 9>.build/firestore-venv.lock
flock 9
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/installed" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "google-cloud-firestore>=2.19,<3"
  touch "$venv/installed"
fi
flock -u 9
host="$1"
script="$2"
shift 2
FIRESTORE_EMULATOR_HOST="$host" GOOGLE_CLOUD_PROJECT="${GOOGLE_CLOUD_PROJECT:-ferry-test}" \
  exec "$venv/bin/python" "Tests/Firestore/$script" "$@"
