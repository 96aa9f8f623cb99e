#!/usr/bin/env python3
"""Measure the peak GPU memory of a few training steps for memsim configs (issue 9's calibration harness).

    calibrate.py CONFIGS [--out results.jsonl] [--failed failed.jsonl] [--steps 3] [--only ID[,ID]]
                 [--in-process] [--timeout S]
    calibrate.py CONFIGS --dry-run [--cli build/native/memsim-cli]

CONFIGS is one memsim config (JSON), a JSON list of them, {"configs": [...]} (sweep.json), or JSONL; each item may
be a bare config or a wrapper {"id", "config", ...} such as tests/validation/cases/*.json.

For each config the harness builds the model from the config's Hugging Face fields with random weights (nothing is
downloaded), applies the precision recipe, optimizer, checkpointing, loss and PEFT settings (translate.py says
exactly how), runs `--steps` training steps on random token batches, and writes one JSON line in the format of
../shared/validation/cases.jsonl with the peaks of torch.cuda.max_memory_allocated, max_memory_reserved,
memory_stats()["active_bytes.all.peak"] and ["requested_bytes.all.peak"], and NVML used memory. Peak statistics
are never reset: the peak covers the whole run, model creation included, which is what memsim predicts.

Each config runs in a fresh Python process (unless --in-process) so that peaks, the caching allocator and the
CUDA context do not carry over. --dry-run translates only (no torch needed) and, where memsim-cli is built, prints
memsim's prediction next to the harness's plan.

torch is imported only inside the functions that need it, so translate.py and this file's pure helpers are
unit-tested on machines without torch (test_calibrate.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import programs  # noqa: E402  (torch-free at import, as translate.py)
import translate as tr  # noqa: E402

GIB = float(1 << 30)
MIB = 1 << 20

QUANTITIES = {
    "allocated": "torch.cuda.max_memory_allocated() over the whole run (model creation and every step; peak "
                 "statistics never reset)",
    "reserved": "torch.cuda.max_memory_reserved() over the whole run (peak statistics never reset)",
    "active": "torch.cuda.memory_stats()['active_bytes.all.peak'] over the whole run (peak statistics never reset)",
    "requested": "torch.cuda.memory_stats()['requested_bytes.all.peak'] over the whole run: bytes asked for, "
                 "before the allocator rounds them up",
    "device": "NVML used memory of the whole GPU (the CUDA context, the caching allocator's segments, and anything "
              "else on the GPU, with the memory the driver reserves, which nvidia-smi leaves out of its used figure), "
              "the highest value sampled during the run; diagnostics.nvml_baseline_bytes is the reading before the "
              "run, which compare.py subtracts",
}


class HarnessError(Exception):
    """The run could not be done as the config says; `field` names the setting involved."""

    def __init__(self, field, message):
        self.field = field
        super().__init__(f"{field}: {message}")


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers (no torch): records, NVML text parsing
# ---------------------------------------------------------------------------------------------------------------

def stat_block(statistic, nbytes, quantity=None):
    if nbytes is None:
        return None
    gib = nbytes / GIB
    return {"statistic": statistic, "value": round(gib, 3), "unit": "GiB", "bytes": int(nbytes),
            "gib": round(gib, 4), "quantity": quantity or QUANTITIES[statistic], "per_gpu": True}


def parse_nvidia_smi_used(text):
    """First number of `nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits` in bytes (MiB units)."""
    for line in text.splitlines():
        line = line.strip()
        if re.fullmatch(r"\d+(\.\d+)?", line):
            return int(float(line) * MIB)
    return None


def nvml_device_selector(env=None):
    """What CUDA device 0 is for NVML: an index or a UUID from CUDA_VISIBLE_DEVICES, else index 0."""
    env = os.environ if env is None else env
    vis = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not vis:
        return 0
    if vis.isdigit():
        return int(vis)
    return vis  # GPU-... or MIG-... UUID


MEMSIM_GPU_BY_NAME = [
    # substring of torch.cuda.get_device_name (lower case), memsim hardware.gpu id
    ("h200", "h200"), ("gb200", "gb200"), ("b200", "b200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"),
    ("a100-sxm4-40gb", "a100-40gb"), ("a100-pcie-40gb", "a100-40gb"), ("a100", "a100-80gb"), ("l40s", "l40s"),
    ("l4", "l4"), ("a10g", "a10g"), ("t4", "t4"), ("v100-sxm2-16gb", "v100-16gb"), ("v100", "v100-32gb"),
    ("rtx 6000 ada", "rtx-6000-ada"), ("rtx a6000", "rtx-a6000"), ("4090", "rtx-4090"), ("3090", "rtx-3090"),
    ("5090", "rtx-5090"),
]


def memsim_gpu_for(name, total_bytes=None):
    n = (name or "").lower()
    for key, gid in MEMSIM_GPU_BY_NAME:
        if key in n:
            if gid == "a100-80gb" and total_bytes and total_bytes < 60 * (1 << 30):
                return "a100-40gb"
            return gid
    return None


def _lm_parts(plan, meas):
    """A language model's model, training and harness blocks of the record."""
    em = plan["effective_model"]
    peft = plan["peft"]
    b = plan["batch"]
    opt = plan["optimizer"]
    peft_block = None
    if peft:
        q = peft["quantization"]
        peft_block = {"method": "DoRA" if peft["use_dora"] else ("QLoRA" if q else "LoRA"),
                      "rank": peft["r"], "alpha": peft["lora_alpha"], "dropout": peft["lora_dropout"],
                      "targets": peft["target_modules"], "modules_to_save": peft["modules_to_save"],
                      "adapter_dtype": peft["adapter_dtype"],
                      "base_weights": (f"bitsandbytes {q['type']}" + (" + double quantization" if q.get("double_quant")
                                                                       else "")) if q else "unquantized",
                      "prepare_kbit": q["prepare_kbit"] if q else None}
    model = {
        "name": plan["model_name"],
        "hf_id": None,
        "family": plan["model_type"] + " (transformers " + plan["model_class"] + ", random weights)",
        "model_type": plan["model_type"],
        "num_layers": em["num_hidden_layers"],
        "hidden_size": em["hidden_size"],
        "num_attention_heads": em["num_attention_heads"],
        "num_kv_heads": em["num_key_value_heads"],
        "head_dim": em["head_dim"],
        "intermediate_size": em["intermediate_size"],
        "mlp_type": "gated (3 matrices)",
        "vocab_size": em["vocab_size"],
        "tied_embeddings": em["tie_word_embeddings"],
        "num_experts": em["num_experts"] or None,
        "num_experts_per_tok": em["num_experts_per_tok"] or None,
        "total_params": meas.get("params_total"),
        "trainable_params": meas.get("params_trainable"),
    }
    training = {
        "framework": f"{plan['framework']} semantics: {plan['loop']}",
        "task": "causal LM on random token ids (labels = inputs)",
        "micro_batch_size": b["micro_batch_size"],
        "seq_len": b["sequence_length"],
        "dataset_packed": True,
        "gradient_accumulation_steps": b["gradient_accumulation_steps"],
        "steps": b["steps"],
        "precision": plan["precision"],
        "param_dtype": plan["param_dtype"],
        "autocast_dtype": plan["autocast_dtype"],
        "optimizer": opt["name"] + f" ({opt['class']}, {opt['impl']})",
        "optimizer_state_dtype": opt["state_dtype"],
        "optimizer_in_backward": plan["optimizer_in_backward"],
        "activation_checkpointing": plan["checkpointing"]["mode"]
        + (f" (every {plan['checkpointing']['every_k_layers']} layers)" if plan["checkpointing"]["mode"] == "every_k"
           else "") + (", non-reentrant" if plan["checkpointing"]["mode"] != "none" else ""),
        "attention_impl": plan["attn_implementation"] + ("" if plan["attention"] == plan["attn_implementation"]
                                                         else f" (config: {plan['attention']})"),
        "loss": plan["loss"]["impl"] + (f" ({plan['loss']['chunks']} chunks)" if plan["loss"]["chunks"] else ""),
        "compile": False,
        "parallelism": {"num_gpus": 1, "dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
                        "zero_or_fsdp": "none (single device)", "offload": "none"},
        "peft": peft_block,
    }
    harness = {k: plan[k] for k in ("hf_config", "attn_implementation", "param_dtype", "autocast_dtype",
                                     "grad_scaler", "optimizer", "checkpointing", "loss", "peft",
                                     "holds_outputs", "param_groups")}
    harness["objective"] = plan.get("objective")
    return model, training, harness


def _program_parts(plan, meas):
    """A model program's model, training and harness blocks of the record (programs.py)."""
    prog, b, opt = plan["program_plan"], plan["batch"], plan["optimizer"]
    model = {"name": plan["model_name"], "hf_id": None,
             "family": f"{prog['program']} ({prog['model_class']}, random weights)",
             "architecture": prog["program"], "architecture_args": prog["args"],
             "num_layers": prog["block_instances"], "total_params": meas.get("params_total"),
             "trainable_params": meas.get("params_trainable")}
    training = {"framework": f"{plan['framework']} semantics: a torch loop", "task": "image classification on random "
                "images (fp32 pixel values, int64 labels)", "micro_batch_size": b["micro_batch_size"],
                "image_inputs": prog["inputs"], "gradient_accumulation_steps": b["gradient_accumulation_steps"],
                "steps": b["steps"], "precision": plan["precision"], "param_dtype": plan["param_dtype"],
                "autocast_dtype": plan["autocast_dtype"], "optimizer": opt["name"] + f" ({opt['class']}, {opt['impl']})",
                "activation_checkpointing": plan["checkpointing"]["mode"] + (", non-reentrant, each program block"
                                                                            if plan["checkpointing"]["mode"] != "none"
                                                                            else ""),
                "compile": False, "parallelism": {"num_gpus": 1, "dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1,
                                                  "zero_or_fsdp": "none (single device)", "offload": "none"},
                "peft": None}
    return model, training, {"program_plan": prog, "optimizer": opt, "checkpointing": plan["checkpointing"]}


