#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer) and runs each one.
#   scripts/fuzz.sh [seconds per target]   (default 60; scripts/test.sh runs a short bounded pass)
# Targets: fragment (URL links), config_json (memsim JSON), hf_config (Hugging Face config.json), deepspeed
# (DeepSpeed config JSON), accelerate (Accelerate config, YAML or JSON), set (--set), lengths_file (a dropped file
# of sample lengths).
# Seeds: tests/fuzz/corpus/<target>; a dictionary tests/fuzz/<target>.dict is used when present. New inputs go to
# build/fuzz/corpus/<target>; a crash is written to
# build/fuzz/crashes/ and fails the run: fix it and add the input to tests/fuzz/regressions/<target>/.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
out="$here/build/fuzz"
mkdir -p "$out/obj" "$out/crashes"
CXX="${MEMSIM_FUZZ_CXX:-clang++-14}"
command -v "$CXX" >/dev/null || CXX=clang++
# MEMSIM_THREADS as in the native build, so that the sanitizers also see pipeline stages simulated on threads.
flags=(-std=c++20 -O1 -g -pthread -DMEMSIM_THREADS=1 -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -I"$here/src")
# Every core source but those that need the build's generated model catalogue (catalog, and advice and validation,
# which use it): a new core file is fuzzed without a list to keep in step.
core=()
for f in "$here"/src/core/*.cpp; do
  f="$(basename "$f" .cpp)"
  case "$f" in catalog|advice|validation) ;; *) core+=("$f") ;; esac
done
# The uncertainty band's residual table, embedded as CMakeLists.txt embeds it (a raw string of the file).
gen="$out/obj/residuals_data.cpp"
{ printf '#include <string_view>\nnamespace memsim {\nstd::string_view residual_table_file() {\n  return R"memsim_tsv('
  cat "$here/src/core/catalog/residuals.tsv"
  printf ')memsim_tsv";\n}\n}  // namespace memsim\n'; } > "$gen.tmp"
cmp -s "$gen.tmp" "$gen" || mv "$gen.tmp" "$gen"
rm -f "$gen.tmp"
# The frozen data of links (tests/golden/vN.defaults.json, vN.presets.json), embedded as CMakeLists.txt embeds it.
gen_links="$out/obj/link_data.cpp"
{ printf '#include "core/link_data.h"\nnamespace memsim {\nconst std::vector<LinkDataFile>& link_data_files() {\n'
  printf '  static const std::vector<LinkDataFile> files = {\n'
  for f in "$here"/tests/golden/v*.defaults.json "$here"/tests/golden/v*.presets.json; do
    name="$(basename "$f" .json)" schema="${name%%.*}"
    printf '    {%s, "%s", R"memsim_json(' "${schema#v}" "${name#*.}"
    cat "$f"
    printf ')memsim_json"},\n'
  done
  printf '  };\n  return files;\n}\n}  // namespace memsim\n'; } > "$gen_links.tmp"
cmp -s "$gen_links.tmp" "$gen_links" || mv "$gen_links.tmp" "$gen_links"
rm -f "$gen_links.tmp"
objs=()
for src in "${core[@]/#/$here/src/core/}" "$gen" "$gen_links"; do
  src="${src%.cpp}.cpp" obj="$out/obj/$(basename "${src%.cpp}").o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find "$here/src/core" -name '*.h' -newer "$obj" -print -quit)" ]; then
    "$CXX" "${flags[@]}" -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done
status=0
for target in fragment config_json hf_config deepspeed accelerate set lengths_file; do
  define="MEMSIM_FUZZ_$(echo "$target" | tr a-z A-Z)"
  bin="$out/fuzz_$target"
  "$CXX" "${flags[@]}" -fsanitize=fuzzer -D"$define" "$here/tests/fuzz/fuzz_targets.cpp" "${objs[@]}" -o "$bin"
  mkdir -p "$out/corpus/$target"
  seeds=("$here/tests/fuzz/corpus/$target")
  [ -d "$here/tests/fuzz/regressions/$target" ] && seeds+=("$here/tests/fuzz/regressions/$target")
  dict=()
  [ -f "$here/tests/fuzz/$target.dict" ] && dict=(-dict="$here/tests/fuzz/$target.dict")
  echo "fuzz: $target for ${seconds}s"
  if ! "$bin" "$out/corpus/$target" "${seeds[@]}" "${dict[@]}" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
       -rss_limit_mb=2048 -artifact_prefix="$out/crashes/$target-" -print_final_stats=1 2>"$out/$target.log"; then
    echo "fuzz: $target FAILED (see $out/$target.log and $out/crashes/)"; tail -30 "$out/$target.log"; status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$out/$target.log" | tail -2
  fi
done
exit $status
