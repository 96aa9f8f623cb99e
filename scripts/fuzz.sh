#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer) and runs each one, as many at
# once as the machine has cores.
#   scripts/fuzz.sh [seconds per target]   (default 60; scripts/test.sh runs a short bounded pass)
# Targets: fragment (URL links), config_json (memsim JSON), hf_config (Hugging Face config.json), deepspeed
# (DeepSpeed config JSON), accelerate (Accelerate config, YAML or JSON), set (--set), lengths_file (a dropped file
# of sample lengths), architecture (a model program, --architecture FILE).
# Seeds: tests/fuzz/corpus/<target>; a dictionary tests/fuzz/<target>.dict is used when present. New inputs go to
# build/fuzz/corpus/<target>; a crash is written to
# build/fuzz/crashes/ and fails the run: fix it and add the input to tests/fuzz/regressions/<target>/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
out="$here/build/fuzz"
mkdir -p "$out/crashes"
# The targets live in the sanitized build that scripts/sanitize.sh uses too (CMakeLists.txt, MEMSIM_SANITIZE=address:
# clang, ASan + UBSan, libFuzzer's coverage), so the core is compiled with the sanitizers once for both.
CXX="${MEMSIM_FUZZ_CXX:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++
targets=(fragment config_json hf_config deepspeed accelerate set lengths_file architecture)
cmake -S "$here" -B "$here/build/asan" -G Ninja -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Debug \
  -DMEMSIM_BUILD_APP=OFF -DMEMSIM_SANITIZE=address >/dev/null
cmake --build "$here/build/asan" -j "$(nproc 2>/dev/null || echo 2)" --target "${targets[@]/#/fuzz_}"
status=0
fuzz_one() {  # fuzz_one TARGET: runs it for $seconds; its result lines go to build/fuzz/TARGET.out
  local target="$1" bin="$here/build/asan/fuzz_$1"
  mkdir -p "$out/corpus/$target"
  local seeds=("$here/tests/fuzz/corpus/$target")
  [ -d "$here/tests/fuzz/regressions/$target" ] && seeds+=("$here/tests/fuzz/regressions/$target")
  local dict=()
  [ -f "$here/tests/fuzz/$target.dict" ] && dict=(-dict="$here/tests/fuzz/$target.dict")
  { echo "fuzz: $target for ${seconds}s"
    if ! "$bin" "$out/corpus/$target" "${seeds[@]}" "${dict[@]}" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
         -rss_limit_mb=2048 -artifact_prefix="$out/crashes/$target-" -print_final_stats=1 2>"$out/$target.log"; then
      echo "fuzz: $target FAILED (see $out/$target.log and $out/crashes/)"; tail -30 "$out/$target.log"; return 1
    else
      grep -E "stat::number_of_executed_units|cov:" "$out/$target.log" | tail -2 || true
    fi; } >"$out/$target.out"
}
# One target per core at a time: each fuzzer is one process on one core.
width="$(nproc 2>/dev/null || echo 2)"
for ((i = 0; i < ${#targets[@]}; i += width)); do
  pids=()
  for target in "${targets[@]:i:width}"; do fuzz_one "$target" & pids+=($!); done
  for ((k = 0; k < ${#pids[@]}; ++k)); do
    wait "${pids[k]}" || status=1
    cat "$out/${targets[i + k]}.out"
  done
done
exit $status
