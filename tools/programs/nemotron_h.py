"""Writes src/core/catalog/architectures/nemotron_h*.json: NVIDIA's Nemotron-H hybrids (NemotronHForCausalLM) as
model programs, one per layer pattern (hybrid_override_pattern), on the path they train on when mamba_ssm and
causal_conv1d are installed (docs/research/nemotron-h.md).

Each character of the pattern is one block, NemotronHBlock: the stream cast to the norm's dtype, an RMSNorm, the
mixer, the residual add (residual_in_fp32 is false in every released config, so the residual stays in the stream's
dtype). The mixer is the block's kind:
- "M": Mamba-2, in_proj then mamba_ssm's fused mamba_split_conv1d_scan_combined (the ssd_mixer op, as mamba2.py);
- "*": self-attention with grouped-query heads and no positional embedding (q_proj, k_proj, v_proj, o_proj);
- "-": the MLP, up_proj, squared ReLU (ReLUSquaredActivation: relu, then torch.square), down_proj; no gate.
- "E": the mixture of experts of Nemotron-3 (NemotronHMoE in transformers 5): the moe op (the sigmoid router and
  the routed experts' grouped GEMMs), then the shared expert, an MLP as "-" of moe_shared_expert_intermediate_size,
  on the same normed input, added to the routed output (docs/research/nemotron3-moe.md section 2).
The kinds are written once and the pattern's later layers run them again ("same_as"), so the program keeps the
pattern's order with one parameter list per kind.

The head: norm_f, lm_head on the stream cast to its dtype, logits.float(), the shifted copy where the loss path
copies (transformers before 4.49) and the cross-entropy.

Not modelled: the unfused Mamba-2 path (a padded batch or a cache: mamba_chunk_scan_combined, then the gated norm
and out_proj as modules), the 4-D mask a padded batch builds, and the slow torch path without kernels.
"""
from common import causal_lm_head, token_embeddings, write_programs

# hybrid_override_pattern of each released size (docs/research/nemotron-h.md section 1; Nemotron-3-Nano's from its
# config.json, docs/research/nemotron3-moe.md section 1.1)
PATTERN_52 = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"  # Nemotron-H-4B and -8B
PATTERN_98 = "M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*-M-M-M-M-M-"  # 47B
PATTERN_118 = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-"
               "M-M-M-M-M*-M-M-M-M-M-")  # 56B

PATTERN_NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # Nemotron-3-Nano-30B-A3B

LAYER = "backbone.layers"


def block(kind, ops, out):
    """NemotronHBlock around its mixer's ops, which read `h` (the normed stream) and write `out`."""
    return [
        {"op": "cast", "in": "x", "dtype": "weights", "out": "x_w"},
        {"op": "rms_norm", "name": f"{LAYER}.norm", "in": "x_w", "out": "h"},
    ] + ops + [{"op": "add", "in": ["x", out], "out": "y"}]


