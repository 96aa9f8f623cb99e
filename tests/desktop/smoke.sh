#!/usr/bin/env bash
# Desktop smoke test under Xvfb: the native app opens a config file, renders frames, writes a screenshot of
# its own framebuffer and exits 0. The screenshot must not be blank. The charts must have been drawn by the GL
# chart renderer (its shaders compiled under GL 3.3 core), and the timeline's blue must cover part of the chart;
# a second run opens the Fit explorer, so the heatmap's shaders draw too; a third opens a run of varying lengths in the
# Run view.
#   tests/desktop/smoke.sh BUILD_DIR OUT_DIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$here/build/native}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
cfg="$out/desktop-config.json"
"$build/memsim-cli" config --hf-config "$here/tests/data/hf/llama-3-8b.json" --set hardware.gpu=h100-sxm > "$cfg"

run() {  # run NAME ARGS...: renders, converts the screenshot to NAME.png, prints the app's output
  local name="$1"; shift
  timeout 120 xvfb-run -a -s "-screen 0 1280x800x24" "$build/memsim" "$cfg" "$@" --screenshot "$out/$name.ppm" \
    | tee "$out/$name.log"
  convert "$out/$name.ppm" "$out/$name.png"
}
draws() {  # draws LOG KIND: how many charts of KIND the GL renderer drew
  sed -n "s/.*charts drawn by the GL renderer:.*$2 \([0-9]*\).*/\1/p" "$1"
}

run desktop --frames 30
colors=$(identify -format '%k' "$out/desktop.png")
echo "desktop smoke: screenshot $out/desktop.png with $colors distinct colours"
[ "$colors" -gt 50 ]
grep -q "^memsim: charts: GL 3.3 core renderer" "$out/desktop.log" || { echo "desktop smoke: the GL chart renderer was not used"; exit 1; }
[ "$(draws "$out/desktop.log" timeline)" -gt 0 ] || { echo "desktop smoke: the timeline was not drawn by the GL renderer"; exit 1; }
# Share of blue (allocated memory) in a band along the bottom of the timeline chart (above its two legend lines and
# the status line), from ImageMagick's
# histogram of that region (lines like "  123: (76,150,230) #4C96E6 srgb(...)").
blue=$(convert "$out/desktop.png" -crop 700x20+530+700 +repage -format %c histogram:info:- |
  awk -F'[:(,)]' '{ n = $1 + 0; all += n; if ($5 > $3 + 80 && $5 > 150) hit += n } END { printf "%d", 100 * hit / all }')
echo "desktop smoke: the allocated memory's blue covers $blue% of the bottom of the timeline"
[ "$blue" -gt 50 ]

run desktop-explorer --frames 40 --view explorer
[ "$(draws "$out/desktop-explorer.log" heatmap)" -gt 0 ] || { echo "desktop smoke: the heatmap was not drawn by the GL renderer"; exit 1; }
# The top-left cell (micro-batch 1, sequence 512) fits: green.
green=$(convert "$out/desktop-explorer.png" -crop 100x16+552+118 +repage -format %c histogram:info:- |
  awk -F'[:(,)]' '{ n = $1 + 0; all += n; if ($4 > $3 + 80 && $4 > $5 + 80) hit += n } END { printf "%d", 100 * hit / all }')
echo "desktop smoke: the heatmap's first cell is $green% green ($out/desktop-explorer.png)"
[ "$green" -gt 50 ]

# A run of sample lengths, filled in over the frames, in the timeline's Run view: its steps' tokens (orange) fill
# the bottom of the lower chart (above the status line).
"$build/memsim-cli" config --preset llama-3.2-1b --set parallel.zero_stage=0 --set parallel.data_parallel_size=1 \
  --set data.lengths=samples --set 'data.sample_lengths=p0=20,p50=300,p99=1500,p100=2048' --set data.steps=300 > "$out/run-config.json"
cfg="$out/run-config.json"
run desktop-run --frames 200 --view run
orange=$(convert "$out/desktop-run.png" -crop 700x12+530+726 +repage -format %c histogram:info:- |
  awk -F'[:(,)]' '{ n = $1 + 0; all += n; if ($3 > 180 && $4 > 100 && $5 < 110) hit += n } END { printf "%d", 100 * hit / all }')
echo "desktop smoke: the run's tokens' orange covers $orange% of the bottom of the Run view ($out/desktop-run.png)"
[ "$orange" -gt 30 ]
