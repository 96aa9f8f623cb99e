#!/usr/bin/env bash
# Installs what is missing, builds the native and web targets, and runs every test:
#   1. native Catch2 unit tests and the CLI contract (ctest)
#   2. the same core tests compiled to wasm, run by node (ctest in build/web)
#   3. the benchmark binaries, natively and in wasm (a short run: they report, they never fail on speed)
#   4. the served page end to end in headless Chromium (playwright-core, node's test runner), two files at a time;
#      a file with a failure runs once more alone, and passing then is printed as FLAKY (tests/e2e/run.sh)
#   5. the desktop app under Xvfb: renders frames, writes a screenshot, exits 0
#   6. the core's unit tests and the CLI contract under ASan + UBSan, the threaded stage simulation under TSan
#      (scripts/sanitize.sh), then every libFuzzer target of the same ASan build for a short, bounded time
#      (scripts/fuzz.sh runs them longer)
#   7. the calibration harness's unit tests (tools/calibrate; no GPU or torch needed), its model programs on the CPU with
#      Debian's torch (their forward's saved set against memsim's), and the validation report
# Screenshots land in build/screenshots. Prints the seconds of each suite; ends with one line
# "test.sh: N passed, M failed, in S s".
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
"$here/scripts/deps.sh" || { echo "test.sh: installing dependencies failed"; echo "0 passed, 1 failed"; exit 1; }
echo "test.sh: dependencies took ${SECONDS} s"; start=$SECONDS
"$here/scripts/build.sh" all || { echo "test.sh: the build failed"; echo "0 passed, 1 failed"; exit 1; }
echo "test.sh: the native and web builds took $((SECONDS - start)) s"

passed=0; failed=0; failures=()
suite() {  # suite NAME COMMAND...
  local name="$1"; shift
  echo; echo "=== $name"
  local start=$SECONDS
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
  echo "=== $name: $((SECONDS - start)) s"  # where CI's time goes (the budget is 20 minutes on 2 cores)
}
shots="$here/build/screenshots"; mkdir -p "$shots"
export NODE_PATH="$here/build/node/node_modules"

# The property tests (tests/property, rapidcheck) are part of ctest; a build without rapidcheck would skip them.
[ -x build/native/memsim_property_tests ] || { echo "test.sh: build/native/memsim_property_tests is missing (librapidcheck-dev)"; failed=$((failed + 1)); failures+=("property tests not built"); }
suite "native unit tests and property tests (ctest)" ctest --test-dir build/native --output-on-failure -j 2
suite "wasm core tests (node)" ctest --test-dir build/web --output-on-failure
suite "benchmark, native" build/native/memsim_bench --benchmark-samples 3 --benchmark-no-analysis
suite "benchmark, wasm (node)" node --no-experimental-fetch build/web/memsim_bench.js --benchmark-samples 3 --benchmark-no-analysis
suite "page end to end (Chromium)" env MEMSIM_SITE=build/web/site MEMSIM_CLI=build/native/memsim-cli \
  MEMSIM_SCREENSHOTS="$shots" bash tests/e2e/run.sh
suite "desktop app under Xvfb" bash tests/desktop/smoke.sh build/native "$shots"
suite "sanitizers: unit tests and CLI under ASan + UBSan, stage threads under TSan" bash scripts/sanitize.sh all
suite "fuzz targets, 6 s each (clang, ASan + UBSan)" bash scripts/fuzz.sh "${MEMSIM_FUZZ_SECONDS:-6}"
suite "calibration harness: config translation (no GPU, no torch)" \
  python3 -m unittest discover -s tools/calibrate -p 'test_*.py'
# Debian's torch is importable only from /usr/bin/python3 (python3 on PATH may be another interpreter without it)
suite "calibration harness on the CPU: model programs against torch's autograd graph (Debian torch)" \
  env OMP_NUM_THREADS=2 /usr/bin/python3 -m unittest tools/calibrate/check_programs_torch.py
suite "docs/validation.md and the band's residual table are current" bash scripts/validation_report.sh --check
suite "generated model programs are current (tools/programs)" \
  bash -c 'python3 tools/programs/sd_unet.py --check && python3 tools/programs/flux.py --check && python3 tools/programs/sd3.py --check && python3 tools/programs/whisper.py --check && python3 tools/programs/mamba2.py --check && python3 tools/programs/nemotron_h.py --check && python3 tools/programs/bamba.py --check'

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed suite: %s\n' "${failures[@]}"
echo "test.sh: $passed passed, $failed failed, in ${SECONDS} s"
[ "$failed" -eq 0 ]