MIXERS = {
    "M": ("mamba", [
        {"op": "linear", "name": f"{LAYER}.mixer.in_proj", "in": "h", "out_features": "d_in_proj", "bias": "use_bias",
         "out": "zxbcdt"},
        {"op": "ssd_mixer", "name": f"{LAYER}.mixer", "in": "zxbcdt", "heads": "mamba_num_heads",
         "head_dim": "mamba_head_dim", "groups": "n_groups", "state": "ssm_state_size", "kernel": "conv_kernel",
         "chunk": "chunk_size", "out_features": "hidden_size", "bias": "use_bias", "conv_bias": "use_conv_bias",
         "out": "mixed"},
    ]),
    "*": ("attention", [
        {"op": "linear", "name": f"{LAYER}.mixer.q_proj", "in": "h", "out_features": "q_width", "bias": "attention_bias",
         "out": "q"},
        {"op": "linear", "name": f"{LAYER}.mixer.k_proj", "in": "h", "out_features": "kv_width", "bias": "attention_bias",
         "out": "k"},
        {"op": "linear", "name": f"{LAYER}.mixer.v_proj", "in": "h", "out_features": "kv_width", "bias": "attention_bias",
         "out": "v"},
        {"op": "attention", "in": ["q", "k", "v"], "heads": "num_attention_heads", "kv_heads": "num_key_value_heads",
         "out": "context"},
        {"op": "linear", "name": f"{LAYER}.mixer.o_proj", "in": "context", "out_features": "hidden_size",
         "bias": "attention_bias", "out": "mixed"},
    ]),
    "-": ("mlp", [
        {"op": "linear", "name": f"{LAYER}.mixer.up_proj", "in": "h", "out_features": "intermediate_size",
         "bias": "mlp_bias", "out": "up"},
        {"op": "relu", "in": "up", "out": "r"},
        # torch.square(r): its backward reads r (2 * r * grad)
        {"op": "mul", "in": ["r", "r"], "out": "r2"},
        {"op": "linear", "name": f"{LAYER}.mixer.down_proj", "in": "r2", "out_features": "hidden_size",
         "bias": "mlp_bias", "out": "mixed"},
    ]),
    "E": ("moe", [
        {"op": "moe", "name": f"{LAYER}.mixer", "in": "h", "experts": "n_routed_experts",
         "top_k": "num_experts_per_tok", "width": "moe_intermediate_size", "out": "routed"},
        {"op": "linear", "name": f"{LAYER}.mixer.shared_experts.up_proj", "in": "h",
         "out_features": "moe_shared_expert_intermediate_size", "bias": "mlp_bias", "out": "s_up"},
        {"op": "relu", "in": "s_up", "out": "s_r"},
        {"op": "mul", "in": ["s_r", "s_r"], "out": "s_r2"},
        {"op": "linear", "name": f"{LAYER}.mixer.shared_experts.down_proj", "in": "s_r2",
         "out_features": "hidden_size", "bias": "mlp_bias", "out": "shared"},
        {"op": "add", "in": ["routed", "shared"], "out": "mixed"},
    ]),
}


def blocks(pattern):
    """The pattern's runs in order: a kind's first run defines it, later runs repeat it (same_as)."""
    entries, seen, i = [], set(), 0
    while i < len(pattern):
        c = pattern[i]
        run = 1
        while i + run < len(pattern) and pattern[i + run] == c:
            run += 1
        name, ops = MIXERS[c]
        if c in seen:
            entries.append({"same_as": name, "repeat": run})
        else:
            seen.add(c)
            entries.append({"name": name, "repeat": run, "input": "x", "ops": block(name, ops, "mixed"), "output": "y"})
        i += run
    return entries


