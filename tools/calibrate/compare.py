#!/usr/bin/env python3
"""Predicted against measured: runs memsim on every result calibrate.py wrote.

    compare.py RESULTS.jsonl [--cli PATH] [--config-gpu] [--json OUT.json]
               [--emit-cases DIR [--statistic allocated]]

For each measured record, `memsim-cli estimate --config -` runs on its memsim_config (with hardware.gpu set to
the GPU of the run, unless --config-gpu) and every statistic the harness measured is printed next to memsim's:
allocated = max_memory_allocated, reserved = max_memory_reserved, active = peak active bytes, requested = peak
requested bytes, device = NVML used memory minus its reading before the run (memsim: reserved + CUDA context). Then the median absolute error and
the worst case per statistic. Error = (predicted - measured) / measured. The parameter count memsim derives is
checked against the model the harness built.

--emit-cases DIR writes one tests/validation/cases-style file per record (statistic --statistic), so that
`memsim-cli validate DIR` includes the measurements in its report.

Exits 0 whatever the errors are; 2 when the results file or memsim-cli cannot be read.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GIB = float(1 << 30)
STATISTICS = ("allocated", "reserved", "active", "requested", "device")
PEAK_KEY = {"allocated": "allocated_bytes", "reserved": "reserved_bytes", "active": "active_bytes",
            "requested": "requested_bytes", "device": "device_bytes"}


def default_cli():
    return os.path.join(REPO, "build", "native", "memsim-cli")


def run_memsim(cli, config, timeout=120):
    """memsim's result JSON with "ok"; on failure {"ok": False, "error", "peft_unsupported"}."""
    try:
        p = subprocess.run([cli, "estimate", "--config", "-"], input=json.dumps(config), capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"ok": False, "error": f"memsim-cli could not run: {e}", "peft_unsupported": False}
    out = None
    try:
        out = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        out = None
    if p.returncode == 0 and isinstance(out, dict) and out.get("ok"):
        return out
    err = p.stderr.strip()
    if isinstance(out, dict) and out.get("errors"):
        err = "; ".join(e.get("message", "") for e in out["errors"]) or err
    err = "; ".join(line.replace("memsim-cli: ", "") for line in err.splitlines() if "note:" not in line) or \
        f"exit status {p.returncode}"
    return {"ok": False, "error": err, "peft_unsupported": 'unknown section "peft"' in err}


def measured_stats(rec):
    """{statistic: bytes} from a record's measured and also_measured blocks."""
    out = {}
    blocks = [rec.get("measured")] + list((rec.get("also_measured") or {}).values())
    for b in blocks:
        if isinstance(b, dict) and b.get("bytes") is not None:
            out[b.get("statistic", "allocated")] = b["bytes"]
    # NVML's used memory includes what the driver reserves before any process runs (615 MiB on an H200 with driver
    # 580; nvidia-smi leaves it out of "used"), and anything else on the GPU: the run's own share is what memsim
    # predicts, so the reading taken before the run is subtracted.
    base = (rec.get("diagnostics") or {}).get("nvml_baseline_bytes")
    if out.get("device") and isinstance(base, int) and 0 < base < out["device"]:
        out["device"] -= base
    return out


def config_for(rec, config_gpu=False):
    config = copy.deepcopy(rec["memsim_config"])
    # calibrate.py checkpoints with use_reentrant=False always (torch.utils.checkpoint, or HF's
    # gradient_checkpointing_enable with those kwargs), whatever the versions would make the default.
    training = config.setdefault("training", {})
    if training.get("activation_checkpointing", "full") != "none":
        training["checkpoint_reentrant"] = "false"
    gpu = (rec.get("hardware") or {}).get("memsim_gpu")
    if gpu and not config_gpu:
        config.setdefault("hardware", {})["gpu"] = gpu
    return config


def compare_record(rec, cli, config_gpu=False):
    row = {"id": rec.get("id"), "stats": {}, "error": None}
    pred = run_memsim(cli, config_for(rec, config_gpu))
    if not pred.get("ok"):
        row["error"] = pred["error"]
        return row
    d = pred["devices"][0]
    row["phase"] = (d.get("peak_at") or {}).get("phase")
    row["fits"] = d.get("fits")
    row["params_memsim"] = pred.get("params_total")
    row["params_measured"] = (rec.get("model") or {}).get("total_params")
    row["peak_during_setup"] = bool((rec.get("diagnostics") or {}).get("peak_during_setup"))
    for stat, meas in measured_stats(rec).items():
        key = PEAK_KEY.get(stat)
        if key is None or key not in d["peak"] or not meas:
            continue
        p = d["peak"][key]
        row["stats"][stat] = {"measured": meas, "predicted": p, "error": (p - meas) / meas}
    return row


