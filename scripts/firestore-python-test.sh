#!/usr/bin/env bash
# Runs Tests/Firestore/test_ferry_firestore.py (google-cloud-firestore from PyPI) against a
# running ferry-server's Firestore port.
#   scripts/firestore-python-test.sh HOST:PORT [TEST-ARGS...]
# Creates a virtualenv under .build/ (ignored) and installs the client into it once.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.build/firestore-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "google-cloud-firestore>=2.19,<3"
fi
host="$1"
shift
FIRESTORE_EMULATOR_HOST="$host" GOOGLE_CLOUD_PROJECT="${GOOGLE_CLOUD_PROJECT:-ferry-test}" \
  exec "$venv/bin/python" Tests/Firestore/test_ferry_firestore.py "$@"
