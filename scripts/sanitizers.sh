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
  mkdir -p "$scratch"
  log="$scratch/sanitizer-test.log"
  echo "building the tests with --sanitize=$s into $scratch..." >&2
  start=$(date +%s)
  # Under ThreadSanitizer Ferry's locks are pthread mutexes, which it sees handed over
  # (FerryMutex, Sources/FerryLog/FerryMutex.swift); Synchronization.Mutex it does not.
  flags=()
  [ "$s" = thread ] && flags=(-Xswiftc -DFERRY_TSAN)
  if ! swift build --build-tests --sanitize="$s" --scratch-path "$scratch" "${flags[@]}" > "$scratch/sanitizer-build.log" 2>&1; then
    grep -E 'error' "$scratch/sanitizer-build.log" >&2 || true
    echo "sanitizers.sh: the $s build failed (log: $scratch/sanitizer-build.log)" >&2
    exit 1
  fi
  built=$(date +%s)
  echo "testing under $s (log: $log)..." >&2
  status=0
  swift test --skip-build --sanitize="$s" --scratch-path "$scratch" "${flags[@]}" > "$log" 2>&1 || status=$?
  done_at=$(date +%s)
  reports=$(grep -cE '^(==[0-9]+==ERROR: AddressSanitizer|WARNING: ThreadSanitizer)' "$log" || true)
  result=$(grep -E '^(✔|✘) Test run with' "$log" | tail -1 || true)
  xctest=$(grep -E 'Executed [0-9]+ tests' "$log" | tail -1 || true)
  [ "$status" -ne 0 ] || [ "$reports" -ne 0 ] && failed=1
  summary+=("$(printf '%-8s exit %s, %s sanitizer reports, build %ss, tests %ss: %s %s' "$s" "$status" "$reports" \
    "$((built - start))" "$((done_at - built))" "$result" "$xctest")")
  if [ "$s" = thread ]; then
    # Does this toolchain's Mutex still look racy to TSan? (why FerryMutex is a pthread
    # mutex under TSan)
    swiftc -sanitize=thread -g scripts/tsan-mutex-repro.swift -o "$scratch/tsan-mutex-repro" 2>/dev/null
    # It needs the lock contended, which a loaded machine may not give: up to three tries.
    reported=no
    for _ in 1 2 3; do
      out=$(TSAN_OPTIONS=halt_on_error=0 "$scratch/tsan-mutex-repro" 2>&1 || true)
      case "$out" in *"WARNING: ThreadSanitizer"*) reported=yes; break ;; esac
    done
    if [ "$reported" = yes ]; then
      summary+=("         tsan-mutex-repro: TSan still reports races on a correct contended Mutex (FerryMutex stays a pthread mutex under TSan)")
    else
      summary+=("         tsan-mutex-repro: no report on a contended Mutex: FerryMutex could stay Mutex under TSan")
    fi
  fi
done
printf '%s\n' "${summary[@]}"
exit "$failed"
