#!/usr/bin/env python3
"""A digest of everything simulate() returns, one line per config, to prove that a refactor changed nothing.

    python3 tools/digest/digest.py build/native/memsim-cli > before.txt
    ... change the core, rebuild ...
    python3 tools/digest/digest.py build/native/memsim-cli > after.txt
    diff before.txt after.txt          # each line that differs names the config whose result changed

The configs are the validation cases (tests/validation/cases), memsim's calibration runs
(tests/validation/measured/*/), and a generated grid: every catalogue preset under a fixed set of variations of
framework, precision, checkpointing, PEFT method and parallel layout (the grid is deterministic). Each config is
run through `memsim-cli estimate --format json --timeline --suggest`, whose output holds the peaks, breakdowns,
timelines and What helps; the line is the config's name, a hash of its own result and a hash of its What helps
(or of the error).

    python3 tools/digest/digest.py --without-band build/native/memsim-cli

hashes the same output without what the uncertainty band adds (src/core/band.h): each device's `band` and
`verdict`, the notes that start with "band:", and each suggestion's `verdict` and `fits` (which follows the verdict).
Its lines equal a digest of a build before the band for every config whose peaks, breakdowns and timelines did not
change.

    python3 tools/digest/digest.py --without-band --drop forward_retained_bytes build/native/memsim-cli

also leaves out device keys a newer build adds (--drop KEY, repeatable), to compare with a build that had none.
"""
import hashlib
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# (name, --set settings) applied to every preset. Chosen to reach each engine: DDP, ZeRO 1-3, FSDP1/2, Megatron
# TP/PP, LoRA/QLoRA/DoRA/IA3, checkpointing modes, offload, expandable segments, old torch switches.
VARIATIONS = [
    ("default", []),
    ("hf-lora-1gpu", ["training.framework=hf_trainer", "peft.method=lora", "parallel.data_parallel_size=1",
                      "parallel.zero_stage=0", "training.micro_batch_size=2", "training.sequence_length=1024",
                      "training.activation_checkpointing=none"]),
    ("hf-qlora-1gpu", ["training.framework=hf_trainer", "peft.method=lora", "peft.base_quantization=nf4",
                       "peft.double_quantization=true", "peft.target_modules=all-linear",
                       "parallel.data_parallel_size=1", "parallel.zero_stage=0", "training.micro_batch_size=4",
                       "training.sequence_length=512", "training.gradient_accumulation_steps=4"]),
    ("torchtune-dora", ["training.framework=torchtune", "peft.method=dora", "parallel.data_parallel_size=1",
                        "parallel.zero_stage=0", "training.sequence_length=512", "training.compile=true"]),
    ("litgpt-fsdp", ["training.framework=litgpt", "parallel.data_parallel_size=4", "parallel.zero_stage=3",
                     "training.precision=bf16_pure", "training.sequence_length=2048",
                     "training.activation_checkpointing=none", "training.micro_batch_size=1"]),
    ("fsdp2-selective", ["training.framework=torchtitan", "parallel.data_parallel_size=8", "parallel.zero_stage=3",
                         "training.activation_checkpointing=selective", "training.micro_batch_size=1",
                         "hardware.gpu=h100-sxm", "hardware.expandable_segments=true"]),
    ("megatron-3d", ["training.framework=megatron", "parallel.data_parallel_size=2", "parallel.tensor_parallel_size=2",
                     "parallel.pipeline_parallel_size=2", "parallel.sequence_parallel=true", "parallel.zero_stage=1",
                     "training.gradient_accumulation_steps=8", "training.micro_batch_size=1"]),
    ("ddp-fp16-old", ["training.framework=hf_trainer", "training.precision=fp16_mixed", "parallel.data_parallel_size=2",
                      "parallel.zero_stage=0", "training.zero_grad_set_to_none=false",
                      "training.softmax_saves_input=true", "training.attention=eager", "training.micro_batch_size=1",
                      "training.sequence_length=512", "training.activation_checkpointing=none"]),
    ("zero3-offload", ["parallel.offload_optimizer=cpu", "parallel.offload_params=cpu", "training.micro_batch_size=1",
                       "training.sequence_length=2048"]),
    ("lora-run", ["training.framework=hf_trainer", "peft.method=lora", "parallel.data_parallel_size=1",
                  "parallel.zero_stage=0", "training.micro_batch_size=2", "training.sequence_length=1024",
                  "training.gradient_accumulation_steps=2", "data.lengths=samples",
                  "data.sample_lengths=p0=16,p50=200,p90=500,p100=1024", "data.steps=40"]),
    ("qlora-run-grouped", ["training.framework=hf_trainer", "peft.method=lora", "peft.base_quantization=nf4",
                           "parallel.data_parallel_size=1", "parallel.zero_stage=0", "training.sequence_length=512",
                           "data.lengths=samples", "data.sample_lengths=0-128:50,128-256:30,256-512:20",
                           "data.group_by_length=true", "data.pad_to_multiple_of=8", "data.steps=30",
                           "training.empty_cache_steps=10"]),
    ("ia3-8bit", ["training.framework=hf_trainer", "peft.method=ia3", "peft.base_quantization=int8",
                  "peft.target_modules=k_proj,v_proj,down_proj",
                  "parallel.data_parallel_size=1", "parallel.zero_stage=0", "training.micro_batch_size=1",
                  "training.sequence_length=512", "training.optimizer=adamw_8bit"]),
]


