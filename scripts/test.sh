#!/usr/bin/env bash
# Installs what is missing, builds the native and web targets, and runs every test:
#   1. native Catch2 unit tests and the CLI contract (ctest)
#   2. the same core tests compiled to wasm, run by node (ctest in build/web)
#   3. the benchmark binaries, natively and in wasm (a short run: they report, they never fail on speed)
#   4. the served page end to end in headless Chromium (playwright-core, node's test runner)
#   5. the desktop app under Xvfb: renders frames, writes a screenshot, exits 0
#   6. every libFuzzer target for a short, bounded time (scripts/fuzz.sh runs them longer)
#   7. the calibration harness's unit tests (tools/calibrate; no GPU or torch needed) and the validation report
# Screenshots land in build/screenshots. Ends with one line "test.sh: N passed, M failed".
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
"$here/scripts/deps.sh" || { echo "test.sh: installing dependencies failed"; echo "0 passed, 1 failed"; exit 1; }
"$here/scripts/build.sh" all || { echo "test.sh: the build failed"; echo "0 passed, 1 failed"; exit 1; }

passed=0; failed=0; failures=()
suite() {  # suite NAME COMMAND...
  local name="$1"; shift
  echo; echo "=== $name"
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); failures+=("$name"); fi
}
shots="$here/build/screenshots"; mkdir -p "$shots"
export NODE_PATH="$here/build/node/node_modules"

suite "native unit tests (ctest)" ctest --test-dir build/native --output-on-failure -j 2
suite "wasm core tests (node)" ctest --test-dir build/web --output-on-failure
suite "benchmark, native" build/native/memsim_bench --benchmark-samples 3 --benchmark-no-analysis
suite "benchmark, wasm (node)" node --no-experimental-fetch build/web/memsim_bench.js --benchmark-samples 3 --benchmark-no-analysis
suite "page end to end (Chromium)" env MEMSIM_SITE=build/web/site MEMSIM_CLI=build/native/memsim-cli \
  MEMSIM_SCREENSHOTS="$shots" node --test tests/e2e/
suite "desktop app under Xvfb" bash tests/desktop/smoke.sh build/native "$shots"
suite "fuzz targets, 10 s each (clang, ASan + UBSan)" bash scripts/fuzz.sh "${MEMSIM_FUZZ_SECONDS:-10}"
suite "calibration harness: config translation (no GPU, no torch)" \
  python3 -m unittest discover -s tools/calibrate -p 'test_*.py'
suite "docs/validation.md and the band's residual table are current" bash scripts/validation_report.sh --check

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed suite: %s\n' "${failures[@]}"
echo "test.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
