#!/usr/bin/env bash
# Regenerates docs/validation.md: predicted against measured for every published case in tests/validation/cases,
# then a section per folder of memsim's own calibration runs (tests/validation/measured/<run>/<statistic>/).
#   scripts/validation_report.sh           write docs/validation.md
#   scripts/validation_report.sh --check   exit 1 if docs/validation.md is not what it would write
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
[ -x build/native/memsim-cli ] || scripts/build.sh native
measured=()
for d in tests/validation/measured/*/*/; do
  compgen -G "$d*.json" >/dev/null && measured+=(--measured "${d%/}")  # traces/ holds no case files
done
report() { build/native/memsim-cli validate tests/validation/cases "${measured[@]}"; }
if [ "${1:-}" = "--check" ]; then
  report | diff -q - docs/validation.md >/dev/null || { echo "docs/validation.md is stale: run scripts/validation_report.sh"; exit 1; }
  echo "docs/validation.md is current"
else
  report > docs/validation.md
  echo "wrote docs/validation.md"
fi
