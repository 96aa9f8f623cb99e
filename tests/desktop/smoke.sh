#!/usr/bin/env bash
# Desktop smoke test under Xvfb: the native app opens a config file, renders frames, writes a screenshot of
# its own framebuffer and exits 0. The screenshot must not be blank.
#   tests/desktop/smoke.sh BUILD_DIR OUT_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$here/build/native}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
cfg="$out/desktop-config.json"
"$build/memsim-cli" config --hf-config "$here/tests/data/hf/llama-3-8b.json" --set hardware.gpu=h100-sxm > "$cfg"
timeout 120 xvfb-run -a -s "-screen 0 1280x800x24" "$build/memsim" "$cfg" --frames 30 --screenshot "$out/desktop.ppm"
convert "$out/desktop.ppm" "$out/desktop.png"
colors=$(identify -format '%k' "$out/desktop.png")
echo "desktop smoke: screenshot $out/desktop.png with $colors distinct colours"
[ "$colors" -gt 50 ]
