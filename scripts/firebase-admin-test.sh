#!/usr/bin/env bash
# Runs Tests/FirebaseAdmin/test_ferry_server.py against a running ferry-server.
#   scripts/firebase-admin-test.sh HOST:PORT TOKEN
# Creates a virtualenv under .build/ (ignored) and installs firebase-admin from PyPI into it once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.build/firebase-admin-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "firebase-admin>=6.5,<8"
fi
FIREBASE_DATABASE_EMULATOR_HOST="$1" exec "$venv/bin/python" Tests/FirebaseAdmin/test_ferry_server.py "$2"