def make_record(plan, config, meas, env):
    """One cases.jsonl line. `meas`: the measurements; `env`: versions and the GPU."""
    b = plan["batch"]
    stats = meas["stats"]
    measured = stat_block("allocated", stats["allocated"])
    also = {k: stat_block(k, stats.get(k), meas.get("quantities", {}).get(k))
            for k in ("reserved", "active", "requested", "device")}
    notes = list(plan["notes"]) + list(meas.get("notes", []))
    if env.get("memsim_gpu") and env["memsim_gpu"] != plan["memsim_gpu"]:
        notes.append(f"hardware.gpu: the config says {plan['memsim_gpu']}, the run was on {env.get('gpu')} "
                     f"(memsim id {env['memsim_gpu']}); compare.py simulates the GPU of the run")
    model, training, harness = (_program_parts if plan.get("kind") == "program" else _lm_parts)(plan, meas)
    return {
        "id": plan["id"],
        "kind": "measured",
        "confidence": "high",
        "source": {
            "title": f"{tr.HARNESS_NAME}: {b['steps']} training steps on random "
                     + ("images" if plan.get("kind") == "program" else "tokens"),
            "repo": "memsim",
            "path": "tools/calibrate/calibrate.py",
            "harness_version": tr.HARNESS_VERSION,
            "date": env.get("date"),
        },
        "model": model,
        "training": training,
        "hardware": {
            "gpu": env.get("gpu"),
            "num_gpus": 1,
            "memsim_gpu": env.get("memsim_gpu"),
            "total_memory_bytes": env.get("total_memory_bytes"),
            "driver": env.get("driver"),
            "cuda": env.get("cuda"),
        },
        "versions": env.get("versions", {}),
        "measured": measured,
        "also_measured": also,
        "peak_note": "peak statistics were not reset after model creation: every figure is the peak over the "
                     "whole run (model creation, optimizer creation and all steps), as memsim predicts it",
        "inferred_fields": [],
        "notes": " ".join(n.rstrip(".") + "." for n in notes),
        "diagnostics": meas.get("diagnostics", {}),
        "harness": harness,
        "memsim_config": config,
    }


def write_trace(snapshot, path):
    """The allocator events of a torch.cuda.memory._snapshot() as compact JSON: [action, address, size, stream]."""
    events = []
    for trace in snapshot.get("device_traces", []):
        for e in trace:
            events.append([e.get("action"), e.get("addr"), e.get("size"), e.get("stream")])
    segments = [{"address": g.get("address"), "total_size": g.get("total_size"), "stream": g.get("stream"),
                 "segment_type": g.get("segment_type")} for g in snapshot.get("segments", [])]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"events": events, "segments": segments}, f, separators=(",", ":"))


def write_live_blocks(snapshot, path, frames=14):
    """The allocated blocks of a snapshot with the innermost Python frames that allocated each (a diagnosis aid)."""
    blocks = []
    for seg in snapshot.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            fr = [f"{f.get('filename', '?').split('site-packages/')[-1]}:{f.get('line')}:{f.get('name')}"
                  for f in (b.get("frames") or [])[:frames]]
            blocks.append({"size": b.get("size"), "requested": b.get("requested_size"), "frames": fr})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(blocks, f)


def failure_record(item_id, error, field=None, partial=None):
    rec = {"id": item_id, "kind": "failed", "field": field, "error": str(error)}
    if partial:
        rec["partial"] = partial
    return rec


# ---------------------------------------------------------------------------------------------------------------
# NVML (pynvml if importable, else nvidia-smi, else nothing)
# ---------------------------------------------------------------------------------------------------------------

class NvmlProbe:
    def __init__(self):
        self.kind = None
        self.nv = self.handle = None
        self.selector = nvml_device_selector()
        self.peak = None
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            if isinstance(self.selector, int):
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.selector)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(self.selector)
            self.nv = pynvml
            self.kind = "pynvml"
        except Exception:
            if shutil.which("nvidia-smi"):
                self.kind = "nvidia-smi"

    def used(self):
        try:
            if self.kind == "pynvml":
                return int(self.nv.nvmlDeviceGetMemoryInfo(self.handle).used)
            if self.kind == "nvidia-smi":
                out = subprocess.run(["nvidia-smi", "-i", str(self.selector), "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
                return parse_nvidia_smi_used(out.stdout)
        except Exception:
            return None
        return None

    def process_used(self):
        if self.kind != "pynvml":
            return None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == os.getpid():
                    return int(p.usedGpuMemory) if p.usedGpuMemory is not None else None
        except Exception:
            return None
        return None

    def driver(self):
        try:
            if self.kind == "pynvml":
                v = self.nv.nvmlSystemGetDriverVersion()
                return v.decode() if isinstance(v, bytes) else v
            if shutil.which("nvidia-smi"):
                out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20)
                return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except Exception:
            return None
        return None

    def name(self):
        try:
            if self.kind == "pynvml":
                v = self.nv.nvmlDeviceGetName(self.handle)
                return v.decode() if isinstance(v, bytes) else v
        except Exception:
            return None
        return None

    def _sample(self, interval):
        while not self._stop.is_set():
            u = self.used()
            if u is not None and (self.peak is None or u > self.peak):
                self.peak = u
            self._stop.wait(interval)

    def start(self, interval=0.02):
        self._stop.clear()
        self.peak = None
        if self.kind == "pynvml":
            self._thread = threading.Thread(target=self._sample, args=(interval,), daemon=True)
            self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        u = self.used()  # the allocator keeps its segments, so the end of the run is a sample of the peak too
        if u is not None and (self.peak is None or u > self.peak):
            self.peak = u
        return self.peak


# ---------------------------------------------------------------------------------------------------------------
# The GPU run (torch imported here only)
# ---------------------------------------------------------------------------------------------------------------

def _version(mod):
    try:
        from importlib.metadata import version
        return version(mod)
    except Exception:
        return None


def _dtype_kwarg(transformers):
    nums = [int(x) for x in re.findall(r"\d+", transformers.__version__)[:2]]
    return "dtype" if tuple(nums) >= (4, 56) else "torch_dtype"


def _require(plan):
    import importlib
    field_of = {"peft": "peft.method", "bitsandbytes": "peft.base_quantization / training.optimizer",
                "liger_kernel": "training.loss", "flash_attn": "training.attention"}
    for mod in plan["requires"]:
        try:
            importlib.import_module(mod)
        except Exception as e:
            raise HarnessError(field_of.get(mod, mod), f"needs the python package {mod} ({e}); "
                               f"pip install {mod.replace('_', '-')}") from None


def _decoder(model):
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if dec is None or not hasattr(dec, "layers"):
        dec = getattr(model, "model", None)
    if dec is None or not hasattr(dec, "layers"):
        raise HarnessError("model", f"cannot find the decoder layers of {type(model).__name__}")
    return dec


def bnb_saves_input(version):
    """Whether this bitsandbytes keeps a 4-bit linear's input for backward (before 0.43.2; PR #1270 dropped it)."""
    nums = tuple(int(x) for x in re.findall(r"\d+", version or "")[:3])
    return nums < (0, 43, 2)


def _quantize_linears(model, plan, torch, notes):
    import bitsandbytes as bnb
    q = plan["peft"]["quantization"]
    if q["bits"] == 4 and q.get("saves_input", False) != bnb_saves_input(bnb.__version__):
        raise HarnessError("peft.bnb_saves_input", f"{q.get('saves_input', False)}, but the installed bitsandbytes "
                           f"{bnb.__version__} {'does' if bnb_saves_input(bnb.__version__) else 'does not'} keep the "
                           "inputs (before 0.43.2 it does): set the field to match, or install another version")
    cdtype = getattr(torch, q["compute_dtype"])
    layers = _decoder(model).layers
    count = 0
    for layer in layers:
        for parent in list(layer.modules()):
            for cname, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear or cname in q["skip_modules"]:
                    continue
                has_bias = child.bias is not None
                if q["bits"] == 4:
                    new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=has_bias, compute_dtype=cdtype,
                                            compress_statistics=q["double_quant"], quant_type=q["type"],
                                            quant_storage=torch.uint8)
                    new.weight.data = child.weight.data  # keeps the Params4bit (and its link to the module)
                else:
                    new = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=has_bias,
                                              has_fp16_weights=False, threshold=6.0)
                    new.weight = bnb.nn.Int8Params(child.weight.data, requires_grad=False, has_fp16_weights=False)
                new.weight.requires_grad_(False)
                if has_bias:
                    new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                new = new.to("cuda")  # bitsandbytes quantizes on the move to the GPU
                setattr(parent, cname, new)
                del child
                count += 1
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            if m.weight.dtype != torch.uint8 or (getattr(m.weight, "quant_state", None) is None
                                                 and getattr(m, "quant_state", None) is None):
                raise HarnessError("peft.base_quantization", "a Linear4bit weight was not quantized")
        elif isinstance(m, bnb.nn.Linear8bitLt) and m.weight.dtype != torch.int8:
            raise HarnessError("peft.base_quantization", "a Linear8bitLt weight was not quantized")
    notes.append(f"quantized {count} decoder linears with bitsandbytes ({q['type']})")


