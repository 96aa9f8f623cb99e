#!/usr/bin/env bash
# Builds the core's tests under clang's sanitizers and runs them (scripts/test.sh runs both stages):
#   scripts/sanitize.sh [address|thread|all]   (default all)
#   address: AddressSanitizer + UndefinedBehaviorSanitizer (build/asan): every core unit test once, in one process,
#            and the CLI contract test with the sanitized CLI. The same build holds the libFuzzer targets
#            (scripts/fuzz.sh), so the core is compiled with the sanitizers once.
#   thread:  ThreadSanitizer (build/tsan): tests/threads, layouts of several distinct devices (pipeline stages),
#            which simulate.cpp replays on threads (for_each_index); one test file, so that the stage costs a build
#            of the core and little more.
# A finding stops the test that made it (-fno-sanitize-recover, halt_on_error) and fails the stage.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-all}"
jobs="$(nproc 2>/dev/null || echo 2)"
CXX="${MEMSIM_SANITIZE_CXX:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++

configure() {  # configure KIND DIR COMPILER
  cmake -S "$here" -B "$2" -G Ninja -DCMAKE_CXX_COMPILER="$3" -DCMAKE_BUILD_TYPE=Debug -DMEMSIM_BUILD_APP=OFF \
    -DMEMSIM_SANITIZE="$1" >/dev/null
}

status=0
log="$here/build/sanitize.log"
mkdir -p "$here/build"
run() {  # run COMMAND...: its last line when it passes, its last 60 lines when it fails
  if "$@" >"$log" 2>&1; then tail -2 "$log"; else tail -60 "$log"; status=1; fi
}
run_all() {  # run_all COMMAND_STRING...: the commands at once (the machine's cores share them), then each one's tail
  local pids=() i=0 r
  for c in "$@"; do i=$((i + 1)); bash -c "$c" >"$log.$i" 2>&1 & pids+=($!); done
  i=0
  for p in "${pids[@]}"; do
    i=$((i + 1)); r=0; wait "$p" || r=$?
    if [ $r -eq 0 ]; then tail -2 "$log.$i"; else tail -60 "$log.$i"; status=1; fi
  done
}
if [ "$what" = address ] || [ "$what" = all ]; then
  configure address "$here/build/asan" "$CXX"
  cmake --build "$here/build/asan" -j "$jobs" --target memsim_tests memsim-cli
  # Every unit test, the published cases once: the [validation] summaries replay every case whole (many times the
  # native 25 s under ASan), and "every validation case parses and simulates" runs the same code over all of them,
  # their runs cut short; the summaries are checked by the native run. Then the CLI contract with the sanitized CLI,
  # without its validate (the same replay of every case whole). One after the other they took 125 s on
  # one core of two (the all-cases test 31 s, test_properties' 1,500 random configs 18 s, the CLI contract 41 s), so
  # they run as three processes at once: the unit tests split by file (-#: Catch2's file-name tags), and the contract.
  echo "sanitize: the core's unit tests (two processes) and the CLI contract under ASan + UBSan"
  first_tests="every validation case parses and simulates,[#test_validation]~[validation],[#test_links],[#test_attention_mask],[#test_catalog],[#test_lengths_file],[#test_simulate]"
  other_tests="~[validation]~[#test_validation]~[#test_links]~[#test_attention_mask]~[#test_catalog]~[#test_lengths_file]~[#test_simulate]"
  asan_env="ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1 UBSAN_OPTIONS=print_stacktrace=1"
  tests="$here/build/asan/memsim_tests -# --reporter compact"
  run_all "env $asan_env $tests '$first_tests'" "env $asan_env $tests '$other_tests'" \
    "env MEMSIM_CLI='$here/build/asan/memsim-cli' MEMSIM_CONTRACT_SKIP_VALIDATE=1 ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 bash '$here/tests/cli/cli_contract.sh'"
fi
if [ "$what" = thread ] || [ "$what" = all ]; then
  # GCC's ThreadSanitizer (libtsan2): clang 14's runtime stops on an internal CHECK in its allocator
  # (sanitizer_allocator_secondary.h:297) while freeing a static string, before any thread starts.
  configure thread "$here/build/tsan" "${MEMSIM_TSAN_CXX:-g++}"
  cmake --build "$here/build/tsan" -j "$jobs" --target memsim_thread_tests
  echo "sanitize: several devices simulated on threads, under TSan"
  run env TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" "$here/build/tsan/memsim_thread_tests" --reporter compact
fi
exit $status
