#!/usr/bin/env bash
# Fuzz smoke for `make test`: build the libFuzzer targets with clang and run
# each for FUZZ_SECONDS, starting from the checked-in corpus (which the plain
# ctest run also replays). Installs clang from Debian's packages when it is
# missing and we are root; otherwise says so and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
cmake=${CMAKE:-cmake}
ninja=${NINJA:-ninja}
if [ "$seconds" = "0" ]; then
  echo "fuzz: FUZZ_SECONDS=0, skipped"
  exit 0
fi
if ! command -v clang >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing clang (Debian package) for libFuzzer"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null; }
  else
    echo "fuzz: clang not found and cannot install it here: libFuzzer run skipped" \
         "(the corpus was replayed by ctest). Install clang to fuzz."
    exit 0
  fi
fi
CC=clang "$cmake" -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
  -DOPT4_BUILD_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
"$cmake" --build build/fuzz >/dev/null
for target in build/fuzz/fuzz_*; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  work=build/fuzz/corpus-$name
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$name"/* "$work"/
  echo "fuzz: $name for ${seconds}s"
  "$target" "$work" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 \
    -artifact_prefix=build/fuzz/ -print_final_stats=1 2> "build/fuzz/$name.log" \
    || { tail -50 "build/fuzz/$name.log"; echo "fuzz: $name FAILED (see build/fuzz/$name.log; the input is build/fuzz/crash-*)"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::new_units_added" "build/fuzz/$name.log" | sed 's/^/  /'
done
