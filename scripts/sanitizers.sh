#!/usr/bin/env bash
# Runs the main package's test suite under AddressSanitizer and/or ThreadSanitizer, each built
# into its own scratch path (.build-asan, .build-tsan). Not part of scripts/test.sh (CI).
#   scripts/sanitizers.sh [address|thread|all]      (default all)
# Crash tests still SIGKILL their (sanitized) child processes. ThreadSanitizer reads
# scripts/tsan-suppressions.txt, where each entry says why the report is not Ferry's.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-all}"
case "$which" in
  address) sanitizers=(address) ;;
  thread) sanitizers=(thread) ;;
  all) sanitizers=(address thread) ;;
  *) echo "usage: scripts/sanitizers.sh [address|thread|all]" >&2; exit 2 ;;
esac
scripts/deps.sh

# Swift's crash backtracer would race the sanitizers' own reports.
export SWIFT_BACKTRACE=enable=no
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:${ASAN_OPTIONS:-}"
export TSAN_OPTIONS="suppressions=$PWD/scripts/tsan-suppressions.txt:halt_on_error=0:second_deadlock_stack=1:${TSAN_OPTIONS:-}"

failed=0
summary=()
for s in "${sanitizers[@]}"; do
  scratch=".build-${s:0:1}san"
  log="$scratch-test.log"
  echo "building the tests with --sanitize=$s into $scratch..." >&2
  start=$(date +%s)
  if ! swift build --build-tests --sanitize="$s" --scratch-path "$scratch" > "$scratch-build.log" 2>&1; then
    grep -E 'error' "$scratch-build.log" >&2 || true
    echo "sanitizers.sh: the $s build failed (log: $scratch-build.log)" >&2
    exit 1
  fi
  built=$(date +%s)
  echo "testing under $s (log: $log)..." >&2
  status=0
  FERRY_SANITIZER="$s" swift test --skip-build --sanitize="$s" --scratch-path "$scratch" > "$log" 2>&1 || status=$?
  done_at=$(date +%s)
  reports=$(grep -cE '^(==[0-9]+==ERROR: AddressSanitizer|WARNING: ThreadSanitizer)' "$log" || true)
  result=$(grep -E '^(✔|✘) Test run with' "$log" | tail -1 || true)
  xctest=$(grep -E 'Executed [0-9]+ tests' "$log" | tail -1 || true)
  [ "$status" -ne 0 ] || [ "$reports" -ne 0 ] && failed=1
  summary+=("$(printf '%-8s exit %s, %s sanitizer reports, build %ss, tests %ss: %s %s' "$s" "$status" "$reports" \
    "$((built - start))" "$((done_at - built))" "$result" "$xctest")")
  grep -E '^Skipping under' "$log" | sort -u || true
done
printf '%s\n' "${summary[@]}"
exit "$failed"
