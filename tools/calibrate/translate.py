"""memsim config -> what the calibration harness runs. Torch-free on purpose.

`translate(item)` reads one memsim config (or a validation-case wrapper around one) and returns a *plan*: a plain
JSON-serialisable dict naming everything calibrate.py will do on the GPU (the dict for
`transformers.AutoConfig.for_model`, the attention implementation, the dtypes, the optimizer class and its
arguments, checkpointing, the loss, PEFT and bitsandbytes settings). Settings the harness cannot reproduce
faithfully raise `Unsupported`, which names every offending field; nothing is silently ignored.

Fields a config leaves out take memsim's defaults (MEMSIM_DEFAULTS, the output of `memsim-cli config`), because
those are what memsim will simulate. Note that memsim's defaults are an 8-GPU ZeRO-3 DeepSpeed run, so a config
for this harness must set at least training.framework, training.precision and the parallel section.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import programs  # noqa: E402  (model programs: their own translation and builders)

HARNESS_NAME = "memsim calibration harness (tools/calibrate/calibrate.py)"
HARNESS_VERSION = 2
DEFAULT_STEPS = 3

# ---------------------------------------------------------------------------------------------------------------
# memsim's defaults for fields a config leaves out (src/core/config.h; checked against `memsim-cli config` by
# test_calibrate.py where the binary is built). The model section has no fixed defaults: memsim starts from the
# structure of model_type (serialize.cpp hf_structure), mirrored in STRUCTURE below.
# ---------------------------------------------------------------------------------------------------------------
MEMSIM_DEFAULTS = {
    "training": {
        "micro_batch_size": 4,
        "sequence_length": 4096,
        "decoder_sequence_length": 0,
        "gradient_accumulation_steps": 1,
        "framework": "deepspeed",
        "precision": "bf16_mixed",
        "optimizer": "adamw",
        "optimizer_impl": "auto",
        "activation_checkpointing": "full",
        "checkpoint_every_k_layers": 2,
        "checkpoint_reentrant": "auto",
        "attention": "auto",
        "norm_impl": "auto",
        "loss": "auto",
        "loss_chunks": 8,
        "activation_offload": False,
        "optimizer_in_backward": False,
        "compile": False,
        "zero_grad_set_to_none": "auto",
        "zero_grad_at": "after_step",
        "softmax_saves_input": "auto",
        "empty_cache_steps": -1,
        "objective": "sft",
        "train_projector": "auto",
        "train_vision_tower": False,
        "vit_gradient_checkpointing": "auto",
        "ema": "none",
        "reference_model": "auto",
        "nll_alpha": 0.0,
        "num_generations": 8,
        "completion_length": 256,
        "generation_engine": "hf_generate",
        "gpu_memory_utilization": 0.3,
        "vllm_sleep": False,
        "reward_model": "none",
        "value_model": "full",
        "use_cache": True,
        "steps_per_generation": 0,
        "num_iterations": 1,
        "vllm_server_tensor_parallel_size": 1,
        "vllm_server_data_parallel_size": 1,
        "vllm_server_gpu_memory_utilization": 0.9,
        "vllm_max_model_len": 0,
        "eval_batch_size": 0,
        "eval_logits_batches": 0,
    },
    "peft": {
        "method": "none",
        "lora_rank": 8,
        "lora_alpha": 16.0,
        "lora_dropout": 0.0,
        "target_modules": "q_proj,v_proj",
        "feedforward_modules": "down_proj",
        "num_virtual_tokens": 20,
        "adapter_prompt_length": 10,
        "adapter_start_layer": 2,
        "adapter_dtype": "auto",
        "base_quantization": "none",
        "double_quantization": False,
        "quant_group_size": 128,
        "prepare_kbit": "auto",
        "bnb_saves_input": "auto",
        "modules_to_save": "",
    },
    "parallel": {
        "data_parallel_size": 8,
        "zero_stage": 3,
        "sharding": "auto",
        "shard_group_size": 0,
        "fsdp_backward_prefetch": "backward_pre",
        "fsdp_forward_prefetch": 0,
        "fsdp2_backward_prefetch": 1,
        "fsdp_shard_embeddings": False,
        "fsdp_use_orig_params": "auto",
        "fsdp_no_sync": "auto",
        "fsdp_checkpoint_in_units": False,
        "tensor_parallel_size": 1,
        "sequence_parallel": False,
        "context_parallel_size": 1,
        "cp_rotate_method": "auto",
        "expert_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "pipeline_schedule": "1f1b",
        "virtual_pipeline_stages": 2,
        "pipeline_first_stage_layers": 0,
        "pipeline_last_stage_layers": 0,
        "offload_optimizer": "none",
        "offload_params": "none",
        "zero_reduce_bucket_size": 0,
        "zero_overlap_comm": "auto",
        "zero_prefetch_bucket_size": 0,
        "zero_param_persistence_threshold": 0,
        "zero_max_live_parameters": 0,
        "ddp_gradient_as_bucket_view": False,
    },
    "hardware": {"gpu": "a100-80gb", "gpu_memory_bytes": 0, "headroom_fraction": 0.10, "cuda_context_bytes": 0,
                 "cuda_module_loading": "auto", "expandable_segments": "auto", "nccl_channels": 16, "gpus_per_node": 8,
                 "host_memory_bytes": 0},
    "versions": {"torch": "latest", "transformers": "latest", "peft": "latest", "bitsandbytes": "latest",
                 "deepspeed": "latest", "torchao": "latest", "flash_attn": "latest", "torchtune": "latest", "unsloth": "latest",
                 "trl": "latest", "vllm": "latest", "liger": "latest", "date": ""},
}

OBJECTIVES = ("sft", "dpo", "orpo", "simpo", "grpo", "kto", "ppo")
SECTIONS = ("schema", "model", "training", "peft", "parallel", "hardware", "data", "versions")
SCHEMAS = (1, 2, 3)

# Schema 2 made the switches that library versions decide derivable: auto (derived from the versions section),
# true or false (serialize.cpp kSchema1Switches). The harness runs the installed libraries, which memsim's "latest"
# stands for, so it accepts only latest versions and no date, and an auto switch takes what memsim derives for the
# newest versions (frameworks.cpp resolve(); the harness's frameworks use transformers' model code and PEFT):
LATEST_SWITCHES = {
    ("training", "zero_grad_set_to_none"): True,   # torch >= 2.0 (pytorch#92731)
    ("training", "softmax_saves_input"): False,    # torch >= 1.11 (pytorch#66018)
    ("peft", "bnb_saves_input"): False,            # bitsandbytes >= 0.43.2 (bitsandbytes#1270)
    ("hardware", "expandable_segments"): False,    # no launcher of the HF frameworks sets it
    ("peft", "prepare_kbit"): True,                # the harness's frameworks call PEFT's helper (schema 3; no TRL)
}

# What memsim's frameworks do where they differ (src/core/frameworks.cpp; checked by test_calibrate.py). The
# harness reproduces only the two that run transformers model code in a torch loop.
FRAMEWORKS = {
    "hf_loop": {
        "attention": "sdpa", "norm_impl": "eager_fp32", "loss": "hf_fp32_upcast", "optimizer_impl": "foreach",
        "param_groups": 1, "holds_logits": True,
        "loop": "out = model(input_ids, labels=labels); (out.loss / gas).backward(); `out` (and its logits) is "
                "held through backward; one parameter group",
    },
    "hf_trainer": {
        "attention": "sdpa", "norm_impl": "eager_fp32", "loss": "hf_fp32_upcast", "optimizer_impl": "fused",
        "param_groups": 2, "holds_logits": False,
        "loop": "Trainer-like: loss = model(input_ids, labels=labels).loss, the outputs are dropped before "
                "backward; two parameter groups (weight decay on matrices and embeddings, none on norms and "
                "biases); no gradient clipping, no Trainer bookkeeping",
    },
}
OTHER_FRAMEWORKS = ("deepspeed", "torchtune", "litgpt", "megatron", "torchtitan", "unsloth")

PRECISIONS = {
    # param dtype, autocast dtype, grad scaler
    "fp32": ("float32", None, False),
    "amp_bf16": ("float32", "bfloat16", False),
    "amp_fp16": ("float32", "float16", True),
    "bf16_pure": ("bfloat16", None, False),
    # 16-bit weights under the Trainer's autocast (--bf16 / --fp16 over a model loaded in 16 bits: a QLoRA base's
    # non-quantized parts, its fp32 adapters); fp16 with the Trainer's GradScaler, which unscales fp32 gradients only
    "bf16_autocast": ("bfloat16", "bfloat16", False),
    "fp16_autocast": ("float16", "float16", True),
}
PADDED_ROW_RULE = "row i of B holds ceil(L x (B - i) / B) tokens"


def padded_row_lengths(micro_batch_size, length):
    """The rows of a padded micro-batch of listed length L (the plan's batch.padded_rows): the first holds L tokens,
    the others fewer, evenly spread (PADDED_ROW_RULE). memsim knows only L; the spread makes the padding real."""
    B = micro_batch_size
    return [-(-length * (B - i) // B) for i in range(B)]


PRECISIONS_NEEDING_A_FRAMEWORK = {
    "bf16_mixed": "bf16 weights and gradients with fp32 master weights in the optimizer (DeepSpeed/ZeRO)",
    "fp16_mixed": "fp16 weights and gradients with fp32 master weights and loss scaling (DeepSpeed)",
    "bf16_fp32_grads": "bf16 weights with fp32 main gradients and master weights (Megatron)",
    "fp8_te": "fp8 matmuls through Transformer Engine modules (Megatron-style bf16 + fp32 main grads)",
    "fp8_torchao": "fp8 matmuls through torchao's Float8Linear",
    "fp8_torchao_fp8_allgather": "fp8 matmuls through torchao's Float8Linear with fp8 FSDP all-gather",
}

TORCH_OPTIMIZERS = {
    # name -> (torch class, kwargs, implementations torch offers)
    "adamw": ("torch.optim.AdamW", {"lr": 1e-5}, ("foreach", "fused", "for_loop")),
    "adam": ("torch.optim.Adam", {"lr": 1e-5}, ("foreach", "fused", "for_loop")),
    "sgd": ("torch.optim.SGD", {"lr": 1e-4, "momentum": 0.0}, ("foreach", "fused", "for_loop")),
    "sgd_momentum": ("torch.optim.SGD", {"lr": 1e-4, "momentum": 0.9}, ("foreach", "fused", "for_loop")),
    "adafactor": ("torch.optim.Adafactor", {"lr": 1e-3}, ("foreach", "for_loop")),
}
BNB_OPTIMIZERS = {
    "adamw_8bit": ("bitsandbytes.optim.AdamW8bit", {"lr": 1e-5}),
    "paged_adamw": ("bitsandbytes.optim.PagedAdamW32bit", {"lr": 1e-5}),
    "paged_adamw_8bit": ("bitsandbytes.optim.PagedAdamW8bit", {"lr": 1e-5}),
    "lion": ("bitsandbytes.optim.Lion32bit", {"lr": 1e-5}),
}
OPTIMIZER_STATE_DTYPE = {
    "adamw_8bit": "uint8 blockwise (fp32 for tensors under 4096 elements)",
    "paged_adamw_8bit": "uint8 blockwise, paged (unified memory, not counted by the torch allocator)",
    "paged_adamw": "fp32, paged (unified memory, not counted by the torch allocator)",
    "lion": "fp32 (one momentum buffer)",
    "sgd": "none",
    "adafactor": "factored second moment (row + column), param dtype",
}

ATTENTION = {"sdpa": "sdpa", "sdpa_repeat_kv": "sdpa", "eager": "eager", "flash_attention_2": "flash_attention_2"}
LOSSES = ("hf_fp32_upcast", "full_fp32", "chunked_fp32", "chunked_bf16", "fused_linear")
CHECKPOINTING = ("none", "full", "selective", "selective_op", "every_k")
NORM_IMPLS = ("auto", "eager_fp32", "fp32_scale", "fused")
OPTIMIZER_IMPLS = ("auto", "foreach", "fused", "for_loop")

# ---------------------------------------------------------------------------------------------------------------
# Model section
# ---------------------------------------------------------------------------------------------------------------

# Every model field memsim reads (serialize.cpp visit_fields), with memsim's default before hf_structure.
MEMSIM_MODEL_FIELDS = {
    "name": "", "model_type": "llama", "hidden_size": 0, "num_hidden_layers": 0, "num_attention_heads": 0,
    "num_key_value_heads": 0, "head_dim": 0, "intermediate_size": 0, "vocab_size": 0,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False, "lm_head_bias": False, "norm_type": "rmsnorm", "mlp_gated": True, "qkv_bias": False,
    "fused_qkv": False, "qk_norm": False,
    "qk_norm_per_head": True, "norms_per_layer": 2, "position_embedding_type": "rope", "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0,
    "shared_expert_intermediate_size": 0, "first_k_dense_replace": 0, "router_bias": False,
    "moe_capacity_factor": 0.0, "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0,
    "v_head_dim": 0, "post_layernorm": False, "type_vocab_size": 0, "task_head": "causal_lm", "num_labels": 2,
    "is_encoder_decoder": False, "num_decoder_layers": 0, "relative_attention_num_buckets": 32,
    # A model program (memsim's src/core/architecture.h); the harness trains the built-in families only.
    "architecture": "", "architecture_args": "",
    # A vision-language model's tower and projector (model.vision_tower); the harness trains text-only models.
    "vision_tower": "", "vision_tower_args": "", "projector_depth": 2,
}
# Older and model-specific HF names memsim reads as its own (serialize.cpp kAliases).
ALIASES = {
    "n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
    "n_inner": "intermediate_size", "n_positions": "max_position_embeddings", "activation_function": "hidden_act",
    "use_qkv_bias": "qkv_bias", "num_kv_heads": "num_key_value_heads", "_name_or_path": "name",
    "num_local_experts": "num_experts", "n_routed_experts": "num_experts",
    "attention_probs_dropout_prob": "attention_dropout", "attn_pdrop": "attention_dropout",
    "hidden_dropout_prob": "hidden_dropout", "resid_pdrop": "hidden_dropout",
}
# HF keys that are bookkeeping, or that the harness sets itself; never passed to AutoConfig.
DROPPED_HF_KEYS = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "use_cache", "gradient_checkpointing",
    "id2label", "label2id", "num_labels", "model_type", "_attn_implementation", "attn_implementation",
}

# What transformers' model class builds for each supported model_type, in memsim's structural terms.
_DECODER = {
    "norm_type": "rmsnorm", "mlp_gated": True, "qkv_bias": False, "qk_norm": False, "qk_norm_per_head": True,
    "norms_per_layer": 2, "position_embedding_type": "rope", "post_layernorm": False, "task_head": "causal_lm",
    "type_vocab_size": 0, "hidden_dropout": 0.0, "router_bias": False, "moe_capacity_factor": 0.0,
    "q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0, "v_head_dim": 0,
}
STRUCTURE = {
    # model_type -> (fixed structure, HF keys that carry attention_bias / mlp_bias, MoE flavour, notes)
    "llama": dict(_DECODER),
    "mistral": dict(_DECODER),
    "qwen2": dict(_DECODER, qkv_bias=True),
    "qwen3": dict(_DECODER, qk_norm=True),
    "mixtral": dict(_DECODER),
    "qwen3_moe": dict(_DECODER, qk_norm=True),
}
ATTENTION_BIAS_KEY = {"llama", "qwen3", "qwen3_moe"}  # configs whose attention_bias switches q/k/v/o biases
MLP_BIAS_KEY = {"llama"}
MOE_TYPES = {"mixtral", "qwen3_moe"}
SLIDING_WINDOW_KEY = {"mistral", "mixtral"}         # sliding_window applies whenever it is set
USE_SLIDING_WINDOW_KEY = {"qwen2", "qwen3", "qwen3_moe"}  # sliding_window applies only with use_sliding_window
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


class Unsupported(Exception):
    """A setting the harness cannot reproduce faithfully. `errors` is a list of (field, message)."""

    def __init__(self, errors):
        self.errors = list(errors)
        super().__init__("; ".join(f"{f}: {m}" for f, m in self.errors))

    @property
    def fields(self):
        return [f for f, _ in self.errors]


# ---------------------------------------------------------------------------------------------------------------
# Input files
# ---------------------------------------------------------------------------------------------------------------

def parse_items(text):
    """Configs in a text: one JSON object, a JSON list, {"configs": [...]} (sweep.json), or JSONL."""
    text = text.strip()
    if not text:
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if doc is None:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("//"):
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n}: not JSON ({e})") from None
        return items
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("configs"), list) and "model" not in doc:
        return doc["configs"]
    return [doc]


def load_items(path):
    with open(path, encoding="utf-8") as f:
        return parse_items(f.read())


def unwrap(item):
    """(id, config, extra) from a bare config or a wrapper {"id", "config", "comment"/"notes"/...}."""
    if not isinstance(item, dict):
        raise Unsupported([("config", f"each config must be a JSON object, got {type(item).__name__}")])
    if "config" in item and "model" not in item:
        config = item["config"]
        if not isinstance(config, dict):
            raise Unsupported([("config", "the wrapper's config must be a JSON object")])
        extra = {k: v for k, v in item.items() if k != "config"}
        return item.get("id") or default_id(config), config, extra
    return default_id(item), item, {}


def _slug(s):
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", str(s)).strip("-").lower()[:60] or "model"


def default_id(config):
    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]
    model = config.get("model", {}) if isinstance(config.get("model"), dict) else {}
    t = config.get("training", {}) if isinstance(config.get("training"), dict) else {}
    name = model.get("name") or model.get("_name_or_path") or model.get("architecture") or model.get("model_type") or "model"
    return "calib-" + "-".join(_slug(x) for x in (name, t.get("precision", "?"), t.get("optimizer", "?"))) + "-" + digest


# ---------------------------------------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------------------------------------

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def effective_model(model):
    """The model memsim simulates: model_type's structure, then the config's keys (aliases resolved)."""
    norm = dict(model)
    for alias, canon in ALIASES.items():
        if canon not in norm and alias in norm:
            norm[canon] = norm[alias]
    mtype = norm.get("model_type") if isinstance(norm.get("model_type"), str) else "llama"
    eff = dict(MEMSIM_MODEL_FIELDS)
    eff.update(STRUCTURE.get(mtype, {}))
    eff["model_type"] = mtype
    if "task_head" not in norm and isinstance(norm.get("architectures"), list):
        if any(isinstance(a, str) and "ForSequenceClassification" in a for a in norm["architectures"]):
            eff["task_head"] = "sequence_classification"
    for k in MEMSIM_MODEL_FIELDS:
        if k in norm and norm[k] is not None:
            eff[k] = norm[k]
    if "num_key_value_heads" not in norm or norm["num_key_value_heads"] is None:
        eff["num_key_value_heads"] = eff["num_attention_heads"]
    return eff, norm


def head_dim_of(eff):
    if eff["head_dim"]:
        return eff["head_dim"]
    return eff["hidden_size"] // eff["num_attention_heads"] if eff["num_attention_heads"] else 0


def expected_params(eff):
    """Parameters transformers builds for the effective model (equals memsim's params_total for these types)."""
    h, L, V = eff["hidden_size"], eff["num_hidden_layers"], eff["vocab_size"]
    d = head_dim_of(eff)
    qw, kvw = eff["num_attention_heads"] * d, eff["num_key_value_heads"] * d
    qkv_bias = eff["attention_bias"] or eff["qkv_bias"]
    attn = h * qw + 2 * h * kvw + qw * h
    if qkv_bias:
        attn += qw + 2 * kvw
    if eff["attention_bias"]:
        attn += h
    if eff["qk_norm"]:
        attn += 2 * d if eff["qk_norm_per_head"] else qw + kvw
    norms = 2 * h
    inter = eff["intermediate_size"]
    dense_mlp = 3 * h * inter + (2 * inter + h if eff["mlp_bias"] else 0)
    per_dense = attn + norms + dense_mlp
    total = V * h + h + (0 if eff["tie_word_embeddings"] else V * h)
    E = eff["num_experts"]
    if E > 0:
        fe = eff["moe_intermediate_size"] or inter
        per_moe = attn + norms + E * h + E * 3 * h * fe
        k = min(eff["first_k_dense_replace"], L)
        return total + k * per_dense + (L - k) * per_moe
    return total + L * per_dense


def linear_shapes(eff):
    """(in, out) of every linear PEFT can target in one dense layer, and of lm_head (MoE experts excluded)."""
    h, d, inter = eff["hidden_size"], head_dim_of(eff), eff["intermediate_size"]
    qw, kvw = eff["num_attention_heads"] * d, eff["num_key_value_heads"] * d
    return {"q_proj": (h, qw), "k_proj": (h, kvw), "v_proj": (h, kvw), "o_proj": (qw, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h), "lm_head": (h, eff["vocab_size"])}


def expected_adapter_params(eff, peft):
    """LoRA A/B (and DoRA magnitude) parameters PEFT adds; memsim's params_total includes them."""
    if not peft:
        return 0
    shapes = linear_shapes(eff)
    targets = peft["target_modules"]
    names = [m for m in shapes if m != "lm_head"] if targets == "all-linear" else list(targets)
    per_layer = head = 0
    for m in names:
        i, o = shapes[m]
        n = peft["r"] * (i + o) + (o if peft["use_dora"] else 0)
        if m == "lm_head":
            head += n
        else:
            per_layer += n
    return per_layer * eff["num_hidden_layers"] + head


def _check_model(model, training, errors, notes):
    if not isinstance(model, dict):
        errors.append(("model", "the model section must be a JSON object"))
        return None, None
    if "text_config" in model and "hidden_size" not in model:
        errors.append(("model.text_config", "multimodal configs are not supported; give the language model's keys"))
        return None, None
    eff, norm = effective_model(model)
    mtype = eff["model_type"]
    if mtype not in STRUCTURE:
        errors.append(("model.model_type", f"\"{mtype}\" is not supported by the harness; supported: "
                       + ", ".join(sorted(STRUCTURE)) + " (the structural checks are written per model_type)"))
        return None, None
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"):
        if not _is_int(norm.get(k)) or norm.get(k) <= 0:
            errors.append((f"model.{k}", "a positive integer is required"))
    if errors and any(f.startswith("model.") for f, _ in errors):
        return None, None
    for k in ("num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
              "first_k_dense_replace", "max_position_embeddings"):
        if not _is_int(eff[k]) or eff[k] < 0:
            errors.append((f"model.{k}", f"must be a non-negative integer; got {eff[k]!r}"))
    if errors:
        return None, None

    # Structure that transformers' class for this model_type fixes.
    for field, want in STRUCTURE[mtype].items():
        got = eff[field]
        if got != want and not (_is_num(got) and _is_num(want) and float(got) == float(want)):
            errors.append((f"model.{field}", f"{got!r}, but transformers' {mtype} model has {field} = {want!r}; "
                           "the harness would measure a different model than memsim simulates"))
    if eff["attention_bias"] and mtype not in ATTENTION_BIAS_KEY:
        errors.append(("model.attention_bias", f"true, but transformers' {mtype} attention has no such switch"))
    if eff["mlp_bias"] and mtype not in MLP_BIAS_KEY:
        errors.append(("model.mlp_bias", f"true, but transformers' {mtype} MLP has no such switch"))
    if eff.get("lm_head_bias"):
        errors.append(("model.lm_head_bias", "true: the harness builds no model whose head has a bias (PhiMoE's "
                       "is not among the classes it drives)"))
    heads, kv = eff["num_attention_heads"], eff["num_key_value_heads"]
    if kv <= 0 or heads % kv:
        errors.append(("model.num_key_value_heads", f"{kv} must divide num_attention_heads ({heads})"))
    if not eff["head_dim"] and eff["hidden_size"] % heads:
        errors.append(("model.head_dim", "0 (hidden_size / num_attention_heads), but hidden_size is not a multiple "
                       "of num_attention_heads; give head_dim"))

    # Mixture of experts.
    E = eff["num_experts"]
    if mtype in MOE_TYPES:
        if E <= 0 or eff["num_experts_per_tok"] <= 0 or eff["num_experts_per_tok"] > E:
            errors.append(("model.num_experts", f"{mtype} needs num_experts > 0 and 0 < num_experts_per_tok <= "
                           f"num_experts; got {E} and {eff['num_experts_per_tok']}"))
        if eff["shared_expert_intermediate_size"]:
            errors.append(("model.shared_expert_intermediate_size", f"transformers' {mtype} has no shared experts"))
        if mtype == "mixtral":
            if eff["moe_intermediate_size"] not in (0, eff["intermediate_size"]):
                errors.append(("model.moe_intermediate_size", "Mixtral experts use intermediate_size; give 0"))
            if eff["first_k_dense_replace"]:
                errors.append(("model.first_k_dense_replace", "every Mixtral layer is a MoE layer; give 0"))
        if mtype == "qwen3_moe":
            step = norm.get("decoder_sparse_step", 1)
            if step != 1:
                errors.append(("model.decoder_sparse_step", f"{step}: memsim models MoE layers after the first "
                               "first_k_dense_replace layers, every layer; only 1 is reproduced"))
            k = eff["first_k_dense_replace"]
            mlp_only = norm.get("mlp_only_layers")
            if mlp_only not in (None, []) and mlp_only != list(range(k)):
                errors.append(("model.mlp_only_layers", f"{mlp_only!r} differs from the first first_k_dense_replace "
                               f"({k}) layers that memsim makes dense"))
        if norm.get("output_router_logits"):
            errors.append(("model.output_router_logits", "true adds the router auxiliary loss, which memsim does "
                           "not model"))
    else:
        for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "first_k_dense_replace"):
            if eff[k]:
                errors.append((f"model.{k}", f"{eff[k]}, but {mtype} is a dense model"))

    # HF keys memsim ignores but that change the model.
    if "quantization_config" in norm:
        errors.append(("model.quantization_config", "a quantized checkpoint; use peft.base_quantization"))
    if norm.get("pretraining_tp", 1) not in (1, None):
        errors.append(("model.pretraining_tp", "values above 1 split the linears in forward; not modelled"))
    seq = training.get("sequence_length", MEMSIM_DEFAULTS["training"]["sequence_length"])
    window = norm.get("sliding_window")
    if mtype in SLIDING_WINDOW_KEY and _is_int(window) and _is_int(seq) and window < seq:
        errors.append(("model.sliding_window", f"{window} is below training.sequence_length ({seq}); memsim "
                       "models full causal attention"))
    if mtype in USE_SLIDING_WINDOW_KEY and norm.get("use_sliding_window") and _is_int(window) and _is_int(seq) \
            and window < seq:
        errors.append(("model.use_sliding_window", f"sliding_window {window} is below training.sequence_length "
                       f"({seq}); memsim models full causal attention"))
    if not isinstance(eff["hidden_act"], str):
        errors.append(("model.hidden_act", "must be a string"))
    if errors:
        return None, None

    # The dict for AutoConfig.for_model: HF keys passed through, memsim's effective values written explicitly.
    hf = {}
    for k, v in norm.items():
        if k in MEMSIM_MODEL_FIELDS or k in ALIASES or k in DROPPED_HF_KEYS:
            continue
        hf[k] = copy.deepcopy(v)
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "hidden_act",
              "attention_dropout"):
        hf[k] = eff[k]
    hf["head_dim"] = head_dim_of(eff)
    if mtype in ATTENTION_BIAS_KEY:
        hf["attention_bias"] = bool(eff["attention_bias"])
    if mtype in MLP_BIAS_KEY:
        hf["mlp_bias"] = bool(eff["mlp_bias"])
    if mtype == "mixtral":
        hf["num_local_experts"] = E
        hf["num_experts_per_tok"] = eff["num_experts_per_tok"]
    if mtype == "qwen3_moe":
        hf["num_experts"] = E
        hf["num_experts_per_tok"] = eff["num_experts_per_tok"]
        hf["moe_intermediate_size"] = eff["moe_intermediate_size"] or eff["intermediate_size"]
        hf["mlp_only_layers"] = list(range(eff["first_k_dense_replace"]))
        hf["decoder_sparse_step"] = 1
        hf["output_router_logits"] = False
        if eff["moe_intermediate_size"] == 0:
            notes.append("model.moe_intermediate_size: 0 means intermediate_size in memsim; passed as such")
    if mtype in SLIDING_WINDOW_KEY and "sliding_window" not in norm:
        hf["sliding_window"] = None
        notes.append(f"model.sliding_window: not given; set to None (full attention, as memsim models) instead of "
                     f"the {mtype} config class default")
    if mtype in USE_SLIDING_WINDOW_KEY and "use_sliding_window" not in norm:
        hf["use_sliding_window"] = False
    hf["use_cache"] = False
    return eff, hf


