#!/usr/bin/env bash
# Fuzzing for `make test` and `make fuzz-long`: build the libFuzzer targets
# with clang, then run each from the checked-in corpus: libFuzzer first runs
# every corpus input (the replay, under ASan+UBSan), then explores new
# inputs until FUZZ_SECONDS have passed since the target started. Up to
# FUZZ_JOBS targets run at once (2 by default: each is one process on one
# core). Installs clang from Debian's packages when it is missing and we are
# root; otherwise says so and skips.
#
# `make test` gives each target FUZZ_SECONDS=10: the replay takes well under
# a second for most targets (each line below says how many inputs it replayed
# and how many new ones it ran after), so this is a brief exploration on top
# of the replay, which plain ctest also does with any compiler. The long runs
# are `make fuzz-long`: each target for 10 minutes (FUZZ_SECONDS=600) with
# FUZZ_MERGE=1, so that what the run found is merged (-merge=1, so only inputs
# that add coverage) into tests/fuzz/corpus/<target>/, to be committed.
#
# Targets (tests/fuzz/): fuzz_plan_load (the plan-file loader),
# fuzz_plan_kinds (plans of given decisions, opt4_plan_from_kinds),
# fuzz_pool_header (the checks before a pool found in /dev/shm is used, then
# the runtime over whatever passed), fuzz_pool_ops (random operation
# sequences against the engine in one process, with oracles), fuzz_records
# (the record file's header and index), fuzz_tar_index (the tar indexer, on
# whole shards in memory), fuzz_s3_answer (an S3 store's answer to a ranged
# GET: headers, Content-Range, a body in pieces), fuzz_decode (the binding's record decoder, in an
# embedded CPython; built only where Python's development files are).
# FUZZ_TARGETS limits the run to some targets ("fuzz_pool_ops fuzz_pool_header").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-10}
jobs=${FUZZ_JOBS:-2}
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

# One target: its corpus copied into a work directory, then libFuzzer.
# -timeout: one input that runs 25 s is a finding (libFuzzer prints its
# stack); the outer timeout bounds the whole run even if libFuzzer hangs.
run_target() {
  local target=$1 name work
  name=$(basename "$target")
  work=build/fuzz/corpus-$name
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$name"/* "$work"/
  timeout --signal=ABRT --kill-after=30 $((seconds + 120)) \
    "$target" "$work" -max_total_time="$seconds" -timeout=25 -max_len=4096 -rss_limit_mb=2048 \
    -artifact_prefix=build/fuzz/"$name"- -print_final_stats=1 2> "build/fuzz/$name.log"
}

names=()
pids=()
for target in build/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "fuzz: $name for ${seconds}s"
  run_target "$target" &
  names+=("$name")
  pids+=($!)
done

failed=0
for k in "${!names[@]}"; do
  name=${names[$k]}
  log=build/fuzz/$name.log
  if ! wait "${pids[$k]}"; then
    tail -50 "$log"
    echo "fuzz: $name FAILED (see $log; the input is build/fuzz/$name-crash-* or $name-timeout-*)"
    failed=1
    continue
  fi
  # libFuzzer's "#N INITED" line: N inputs run by then, the corpus replay.
  replayed=$(sed -n 's/^#\([0-9]*\)[[:space:]]*INITED.*/\1/p' "$log" | head -1)
  total=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$log")
  added=$(sed -n 's/^stat::new_units_added:[[:space:]]*//p' "$log")
  echo "  $name: corpus replayed (${replayed:-?} runs), then $(( ${total:-0} - ${replayed:-0} )) new inputs" \
       "run, ${added:-?} of them new coverage"
  echo "fuzz: $name ok"
  if [ "$merge" = "1" ]; then
    before=$(ls tests/fuzz/corpus/"$name" | wc -l)
    "build/fuzz/$name" -merge=1 -max_len=4096 tests/fuzz/corpus/"$name" "build/fuzz/corpus-$name" \
      2> "build/fuzz/$name.merge.log"
    echo "  corpus: $before -> $(ls tests/fuzz/corpus/"$name" | wc -l) inputs in tests/fuzz/corpus/$name"
  fi
done
exit $failed