def _every_k_checkpointing(model, k, torch):
    import torch.utils.checkpoint as cp
    layers = _decoder(model).layers
    wrapped = []
    for i, layer in enumerate(layers):
        if i % k:
            continue
        orig = layer.forward

        def forward(*args, _orig=orig, **kwargs):
            return cp.checkpoint(_orig, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
        wrapped.append(i)
    return wrapped


def _make_optimizer(plan, params, torch):
    o = plan["optimizer"]
    if o["name"] == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        raise HarnessError("training.optimizer", "adafactor needs torch.optim.Adafactor (torch >= 2.5)")
    cls = programs.resolve(o["class"])
    try:
        if plan["optimizer_in_backward"]:
            opts = {p: cls([p], **o["kwargs"]) for p in params}
            return None, opts
        if plan["param_groups"] == 2:
            decay = [p for p in params if p.ndim >= 2]
            no_decay = [p for p in params if p.ndim < 2]
            groups = [g for g in ({"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0})
                      if g["params"]]
        else:
            groups = [{"params": params}]
        return cls(groups, **o["kwargs"]), None
    except (RuntimeError, TypeError, ValueError) as e:
        raise HarnessError("training.optimizer_impl", f"{o['class']}({o['kwargs']}) failed: {e}") from None


def _lora_config(peft_lib, peft_plan, task_type):
    """The plan's LoraConfig (the policy's; PPO's value model takes the same with task_type SEQ_CLS)."""
    return peft_lib.LoraConfig(r=peft_plan["r"], lora_alpha=peft_plan["lora_alpha"],
                               lora_dropout=peft_plan["lora_dropout"], target_modules=peft_plan["target_modules"],
                               use_dora=peft_plan["use_dora"], modules_to_save=peft_plan["modules_to_save"] or None,
                               bias="none", task_type=task_type)


def _get_peft_model(peft_lib, model, lcfg):
    try:
        return peft_lib.get_peft_model(model, lcfg, autocast_adapter_dtype=False)
    except TypeError:
        return peft_lib.get_peft_model(model, lcfg)


def _cast_adapters(model, peft_plan, torch):
    """Every trainable adapter parameter in the plan's adapter_dtype."""
    adt = getattr(torch, peft_plan["adapter_dtype"])
    for n, p in model.named_parameters():
        if p.requires_grad and "lora_" in n and p.dtype != adt:
            p.data = p.data.to(adt)


def selective_log_softmax(logits, index, torch):
    """TRL's trl/trainer/utils.py selective_log_softmax (v0.15 onwards), copied: fp32 rows through logsumexp, 16-bit
    rows through a log_softmax each."""
    import torch.nn.functional as F
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
        return selected - lse
    rows = []
    for row_logits, row_labels in zip(logits, index):
        row_logps = F.log_softmax(row_logits, dim=-1)
        rows.append(row_logps.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def _entropy_metric(shift_logits, torch):
    """TRL's entropy_from_logits (trl/trainer/utils.py, v1.9) as the preference trainers log it before backward: a
    flattened copy of the logits, then 128 rows at a time."""
    import torch.nn.functional as F
    flat = shift_logits.detach().reshape(-1, shift_logits.size(-1))
    for chunk in flat.split(128):
        p = F.softmax(chunk, dim=-1)
        (torch.logsumexp(chunk, dim=-1) - (p * chunk).sum(dim=-1)).sum()
    del flat


def _reference_context(model, obj):
    """The reference's forward: the policy with its adapters off (TRL's null_ref_context / use_adapter), else
    nothing (a copy, or the policy's own weights)."""
    import contextlib
    return model.disable_adapter() if obj["reference"] == "adapter_disabled" else contextlib.nullcontext()


def _dpo_loss_fn(plan, model, ref_model, torch):
    """DPOTrainer._compute_loss of TRL's newest release (huggingface/trl trl/trainer/dpo_trainer.py, v1.9), on
    ids = [chosen; rejected] with every token a completion token: the policy's outputs and the reference's stay
    referenced until the loss returns, as its locals do there."""
    import torch.nn.functional as F
    obj = plan["objective"]

    def logits_of(out):
        return out.logits.float() if obj["logits_fp32"] else out.logits  # accelerate's convert_outputs_to_fp32

    def f(ids, labels):
        rows = ids.shape[0] // 2
        outputs = model(input_ids=ids, use_cache=False)
        shift_logits = logits_of(outputs)[..., :-1, :]
        shift_labels = ids[..., 1:]
        logps = selective_log_softmax(shift_logits, shift_labels, torch).sum(dim=1)
        chosen, rejected = logps.chunk(2, dim=0)
        ref_outputs = None
        if obj["reference"] == "precomputed":
            ref_chosen, ref_rejected = torch.zeros_like(chosen), torch.zeros_like(rejected)
        else:
            with torch.no_grad(), _reference_context(model, obj):
                ref_outputs = (ref_model or model)(input_ids=ids, use_cache=False)
                ref_logps = selective_log_softmax(logits_of(ref_outputs)[..., :-1, :], shift_labels, torch).sum(dim=1)
            ref_chosen, ref_rejected = ref_logps.chunk(2, dim=0)
        delta = (chosen - ref_chosen) - (rejected - ref_rejected)
        loss = -F.logsigmoid(obj["beta"] * delta).mean()
        if obj["nll_alpha"] > 0:
            loss = loss + obj["nll_alpha"] * F.cross_entropy(torch.flatten(shift_logits[:rows], end_dim=1),
                                                           torch.flatten(shift_labels[:rows], end_dim=1))
        # the metrics before backward: entropy_from_logits (128-row chunks of a flattened copy) and the masked means
        with torch.no_grad():
            _entropy_metric(shift_logits, torch)
            c_logits, r_logits = shift_logits.detach().chunk(2, dim=0)
            c_logits.reshape(-1, c_logits.size(-1)).mean(-1).sum(), r_logits.reshape(-1, r_logits.size(-1)).mean(-1).sum()
        del outputs, ref_outputs, shift_logits
        return loss, None
    return f


def _kto_loss_fn(plan, model, ref_model, torch):
    """KTOTrainer._compute_loss of TRL's newest release (huggingface/trl trl/trainer/kto_trainer.py, v1.9) on B
    unpaired rows, the first half desirable: _compute_kl_logps (the KL batch under no_grad: each row's prompt with
    another row's completion, here the batch rolled by one row), the batch's forward, the reference on both under
    no_grad (its outputs alive to the end, as the local ref_outputs is there), the loss, then the metrics before
    backward: entropy_from_logits and the index_select copies of each half's shifted logits."""
    obj = plan["objective"]

    def logits_of(out):
        return out.logits.float() if obj["logits_fp32"] else out.logits  # accelerate's convert_outputs_to_fp32

    def kl_logps(m, kl_ids):
        with torch.no_grad():
            logits = logits_of(m(input_ids=kl_ids, use_cache=False))
            out = selective_log_softmax(logits[:, :-1, :], kl_ids[:, 1:], torch).sum(-1)
            del logits
        return out

    def f(ids, labels):
        rows = ids.shape[0]
        desirable = torch.arange(rows, device=ids.device) < (rows + 1) // 2
        kl_ids = torch.roll(ids, 1, dims=0)
        policy_kl = kl_logps(model, kl_ids)
        outputs = model(input_ids=ids, use_cache=False)
        shift_logits = logits_of(outputs)[:, :-1, :]
        logps = selective_log_softmax(shift_logits, ids[:, 1:], torch).sum(-1)
        ref_outputs = None
        if obj["reference"] == "precomputed":
            ref_logps, ref_kl = torch.zeros_like(logps), torch.zeros_like(policy_kl)
        else:
            with torch.no_grad(), _reference_context(model, obj):
                ref = ref_model or model
                ref_kl = kl_logps(ref, kl_ids)
                ref_outputs = ref(input_ids=ids, use_cache=False)
                ref_logps = selective_log_softmax(logits_of(ref_outputs)[:, :-1, :], ids[:, 1:], torch).sum(-1)
        kl = (policy_kl - ref_kl).mean().detach().clamp(min=0)
        ratios = logps - ref_logps
        losses = torch.where(desirable, 1 - torch.sigmoid(obj["beta"] * (ratios - kl)),
                             1 - torch.sigmoid(obj["beta"] * (kl - ratios)))
        loss = losses.nanmean()
        with torch.no_grad():
            _entropy_metric(shift_logits, torch)
            idx = torch.nonzero(desirable).view(-1), torch.nonzero(~desirable).view(-1)
            copies = [shift_logits.detach().index_select(0, i) for i in idx]
            for c_ in copies:
                c_.mean(-1).sum()
            del copies
        del outputs, ref_outputs, shift_logits
        return loss, None
    return f


def _grpo_logps(model, ids, completion, logits_fp32, torch):
    """GRPOTrainer._get_per_token_logps_and_entropies (v1.9): logits of the completion's tokens only, divided by the
    temperature in place, selective_log_softmax."""
    logits = model(input_ids=ids, logits_to_keep=completion + 1, use_cache=False).logits
    if logits_fp32:
        logits = logits.float()  # accelerate's convert_outputs_to_fp32
    logits = logits[:, :-1, :][:, -completion:]
    logits.div_(1.0)
    return selective_log_softmax(logits, ids[:, -completion:], torch)


def grpo_rollout(plan, model, ref_model, torch, dev):
    """A step's generation and scoring as GRPOTrainer._generate_and_score_completions (v1.9) runs them with use_vllm
    false: generate with gradient checkpointing off (unwrap_model_for_generation, TRL 0.22+), then the reference's
    no-grad log-probabilities in chunks of the micro-batch. Returns the completions and the reference's log-probs."""
    obj = plan["objective"]
    b = plan["batch"]
    V = plan["effective_model"]["vocab_size"]
    rows, P, C = obj["generation_rows"], obj["prompt_length"], obj["completion_length"]
    prompts = torch.randint(0, V, (rows, P), device=dev)
    was_ckpt = getattr(model, "is_gradient_checkpointing", False)
    if was_ckpt:
        model.gradient_checkpointing_disable()
    with torch.no_grad():
        ids = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=C,
                             min_new_tokens=C, do_sample=True, use_cache=True, pad_token_id=0, eos_token_id=None)
    if was_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ref = None
    if obj["reference"] != "none":
        with torch.no_grad(), _reference_context(model, obj):
            ref = torch.cat([_grpo_logps(ref_model or model, chunk, C, obj["logits_fp32"], torch)
                             for chunk in ids.split(b["micro_batch_size"])])
    return ids, ref


def _grpo_loss_fn(plan, model, torch):
    """GRPOTrainer._compute_loss (v1.9, loss_type dapo's token-level mean; beta's KL term where a reference scored):
    the policy's per-token log-probabilities with grad, the importance ratio against their detached selves."""
    obj = plan["objective"]

    def f(ids, ref_logps):
        logps = _grpo_logps(model, ids, obj["completion_length"], obj["logits_fp32"], torch)
        advantages = torch.randn(ids.shape[0], 1, device=ids.device)
        loss = -(torch.exp(logps - logps.detach()) * advantages)
        if ref_logps is not None:
            # beta: GRPOConfig's default while a reference was the default (0.04 up to TRL 0.18); memory does not
            # depend on it
            loss = loss + 0.04 * (torch.exp(ref_logps - logps) - (ref_logps - logps) - 1)
        return loss.mean(), None
    return f


# PPO: TRL's PPOTrainer (huggingface/trl trl/trainer/ppo_trainer.py v0.12-v0.25, trl/experimental/ppo/ppo_trainer.py
# from v0.26; its helpers forward, get_reward, generate, batch_generation and pad in trl/trainer/utils.py up to
# v0.25). docs/research/ppo.md says what it keeps on the GPU; memsim models it in src/core/ppo_step.cpp.

# The pad id the rows are masked against: no token id, so every position is attended to, as in TRL's runs whose
# responses hold no pad token (without a stop token nothing is truncated). A real id would mask the odd position the
# model happens to sample it at, and with it change what the attention kernels are given.
PPO_PAD = -1


def _disable_dropout(module, torch):
    """TRL's disable_dropout_in_model, which PPOTrainer applies to the policy (after PEFT), the reference, the value and
    the reward model: every nn.Dropout's p set to 0 (torch's dropout of p 0 returns its input and keeps no mask)."""
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def _ppo_inputs(query_responses, torch):
    """The inputs TRL's forward() and get_reward() build: a mask of the non-pad tokens, position ids from it (an
    exclusive cumsum), the pad tokens zeroed."""
    attention_mask = query_responses != PPO_PAD
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def _ppo_forward(model, query_responses, torch):
    """TRL's forward(): the output with every hidden state and the logits of every position (use_cache is left to the
    model's config, false in the harness)."""
    return model(**_ppo_inputs(query_responses, torch), return_dict=True, output_hidden_states=True)


def _ppo_get_reward(part, query_responses, torch):
    """TRL's get_reward(): the sequence classifier's backbone (getattr(model, base_model_prefix)) with every hidden
    state and use_cache false, its score head on the last one: a value per position. The backbone's output, and with
    it the hidden states, goes when this returns."""
    output = part["backbone"](**_ppo_inputs(query_responses, torch), return_dict=True, output_hidden_states=True,
                              use_cache=False)
    return part["score"](output.hidden_states[-1])


def _outputs_to_fp32(out, torch):
    """accelerate's convert_outputs_to_fp32 (operations.py recursively_apply) on what the prepared model returns: every
    fp16/bf16 tensor as an fp32 copy, tuples (the hidden states) and ModelOutputs rebuilt around them."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out
    if isinstance(out, (tuple, list)):
        return type(out)(_outputs_to_fp32(x, torch) for x in out)
    if hasattr(out, "items"):  # a transformers ModelOutput (an OrderedDict of the fields that are set)
        return type(out)(**{k: _outputs_to_fp32(v, torch) for k, v in out.items()})
    return out


def _ppo_generate(model, queries, completion, temperature, torch):
    """TRL's generate(): model.generate with return_dict_in_generate and output_scores, then torch.stack of the
    processed fp32 scores of every generated token, (rows, completion, vocab). generate's output, which holds those
    scores and the KV cache, goes when this returns."""
    context_length = queries.shape[1]
    attention_mask = queries != PPO_PAD
    input_ids = torch.masked_fill(queries, ~attention_mask, 0)
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, return_dict_in_generate=True,
                            output_scores=True, do_sample=True, max_new_tokens=completion, min_new_tokens=completion,
                            temperature=temperature, top_k=0, top_p=1.0, use_cache=True, pad_token_id=0,
                            eos_token_id=None)
    logits = torch.stack(output.scores, 1)
    return torch.cat((queries, output.sequences[:, context_length:]), dim=1), logits


def _ppo_pad(tensors, padding_value, torch):
    """TRL's pad() (padding_side right): one new tensor of (chunks, the largest chunk's shape) the chunks are copied
    into."""
    shape = [max(t.shape[d] for t in tensors) for d in range(tensors[0].dim())]
    output = torch.full((len(tensors), *shape), padding_value, dtype=tensors[0].dtype, device=tensors[0].device)
    for i, t in enumerate(tensors):
        output[i][tuple(slice(0, n) for n in t.shape)] = t
    return output


def _ppo_batch_generation(model, queries, chunk_rows, completion, temperature, torch):
    """TRL's batch_generation(): generate() over local_rollout_forward_batch_size queries at a time, each chunk's
    stacked scores kept, then both lists padded into one tensor each (the chunks alive with the copy) and viewed as
    rows."""
    query_responses, logitss = [], []
    rows = queries.shape[0]
    for i in range(0, rows, chunk_rows):
        query_response, logits = _ppo_generate(model, queries[i:i + chunk_rows], completion, temperature, torch)
        query_responses.append(query_response)
        logitss.append(logits)
    padded_query_responses = _ppo_pad(query_responses, PPO_PAD, torch)
    padded_logitss = _ppo_pad(logitss, 0, torch)
    padded_query_responses = padded_query_responses.view(-1, padded_query_responses.shape[-1])[:rows]
    padded_logitss = padded_logitss.view(-1, *padded_logitss.shape[2:])[:rows]
    return padded_query_responses, padded_logitss


def ppo_rollout(plan, model, ref_model, critic, state, torch, dev):
    """An update's rollout as PPOTrainer.train() runs it, all under no_grad and outside accelerate's autocast (which
    wraps only the prepared PolicyAndValueWrapper's forward; generate runs on unwrapped_model.policy, the reference is
    moved to the device unprepared, get_reward takes the unwrapped value model): batch_generation with gradient
    checkpointing off around it (unwrap_model_for_generation, TRL 0.22+), its padded scores rebinding `logitss` (in
    `state`: the last update's go only now, and these stay until the next update's generation returns); then chunk by
    chunk selective_log_softmax of the scores, the reference's forward with every hidden state (logits sliced to the
    response, divided by the temperature in place, selective_log_softmax, deleted), get_reward of the value model and
    of the reward model, empty_cache after the scores and after the reference; the rewards, GAE and whitening are
    (rows, completion) tensors, which random advantages stand for. Returns the rollout's tensors by name."""
    import gc
    obj = plan["objective"]
    V = plan["effective_model"]["vocab_size"]
    rows, chunk = obj["generation_rows"], obj["chunk_rows"]
    P, C = obj["prompt_length"], obj["completion_length"]
    temperature = obj["temperature"] + 1e-7
    with torch.no_grad():
        queries = torch.randint(0, V, (rows, P), device=dev)
        was_ckpt = getattr(model, "is_gradient_checkpointing", False)
        if was_ckpt:
            model.gradient_checkpointing_disable()
        query_responses, logitss = _ppo_batch_generation(model, queries, chunk, C, temperature, torch)
        state["logitss"] = logitss  # `query_responses, logitss = batch_generation(...)`: the name rebinds
        if was_ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        responses, logprobs, ref_logprobs, values, scores = [], [], [], [], []
        for i in range(0, rows, chunk):
            query = queries[i:i + chunk]
            query_response = query_responses[i:i + chunk]
            response = query_response[:, P:]
            logits = logitss[i:i + chunk]
            logprob = selective_log_softmax(logits, response, torch)
            del logits
            torch.cuda.empty_cache()
            with _reference_context(model, obj):  # null_ref_context: the policy with its adapters off
                ref_output = _ppo_forward(ref_model or model, query_response, torch)
            ref_logits = ref_output.logits[:, P - 1:-1]
            ref_logits /= temperature
            ref_logprob = selective_log_softmax(ref_logits, response, torch)
            del ref_output, ref_logits
            torch.cuda.empty_cache()
            postprocessed_query_response = torch.cat((query, response), 1)  # no stop token: nothing truncated
            full_value = _ppo_get_reward(critic["value"], query_response, torch)
            value = full_value[:, P - 1:-1].squeeze(-1)
            score = _ppo_get_reward(critic["reward"], postprocessed_query_response, torch)[:, -1].squeeze(-1)
            responses.append(response)
            logprobs.append(logprob)
            ref_logprobs.append(ref_logprob)
            values.append(value)
            scores.append(score)
        responses = torch.cat(responses, 0)
        logprobs = torch.cat(logprobs, 0)
        ref_logprobs = torch.cat(ref_logprobs, 0)
        values = torch.cat(values, 0)
        scores = torch.cat(scores, 0)
        del logprob, ref_logprob, full_value, value, score
        torch.cuda.empty_cache()
        gc.collect()
        advantages = torch.randn(rows, C, device=dev)  # rewards, GAE and whitening: (rows, completion) tensors
        returns = advantages + values
        torch.cuda.empty_cache()
    return {"query_responses": query_responses, "responses": responses, "logprobs": logprobs,
            "ref_logprobs": ref_logprobs, "values": values, "returns": returns, "advantages": advantages,
            "scores": scores}


def _ppo_loss_fn(plan, model, critic, torch, ctx, held):
    """One micro-batch of PPOTrainer's training loop up to its loss: forward(model, ...) of the prepared
    PolicyAndValueWrapper (the value model's backbone with every hidden state and its score head, then the policy's
    forward with every hidden state and the logits of every position) under accelerate's autocast, its outputs
    converted to fp32; logits[:, P-1:-1] divided by the temperature in place, selective_log_softmax, the clipped
    policy loss and vf_coef x the clipped value loss. `output`, `vpred_temp` and `logits` go into `held`, the loop's
    locals: the previous micro-batch's are freed only as the names rebind."""
    obj = plan["objective"]
    P = obj["prompt_length"]
    temperature = obj["temperature"] + 1e-7
    clip, clip_value = obj["cliprange"], obj["cliprange_value"]

    def f(mb):
        kwargs = _ppo_inputs(mb["query_responses"], torch)
        with ctx():  # PolicyAndValueWrapper.forward
            critic_output = critic["value"]["backbone"](**kwargs, return_dict=True, output_hidden_states=True)
            vpred_temp = critic["value"]["score"](critic_output.hidden_states[-1])
            output = model(**kwargs, return_dict=True, output_hidden_states=True)
            del critic_output  # forward's local, alive through the policy's forward
        if obj["logits_fp32"]:  # accelerate's convert_outputs_to_fp32 on the wrapper's (output, logits)
            output, vpred_temp = _outputs_to_fp32(output, torch), _outputs_to_fp32(vpred_temp, torch)
        held["output"], held["vpred_temp"] = output, vpred_temp  # `output, vpred_temp = forward(model, ...)`
        del output, vpred_temp
        logits = held["output"].logits[:, P - 1:-1]
        logits /= temperature
        held["logits"] = logits
        new_logprobs = selective_log_softmax(logits, mb["responses"], torch)
        vpred = held["vpred_temp"][:, P - 1:-1].squeeze(-1)
        vpredclipped = torch.clamp(vpred, mb["values"] - clip_value, mb["values"] + clip_value)
        vf_losses1 = torch.square(vpred - mb["returns"])
        vf_losses2 = torch.square(vpredclipped - mb["returns"])
        vf_loss = 0.5 * torch.max(vf_losses1, vf_losses2).mean()
        ratio = torch.exp(new_logprobs - mb["logprobs"])
        pg_losses = -mb["advantages"] * ratio
        pg_losses2 = -mb["advantages"] * torch.clamp(ratio, 1.0 - clip, 1.0 + clip)
        pg_loss = torch.max(pg_losses, pg_losses2).mean()
        return pg_loss + obj["vf_coef"] * vf_loss
    return f


def _ppo_entropy(held, torch):
    """The entropy PPOTrainer logs after each micro-batch's backward (at the last one after optimizer.step() and
    zero_grad()), under no_grad and outside autocast: prob_dist = softmax(logits) (which replaces the previous
    micro-batch's as the name rebinds), then logsumexp(logits) - sum(prob_dist * logits)."""
    with torch.no_grad():
        logits = held["logits"]
        held["prob_dist"] = torch.nn.functional.softmax(logits, dim=-1)
        held["entropy"] = torch.logsumexp(logits, dim=-1) - torch.sum(held["prob_dist"] * logits, dim=-1)


def ppo_update(plan, model, ref_model, critic, state, opt, scaler, ctx, torch, dev):
    """One update of PPOTrainer.train() per harness step (num_mini_batches 1): the rollout, then num_ppo_epochs
    passes over a fresh permutation of its rows in gradient_accumulation_steps micro-batches of micro_batch_size
    under accelerator.accumulate: accelerator.backward divides the loss by the accumulation steps, optimizer.step()
    and zero_grad() take effect at the last micro-batch, the entropy follows; the micro-batch's locals (`output`,
    `logits`, `prob_dist`, ...) live until the next one rebinds them, and at the end of each pass the loop deletes them
    and empties the cache. At the end of the update the rollout's tensors go, with empty_cache and gc.collect
    (logitss, in `state`, stays until the next update's generation). Returns the losses."""
    import contextlib
    import gc
    obj = plan["objective"]
    b = plan["batch"]
    B, gas = b["micro_batch_size"], b["gradient_accumulation_steps"]
    with ctx() if obj["rollout_autocast"] else contextlib.nullcontext():  # outside accelerate's autocast (the plan)
        rollout = ppo_rollout(plan, model, ref_model, critic, state, torch, dev)
    held = {}
    loss_fn = _ppo_loss_fn(plan, model, critic, torch, ctx, held)
    losses = []
    for _ in range(obj["num_ppo_epochs"]):
        b_inds = torch.randperm(obj["generation_rows"])
        for k in range(gas):
            inds = b_inds[k * B:(k + 1) * B].to(dev)
            held["mb"] = {name: rollout[name][inds] for name in ("advantages", "responses", "query_responses",
                                                                 "logprobs", "returns", "values")}
            loss = loss_fn(held["mb"]) / gas
            (scaler.scale(loss) if scaler else loss).backward()
            losses.append(float(loss.detach()) * gas)
            if k == gas - 1:
                if scaler:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                opt.zero_grad(set_to_none=plan["zero_grad_set_to_none"])
            _ppo_entropy(held, torch)
            held["loss"] = loss
            del loss
        held.clear()  # `del (output, vpred_temp, logits, ..., prob_dist, entropy, ...)`
        torch.cuda.empty_cache()
    del rollout
    torch.cuda.empty_cache()
    gc.collect()
    return losses


def ppo_models(plan, transformers, torch, dev, kwargs, diag):
    """PPOTrainer's value and reward models: the policy's architecture as AutoModelForSequenceClassification
    (num_labels 1, random weights), built on the GPU in the policy's dtype, as TRL's examples load them. The value
    model trains, in full as PPOTrainer has it or with the policy's LoRA config (task_type SEQ_CLS) where
    training.value_model is peft, as ms-swift prepares it, and is never checkpointed; the reward model is frozen, in
    eval mode. Each part is its backbone (getattr(model, base_model_prefix), what PolicyAndValueWrapper and
    get_reward call) and its score head; "params" are the value model's trainable parameters."""
    obj = plan["objective"]
    cfg = transformers.AutoConfig.for_model(plan["model_type"], num_labels=1, **plan["hf_config"])
    parts = {}
    for name in ("value", "reward"):
        field = f"training.{name}_model"
        with torch.device(dev):
            m = transformers.AutoModelForSequenceClassification.from_config(cfg, **kwargs)
        n = sum(p.numel() for p in m.parameters())
        if n != obj["score_model_params"]:
            raise HarnessError(field, f"transformers {transformers.__version__} built {n} parameters for the {name} "
                               f"model, the policy's shape as a sequence classifier has {obj['score_model_params']}")
        m.config.use_cache = False
        base = m
        if name == "reward":
            m.eval()
            m.requires_grad_(False)
        elif obj["value_model"] == "peft":
            import peft as peft_lib
            m = _get_peft_model(peft_lib, m, _lora_config(peft_lib, plan["peft"], "SEQ_CLS"))
            _cast_adapters(m, plan["peft"], torch)
            adapters = sum(p.numel() for n_, p in m.named_parameters() if "lora_" in n_)
            if adapters != plan["expected_adapter_params"]:
                raise HarnessError(field, f"PEFT added {adapters} adapter parameters to the value model, the "
                                   f"policy's targets have {plan['expected_adapter_params']}")
            base = m.get_base_model()
            m.train()
        else:
            m.train()
        _disable_dropout(m, torch)
        parts[name] = {"model": m, "backbone": getattr(base, base.base_model_prefix), "score": base.score}
        diag.setdefault("ppo_models", {})[name] = {
            "params": n, "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad)}
    parts["params"] = [p for p in parts["value"]["model"].parameters() if p.requires_grad]
    return parts


def pad_rows(labels, torch):
    """A padded micro-batch as a collator makes it (translate.py padded_row_lengths: row i of B holds
    ceil(L x (B - i) / B) of its L tokens, right-padded): the attention_mask, 1 over each row's tokens and 0 over its
    padding, and the labels with -100 at the padding. The token ids under the padding stay as drawn: the mask hides
    them, as a pad token id would be."""
    B, S = labels.shape
    rows = torch.tensor(tr.padded_row_lengths(B, S), device=labels.device)
    mask = (torch.arange(S, device=labels.device)[None, :] < rows[:, None]).long()
    return mask, labels.masked_fill(mask == 0, -100)


def _loss_fn(plan, model, base, torch, ref_model=None):
    import torch.nn.functional as F
    if plan.get("objective") and plan["objective"]["kind"] == "grpo":
        return _grpo_loss_fn(plan, model, torch)
    if plan.get("objective") and plan["objective"]["kind"] == "kto":
        return _kto_loss_fn(plan, model, ref_model, torch)
    if plan.get("objective"):
        return _dpo_loss_fn(plan, model, ref_model, torch)
    impl = plan["loss"]["impl"]
    holds = plan["holds_outputs"]
    ignore = -100

    if impl == "hf_fp32_upcast":
        def f(ids, labels, mask=None):
            out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
            return out.loss, (out if holds else None)
        return f

    decoder = _decoder(base)
    head = base.get_output_embeddings()

    def shifted(labels):
        return torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), ignore)], dim=1)

    if impl == "full_fp32":
        def f(ids, labels, mask=None):
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False)[0]
            logits = head(hidden).float()
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), shifted(labels).view(-1), ignore_index=ignore)
            del logits
            return loss, None
        return f

    if impl == "chunked_fp32":
        n = plan["loss"]["chunks"]

        def f(ids, labels, mask=None):  # torchtune CEWithChunkedOutputLoss
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False)[0]
            logits = [head(c) for c in hidden.chunk(n, dim=1)]
            target = shifted(labels)
            chunks = [c.reshape(-1) for c in target.chunk(n, dim=1)]
            total = (target != ignore).sum()
            loss = 0.0
            for lg, lb in zip(logits, chunks):
                loss = loss + F.cross_entropy(lg.reshape(-1, lg.size(-1)).float(), lb, ignore_index=ignore,
                                              reduction="sum")
            del logits
            return loss / total, None
        return f

    if impl == "chunked_bf16":
        def f(ids, labels, mask=None):  # litgpt chunked_cross_entropy, logits held by the loop
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False)[0]
            logits = head(hidden)
            lg = logits[..., :-1, :].reshape(-1, logits.size(-1))
            tg = labels[..., 1:].reshape(-1)
            parts = [F.cross_entropy(a, b, ignore_index=ignore, reduction="none")
                     for a, b in zip(lg.split(128), tg.split(128))]
            n = (tg != ignore).sum()
            return torch.cat(parts).sum() / n.maximum(torch.ones_like(n)), logits
        return f

    if impl == "fused_linear":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        lf = LigerFusedLinearCrossEntropyLoss()

        def f(ids, labels, mask=None):
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False)[0]
            h = hidden.reshape(-1, hidden.size(-1))
            return lf(head.weight, h, shifted(labels).reshape(-1)), None
        return f
    raise HarnessError("training.loss", f"unknown loss {impl}")


