#!/usr/bin/env bash
# Installs the Debian packages the build needs, if they are missing. Safe to run again.
#   liblz4-dev       the LZ4 codec the log compresses frames with
#   libleveldb-dev   LevelDB, a peer in ferry-bench (the library never links it)
#   libsqlite3-dev   SQLite, a peer in ferry-bench
#   pkg-config       how SwiftPM finds liblz4 and sqlite3
#   python3-venv     the server's firebase-admin test builds a virtualenv (only if `python3 -m venv` fails)
#   postgresql       the server's PostgreSQL backend is tested against a throw-away cluster (scripts/postgres.sh)
#   procps           pgrep, with which a test freezes that cluster's processes
set -euo pipefail
needed=()
for pkg in liblz4-dev libleveldb-dev libsqlite3-dev pkg-config; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || needed+=("$pkg")
done
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  needed+=(postgresql)
fi
command -v pgrep >/dev/null 2>&1 || needed+=(procps)
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  needed+=(python3-venv)
fi
if [ ${#needed[@]} -gt 0 ]; then
  echo "installing: ${needed[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${needed[@]}" >/dev/null
fi
