#!/usr/bin/env bash
# Runs a sweep on one GPU in one go: library versions first, then the first config alone as a smoke gate (a
# mismatch between the harness and the installed torch/transformers then fails once, in seconds, instead of once
# per config), then the rest. Results are appended config by config, so a run cut short keeps what it measured.
#
#   tools/calibrate/run_sweep.sh OUTDIR [SWEEP.json] [extra calibrate.py args...]
#
# OUTDIR gets env.txt, results.jsonl and results.failed.jsonl. PER_CONFIG_TIMEOUT (s, default 150) bounds each config.
set -u
out=${1:?usage: run_sweep.sh OUTDIR [SWEEP.json] [calibrate.py args]}
here=$(cd "$(dirname "$0")" && pwd)
sweep=${2:-$here/sweep.json}
shift $(( $# >= 2 ? 2 : 1 ))
mkdir -p "$out"
export PYTHONUNBUFFERED=1

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  python3 - <<'EOF' 2>&1
import importlib.metadata as md, platform
print("python", platform.python_version())
for p in ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "liger-kernel", "flash-attn", "nvidia-ml-py"):
    try:
        print(p, md.version(p))
    except Exception:
        print(p, "absent")
import torch
print("cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
EOF
} | tee "$out/env.txt"

ids=$(python3 -c "import sys; sys.path.insert(0, '$here'); import translate as tr; \
print(','.join(tr.unwrap(i)[0] for i in tr.load_items('$sweep')))") || exit 2
first=${ids%%,*}
rest=${ids#*,}
t=${PER_CONFIG_TIMEOUT:-150}

python3 "$here/calibrate.py" "$sweep" --only "$first" --out "$out/results.jsonl" --timeout "$t" "$@"
if [ $? -ne 0 ] && ! [ -s "$out/results.jsonl" ]; then
  echo "smoke config $first failed; not running the rest:"
  cat "$out/results.failed.jsonl" 2>/dev/null
  exit 1
fi
[ "$rest" = "$ids" ] && exit 0  # a sweep of one config
python3 "$here/calibrate.py" "$sweep" --only "$rest" --out "$out/results.jsonl" --timeout "$t" "$@"