def _allocator_settings(plan, torch, notes):
    """hardware.expandable_segments, before the first allocation: the allocator reads its settings then (run_isolated
    also puts it in the worker's PYTORCH_CUDA_ALLOC_CONF); other settings in the environment stay."""
    alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if alloc_conf and alloc_conf != "expandable_segments:True":  # not only what run_isolated put there
        notes.append(f"PYTORCH_CUDA_ALLOC_CONF={alloc_conf} in the environment (memsim models the default allocator "
                     "and expandable_segments, which the config sets)")
    expandable = bool(plan.get("expandable_segments"))
    if expandable or (alloc_conf and "expandable_segments" in alloc_conf):
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
        if setter is None:
            raise HarnessError("hardware.expandable_segments", "this torch cannot set expandable_segments at run time")
        setter(f"expandable_segments:{expandable}")
        if expandable:
            notes.append("allocator: expandable_segments:True (hardware.expandable_segments)")
        else:
            notes.append("allocator: expandable_segments from the environment turned off, as the config says "
                         "(hardware.expandable_segments false)")


def _peaks(torch, dev, probe, diag, notes, losses, setup_peak):
    """The run's peak statistics (never reset: the whole run, model creation included) and NVML's, with the
    diagnostics and notes they call for; `setup_peak` is max_memory_allocated once the optimizer was built."""
    s = torch.cuda.memory_stats(dev)
    stats = {
        "allocated": torch.cuda.max_memory_allocated(dev),
        "reserved": torch.cuda.max_memory_reserved(dev),
        "active": s.get("active_bytes.all.peak"),
        "requested": s.get("requested_bytes.all.peak"),
    }
    diag["num_alloc_retries"] = s.get("num_alloc_retries")
    diag["num_ooms"] = s.get("num_ooms")
    diag["losses"] = [round(x, 4) for x in losses]
    diag["nvml_process_used_bytes"] = probe.process_used()
    device_peak = probe.stop()
    stats["device"] = device_peak
    quantities = {}
    if device_peak is not None and probe.kind == "nvidia-smi":
        quantities["device"] = ("nvidia-smi memory.used of the whole GPU at the end of the run (MiB resolution; the "
                                "caching allocator still holds its segments, so this is its peak plus the context)")
    diag["peak_during_setup"] = setup_peak >= stats["allocated"]
    if diag["peak_during_setup"]:
        notes.append("the allocated peak was reached while building the model, adapters or optimizer, before the "
                     "first step (e.g. a weight in its load dtype next to its quantized copy); it does not measure "
                     "the training step")
    if diag.get("num_alloc_retries"):
        notes.append(f"the allocator freed its cache and retried {diag['num_alloc_retries']} times (near OOM): "
                     "reserved is not the unconstrained peak")
    return stats, quantities


