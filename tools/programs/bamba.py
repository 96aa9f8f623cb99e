"""Writes src/core/catalog/architectures/bamba.json: IBM's Bamba-9B (transformers' BambaForCausalLM, from 4.48) as a
model program, on the path it trains on when mamba_ssm and causal_conv1d are installed (docs/research/nemotron-h.md
section 2).

Every layer (BambaDecoderLayer) is input_layernorm, a mixer, the residual add, pre_ff_layernorm, the SwiGLU
feed_forward (gate_proj, up_proj, down_proj) and the residual add; the mixer is the layer's kind:
- Mamba-2 (BambaMixer.cuda_kernels_forward in training): in_proj, then mamba_ssm's fused
  mamba_split_conv1d_scan_combined (the ssd_mixer op, as mamba2.py), one group;
- attention at attn_layer_indices (9, 18, 27 of 32): q_proj, k_proj, v_proj, apply_rotary_pos_emb on the first
  half of each head (partial_rotary_factor 0.5, which BambaConfig hard-codes: attn_rotary_emb 64 of 128),
  grouped-query attention (32 query heads, 8 kv heads), o_proj.
The two kinds are written once and the pattern's later layers run them again ("same_as").

The head: final_layernorm, lm_head, the loss's fp32 copy of the logits, the shifted copy where the loss path copies
(transformers before 4.49) and the cross-entropy.

Not modelled: the unfused Mamba-2 path that a padded batch or a cache takes, a padded batch's 4-D mask, the optional
z-loss.
"""
from common import causal_lm_head, token_embeddings, write_programs

LAYER = "model.layers"
ATTENTION_LAYERS = (9, 18, 27)  # Bamba-9B's attn_layer_indices
LAYERS = 32


def layer(mixer_ops):
    """BambaDecoderLayer around its mixer's ops, which read `h` and write `mixed`."""
    return [
        {"op": "rms_norm", "name": f"{LAYER}.input_layernorm", "in": "x", "out": "h"},
    ] + mixer_ops + [
        {"op": "add", "in": ["x", "mixed"], "out": "r"},
        {"op": "rms_norm", "name": f"{LAYER}.pre_ff_layernorm", "in": "r", "out": "h2"},
        {"op": "linear", "name": f"{LAYER}.feed_forward.gate_proj", "in": "h2", "out_features": "intermediate_size",
         "bias": False, "out": "gate"},
        {"op": "silu", "in": "gate", "out": "act"},
        {"op": "linear", "name": f"{LAYER}.feed_forward.up_proj", "in": "h2", "out_features": "intermediate_size",
         "bias": False, "out": "up"},
        {"op": "mul", "in": ["act", "up"], "out": "gated"},
        {"op": "linear", "name": f"{LAYER}.feed_forward.down_proj", "in": "gated", "out_features": "hidden_size",
         "bias": False, "out": "ff"},
        {"op": "add", "in": ["r", "ff"], "out": "y"},
    ]


MAMBA = [
    {"op": "linear", "name": f"{LAYER}.mamba.in_proj", "in": "h", "out_features": "d_in_proj", "bias": "mamba_proj_bias",
     "out": "zxbcdt"},
    {"op": "ssd_mixer", "name": f"{LAYER}.mamba", "in": "zxbcdt", "heads": "mamba_n_heads", "head_dim": "mamba_d_head",
     "groups": "mamba_n_groups", "state": "mamba_d_state", "kernel": "mamba_d_conv", "chunk": "mamba_chunk_size",
     "out_features": "hidden_size", "bias": "mamba_proj_bias", "conv_bias": "mamba_conv_bias", "out": "mixed"},
]

ATTENTION = [
    {"op": "linear", "name": f"{LAYER}.self_attn.q_proj", "in": "h", "out_features": "hidden_size",
     "bias": "attention_bias", "out": "q"},
    {"op": "linear", "name": f"{LAYER}.self_attn.k_proj", "in": "h", "out_features": "kv_width",
     "bias": "attention_bias", "out": "k"},
    {"op": "linear", "name": f"{LAYER}.self_attn.v_proj", "in": "h", "out_features": "kv_width",
     "bias": "attention_bias", "out": "v"},
    {"op": "rotary", "in": "q", "variant": "transformers", "heads": "num_attention_heads",
     "rotary_dims": "attn_rotary_emb", "out": "q_rot"},
    {"op": "rotary", "in": "k", "variant": "transformers", "heads": "num_key_value_heads",
     "rotary_dims": "attn_rotary_emb", "out": "k_rot"},
    {"op": "attention", "in": ["q_rot", "k_rot", "v"], "heads": "num_attention_heads",
     "kv_heads": "num_key_value_heads", "out": "context"},
    {"op": "linear", "name": f"{LAYER}.self_attn.o_proj", "in": "context", "out_features": "hidden_size",
     "bias": "attention_bias", "out": "mixed"},
]


def blocks():
    """The layers in order: runs of Mamba-2 layers with an attention layer at each of ATTENTION_LAYERS."""
    entries, start, defined = [], 0, set()
    for index in list(ATTENTION_LAYERS) + [LAYERS]:
        for name, ops, run in (("mamba", MAMBA, index - start), ("attention", ATTENTION, 1 if index < LAYERS else 0)):
            if run == 0:
                continue
            if name in defined:
                entries.append({"same_as": name, "repeat": run})
            else:
                defined.add(name)
                entries.append({"name": name, "repeat": run, "input": "x", "ops": layer(ops), "output": "y"})
        start = index + 1
    return entries


def bamba():
    return {
        "memsim_architecture": 1,
        "name": "bamba",
        "title": "Bamba hybrid language model (Mamba-2 and attention layers, each with a SwiGLU MLP)",
        "source": "transformers v4.48 src/transformers/models/bamba/modeling_bamba.py (BambaForCausalLM, "
                  "BambaDecoderLayer, BambaMixer.cuda_kernels_forward, BambaAttention, BambaMLP), configuration_bamba.py; "
                  "ibm-fms/Bamba-9B config.json. docs/research/nemotron-h.md section 2. Generated by tools/programs/bamba.py",
        # the attention's projections (in_proj and the MLP's linears may be added; out_proj may not: the fused kernel
        # reads its weight itself)
        "lora_targets": "q_proj,k_proj,v_proj,o_proj",
        "model_types": ["bamba"],
        # another layer pattern needs another program: its import is refused with the pattern this one has
        "requires": {"attn_layer_indices": {"equals": list(ATTENTION_LAYERS), "when_absent": None}},
        "hyperparameters": {
            "vocab_size": 128256, "hidden_size": 4096, "tie_word_embeddings": 0,
            "num_attention_heads": 32, "num_key_value_heads": 8, "attention_bias": 0, "attn_rotary_emb": 64,
            "intermediate_size": 14336,
            "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
            "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": 1, "mamba_proj_bias": 0,
            # memsim's: the tokens per sample (input_ids [batch, seq])
            "sequence_length": 2048,
        },
        "dims": {
            "d_inner": "mamba_n_heads * mamba_d_head",
            "d_in_proj": "2 * d_inner + 2 * mamba_n_groups * mamba_d_state + mamba_n_heads",
            "kv_width": "num_key_value_heads * hidden_size / num_attention_heads",
        },
        "inputs": {"input_ids": {"shape": ["sequence_length"], "dtype": "int64"}},
        "embeddings": token_embeddings("model.embed_tokens"),
        "blocks": blocks(),
        "head": causal_lm_head("model.final_layernorm"),
    }


if __name__ == "__main__":
    write_programs([("bamba", bamba())], "bamba.py")
