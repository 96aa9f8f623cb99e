#!/usr/bin/env bash
# Builds the native targets (CLI, desktop app, tests, benchmark) and the web targets (page, wasm tests,
# wasm benchmark). Assumes scripts/deps.sh has run.
#   scripts/build.sh [native|web|all]   (default all)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
what="${1:-all}"
jobs="$(nproc 2>/dev/null || echo 2)"
imgui="${MEMSIM_IMGUI_DIR:-$here/build/deps/imgui-1.86}"

if [ "$what" = native ] || [ "$what" = all ]; then
  cmake -S "$here" -B "$here/build/native" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMSIM_IMGUI_DIR="$imgui" >/dev/null
  cmake --build "$here/build/native" -j "$jobs"
fi

if [ "$what" = web ] || [ "$what" = all ]; then
  # Emscripten 3.1.6 with Node 20 (TOOLCHAIN.md): the JS optimizer needs Debian's acorn, and node's own fetch
  # breaks the 3.1.6 loader, so the crossing emulator turns it off.
  export NODE_PATH=/usr/share/nodejs
  emcmake cmake -S "$here" -B "$here/build/web" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEMSIM_IMGUI_DIR="$imgui" \
    -DCMAKE_CROSSCOMPILING_EMULATOR="node;--no-experimental-fetch" >/dev/null
  cmake --build "$here/build/web" -j "$jobs"
fi