def _start(plan, probe):
    """NVML's baseline before torch touches the GPU, the CUDA check, the plan's packages and allocator settings."""
    probe = probe or NvmlProbe()
    baseline = probe.used()
    import torch
    if not torch.cuda.is_available():
        raise HarnessError("hardware", "no CUDA device")
    _require(plan)
    notes, diag = [], {"nvml": probe.kind, "nvml_device": probe.name(), "nvml_baseline_bytes": baseline}
    _allocator_settings(plan, torch, notes)
    torch.manual_seed(0)
    return torch, probe, notes, diag


def run_plan(plan, config, probe=None):
    """Runs one plan on CUDA device 0; returns the record. Raises HarnessError or torch's OOM error."""
    torch, probe, notes, diag = _start(plan, probe)
    import transformers

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    trace_dir = os.environ.get("MEMSIM_CALIB_TRACE_DIR")
    # MEMSIM_CALIB_SNAPSHOT_STEP=N: after step N, list the live blocks with the Python frames that allocated them
    snapshot_step = int(os.environ.get("MEMSIM_CALIB_SNAPSHOT_STEP", "0") or 0)
    if trace_dir:  # the caching allocator's own alloc/free/segment events, for replaying through memsim's model
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc" if snapshot_step else None,
                                                 stacks="python", max_entries=2_000_000)
    props = torch.cuda.get_device_properties(dev)
    probe.start()
    t0 = time.time()

    def mark(name):
        diag.setdefault("allocated_after", {})[name] = torch.cuda.memory_allocated(dev)
        diag.setdefault("peak_allocated_after", {})[name] = torch.cuda.max_memory_allocated(dev)
        diag.setdefault("seconds_after", {})[name] = round(time.time() - t0, 2)

    # --- model, random weights, built directly in its dtype (on the GPU unless it is quantized first on the CPU)
    cfg = transformers.AutoConfig.for_model(plan["model_type"], **plan["hf_config"])
    param_dtype = getattr(torch, plan["param_dtype"])
    peft_plan = plan["peft"]
    quant = peft_plan["quantization"] if peft_plan else None
    kwargs = {"attn_implementation": plan["attn_implementation"], _dtype_kwarg(transformers): param_dtype}
    with torch.device("cpu" if quant else dev):
        model = transformers.AutoModelForCausalLM.from_config(cfg, **kwargs)
    got_attn = getattr(model.config, "_attn_implementation", None)
    if got_attn != plan["attn_implementation"]:
        raise HarnessError("training.attention", f"asked transformers for {plan['attn_implementation']}, got {got_attn}")
    params_total = sum(p.numel() for p in model.parameters())  # before quantization packs the weights
    if params_total != plan["expected_params"]:
        raise HarnessError("model", f"transformers {transformers.__version__} built {params_total} parameters, the "
                           f"memsim shape has {plan['expected_params']}: the translation does not fit this "
                           "model_type/version")
    model.config.use_cache = False
    if quant:
        _quantize_linears(model, plan, torch, notes)
        model.to(dev)
        # what from_pretrained(quantization_config=...) marks, and PEFT reads to pick its bitsandbytes LoRA layers
        for attr in ("is_loaded_in_4bit", "is_loaded_in_8bit"):
            try:
                setattr(model, attr, (quant["bits"] == 4) == (attr == "is_loaded_in_4bit"))
            except Exception:
                pass
    mark("model")
    # DPO's frozen reference copy (TRL's create_reference_model: a deepcopy in the policy's dtype, eval, no grad)
    ref_model = None
    if plan.get("objective") and plan["objective"]["reference"] == "copy":
        import copy
        ref_model = copy.deepcopy(model).eval()
        for p_ in ref_model.parameters():
            p_.requires_grad_(False)
        mark("reference")

    # --- checkpointing (before PEFT wraps the model)
    ck = plan["checkpointing"]
    if ck["mode"] == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif ck["mode"] == "every_k":
        wrapped = _every_k_checkpointing(model, ck["every_k_layers"], torch)
        diag["checkpointed_layers"] = wrapped

    # --- PEFT
    base = model
    if peft_plan:
        import peft as peft_lib
        if quant and quant["prepare_kbit"]:
            model = peft_lib.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            cast = 0
            for p in model.parameters():
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.float()
                    cast += 1
            if cast:
                notes.append(f"prepare_kbit: {cast} parameters left in 16 bits by peft were cast to fp32")
        model = _get_peft_model(peft_lib, model, _lora_config(peft_lib, peft_plan, "CAUSAL_LM"))
        _cast_adapters(model, peft_plan, torch)
        base = model.get_base_model()
        adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
        if adapters != plan["expected_adapter_params"]:
            raise HarnessError("peft.target_modules", f"PEFT added {adapters} adapter parameters, the memsim shape "
                               f"has {plan['expected_adapter_params']}: the targets do not match")
        mark("peft")
    model.train()
    # PPO: the value and reward models beside the policy, dropout off in every model (ppo_models)
    ppo = bool(plan.get("objective")) and plan["objective"]["kind"] == "ppo"
    critic = None
    if ppo:
        critic = ppo_models(plan, transformers, torch, dev, kwargs, diag)
        for m_ in (model, ref_model):
            if m_ is not None:
                _disable_dropout(m_, torch)
        mark("value and reward models")
    params = [p for p in model.parameters() if p.requires_grad]
    params_trainable = sum(p.numel() for p in params)
    diag["trainable_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in params})

    # --- optimizer (PPO: one over the policy's and the value model's parameters, as over PolicyAndValueWrapper)
    opt, per_param = _make_optimizer(plan, params + (critic["params"] if critic else []), torch)
    set_to_none = plan["zero_grad_set_to_none"]
    if per_param:
        def hook(p):
            per_param[p].step()
            per_param[p].zero_grad(set_to_none=set_to_none)
        for p in params:
            p.register_post_accumulate_grad_hook(hook)
    mark("optimizer")

    scaler = None
    if plan["grad_scaler"]:
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") \
            else torch.cuda.amp.GradScaler()
    autocast = plan["autocast_dtype"]

    def ctx():
        if autocast:
            return torch.autocast(device_type="cuda", dtype=getattr(torch, autocast))
        import contextlib
        return contextlib.nullcontext()

    loss_fn = None if ppo else _loss_fn(plan, model, base, torch, ref_model)
    grpo = bool(plan.get("objective")) and plan["objective"]["kind"] == "grpo"
    # DPO: a micro-batch of pairs is [chosen; rejected]; KTO's rows are unpaired
    pair_rows = 2 if plan.get("objective") and plan["objective"]["kind"] == "dpo" else 1
    b = plan["batch"]
    B, S, gas = b["micro_batch_size"], b["sequence_length"], b["gradient_accumulation_steps"]
    lengths = b.get("lengths")  # a run of listed micro-batch lengths, in order and cycled (memsim's micro_batches)
    V = plan["effective_model"]["vocab_size"]
    losses, step_seconds = [], []
    micro = 0
    ppo_state = {}  # PPO: the last update's logitss, alive until the next update's generation returns
    for step in range(1, b["steps"] + 1):
        ts = time.time()
        if ppo:  # one PPOTrainer update: its rollout, then num_ppo_epochs optimizer steps (ppo_update)
            losses += ppo_update(plan, model, ref_model, critic, ppo_state, opt, scaler, ctx, torch, dev)
        if grpo:
            with ctx():
                rollout_ids, rollout_ref = grpo_rollout(plan, model, ref_model, torch, dev)
        for k in range(0 if ppo else gas):
            if lengths:
                S = lengths[micro % len(lengths)]
            micro += 1
            if grpo:  # this micro-batch's completions, and the reference's log-probabilities of them
                ids = rollout_ids[k * B:(k + 1) * B]
                labels = None if rollout_ref is None else rollout_ref[k * B:(k + 1) * B]
            else:
                ids = torch.randint(0, V, (B * pair_rows, S), device=dev)
                labels = ids.clone()
            mask = None
            if b.get("padded_rows"):
                mask, labels = pad_rows(labels, torch)
            with ctx():
                loss, held = loss_fn(ids, labels, mask) if mask is not None else loss_fn(ids, labels)
                loss = loss / gas
            (scaler.scale(loss) if scaler else loss).backward()
            losses.append(float(loss.detach()) * gas)
            del loss, held, ids, labels, mask
        if grpo:
            del rollout_ids, rollout_ref  # the generation batch goes with its step
        if opt is not None and not ppo:
            if scaler:
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                if scaler.get_scale() < scale:  # inf/NaN gradients: the step was skipped, opt.step() never ran
                    diag["scaler_skipped_steps"] = diag.get("scaler_skipped_steps", 0) + 1
            else:
                opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        if b.get("empty_cache_steps") and step % b["empty_cache_steps"] == 0:
            torch.cuda.empty_cache()  # memsim's training.empty_cache_steps
        torch.cuda.synchronize(dev)
        step_seconds.append(round(time.time() - ts, 3))
        mark(f"step {step}")
        if trace_dir and step == snapshot_step:
            write_live_blocks(torch.cuda.memory._snapshot(),
                              os.path.join(trace_dir, f"{plan['id']}.step{step}.blocks.json"))

    if trace_dir:
        write_trace(torch.cuda.memory._snapshot(), os.path.join(trace_dir, plan["id"] + ".trace.json"))
        torch.cuda.memory._record_memory_history(enabled=None)
    diag["step_seconds"] = step_seconds
    stats, quantities = _peaks(torch, dev, probe, diag, notes, losses,
                               diag["peak_allocated_after"].get("optimizer", 0))
    if any(x != x for x in losses):
        notes.append("some losses were NaN (random weights); memory is unaffected" +
                     (" except where GradScaler skipped the optimizer step (diagnostics.scaler_skipped_steps)"
                      if diag.get("scaler_skipped_steps") else ""))
    if diag.get("scaler_skipped_steps"):
        notes.append(f"GradScaler skipped {diag['scaler_skipped_steps']} optimizer step(s) (inf/NaN gradients from "
                     "random weights): the optimizer states may be missing from the peak if no step ran")
    env = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(dev),
        "memsim_gpu": memsim_gpu_for(torch.cuda.get_device_name(dev), props.total_memory),
        "total_memory_bytes": props.total_memory,
        "driver": probe.driver(),
        "cuda": torch.version.cuda,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "peft": _version("peft"),
                     "bitsandbytes": _version("bitsandbytes"), "liger_kernel": _version("liger_kernel") or
                     _version("liger-kernel"), "flash_attn": _version("flash_attn") or _version("flash-attn"),
                     "cudnn": torch.backends.cudnn.version()},
    }
    meas = {"stats": stats, "params_total": params_total + plan["expected_adapter_params"],
            "params_trainable": params_trainable,
            "diagnostics": diag, "notes": notes, "quantities": quantities}
    return make_record(plan, config, meas, env)


