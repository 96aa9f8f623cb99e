#!/usr/bin/env bash
# Regenerates docs/validation.md: predicted against measured for every case in tests/validation/cases.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -x "$here/build/native/memsim-cli" ] || "$here/scripts/build.sh" native
"$here/build/native/memsim-cli" validate "$here/tests/validation/cases" > "$here/docs/validation.md"
echo "wrote docs/validation.md"
