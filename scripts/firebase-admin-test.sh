#!/usr/bin/env bash
# Runs Tests/FirebaseAdmin/test_ferry_server.py against a running ferry-server.
#   scripts/firebase-admin-test.sh HOST:PORT TOKEN
# Creates a virtualenv under .build/ (ignored) and installs firebase-admin from PyPI into it once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.build/firebase-admin-venv
# One run at a time makes the virtualenv (two tests may start this together); a finished one is
# marked, so a half-made one is made again.
mkdir -p .build
exec 9>.build/firebase-admin-venv.lock
flock 9
if [ ! -e "$venv/.ready" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "firebase-admin>=6.5,<8"
  touch "$venv/.ready"
fi
flock -u 9
FIREBASE_DATABASE_EMULATOR_HOST="$1" exec "$venv/bin/python" Tests/FirebaseAdmin/test_ferry_server.py "$2"
