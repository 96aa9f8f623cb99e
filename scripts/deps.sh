#!/usr/bin/env bash
# Installs what memsim needs from Debian's packages, only what is missing, then fetches the
# Dear ImGui sources (Debian source package `imgui`, checked against its signed .dsc by apt)
# into build/deps. Idempotent: a second run does nothing but checks.
#   scripts/deps.sh            everything (build + tests)
#   scripts/deps.sh --build    only what building the web page and the desktop app needs
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-all}"

pkgs=(cmake ninja-build g++ emscripten libglfw3-dev nlohmann-json3-dev catch2 libimgui-dev fonts-dejavu-core python3 xz-utils)
if [ "$mode" != "--build" ]; then
  # test tooling: browser, X server for the desktop smoke test, screenshots, fuzzing and sanitizers, rapidcheck for
  # the property tests, npm for playwright-core, jsonschema to check docs/config.schema.json (tests/cli/schema_check.py),
  # PyYAML to check the YAML reader (tests/yaml/yaml_differential.py), torch and torchvision (1.13 and 0.14, CPU) for the
  # calibration harness's model programs against torch's autograd graph (tools/calibrate/check_programs_torch.py)
  pkgs+=(chromium xvfb xauth imagemagick clang libclang-rt-14-dev librapidcheck-dev nodejs npm python3-jsonschema python3-yaml
         python3-torch python3-torchvision)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm from Debian conflicts with a nodesource node that already ships npm; accept any working npm.
if command -v npm >/dev/null 2>&1; then
  tmp=(); for p in "${missing[@]}"; do [ "$p" = npm ] || [ "$p" = nodejs ] || tmp+=("$p"); done; missing=("${tmp[@]+"${tmp[@]}"}")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Dear ImGui core sources (the -dev package ships headers only). MEMSIM_IMGUI_DIR overrides.
if [ -z "${MEMSIM_IMGUI_DIR:-}" ]; then
  D="$here/build/deps"
  if [ ! -f "$D/imgui-1.86/imgui.cpp" ]; then
    mkdir -p "$D/lists/partial"
    URI=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$URI" ] || URI=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$URI" ] || URI=http://deb.debian.org/debian
    printf 'Types: deb-src\nURIs: %s\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$URI" > "$D/src.sources"
    O="-o Dir::Etc::sourcelist=$D/src.sources -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$D/lists"
    apt-get $O update -qq
    (cd "$D" && apt-get $O source --download-only imgui >/dev/null)
    tar xf "$D"/imgui_1.86+ds.orig.tar.xz -C "$D"
  fi
fi

# playwright-core for the end-to-end test (never `playwright install`: the system chromium is used).
if [ "$mode" != "--build" ] && [ ! -d "$here/build/node/node_modules/playwright-core" ]; then
  mkdir -p "$here/build/node"
  (cd "$here/build/node" && npm install --silent --no-audit --no-fund --prefix . playwright-core@1 >/dev/null)
fi
echo "deps: ok"