def run_program_plan(plan, config, probe=None):
    """A model program's plan (programs.py) on CUDA device 0: the same peaks as run_plan, from random images."""
    torch, probe, notes, diag = _start(plan, probe)
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    probe.start()
    prog = plan["program_plan"]
    model = programs.build(prog, torch).to(dev, dtype=getattr(torch, plan["param_dtype"]))
    params_total = sum(p.numel() for p in model.parameters())
    if plan["checkpointing"]["mode"] == "full":
        diag["checkpoint_units"] = programs.checkpoint_units(model, prog, torch)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt, _ = _make_optimizer(plan, params, torch)
    setup_peak = torch.cuda.max_memory_allocated(dev)
    b = plan["batch"]
    autocast = plan["autocast_dtype"]
    losses = []
    for _ in range(b["steps"]):
        for _ in range(b["gradient_accumulation_steps"]):
            x, y = programs.make_batch(prog, b["micro_batch_size"], torch, dev)
            with torch.autocast("cuda", dtype=getattr(torch, autocast or "bfloat16"), enabled=autocast is not None):
                loss = programs.loss_of(model, x, y, torch) / b["gradient_accumulation_steps"]
            loss.backward()
            losses.append(float(loss.detach()) * b["gradient_accumulation_steps"])
            del loss, x, y
        opt.step()
        opt.zero_grad(set_to_none=plan["zero_grad_set_to_none"])
        torch.cuda.synchronize(dev)
    stats, quantities = _peaks(torch, dev, probe, diag, notes, losses, setup_peak)
    env = {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(dev),
           "memsim_gpu": memsim_gpu_for(torch.cuda.get_device_name(dev), props.total_memory),
           "total_memory_bytes": props.total_memory, "driver": probe.driver(), "cuda": torch.version.cuda,
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        prog["library"]: _version(prog["library"]), "cudnn": torch.backends.cudnn.version()}}
    meas = {"stats": stats, "params_total": params_total, "params_trainable": sum(p.numel() for p in params),
            "diagnostics": diag, "notes": notes, "quantities": quantities}
    return make_record(plan, config, meas, env)