def nemotron_h(name, pattern, hyperparameters, moe=False):
    program = {
        "memsim_architecture": 1,
        "name": name,
        "title": ("Nemotron-3 hybrid mixture of experts (Mamba-2, attention and MoE layers, %d in all)" if moe else
                  "Nemotron-H hybrid language model (Mamba-2, attention and MLP layers, %d in all)") % len(pattern),
        "source": "NVIDIA's modeling_nemotron_h.py (the Hub repos' remote code, NemotronHForCausalLM, NemotronHBlock, "
                  "NemotronHMamba2Mixer.cuda_kernels_forward, NemotronHAttention, NemotronHMLP) and transformers' "
                  "models/nemotron_h (PR #44390); the sizes from Megatron-Bridge's nemotron_h_provider.py and the "
                  "8B's config.json. docs/research/nemotron-h.md. Generated by tools/programs/nemotron_h.py",
        # PEFT (0.20) targets the attention's projections by default; of the Mamba-2 mixer's linears only in_proj is
        # called (the fused kernel reads out_proj's weight itself)
        "lora_targets": "q_proj,k_proj,v_proj,o_proj",
        "model_types": ["nemotron_h"],
        # a config.json with another layer pattern, activation or an fp32 residual needs another program: its import
        # is refused with the pattern this one has
        "requires": {
            "hybrid_override_pattern": {"equals": pattern, "when_absent": PATTERN_52},
            "mlp_hidden_act": {"equals": "relu2", "when_absent": "relu2"},
            "residual_in_fp32": {"equals": False, "when_absent": False},
        },
        "hyperparameters": dict(hyperparameters, **{
            # memsim's: the tokens per sample (input_ids [batch, seq])
            "sequence_length": 2048,
        }),
        "dims": {
            "d_inner": "mamba_num_heads * mamba_head_dim",
            "d_in_proj": "2 * d_inner + 2 * n_groups * ssm_state_size + mamba_num_heads",
            "q_width": "num_attention_heads * attention_head_dim",
            "kv_width": "num_key_value_heads * attention_head_dim",
        },
        "inputs": {"input_ids": {"shape": ["sequence_length"], "dtype": "int64"}},
        "embeddings": token_embeddings("backbone.embeddings"),
        "blocks": blocks(pattern),
        "head": causal_lm_head("backbone.norm_f"),
    }
    if moe:
        program["source"] = ("transformers' models/nemotron_h (PR #44390, >= 5.3: NemotronHForCausalLM, NemotronHBlock, "
                             "NemotronHMoE, NemotronHTopkRouter, NemotronHExperts through integrations/moe.py's grouped_mm) "
                             "with mamba_ssm's kernels; the sizes from nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json. "
                             "docs/research/nemotron3-moe.md. Generated by tools/programs/nemotron_h.py")
        # n_group = topk_group = 1 (the group-limited choice a no-op) and no latent projection (Nemotron-3 Super has
        # one): the program's routing; the config's head_dim is the attention's
        program["requires"].update({
            "n_group": {"equals": 1, "when_absent": 1},
            "topk_group": {"equals": 1, "when_absent": 1},
            "moe_latent_size": {"equals": None, "when_absent": None},
        })
        program["hf_keys"] = {"attention_head_dim": "/head_dim"}
    return program


# Nemotron-H-8B-Base-8K's config.json (the program's defaults); the 4B, 47B and 56B presets set what differs.
HYPERPARAMETERS_8B = {
    "vocab_size": 131072, "hidden_size": 4096, "tie_word_embeddings": 0,
    "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128, "attention_bias": 0,
    "intermediate_size": 21504, "mlp_bias": 0,
    "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
    "chunk_size": 128, "use_bias": 0, "use_conv_bias": 1,
}
# Megatron-Bridge NemotronHModelProvider47B / 56B: hidden 8192, 256 Mamba heads of 64, state 256, 64 query heads
HYPERPARAMETERS_LARGE = dict(HYPERPARAMETERS_8B, hidden_size=8192, num_attention_heads=64, mamba_num_heads=256,
                             ssm_state_size=256)

# nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json (docs/research/nemotron3-moe.md section 1.1): no "-"
# layer, so no intermediate_size
HYPERPARAMETERS_NANO = {
    "vocab_size": 131072, "hidden_size": 2688, "tie_word_embeddings": 0,
    "num_attention_heads": 32, "num_key_value_heads": 2, "attention_head_dim": 128, "attention_bias": 0, "mlp_bias": 0,
    "mamba_num_heads": 64, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
    "chunk_size": 128, "use_bias": 0, "use_conv_bias": 1,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
}

if __name__ == "__main__":
    write_programs([
        ("nemotron_h", nemotron_h("nemotron_h", PATTERN_52, HYPERPARAMETERS_8B)),
        ("nemotron_h_47b", nemotron_h("nemotron_h_47b", PATTERN_98, dict(HYPERPARAMETERS_LARGE, intermediate_size=30720))),
        ("nemotron_h_56b", nemotron_h("nemotron_h_56b", PATTERN_118, dict(HYPERPARAMETERS_LARGE, intermediate_size=32768))),
        ("nemotron3_nano", nemotron_h("nemotron3_nano", PATTERN_NANO, HYPERPARAMETERS_NANO, moe=True)),
    ], "nemotron_h.py")