def summarize(rows):
    out = {}
    for stat in STATISTICS:
        errs = [(r["stats"][stat]["error"], r["id"]) for r in rows if stat in r["stats"]]
        if not errs:
            continue
        worst = max(errs, key=lambda e: abs(e[0]))
        out[stat] = {"n": len(errs), "median_abs_error": statistics.median(abs(e) for e, _ in errs),
                     "worst_error": worst[0], "worst_id": worst[1]}
    return out


def print_report(rows, summary, out=sys.stdout):
    w = max([len(r["id"] or "") for r in rows] + [4])
    print(f"{'case':<{w}}  {'statistic':<9}  {'measured':>10}  {'predicted':>10}  {'error':>8}", file=out)
    for r in rows:
        if r["error"]:
            print(f"{r['id']:<{w}}  memsim could not simulate it: {r['error']}", file=out)
            continue
        for stat in STATISTICS:
            s = r["stats"].get(stat)
            if s:
                print(f"{r['id']:<{w}}  {stat:<9}  {s['measured'] / GIB:>6.2f} GiB  {s['predicted'] / GIB:>6.2f} GiB  "
                      f"{100 * s['error']:>+7.1f}%", file=out)
        if r.get("params_measured") and r.get("params_memsim") and r["params_measured"] != r["params_memsim"]:
            print(f"{'':<{w}}  parameters differ: memsim {r['params_memsim']}, built {r['params_measured']}", file=out)
        if r.get("peak_during_setup"):
            print(f"{'':<{w}}  the measured peak was set before the first step (see the record's notes)", file=out)
        if r.get("phase"):
            print(f"{'':<{w}}  memsim's peak: {r['phase']}", file=out)
    print(file=out)
    if not summary:
        print("no comparable results", file=out)
    for stat, s in summary.items():
        print(f"{stat:<9}: {s['n']} cases, median absolute error {100 * s['median_abs_error']:.1f}%, worst "
              f"{100 * s['worst_error']:+.1f}% ({s['worst_id']})", file=out)
    failed = [r for r in rows if r["error"]]
    if failed:
        print(f"{len(failed)} result(s) memsim could not simulate (see above)", file=out)


def emit_case(rec, statistic, directory):
    nbytes = measured_stats(rec).get(statistic)  # device: the run's own share (baseline subtracted)
    if not nbytes:
        return None
    hw = rec.get("hardware") or {}
    v = rec.get("versions") or {}
    config = config_for(rec)
    case = {
        "id": rec["id"],
        "confidence": rec.get("confidence", "high"),
        "statistic": statistic,
        "measured_gib": round(nbytes / GIB, 4),
        "source": f"memsim calibration harness on {hw.get('gpu')} (driver {hw.get('driver')}, torch {v.get('torch')}, "
                  f"transformers {v.get('transformers')}, peft {v.get('peft')}), {rec['source'].get('date')}",
        "notes": rec.get("notes", ""),
        "inferred": {},
        "config": config,
    }
    path = os.path.join(directory, f"{rec['id']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(case, f, indent=2)
        f.write("\n")
    return path


def load_results(path):
    recs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if rec.get("kind") == "measured" and isinstance(rec.get("memsim_config"), dict):
                recs.append(rec)
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("--cli", default=None, help="memsim-cli (default: build/native/memsim-cli in the repository)")
    ap.add_argument("--config-gpu", action="store_true", help="simulate the config's hardware.gpu instead of the "
                    "GPU the run used")
    ap.add_argument("--json", default=None, help="also write the comparison as JSON")
    ap.add_argument("--emit-cases", default=None, metavar="DIR", help="write validation case files into DIR")
    ap.add_argument("--statistic", default="allocated", choices=("allocated", "reserved", "active", "device"))
    a = ap.parse_args(argv)
    cli = a.cli or default_cli()
    try:
        recs = load_results(a.results)
    except (OSError, ValueError) as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    if not os.path.exists(cli):
        print(f"compare.py: memsim-cli not found at {cli} (build it, or pass --cli)", file=sys.stderr)
        return 2
    rows = [compare_record(r, cli, a.config_gpu) for r in recs]
    summary = summarize(rows)
    print_report(rows, summary)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=2)
    if a.emit_cases:
        os.makedirs(a.emit_cases, exist_ok=True)
        n = sum(1 for r in recs if emit_case(r, a.statistic, a.emit_cases))
        print(f"wrote {n} case file(s) ({a.statistic}) to {a.emit_cases}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