def _section(config, name, errors):
    sec = config.get(name, {})
    if not isinstance(sec, dict):
        errors.append((name, f"the {name} section must be a JSON object"))
        return {}
    eff = dict(MEMSIM_DEFAULTS[name])
    for k, v in sec.items():
        if k not in eff:
            errors.append((f"{name}.{k}", "unknown field (memsim would reject it too)"))
        else:
            eff[k] = v
    return eff


def _choice(errors, field, value, allowed):
    if value not in allowed:
        errors.append((field, f"must be one of: {', '.join(allowed)}; got {value!r}"))
        return False
    return True


def translate(item, steps=DEFAULT_STEPS):
    """Plan for one config or case wrapper. Raises Unsupported naming every field it cannot reproduce."""
    cid, config, extra = unwrap(item)
    errors, notes = [], []
    for k in config:
        if k not in SECTIONS:
            errors.append((k, f"unknown section; a memsim config has {', '.join(SECTIONS)}"))
    if "schema" in config and config["schema"] not in SCHEMAS:
        errors.append(("schema", f"{config['schema']!r}: the harness reads schemas 1 to 3"))
    for lib, v in _section(config, "versions", errors).items():
        if lib == "date" and v != "":
            errors.append(("versions.date", f"{v!r}: the harness runs the installed libraries, which memsim's latest "
                           "versions stand for; a date would derive switches this run does not reproduce"))
        elif lib != "date" and v != "latest":
            errors.append((f"versions.{lib}", f"{v!r}: the harness runs the installed {lib}, which memsim's latest "
                           "stands for; a stated version would derive switches this run does not reproduce"))
    if "model" not in config:
        errors.append(("model", "the model section is required (memsim's default model is not a real checkpoint "
                       "shape the harness should guess)"))

    t = _section(config, "training", errors)
    p = _section(config, "parallel", errors)
    hw = _section(config, "hardware", errors)
    pf = _section(config, "peft", errors)
    for (name, key), latest in LATEST_SWITCHES.items():
        sec = {"training": t, "peft": pf, "hardware": hw}[name]
        if key not in sec:
            continue
        v = sec[key]
        if v == "auto":
            sec[key] = latest
            notes.append(f"{name}.{key}: auto -> {str(latest).lower()} (the newest versions')")
        elif v in ("true", "false"):
            sec[key] = v == "true"  # schema 2 writes them as strings; schema 1 as JSON booleans
    if pf.get("adapter_dtype") == "auto":
        pf["adapter_dtype"] = "fp32"  # peft >= 0.12: get_peft_model autocasts adapters to fp32 (peft#1706)
    if t.get("empty_cache_steps") == -1:
        # auto: only the HF Trainer of transformers 4.41 emptied the cache at every step (transformers#28769, #31530)
        t["empty_cache_steps"] = 0
        notes.append("training.empty_cache_steps: auto -> 0 (never: the newest versions')")
    given_training = config.get("training", {}) if isinstance(config.get("training"), dict) else {}
    given_parallel = config.get("parallel", {}) if isinstance(config.get("parallel"), dict) else {}

    eff = hf = prog = None
    if isinstance(config.get("model"), dict) and config["model"].get("architecture"):
        # a model program (memsim's src/core/catalog/architectures): programs.py builds its library's class; the
        # built-in structural fields beside it (memsim-cli config writes them all) are not read
        prog = programs.translate_program(config["model"], t, pf, errors, notes)
    elif "model" in config:
        eff, hf = _check_model(config["model"], given_training, errors, notes)

    # --- parallel: one GPU only
    for k, want in (("data_parallel_size", 1), ("zero_stage", 0), ("tensor_parallel_size", 1),
                    ("pipeline_parallel_size", 1), ("context_parallel_size", 1), ("expert_parallel_size", 1),
                    ("offload_optimizer", "none"), ("offload_params", "none")):
        if p[k] != want:
            how = "" if k in given_parallel else f" (not given: memsim's default is {p[k]})"
            errors.append((f"parallel.{k}", f"{p[k]}{how}; the harness runs one GPU without ZeRO: set {want}"))

    # --- integers
    for k in ("micro_batch_size", "sequence_length", "gradient_accumulation_steps", "checkpoint_every_k_layers",
              "loss_chunks"):
        if not _is_int(t[k]) or t[k] < 1:
            errors.append((f"training.{k}", f"must be a positive integer; got {t[k]!r}"))

    # --- framework
    fw = t["framework"]
    spec = FRAMEWORKS.get(fw)
    if spec is None:
        how = "" if "framework" in given_training else " (not given: memsim's default)"
        if fw in OTHER_FRAMEWORKS:
            errors.append(("training.framework", f"{fw}{how}: the harness runs transformers model code in a plain "
                           "torch loop; it reproduces hf_loop and hf_trainer only"))
        else:
            errors.append(("training.framework", f"unknown value {fw!r}"))
        spec = FRAMEWORKS["hf_loop"]

    def resolved(field):
        v = t[field]
        if v == "auto":
            notes.append(f"training.{field}: auto -> {spec[field]} ({fw})")
            return spec[field]
        return v

    # --- precision
    prec = t["precision"]
    if prec in PRECISIONS_NEEDING_A_FRAMEWORK:
        how = "" if "precision" in given_training else " (not given: memsim's default)"
        errors.append(("training.precision", f"{prec}{how}: {PRECISIONS_NEEDING_A_FRAMEWORK[prec]} needs "
                       "DeepSpeed/Megatron; a torch loop cannot reproduce it faithfully. Use fp32, amp_bf16, "
                       "amp_fp16, bf16_pure, bf16_autocast or fp16_autocast"))
        param_dtype, autocast, scaler = "bfloat16", None, False
    elif prec in PRECISIONS:
        param_dtype, autocast, scaler = PRECISIONS[prec]
    else:
        errors.append(("training.precision", f"unknown value {prec!r}"))
        param_dtype, autocast, scaler = "float32", None, False

    # --- attention
    attention = resolved("attention") if _choice(errors, "training.attention", t["attention"],
                                                 ("auto",) + tuple(ATTENTION)) else "sdpa"
    attn_impl = ATTENTION.get(attention, "sdpa")
    if attention == "sdpa_repeat_kv":
        notes.append("training.attention: sdpa_repeat_kv runs transformers' sdpa; whether it expands k/v for GQA "
                     "depends on the transformers and torch versions (sdpa_attention.py use_gqa_in_sdpa)")
    if attn_impl == "flash_attention_2" and prec == "fp32":
        errors.append(("training.attention", "flash_attention_2 needs fp16/bf16 inputs; with fp32 transformers "
                       "casts q/k/v silently"))

    # --- norm
    if _choice(errors, "training.norm_impl", t["norm_impl"], NORM_IMPLS):
        norm_impl = resolved("norm_impl")
        if norm_impl != "eager_fp32":
            errors.append(("training.norm_impl", f"{norm_impl}: the harness runs the model's own norm "
                           "(transformers' RMSNorm upcasts to fp32 = eager_fp32)"))

    # --- loss
    loss = "hf_fp32_upcast"
    if _choice(errors, "training.loss", t["loss"], ("auto",) + LOSSES):
        loss = resolved("loss")

    # --- objective: supervised, or DPO as TRL's DPOTrainer._compute_loss runs it at its newest release (the harness
    # runs the installed libraries, which memsim's latest stands for; docs/research/preference.md)
    objective = None
    if t["objective"] == "grpo":
        objective = _grpo_objective(t, pf, fw, errors)
    elif t["objective"] == "ppo":
        objective = _ppo_objective(t, pf, fw, errors, eff)
    elif _choice(errors, "training.objective", t["objective"], OBJECTIVES) and t["objective"] != "sft":
        ref = t["reference_model"]
        if ref == "auto":
            ref = "adapter_disabled" if pf.get("method", "none") != "none" else "copy"
        kind = t["objective"]
        if kind not in ("dpo", "kto"):
            errors.append(("training.objective", f"{kind}: the harness reproduces DPO and KTO (TRL's "
                           "DPOTrainer._compute_loss, KTOTrainer._compute_loss), GRPO and PPO; orpo and simpo are "
                           "not reproduced yet"))
        if ref not in ("copy", "adapter_disabled", "precomputed"):
            errors.append(("training.reference_model", f"{ref}: {kind} needs copy, adapter_disabled or precomputed"))
        if kind == "kto" and t["micro_batch_size"] < 2:
            errors.append(("training.micro_batch_size", "kto estimates its KL term from the other rows of the "
                           "micro-batch: at least 2 (KTOTrainer's check)"))
        if kind == "kto" and isinstance(t["nll_alpha"], (int, float)) and t["nll_alpha"] > 0:
            errors.append(("training.nll_alpha", "kto has no NLL term: 0"))
        if ref == "adapter_disabled" and pf.get("method", "none") == "none":
            errors.append(("training.reference_model", "adapter_disabled needs a PEFT method"))
        if fw != "hf_trainer":
            errors.append(("training.framework", f"{fw}: DPO runs TRL's DPOTrainer on the HF Trainer; set hf_trainer"))
        if t["loss"] != "auto":
            errors.append(("training.loss", "with training.objective dpo the loss is TRL's log-probabilities: auto"))
        if not isinstance(t["nll_alpha"], (int, float)) or t["nll_alpha"] < 0:
            errors.append(("training.nll_alpha", f"must be a number from 0; got {t['nll_alpha']!r}"))
        objective = {
            # beta: DPOConfig's and KTOConfig's default (0.1); memory does not depend on it
            "kind": kind, "reference": ref, "beta": 0.1, "nll_alpha": t["nll_alpha"],
            # accelerate's convert_outputs_to_fp32 under the Trainer's bf16/fp16 (TRL's configs set bf16), outside
            # DeepSpeed: the logits the loss reads are fp32 (memsim's PreferenceFlow::logits_fp32)
            "logits_fp32": True,
            "how": "TRL DPOTrainer._compute_loss (v1.9): one forward of [chosen; rejected], selective_log_softmax "
                   "of logits[..., :-1, :], the reference under no_grad with its logits alive to the loss, the "
                   "sigmoid loss, then entropy_from_logits and the masked logit means before backward",
        }
        if kind == "kto":
            objective["how"] = ("TRL KTOTrainer._compute_loss (v1.9): the KL batch (each row's prompt with the "
                                "previous row's completion) under no_grad, the batch's forward with "
                                "selective_log_softmax of logits[:, :-1, :], the reference's KL and batch forwards "
                                "under no_grad with its outputs alive to the loss, the KTO loss over the desirable "
                                "first half and the undesirable second half, then entropy_from_logits and "
                                "index_select copies of each half's logits before backward")

    # --- checkpointing
    ck = t["activation_checkpointing"]
    if _choice(errors, "training.activation_checkpointing", ck, CHECKPOINTING) and ck == "selective":
        errors.append(("training.activation_checkpointing", "selective (recompute the attention core only) has "
                       "no faithful equivalent on transformers model code"))
    if ck == "selective_op":
        errors.append(("training.activation_checkpointing", "selective_op is torchtitan's op-level policy on its "
                       "own model code; the harness runs transformers model code"))
    if ck != "none" and t.get("checkpoint_reentrant") in (True, "true"):
        errors.append(("training.checkpoint_reentrant", "true: the harness checkpoints non-reentrantly "
                       "(use_reentrant=False, transformers 5's default); set false or auto"))
    checkpointing = {"mode": ck, "use_reentrant": False}
    if ck == "every_k":
        checkpointing["every_k_layers"] = t["checkpoint_every_k_layers"]
        checkpointing["layers"] = "0, k, 2k, ... wrapped in torch.utils.checkpoint.checkpoint"
    elif ck == "full":
        checkpointing["how"] = "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})"

    # --- flags the harness cannot reproduce
    if t["zero_grad_at"] != "after_step":
        errors.append(("training.zero_grad_at", f"{t['zero_grad_at']}: the harness calls zero_grad after each "
                       "optimizer step (after_step)"))
    if t["activation_offload"]:
        errors.append(("training.activation_offload", "true: offloading saved activations to the host is a "
                       "torchtune/Megatron feature; not reproduced"))
    if t["compile"]:
        errors.append(("training.compile", "true: the harness runs eager PyTorch and does not torch.compile the model "
                       "(memsim models compile's saved set; tools/calibrate/probes/compile_saved.py measures it)"))
    if t["softmax_saves_input"] is True:
        errors.append(("training.softmax_saves_input", "true: that is torch <= 1.10's softmax; the harness runs the "
                       "installed torch, whose softmax keeps only its output"))
    for k in ("activation_offload", "compile", "optimizer_in_backward", "zero_grad_set_to_none", "softmax_saves_input"):
        if not isinstance(t[k], bool):
            errors.append((f"training.{k}", f"must be {'auto, ' if (('training', k) in LATEST_SWITCHES) else ''}true "
                           f"or false; got {t[k]!r}"))

    # --- PEFT
    peft = None
    method = pf["method"]
    if _choice(errors, "peft.method", method, ("none", "lora", "dora")):
        _choice(errors, "peft.adapter_dtype", pf["adapter_dtype"], ("fp32", "bf16", "fp16"))
        _choice(errors, "peft.base_quantization", pf["base_quantization"], ("none", "int8", "nf4", "fp4"))
        quant = pf["base_quantization"]
        if method == "none":
            if quant != "none":
                errors.append(("peft.base_quantization", f"{quant} needs peft.method lora or dora: quantized "
                               "weights cannot be trained in full"))
        else:
            if not _is_int(pf["lora_rank"]) or pf["lora_rank"] < 1:
                errors.append(("peft.lora_rank", f"must be a positive integer; got {pf['lora_rank']!r}"))
            if not _is_num(pf["lora_alpha"]) or pf["lora_alpha"] <= 0:
                errors.append(("peft.lora_alpha", "must be a number above 0"))
            if not _is_num(pf["lora_dropout"]) or not 0 <= pf["lora_dropout"] < 1:
                errors.append(("peft.lora_dropout", "must be a probability from 0 to below 1"))
            targets = pf["target_modules"]
            if not isinstance(targets, str) or not targets.strip():
                errors.append(("peft.target_modules", "must be a comma-separated string of module names or "
                               "all-linear"))
                targets = "q_proj,v_proj"
            if targets.strip() == "all-linear":
                target_list = "all-linear"
            else:
                target_list = [s.strip() for s in targets.split(",") if s.strip()]
                bad = [s for s in target_list if s not in LINEAR_MODULES]
                if bad:
                    errors.append(("peft.target_modules", f"{', '.join(bad)} not among this model's linears "
                                   f"({', '.join(LINEAR_MODULES)})"))
            mts = pf["modules_to_save"]
            if not isinstance(mts, str):
                errors.append(("peft.modules_to_save", "must be a comma-separated string"))
                mts = ""
            to_save = [s.strip() for s in mts.split(",") if s.strip()]
            if not isinstance(pf["double_quantization"], bool) or not isinstance(pf["prepare_kbit"], bool):
                errors.append(("peft.double_quantization", "double_quantization and prepare_kbit must be true or "
                               "false"))
            if not isinstance(pf["bnb_saves_input"], bool):
                errors.append(("peft.bnb_saves_input", "must be auto, true or false"))
            if pf["double_quantization"] and quant not in ("nf4", "fp4"):
                errors.append(("peft.double_quantization", f"true needs 4-bit base_quantization; got {quant}"))
            if eff is not None and eff["num_experts"] > 0:
                attn_only = {"q_proj", "k_proj", "v_proj", "o_proj"}
                if target_list == "all-linear" or not set(target_list) <= attn_only:
                    errors.append(("peft.target_modules", "on a MoE model only attention projections (q/k/v/o_proj) "
                                   "are reproduced: whether PEFT reaches the experts depends on the transformers "
                                   "version (nn.Linear experts before v5, grouped 3-D parameters after)"))
            if t["loss"] == "fused_linear" or (t["loss"] == "auto" and spec["loss"] == "fused_linear"):
                if "lm_head" in to_save or (isinstance(target_list, list) and "lm_head" in target_list):
                    errors.append(("training.loss", "fused_linear reads lm_head.weight directly; an adapted or "
                                   "saved lm_head is not reproduced"))
            if quant != "none" and eff is not None and eff["num_experts"] > 0:
                errors.append(("peft.base_quantization", "quantizing MoE models (routers, grouped experts) is "
                               "version-dependent in transformers/bitsandbytes; not reproduced"))
            if quant != "none" and param_dtype == "float32" and autocast is None:
                notes.append("peft.base_quantization with fp32 precision: bitsandbytes computes in fp32")
            compute = {"bfloat16": "bfloat16", "float16": "float16"}.get(autocast or param_dtype, "float32")
            peft = {
                "method": method,
                "use_dora": method == "dora",
                "r": pf["lora_rank"],
                "lora_alpha": pf["lora_alpha"],
                "lora_dropout": pf["lora_dropout"],
                "target_modules": target_list,
                "modules_to_save": to_save,
                "adapter_dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(pf["adapter_dtype"]),
                "quantization": None if quant == "none" else {
                    "type": quant,
                    "bits": 8 if quant == "int8" else 4,
                    "double_quant": bool(pf["double_quantization"]),
                    "compute_dtype": compute,
                    "prepare_kbit": bool(pf["prepare_kbit"]),
                    "saves_input": bool(pf["bnb_saves_input"]),
                    "skip_modules": ["lm_head"],
                    "how": ("every nn.Linear of the decoder layers replaced by bitsandbytes "
                            + ("Linear8bitLt (has_fp16_weights=False, threshold 6.0)" if quant == "int8"
                               else f"Linear4bit (quant_type {quant}, compress_statistics {bool(pf['double_quantization'])})")
                            + "; lm_head, embeddings and norms stay, as from_pretrained(quantization_config=...) "
                            "does"),
                },
                "get_peft_model": "autocast_adapter_dtype=False, then every trainable parameter cast to "
                                  "adapter_dtype",
            }
            if to_save:
                notes.append("peft.modules_to_save: PEFT keeps the original module frozen and trains a copy "
                             "(ModulesToSaveWrapper)")

    # fp16 weights under the Trainer's GradScaler: only fp32 parameters may train. GradScaler.unscale_ raises
    # "Attempting to unscale FP16 gradients" (as the HF Trainer does with --fp16 over a model loaded in fp16), and its
    # CUDA unscale kernel has no bf16 case. PPO's value model trains in the policy's dtype, in full or through PEFT's
    # sequence-classification wrapper, whose score head is a trainable copy in that dtype.
    if prec == "fp16_autocast" and (peft is None or peft["adapter_dtype"] != "float32" or peft["modules_to_save"]
                                    or t["objective"] == "ppo"):
        errors.append(("training.precision", "fp16_autocast would train parameters that are not fp32 (GradScaler "
                       "unscales fp32 gradients only; the HF Trainer's --fp16 refuses fp16 ones the same way): it "
                       "needs peft.method lora or dora with peft.adapter_dtype fp32, no modules_to_save, and an "
                       "objective other than ppo (its value model trains in the weights' dtype)"))

    # --- optimizer
    opt_name = t["optimizer"]
    impl_given = t["optimizer_impl"]
    _choice(errors, "training.optimizer_impl", impl_given, OPTIMIZER_IMPLS)
    optimizer = None
    if opt_name in TORCH_OPTIMIZERS:
        cls, kwargs, impls = TORCH_OPTIMIZERS[opt_name]
        impl = resolved("optimizer_impl") if impl_given in OPTIMIZER_IMPLS else "foreach"
        kwargs = dict(kwargs)
        if impl not in impls:
            errors.append(("training.optimizer_impl", f"{impl}: {cls} has no {impl} implementation"))
        elif impl == "fused":
            kwargs["fused"] = True
        elif impl == "foreach":
            kwargs["foreach"] = True
        else:
            kwargs["foreach"] = False  # with fused left at None: torch's per-tensor loop
        state_dtype = OPTIMIZER_STATE_DTYPE.get(opt_name)
        if state_dtype is None:
            state_dtype = "param dtype (" + {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[param_dtype] + ")"
        optimizer = {"name": opt_name, "library": "torch", "class": cls, "kwargs": kwargs, "impl": impl,
                     "state_dtype": state_dtype}
    elif opt_name in BNB_OPTIMIZERS:
        cls, kwargs = BNB_OPTIMIZERS[opt_name]
        if impl_given != "auto":
            errors.append(("training.optimizer_impl", f"{impl_given}: {cls} is one bitsandbytes kernel; only auto "
                           "applies"))
        if opt_name == "lion" and param_dtype != "float32":
            errors.append(("training.optimizer", "lion: the harness uses bitsandbytes Lion32bit, whose fp32 state "
                           "differs from memsim's state in the param dtype for bf16 parameters"))
        optimizer = {"name": opt_name, "library": "bitsandbytes", "class": cls, "kwargs": dict(kwargs),
                     "impl": "bitsandbytes kernel", "state_dtype": OPTIMIZER_STATE_DTYPE[opt_name]}
        notes.append(f"training.optimizer_impl: not applicable to {cls}")
    else:
        errors.append(("training.optimizer", f"unknown value {opt_name!r}"))

    oib = t["optimizer_in_backward"] is True
    if oib:
        if _is_int(t["gradient_accumulation_steps"]) and t["gradient_accumulation_steps"] != 1:
            errors.append(("training.optimizer_in_backward", "true needs gradient_accumulation_steps 1 (the step "
                           "runs as each gradient is ready)"))
        if scaler:
            errors.append(("training.optimizer_in_backward", f"true cannot be combined with {prec}'s GradScaler"))

    if hw and not isinstance(hw["expandable_segments"], bool):
        errors.append(("hardware.expandable_segments", f"must be auto, true or false; got {hw['expandable_segments']!r}"))

    # --- data: a run of listed micro-batch lengths is replayed as listed (memsim's data.lengths micro_batches),
    # each step's micro-batches in order, so that the reserved memory a run of varying lengths builds up can be
    # measured against memsim's run replay. A length distribution (samples) is memsim's own draw: not reproduced.
    d = config.get("data", {}) if isinstance(config.get("data"), dict) else {}
    lengths = None
    mode = d.get("lengths", "fixed")
    if mode == "micro_batches":
        raw = d.get("micro_batch_lengths", "")
        items = raw if isinstance(raw, list) else [x for x in str(raw).split(",") if x.strip()]
        try:
            lengths = [int(x) for x in items]
        except ValueError:
            errors.append(("data.micro_batch_lengths", f"{raw!r}: a list of integers"))
        if lengths is not None and (not lengths or min(lengths) < 1):
            errors.append(("data.micro_batch_lengths", "at least one length, each at least 1"))
        gas = t["gradient_accumulation_steps"]
        if lengths and not d.get("steps"):
            steps = -(-len(lengths) // gas)  # memsim replays the list once
        elif lengths:
            steps = int(d["steps"])
    elif mode != "fixed":
        errors.append(("data.lengths", f"{mode}: the harness replays fixed shapes or listed micro-batch lengths "
                       "(micro_batches); a sample-length distribution is drawn by memsim"))
    # Padded rows, where memsim takes a micro-batch to be padded (src/core/data_shape.cpp plan_run): listed lengths
    # that vary, more than one row, and a padding other than none. memsim knows only each micro-batch's padded
    # length; the harness makes its rows of PADDED_ROW_RULE's lengths, pads them on the right with an
    # attention_mask of zeros and labels of -100 (tokenizer.pad, then DataCollatorForLanguageModeling's or
    # DataCollatorForCompletionOnlyLM's labels), so that
    # transformers takes its padded paths (FA2's unpad, SDPA's mask). Elsewhere every row is full, no mask.
    padding = d.get("padding", "longest")
    _choice(errors, "data.padding", padding, ("longest", "max_length", "none"))
    # pad_to_multiple_of: a listed length is the padded length already (memsim rounds only drawn samples)
    if not _is_int(d.get("pad_to_multiple_of", 1)) or d.get("pad_to_multiple_of", 1) < 1:
        errors.append(("data.pad_to_multiple_of", f"{d['pad_to_multiple_of']!r}: a positive integer"))
    padded_rows = bool(lengths) and len(set(lengths)) > 1 and _is_int(t["micro_batch_size"]) and \
        t["micro_batch_size"] > 1 and padding != "none"
    if padded_rows and (t["objective"] != "sft" or prog is not None):
        errors.append(("data.padding", f"{padding}: padded rows are built for supervised fine-tuning of a causal LM "
                       "only; list one length throughout, or set data.padding none (full rows)"))
    if padded_rows:
        notes.append("data: micro-batches of " + str(t["micro_batch_size"]) + " rows padded to each listed length "
                     f"({PADDED_ROW_RULE}, right-padded: attention_mask 0, labels -100)")
    if t["objective"] == "ppo" and mode != "fixed":
        errors.append(("data.lengths", f"{mode}: ppo generates every response at completion_length after prompts of "
                       "sequence_length - completion_length tokens (memsim models no other): fixed"))
    for k in d:
        if k not in ("lengths", "micro_batch_lengths", "steps", "padding", "pad_to_multiple_of"):
            errors.append((f"data.{k}", "the harness reads data.lengths, data.micro_batch_lengths, data.steps, "
                           "data.padding and data.pad_to_multiple_of"))

    if errors:
        raise Unsupported(errors)

    if prog is not None:
        return _program_plan(cid, prog, t, spec, fw, optimizer, steps, hw, notes, extra)

    requires = []
    if peft:
        requires.append("peft")
        if peft["quantization"]:
            requires.append("bitsandbytes")
    if optimizer["library"] == "bitsandbytes" and "bitsandbytes" not in requires:
        requires.append("bitsandbytes")
    if loss == "fused_linear":
        requires.append("liger_kernel")
    if attn_impl == "flash_attention_2":
        requires.append("flash_attn")

    plan = {
        "id": cid,
        "harness_version": HARNESS_VERSION,
        "model_type": eff["model_type"],
        "model_name": eff["name"] or eff["model_type"],
        "hf_config": hf,
        "model_class": "AutoModelForCausalLM",
        "attn_implementation": attn_impl,
        "attention": attention,
        "param_dtype": param_dtype,
        "autocast_dtype": autocast,
        "grad_scaler": scaler,
        "precision": prec,
        "framework": fw,
        "loop": spec["loop"],
        "holds_outputs": spec["holds_logits"],
        "param_groups": spec["param_groups"],
        "optimizer": optimizer,
        "optimizer_in_backward": oib,
        "zero_grad_set_to_none": t["zero_grad_set_to_none"],
        "checkpointing": checkpointing,
        "loss": {"impl": loss, "chunks": t["loss_chunks"] if loss == "chunked_fp32" else None},
        "objective": objective,
        "batch": {"micro_batch_size": t["micro_batch_size"], "sequence_length": t["sequence_length"],
                  "gradient_accumulation_steps": t["gradient_accumulation_steps"], "steps": steps,
                  "lengths": lengths, "empty_cache_steps": t["empty_cache_steps"], "padded_rows": padded_rows},
        "peft": peft,
        "requires": requires,
        "expected_params": expected_params(eff),
        "expected_adapter_params": expected_adapter_params(eff, peft),
        "memsim_gpu": hw["gpu"],
        # PYTORCH_CUDA_ALLOC_CONF's expandable_segments, which memsim models (hardware.expandable_segments)
        "expandable_segments": hw["expandable_segments"] is True,
        "notes": notes,
        "extra": extra,
        "effective_model": {k: eff[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "num_key_value_heads", "intermediate_size", "vocab_size",
                                                 "tie_word_embeddings", "num_experts", "num_experts_per_tok",
                                                 "moe_intermediate_size", "first_k_dense_replace", "hidden_act")},
    }
    plan["effective_model"]["head_dim"] = head_dim_of(eff)
    return plan


def _program_plan(cid, prog, t, spec, fw, optimizer, steps, hw, notes, extra):
    """The plan of a model program (programs.py): the program's own part, and the loop's settings as for LMs."""
    if optimizer["library"] != "torch":
        raise Unsupported([("training.optimizer", f"{optimizer['name']}: programs run torch's optimizers")])
    if t["optimizer_in_backward"] is True:
        raise Unsupported([("training.optimizer_in_backward", "programs step after backward: false")])
    if t["empty_cache_steps"] != 0:
        raise Unsupported([("training.empty_cache_steps", "the program runs call no empty_cache: 0")])
    # what translate() resolved for language models (attention kernel, norm, loss) does not apply to a program
    notes = [n for n in notes if not n.startswith(("training.attention", "training.norm_impl", "training.loss"))]
    return {
        "id": cid,
        "harness_version": HARNESS_VERSION,
        "kind": "program",
        "program_plan": prog,
        "model_name": prog["program"] + " " + ",".join(f"{k}={v}" for k, v in prog["args"].items()),
        "precision": t["precision"],
        "param_dtype": prog["param_dtype"],
        "autocast_dtype": prog["autocast_dtype"],
        "grad_scaler": False,
        "framework": fw,
        "loop": spec["loop"],
        "optimizer": optimizer,
        "optimizer_in_backward": False,
        "param_groups": spec["param_groups"],
        "zero_grad_set_to_none": t["zero_grad_set_to_none"],
        "checkpointing": prog["checkpointing"],
        "batch": {"micro_batch_size": t["micro_batch_size"], "gradient_accumulation_steps":
                  t["gradient_accumulation_steps"], "steps": steps},
        "peft": None,
        "requires": [prog["library"]],
        "memsim_gpu": hw["gpu"],
        "expandable_segments": hw["expandable_segments"] is True,
        "notes": notes,
        "extra": extra,
    }


def _grpo_objective(t, pf, fw, errors):
    """GRPO as TRL's GRPOTrainer runs it at its newest release with use_vllm false (docs/research/grpo.md): one
    model.generate of the step's micro_batch_size x gradient_accumulation_steps completions with a KV cache
    (gradient checkpointing off around it, TRL 0.22+), the reference's no-grad scoring in chunks of the micro-batch,
    then each micro-batch's forward with logits over the completion's tokens. The harness runs no vLLM and no reward
    model: those are refused."""
    ref = t["reference_model"]
    if ref == "auto":
        ref = "none"  # GRPOConfig.beta defaults to 0.0 from TRL 0.19
    if ref not in ("copy", "adapter_disabled", "none"):
        errors.append(("training.reference_model", f"{ref}: grpo takes copy, adapter_disabled or none (beta = 0)"))
    if ref == "adapter_disabled" and pf.get("method", "none") == "none":
        errors.append(("training.reference_model", "adapter_disabled needs a PEFT method"))
    if fw != "hf_trainer":
        errors.append(("training.framework", f"{fw}: GRPO runs TRL's GRPOTrainer on the HF Trainer; set hf_trainer"))
    if t["generation_engine"] != "hf_generate":
        errors.append(("training.generation_engine", f"{t['generation_engine']}: the harness generates with "
                       "model.generate only (no vLLM on the calibration machine)"))
    if t["reward_model"] != "none":
        errors.append(("training.reward_model", "the harness scores with a rule (no reward model)"))
    if t["loss"] != "auto":
        errors.append(("training.loss", "with training.objective grpo the loss is TRL's log-probabilities: auto"))
    if t["steps_per_generation"] not in (0, t["gradient_accumulation_steps"]):
        errors.append(("training.steps_per_generation", "the harness generates once per optimizer step: 0 (the "
                       "default, gradient_accumulation_steps)"))
    if t["num_iterations"] != 1:
        errors.append(("training.num_iterations", "the harness trains each generation once: 1"))
    c, s = t["completion_length"], t["sequence_length"]
    if not isinstance(c, int) or not 1 <= c < s:
        errors.append(("training.completion_length", f"must be from 1 to below sequence_length ({s}); got {c!r}"))
    return {
        "kind": "grpo", "reference": ref, "completion_length": c, "prompt_length": s - c if isinstance(c, int) else 0,
        "generation_rows": t["micro_batch_size"] * t["gradient_accumulation_steps"],
        # accelerate's convert_outputs_to_fp32 under the Trainer's bf16 (GRPOConfig sets it), outside DeepSpeed
        "logits_fp32": True,
        "how": "TRL GRPOTrainer (v1.9, use_vllm false): model.generate with a KV cache (gradient checkpointing off "
               "around it), the reference under no_grad in chunks of the micro-batch, then logits_to_keep = "
               "completion + 1, logits.div_(temperature), selective_log_softmax, the per-token loss",
    }


# PPOConfig.local_rollout_forward_batch_size (64): the rows generate() and the scoring passes take at a time
# (memsim's kPpoRolloutChunkRows, src/core/rollout.h)
PPO_ROLLOUT_CHUNK_ROWS = 64


def expected_score_model_params(eff):
    """Parameters of the policy's architecture as AutoModelForSequenceClassification with num_labels 1 (PPO's value
    and reward models): the decoder and its final norm, no lm_head, a score head of hidden x 1 without bias."""
    h, V = eff["hidden_size"], eff["vocab_size"]
    return expected_params(eff) - (0 if eff["tie_word_embeddings"] else V * h) + h


def _ppo_objective(t, pf, fw, errors, eff):
    """PPO as TRL's PPOTrainer runs it (v0.12-v0.25 trl/trainer/ppo_trainer.py, v0.26+ trl/experimental/ppo;
    docs/research/ppo.md), one update per harness step: model.generate of the update's micro_batch_size x
    gradient_accumulation_steps responses, 64 at a time, keeping the fp32 scores of every token (logitss, held until
    the next update's generation returns); each chunk scored under no_grad by the reference, the value model and the
    reward model, every one with all its hidden states; then num_ppo_epochs (training.num_iterations) passes of
    gradient_accumulation_steps micro-batches through the value model and the policy, one optimizer over both. The
    reward model is a random one of the policy's shape (same_as_policy); no vLLM."""
    peft_on = pf.get("method", "none") != "none"
    ref = t["reference_model"]
    if ref == "auto":
        ref = "adapter_disabled" if peft_on else "copy"  # create_reference_model, or the adapters off (PEFT)
    if ref not in ("copy", "adapter_disabled"):
        errors.append(("training.reference_model", f"{ref}: ppo scores every rollout with a reference model "
                       "(PPOTrainer raises without one): auto, copy or adapter_disabled"))
    if ref == "adapter_disabled" and not peft_on:
        errors.append(("training.reference_model", "adapter_disabled needs a PEFT method"))
    if fw != "hf_trainer":
        errors.append(("training.framework", f"{fw}: PPO runs TRL's PPOTrainer (accelerate, the HF Trainer's "
                       "optimizer groups); set hf_trainer"))
    if t["generation_engine"] != "hf_generate":
        errors.append(("training.generation_engine", f"{t['generation_engine']}: PPOTrainer generates with the "
                       "policy's model.generate only (it has no vLLM path): hf_generate"))
    if t["reward_model"] != "same_as_policy":
        errors.append(("training.reward_model", f"{t['reward_model']}: ppo scores with a reward model of the "
                       "policy's shape, from which TRL initialises the value model: same_as_policy"))
    vm = t["value_model"]
    if vm not in ("full", "peft"):
        errors.append(("training.value_model", f"must be one of: full, peft; got {vm!r}"))
    elif vm == "peft" and not peft_on:
        errors.append(("training.value_model", "peft puts the policy's PEFT method on the value model: set "
                       "peft.method, or use full"))
    elif vm == "peft":
        targets = pf["target_modules"] if isinstance(pf["target_modules"], str) else ""
        to_save = pf["modules_to_save"] if isinstance(pf["modules_to_save"], str) else ""
        if "lm_head" in [x.strip() for x in (targets + "," + to_save).split(",")]:
            errors.append(("training.value_model", "peft with lm_head among peft.target_modules or "
                           "peft.modules_to_save: the value model has a score head instead; not reproduced"))
    if pf.get("base_quantization", "none") != "none":
        errors.append(("peft.base_quantization", f"{pf['base_quantization']} with ppo: the harness quantizes the "
                       "policy only (the reward model and a peft value model would be quantized too); not reproduced"))
    if t["loss"] != "auto":
        errors.append(("training.loss", "with training.objective ppo the loss is TRL's log-probabilities: auto"))
    if t["optimizer_in_backward"] is True:
        errors.append(("training.optimizer_in_backward", "true: PPOTrainer steps one optimizer over the policy and "
                       "the value model after the accumulated micro-batches: false"))
    epochs = t["num_iterations"]
    if not _is_int(epochs) or epochs < 1:
        errors.append(("training.num_iterations", f"num_ppo_epochs: a positive integer; got {epochs!r}"))
    c, s = t["completion_length"], t["sequence_length"]
    if not _is_int(c) or not _is_int(s) or not 1 <= c < s:
        errors.append(("training.completion_length", f"must be from 1 to below sequence_length ({s}); got {c!r}"))
    b, gas = t["micro_batch_size"], t["gradient_accumulation_steps"]
    rows = b * gas if _is_int(b) and _is_int(gas) else 0
    return {
        "kind": "ppo", "reference": ref, "value_model": vm, "reward_model": "same_as_policy",
        "completion_length": c, "prompt_length": s - c if _is_int(c) and _is_int(s) else 0,
        # local_batch_size = per_device_train_batch_size x gradient_accumulation_steps (num_mini_batches 1)
        "generation_rows": rows,
        "chunk_rows": min(rows, PPO_ROLLOUT_CHUNK_ROWS),
        "num_ppo_epochs": epochs,
        # PPOConfig's defaults; memory does not depend on them
        "temperature": 0.7, "cliprange": 0.2, "cliprange_value": 0.2, "vf_coef": 0.1,
        # accelerate's convert_outputs_to_fp32 on the PolicyAndValueWrapper's outputs under the Trainer's bf16/fp16
        # (outside DeepSpeed): the training forward's logits, hidden states and values are fp32, as GRPO's logits
        "logits_fp32": True,
        # accelerate's autocast wraps only the prepared wrapper's forward: generate (unwrapped_model.policy), the
        # reference (moved to the device, not prepared), the value and reward models' get_reward run without it
        "rollout_autocast": False,
        "score_model_params": expected_score_model_params(eff) if eff is not None else None,
        "how": "TRL PPOTrainer (v0.12-v1.9, num_mini_batches 1): batch_generation in chunks of "
               "local_rollout_forward_batch_size (64) with output_scores (the fp32 scores stacked per chunk, padded "
               "into logitss, kept until the next update's generation returns) and a KV cache (gradient checkpointing "
               "off around generate); per chunk under no_grad selective_log_softmax of the scores, the reference's "
               "forward with output_hidden_states (logits of every position, sliced, divided by the temperature in "
               "place, selective_log_softmax), get_reward of the value and the reward model (backbone with hidden "
               "states, score head), empty_cache after the scores and the reference; then num_ppo_epochs passes of "
               "gradient_accumulation_steps micro-batches: the value backbone and score head, the policy's forward "
               "with hidden states (outputs converted to fp32), logits[:, P-1:-1] /= temperature, "
               "selective_log_softmax, the clipped policy loss plus vf_coef x the clipped value loss, backward, the "
               "optimizer step at the last micro-batch, then the entropy (softmax, logsumexp) under no_grad; "
               "`output`, `logits` and `prob_dist` live to the next micro-batch, deleted with empty_cache after the "
               "mini-batch. Dropout off in every model (disable_dropout_in_model); use_cache false on every model",
    }


def try_translate(item, steps=DEFAULT_STEPS):
    """(plan, None) or (None, Unsupported)."""
    try:
        return translate(item, steps), None
    except Unsupported as e:
        return None, e
