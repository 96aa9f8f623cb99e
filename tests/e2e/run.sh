#!/usr/bin/env bash
# Runs the page's end-to-end tests (node's test runner, two files at a time: two Chromiums on CI's two cores take as
# long as three, and their software-rendered frames are slower with three), then runs once more, one at a time, each
# file that had a failure. A file that fails and then passes is printed as FLAKY with its first failures, so that a
# timing-dependent test shows in the log instead of failing CI at random; a file that fails twice fails the suite.
#   tests/e2e/run.sh   (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, MEMSIM_SCREENSHOTS and NODE_PATH)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
log="$(mktemp)"
# The slowest files first (programs.test.mjs about 130 s, page.test.mjs 100 s, keyboard.test.mjs 75 s on CI's two
# cores; the others 5-40 s), so that none of them starts last and runs alone at the end.
slowest=(programs page keyboard)
files=()
for name in "${slowest[@]}"; do files+=("$here/tests/e2e/$name.test.mjs"); done
for f in "$here"/tests/e2e/*.test.mjs; do
  case " ${slowest[*]} " in *" $(basename "$f" .test.mjs) "*) ;; *) files+=("$f") ;; esac
done
node --test --test-concurrency=2 "${files[@]}" | tee "$log"
[ "${PIPESTATUS[0]}" -eq 0 ] && { rm -f "$log"; exit 0; }
# The failed tests' files, from the TAP report's "location: '/path/x.test.mjs:line:column'".
mapfile -t failed < <(grep -oE "location: '[^']+\.test\.mjs" "$log" | sed -E "s/^location: '//" | sort -u)
echo
echo "e2e: failures in ${#failed[@]} file(s); running each again, alone:"
grep -E "^not ok" "$log" | sed 's/^/e2e: first run: /'
rm -f "$log"
[ ${#failed[@]} -eq 0 ] && exit 1
status=0
for file in "${failed[@]}"; do
  if node --test --test-concurrency=1 "$file"; then
    echo "e2e: FLAKY: $(basename "$file") failed with the others running and passed alone"
  else
    echo "e2e: $(basename "$file") failed again"; status=1
  fi
done
exit $status