def presets(cli):
    out = subprocess.run([cli, "presets"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def case_configs():
    dirs = [os.path.join(ROOT, "tests", "validation", "cases")]
    measured = os.path.join(ROOT, "tests", "validation", "measured")
    for d in sorted(os.listdir(measured)):
        for stat in ("allocated", "reserved"):
            p = os.path.join(measured, d, stat)
            if os.path.isdir(p):
                dirs.append(p)
    for d in dirs:
        for f in sorted(os.listdir(d)):
            if f.endswith(".json"):
                with open(os.path.join(d, f)) as fh:
                    case = json.load(fh)
                yield os.path.relpath(os.path.join(d, f), ROOT), ["--config", "-"], json.dumps(case["config"])


def grid(cli):
    for preset, (name, sets) in itertools.product(presets(cli), VARIATIONS):
        args = ["--preset", preset]
        for s in sets:
            args += ["--set", s]
        yield f"{preset}/{name}", args, None


def without_keys(stdout, keys):
    """The estimate's JSON without the device keys named (--drop KEY: an output field a newer build adds, such as
    forward_retained_bytes, so that its digest can be compared with an older build's)."""
    try:
        out = json.loads(stdout)
    except ValueError:
        return stdout
    for dev in out.get("devices", []):
        for k in keys:
            dev.pop(k, None)
    return json.dumps(out, indent=2) + "\n"


def without_band(stdout):
    """The estimate's JSON as a build before the band printed it (see the module's docstring)."""
    try:
        out = json.loads(stdout)
    except ValueError:
        return stdout
    for dev in out.get("devices", []):
        dev.pop("band", None)
        dev.pop("verdict", None)
    if "notes" in out:
        out["notes"] = [n for n in out["notes"] if not n.startswith("band:")]
    for sg in out.get("suggestions", []):
        sg.pop("verdict", None)
        sg.pop("fits", None)
    return json.dumps(out, indent=2) + "\n"


def run(cli, item, strip_band=False, drop=()):
    name, args, stdin = item
    p = subprocess.run([cli, "estimate", *args, "--format", "json", "--timeline", "--suggest"], input=stdin,
                       capture_output=True, text=True)
    stdout = without_band(p.stdout) if strip_band else p.stdout
    if drop:
        stdout = without_keys(stdout, drop)
    # Two hashes: the config's own result, and What helps (whose suggestions simulate other configs, so a change
    # to one mechanism shows there for configs it does not touch).
    try:
        out = json.loads(stdout)
        suggestions = out.pop("suggestions", None)
        own, helps = json.dumps(out, sort_keys=True), json.dumps(suggestions, sort_keys=True)
    except ValueError:
        own, helps = stdout, ""
    h = lambda text: hashlib.sha1((text + "\n" + p.stderr + "\n" + str(p.returncode)).encode()).hexdigest()[:16]
    return f"{name} {h(own)} {h(helps)}"


def main():
    args = sys.argv[1:]
    strip_band = bool(args) and args[0] == "--without-band"
    if strip_band:
        args = args[1:]
    drop = []
    while len(args) >= 2 and args[0] == "--drop":
        drop.append(args[1])
        args = args[2:]
    if len(args) != 1:
        sys.exit(__doc__)
    cli = os.path.abspath(args[0])
    items = list(case_configs()) + list(grid(cli))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for line in pool.map(lambda i: run(cli, i, strip_band, drop), items):
            print(line)


if __name__ == "__main__":
    main()