def run_cpu(items, cli):
    """Program configs on the CPU (no GPU needed): each one's parameters and its forward's saved set against
    memsim's, and two training steps. Returns how many differ by more than 1% or fail."""
    import torch
    bad = 0
    for item in items:
        plan, err = tr.try_translate(item, 2)
        cid = _item_id(item)
        if err or plan.get("kind") != "program":
            bad += 1
            print(f"REFUSED {cid}: {err or 'the CPU run measures model programs only'}")
            continue
        try:
            got = programs.run_cpu(plan, torch)
        except ImportError as e:  # transformers' families where transformers is not installed (Debian has none)
            bad += 1
            print(f"REFUSED {cid}: needs {e.name or e} ({plan['program_plan']['library']}); a GPU machine has it")
            continue
        except Exception as e:  # torch 1.13's CPU autocast refuses some mixed dtypes (layer_norm in bf16)
            bad += 1
            print(f"FAILED  {cid}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        line = f"ok      {cid}: {got['params_total']} params, losses {[round(x, 3) for x in got['losses']]}"
        if cli and got["saved_bytes"] is not None:
            forward, params = programs.memsim_forward_bytes(tr.unwrap(item)[1], cli)
            err_pct = 100.0 * (forward - got["saved_bytes"]) / got["saved_bytes"]
            line += (f"\n        forward saved set: torch {got['saved_bytes']} bytes, memsim {forward} "
                     f"({err_pct:+.2f}%); memsim params {params}")
            if abs(err_pct) > 1.0 or params != got["params_total"]:
                bad += 1
                line += "  DIFFERS"
        print(line, flush=True)
    return bad


# ---------------------------------------------------------------------------------------------------------------
# Worker process and driver
# ---------------------------------------------------------------------------------------------------------------

def worker(job_path, result_path):
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    result = {"ok": False}
    try:
        run = run_program_plan if job["plan"].get("kind") == "program" else run_plan
        result = {"ok": True, "record": run(job["plan"], job["config"])}
    except HarnessError as e:
        result = {"ok": False, "field": e.field, "error": str(e)}
    except Exception as e:  # OOM and anything else: name it, keep the peaks reached so far
        partial = {}
        try:
            import torch
            if torch.cuda.is_available():
                partial = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                           "max_memory_reserved": torch.cuda.max_memory_reserved()}
        except Exception:
            pass
        oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
        result = {"ok": False, "field": "hardware" if oom else None,
                  "error": ("OOM: " if oom else "") + f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc(limit=20), "partial": partial}
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0 if result.get("ok") else 1


