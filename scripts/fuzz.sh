#!/usr/bin/env bash
# Fuzz smoke for `make test`: build the libFuzzer targets with clang and run
# each for FUZZ_SECONDS, one after the other, starting from the checked-in
# corpus (which the plain ctest run also replays). Installs clang from
# Debian's packages when it is missing and we are root; otherwise says so and
# skips.
#
# Targets (tests/fuzz/): fuzz_plan_load (the plan-file loader),
# fuzz_plan_kinds (plans of given decisions, opt4_plan_from_kinds),
# fuzz_pool_header (the checks before a pool found in /dev/shm is used, then
# the runtime over whatever passed), fuzz_pool_ops (random operation
# sequences against the engine in one process, with oracles), fuzz_records
# (the record file's header and index), fuzz_tar_index (the tar indexer, on
# whole shards in memory), fuzz_decode (the binding's record decoder, in an
# embedded CPython; built only where Python's development files are).
#
# `make fuzz-long` runs each for 10 minutes (FUZZ_SECONDS=600) with
# FUZZ_MERGE=1: what the run found is merged (-merge=1, so only inputs that
# add coverage) into tests/fuzz/corpus/<target>/, to be committed. FUZZ_TARGETS
# limits the run to some targets ("fuzz_pool_ops fuzz_pool_header").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
cmake=${CMAKE:-cmake}
ninja=${NINJA:-ninja}
if [ "$seconds" = "0" ]; then
  echo "STAGE SKIPPED: FUZZ_SECONDS=0 (the corpus was still replayed by ctest)"
  exit 0
fi
if ! command -v clang >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 && [ "${FUZZ_INSTALL_CLANG:-1}" = "1" ]; then
    echo "fuzz: libFuzzer needs clang, which is not installed: installing Debian's 'clang' package" \
         "with apt-get (as root; FUZZ_INSTALL_CLANG=0 skips this)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null 2>&1; } \
      || true
  fi
  if ! command -v clang >/dev/null 2>&1; then
    echo "STAGE SKIPPED: no clang, so no libFuzzer run (the corpus was still replayed by ctest);" \
         "install clang (apt-get install clang) to fuzz"
    exit 0
  fi
fi
CC=clang "$cmake" -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
  -DOPT4_BUILD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
"$cmake" --build build/fuzz >/dev/null
if [ ! -x build/fuzz/fuzz_decode ]; then
  echo "fuzz: fuzz_decode not built: no Python development files to embed the interpreter" \
       "(apt-get install python3-dev); the other targets run"
fi
merge=${FUZZ_MERGE:-0}
only=${FUZZ_TARGETS:-}
failed=0
for target in build/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then continue; fi
  work=build/fuzz/corpus-$name
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$name"/* "$work"/
  echo "fuzz: $name for ${seconds}s"
  # -timeout: one input that runs 25 s is a finding (libFuzzer prints its
  # stack); the outer timeout bounds the whole run even if libFuzzer hangs.
  timeout --signal=ABRT --kill-after=30 $((seconds + 120)) \
    "$target" "$work" -max_total_time="$seconds" -timeout=25 -max_len=4096 -rss_limit_mb=2048 \
    -artifact_prefix=build/fuzz/ -print_final_stats=1 2> "build/fuzz/$name.log" \
    || { tail -50 "build/fuzz/$name.log"; echo "fuzz: $name FAILED (see build/fuzz/$name.log; the input is build/fuzz/crash-* or timeout-*)"; failed=1; continue; }
  grep -E "stat::number_of_executed_units|stat::new_units_added" "build/fuzz/$name.log" | sed 's/^/  /'
  echo "fuzz: $name ok"
  if [ "$merge" = "1" ]; then
    before=$(ls tests/fuzz/corpus/"$name" | wc -l)
    "$target" -merge=1 -max_len=4096 tests/fuzz/corpus/"$name" "$work" 2> "build/fuzz/$name.merge.log"
    echo "  corpus: $before -> $(ls tests/fuzz/corpus/"$name" | wc -l) inputs in tests/fuzz/corpus/$name"
  fi
done
exit $failed
