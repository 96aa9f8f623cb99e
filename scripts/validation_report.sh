#!/usr/bin/env bash
# Regenerates docs/validation.md: predicted against measured for every published case in tests/validation/cases,
# then a section per folder of memsim's own calibration runs (tests/validation/measured/<run>/<statistic>/); and
# src/core/catalog/residuals.tsv, the published cases' errors that the uncertainty band is made of (src/core/band.h),
# which the build embeds.
#   scripts/validation_report.sh           write docs/validation.md and src/core/catalog/residuals.tsv
#   scripts/validation_report.sh --check   exit 1 if either is not what it would write
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
[ -x build/native/memsim-cli ] || scripts/build.sh native
measured=()
for d in tests/validation/measured/*/*/; do
  compgen -G "$d*.json" >/dev/null && measured+=(--measured "${d%/}")  # traces/ holds no case files
done
report() { build/native/memsim-cli validate tests/validation/cases "${measured[@]}" --residuals "$1"; }
if [ "${1:-}" = "--check" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  report "$tmp/residuals.tsv" > "$tmp/validation.md"
  stale=0
  diff -q "$tmp/validation.md" docs/validation.md >/dev/null || { echo "docs/validation.md is stale: run scripts/validation_report.sh"; stale=1; }
  diff -q "$tmp/residuals.tsv" src/core/catalog/residuals.tsv >/dev/null ||
    { echo "src/core/catalog/residuals.tsv is stale: run scripts/validation_report.sh, then rebuild"; stale=1; }
  [ "$stale" = 0 ] || exit 1
  echo "docs/validation.md and src/core/catalog/residuals.tsv are current"
else
  report src/core/catalog/residuals.tsv > docs/validation.md
  echo "wrote docs/validation.md and src/core/catalog/residuals.tsv (rebuild to embed the table)"
fi
