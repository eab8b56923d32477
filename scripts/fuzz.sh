#!/usr/bin/env bash
# Runs every libFuzzer target of Fuzz/ (one per decoder: frames, records, values, checkpoints,
# JSON) for a bounded time each, under AddressSanitizer. Fails if any target crashes; prints one
# line per target (runs, coverage, corpus). Not part of scripts/test.sh (CI): run it by hand.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 60)
# Crashes are written to .build-fuzz/artifacts/<target>/; the corpora grow in
# .build-fuzz/corpus/<target>/, seeded from Fuzz/Corpus/<target>/ (checked in) and
# Fixtures/fuzz/<target>/ (regression inputs of fixed bugs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
targets=(fuzz-frame fuzz-record fuzz-value fuzz-checkpoint fuzz-json)
scripts/deps.sh

# libFuzzer and the sanitizers come with the toolchain's clang; nothing else to install.
mkdir -p .build-fuzz
if ! (cd Fuzz && swift build -c release -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library) > .build-fuzz/build.log 2>&1; then
  grep -E 'error' .build-fuzz/build.log >&2 || true
  echo "fuzz.sh: the build failed (log: .build-fuzz/build.log)" >&2
  exit 1
fi
bin="Fuzz/.build/release"
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "fuzz.sh: $bin/$t was not built" >&2; exit 1; }
done

# Swift's own crash backtracer would race ASan's report; leaks are not what these targets look for.
export SWIFT_BACKTRACE=enable=no
export ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}"

work=.build-fuzz
failed=0
summary=()
for t in "${targets[@]}"; do
  corpus="$work/corpus/$t"
  artifacts="$work/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=(Fuzz/Corpus/"$t")
  [ -d "Fixtures/fuzz/$t" ] && seeds+=("Fixtures/fuzz/$t")
  log="$work/$t.log"
  echo "fuzzing $t for ${seconds}s..." >&2
  status=0
  "$bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" > "$log" 2>&1 || status=$?
  runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 || true)
  if [ "$status" -ne 0 ]; then
    failed=1
    crash=$(grep -oE "Test unit written to .*" "$log" | tail -1 || true)
    summary+=("$(printf '%-16s CRASHED (exit %s) after %s runs; %s; see %s' "$t" "$status" "$runs" "${crash:-no unit}" "$log")")
  else
    summary+=("$(printf '%-16s ok  %10s runs in %ss  %s  %s' "$t" "$runs" "$seconds" "$cov" "$corp")")
  fi
done
printf '%s\n' "${summary[@]}"
exit "$failed"