def run_isolated(plan, config, timeout):
    with tempfile.TemporaryDirectory(prefix="memsim-calib-") as d:
        job, res = os.path.join(d, "job.json"), os.path.join(d, "result.json")
        with open(job, "w", encoding="utf-8") as f:
            json.dump({"plan": plan, "config": config}, f)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if plan.get("expandable_segments"):  # hardware.expandable_segments, from the worker's start
            env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(
                [s for s in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if s and "expandable_segments" not in s]
                + ["expandable_segments:True"])
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", job, res], env=env,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "field": None, "error": f"timed out after {timeout} s"}
        if os.path.exists(res):
            with open(res, encoding="utf-8") as f:
                out = json.load(f)
        else:
            out = {"ok": False, "field": None, "error": f"worker exited with {proc.returncode} and no result"}
        if not out.get("ok"):
            out["stderr_tail"] = proc.stderr[-3000:]
        return out


def _item_id(item):
    try:
        return tr.unwrap(item)[0]
    except tr.Unsupported:
        return item.get("id", "?") if isinstance(item, dict) else "?"


def dry_run(items, steps, cli):
    sys.path.insert(0, HERE)
    import compare
    bad = 0
    for item in items:
        plan, err = tr.try_translate(item, steps)
        cid = _item_id(item)
        if err:
            bad += 1
            print(f"REFUSED {cid}: {err}")
            continue
        _, config, _ = tr.unwrap(item)
        if plan.get("kind") == "program":
            prog = plan["program_plan"]
            line = (f"ok      {cid}: {prog['model_class']} ({prog['block_instances']} blocks), {plan['precision']}, "
                    f"{plan['optimizer']['name']}, ckpt {plan['checkpointing']['mode']}")
            if cli:
                pred = compare.run_memsim(cli, config)
                if not pred.get("ok"):
                    bad += 1
                    line += f"\n        memsim REJECTED: {pred.get('error')}"
                else:
                    pk = pred["devices"][0]["peak"]
                    line += (f"\n        memsim: {pred.get('params_total')} params, allocated "
                             f"{pk['allocated_bytes'] / GIB:.2f} GiB, reserved {pk['reserved_bytes'] / GIB:.2f} GiB")
            print(line)
            continue
        line = (f"ok      {cid}: {plan['model_type']} {plan['expected_params'] / 1e9:.2f}B params, {plan['precision']}, "
                f"{plan['optimizer']['name']} ({plan['optimizer']['impl']}), ckpt {plan['checkpointing']['mode']}, "
                f"{plan['attn_implementation']}, loss {plan['loss']['impl']}"
                + (f", {plan['peft']['method']}" + (f"+{plan['peft']['quantization']['type']}"
                                                   if plan["peft"]["quantization"] else "") if plan["peft"] else ""))
        if cli:
            pred = compare.run_memsim(cli, config)
            if pred.get("ok"):
                d = pred["devices"][0]
                pk = d["peak"]
                want = plan["expected_params"] + plan["expected_adapter_params"]
                mismatch = "" if pred.get("params_total") == want else \
                    f"  PARAMS DIFFER: memsim {pred.get('params_total')} vs harness {want}"
                if mismatch:
                    bad += 1
                line += (f"\n        memsim: allocated {pk['allocated_bytes'] / GIB:.2f} GiB, reserved "
                         f"{pk['reserved_bytes'] / GIB:.2f} GiB, device {pk['device_bytes'] / GIB:.2f} GiB, fits "
                         f"{d['fits']} on {config.get('hardware', {}).get('gpu', 'a100-80gb')}" + mismatch)
            elif pred.get("peft_unsupported"):
                line += "\n        memsim: this build does not accept the peft section yet (not checked)"
            else:
                bad += 1
                line += f"\n        memsim REJECTED: {pred.get('error')}"
        print(line)
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="?")
    ap.add_argument("--out", default="calibration-results.jsonl", help="measured cases, one JSON line each (appended)")
    ap.add_argument("--failed", default=None, help="failures, one JSON line each (default: OUT with .failed.jsonl)")
    ap.add_argument("--steps", type=int, default=tr.DEFAULT_STEPS)
    ap.add_argument("--only", default=None, help="comma-separated ids to run")
    ap.add_argument("--in-process", action="store_true", help="run every config in this process (faster, less "
                    "faithful: allocator state and CUDA context carry over)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per config (isolated mode)")
    ap.add_argument("--dry-run", action="store_true", help="translate only; with memsim-cli, print its prediction")
    ap.add_argument("--cli", default=None, help="memsim-cli for --dry-run (default: build/native/memsim-cli)")
    ap.add_argument("--cpu", action="store_true", help="model programs on the CPU: parameters and the forward's "
                    "saved set against memsim-cli's (--cli), and two training steps")
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for k, v in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):  # random weights: nothing to download
        os.environ.setdefault(k, v)
    if a.worker:
        return worker(*a.worker)
    if not a.configs:
        ap.error("CONFIGS is required")
    try:
        items = tr.load_items(a.configs)
    except (OSError, ValueError) as e:
        print(f"calibrate.py: cannot read {a.configs}: {e}", file=sys.stderr)
        return 2
    if a.only:
        wanted = set(a.only.split(","))
        items = [i for i in items if _item_id(i) in wanted]
    if a.cpu:
        import compare
        cli = a.cli or compare.default_cli()
        bad = run_cpu(items, cli if os.path.exists(cli) else None)
        print(f"{len(items) - bad} of {len(items)} configs agree")
        return 1 if bad else 0
    if a.dry_run:
        import compare
        cli = a.cli or compare.default_cli()
        if not os.path.exists(cli):
            print(f"(memsim-cli not found at {cli}: translation only)")
            cli = None
        bad = dry_run(items, a.steps, cli)
        print(f"{len(items) - bad} of {len(items)} configs valid" + (" for the harness and memsim" if cli else ""))
        return 1 if bad else 0

    failed_path = a.failed or re.sub(r"(\.jsonl)?$", ".failed.jsonl", a.out, count=1)
    n_ok = n_fail = 0
    probe = None
    t_all = time.time()
    for item in items:
        t0 = time.time()
        plan, err = tr.try_translate(item, a.steps)
        cid = _item_id(item)
        if err:
            rec = failure_record(cid, err, ",".join(err.fields))
        elif a.in_process:
            try:
                probe = probe or NvmlProbe()
                run = run_program_plan if plan.get("kind") == "program" else run_plan
                rec = run(plan, tr.unwrap(item)[1], probe=probe)
            except HarnessError as e:
                rec = failure_record(cid, e, e.field)
            except Exception as e:
                rec = failure_record(cid, f"{type(e).__name__}: {e}")
            finally:
                probe.stop()  # the sampler of a run that failed half-way
                try:
                    import gc
                    import torch
                    gc.collect()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()  # between configs only, never within a run
                except Exception:
                    pass
        else:
            res = run_isolated(plan, tr.unwrap(item)[1], a.timeout)
            rec = res["record"] if res.get("ok") else failure_record(cid, res.get("error"), res.get("field"),
                                                                      res.get("partial"))
            for k in ("traceback", "stderr_tail"):
                if not res.get("ok") and res.get(k):
                    rec[k] = res[k]
        dt = time.time() - t0
        if rec["kind"] == "measured":
            n_ok += 1
            with open(a.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            m, also = rec["measured"], rec["also_measured"]
            dev = also.get("device")
            print(f"ok   {cid}: allocated {m['gib']:.2f} GiB, reserved {also['reserved']['gib']:.2f} GiB, active "
                  f"{also['active']['gib']:.2f} GiB, device {dev['gib'] if dev else 'n/a'} GiB ({dt:.0f} s)",
                  flush=True)
        else:
            n_fail += 1
            with open(failed_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"FAIL {cid}: {rec['error']} ({dt:.0f} s)", flush=True)
            if rec.get("traceback"):  # where it broke, for the log of a run on a borrowed machine
                print("     " + rec["traceback"].strip().splitlines()[-3:][0], flush=True)
    print(f"{n_ok} measured -> {a.out}; {n_fail} failed" + (f" -> {failed_path}" if n_fail else "")
          + f"; {time.time() - t_all:.0f} s in all")
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
