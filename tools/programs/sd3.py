#!/usr/bin/env python3
"""Writes src/core/catalog/architectures/sd3_mmdit.json: Stable Diffusion 3's transformer (diffusers
SD3Transformer2DModel), an MMDiT of joint blocks, as a memsim model program.

What each stage does, and why, is in docs/research/sd3-mmdit.md (diffusers v0.29-v0.36); it shares FLUX.1's
building blocks (tools/programs/flux.py, docs/research/flux-dit.md):

- the embeddings: PatchEmbed (a 2 x 2 convolution of the 16 latent channels, its tokens, plus the position table
  cropped to the image), the timestep and pooled-text projections summed into temb (a carry every block's modulation
  reads), and context_embedder on the text encoders' joint hidden states;
- each JointTransformerBlock is a block kind of its own, run once and checkpointed: the image rows are passed on, the
  text rows a carry from block to block. AdaLayerNormZero modulates each stream, the image's q, k, v are concatenated
  before the text's (JointAttnProcessor2_0), SDPA attends over both, and the output is split back; the last block's
  text stream is context_pre_only (AdaLayerNormContinuous and add_q/k/v_proj, nothing after the attention);
- the head applies norm_out (AdaLayerNormContinuous) and proj_out, and the loss is the MSE of the prediction
  against the flow-matching target.

Usage: python3 tools/programs/sd3.py [--check]   (--check: exit 1 if a checked-in file differs)
"""
from common import mlp_embedding, write_programs
from flux import C, dit_head, feed_forward, modulate, modulation, rms


def joint_block(i, last, ctx_in, ctx_out, qk_norm, dual=False):
    """JointTransformerBlock (attention.py) with JointAttnProcessor2_0 (attention_processor.py); dual: SD3.5 Medium's
    use_dual_attention, SD35AdaLayerNormZeroX's nine chunks and attn2, self-attention over the image rows alone
    (AttnProcessor2_0) after the joint attention's residual (sd3-mmdit.md section 2)."""
    n = f"transformer_blocks.{i}"
    if dual:
        ops, (sh, sc, ga, sh2, sc2, ga2, sh3, sc3, ga3) = modulation(f"{n}.norm1", "temb", 9, "i")
    else:
        ops, (sh, sc, ga, sh2, sc2, ga2) = modulation(f"{n}.norm1", "temb", 6, "i")
    if last:  # context_pre_only: AdaLayerNormContinuous, scale then shift
        cops, (csc, csh) = modulation(f"{n}.norm1_context", "temb", 2, "c")
    else:
        cops, (csh, csc, cga, csh2, csc2, cga2) = modulation(f"{n}.norm1_context", "temb", 6, "c")
    ops += cops
    ops += modulate("x", sc, sh, "xm", f"{n}.norm1.norm")
    if dual:  # the same LayerNorm output, modulated a second time for attn2
        ops += [{"op": "mul", "in": ["xm_n", sc3], "out": "xm2_s"}, {"op": "add", "in": ["xm2_s", sh3], "out": "xm2"}]
    ops += modulate(ctx_in, csc, csh, "cm", f"{n}.norm1_context.norm")
    a = f"{n}.attn"
    for p, t in (("to_q", "q"), ("to_k", "k"), ("to_v", "v")):
        ops.append({"op": "linear", "name": f"{a}.{p}", "in": "xm", "out_features": C, "out": t})
    for p, t in (("add_q_proj", "cq"), ("add_k_proj", "ck"), ("add_v_proj", "cv")):
        ops.append({"op": "linear", "name": f"{a}.{p}", "in": "cm", "out_features": C, "out": t})
    q, k, cq, ck = "q", "k", "cq", "ck"
    if qk_norm:
        # SD3.5's q/k norms are diffusers' own RMSNorm in every version (sd3-mmdit.md section 1)
        ops += [rms(f"{a}.norm_q", "q", "qn", "diffusers"), rms(f"{a}.norm_k", "k", "kn", "diffusers"),
                rms(f"{a}.norm_added_q", "cq", "cqn", "diffusers"), rms(f"{a}.norm_added_k", "ck", "ckn", "diffusers")]
        q, k, cq, ck = "qn", "kn", "cqn", "ckn"
    ops += [
        {"op": "concat", "in": [q, cq], "out": "jq"},
        {"op": "concat", "in": [k, ck], "out": "jk"},
        {"op": "concat", "in": ["v", "cv"], "out": "jv"},
        {"op": "attention", "in": ["jq", "jk", "jv"], "heads": "num_attention_heads", "cast_out": True, "out": "ao"},
        {"op": "slice", "in": "ao", "axis": "tokens", "start": 0, "size": "image_tokens", "out": "iao"},
        {"op": "linear", "name": f"{a}.to_out.0", "in": "iao", "out_features": C, "out": "io"},
    ]
    if not last:  # JointAttnProcessor2_0 projects the text rows (to_add_out) as it returns, before the residuals
        ops += [
            {"op": "slice", "in": "ao", "axis": "tokens", "start": "image_tokens", "size": "text_tokens", "out": "cao"},
            {"op": "linear", "name": f"{a}.to_add_out", "in": "cao", "out_features": C, "out": "co"},
        ]
    ops += [
        {"op": "mul", "in": ["io", ga], "out": "ig"},
        {"op": "add", "in": ["x", "ig"], "out": "x1"},
    ]
    if dual:
        a2 = f"{n}.attn2"
        ops += [{"op": "linear", "name": f"{a2}.{p}", "in": "xm2", "out_features": C, "out": t} for p, t in (("to_q", "q2"), ("to_k", "k2"), ("to_v", "v2"))]
        q2, k2 = "q2", "k2"
        if qk_norm:
            ops += [rms(f"{a2}.norm_q", "q2", "q2n", "diffusers"), rms(f"{a2}.norm_k", "k2", "k2n", "diffusers")]
            q2, k2 = "q2n", "k2n"
        ops += [
            {"op": "attention", "in": [q2, k2, "v2"], "heads": "num_attention_heads", "cast_out": True, "out": "ao2"},
            {"op": "linear", "name": f"{a2}.to_out.0", "in": "ao2", "out_features": C, "out": "io2"},
            {"op": "mul", "in": ["io2", ga3], "out": "ig2"},
            {"op": "add", "in": ["x1", "ig2"], "out": "x1d"},
        ]
    x1 = "x1d" if dual else "x1"
    ops += modulate(x1, sc2, sh2, "x1m", f"{n}.norm2")
    ops += feed_forward(f"{n}.ff", "x1m", "f")
    ops += [
        {"op": "mul", "in": ["f", ga2], "out": "fg"},
        {"op": "add", "in": [x1, "fg"], "out": "y"},
    ]
    stage = {"name": n, "repeat": 1, "input": "x", "ops": ops, "output": "y"}
    if last:
        return stage
    ops += [
        {"op": "mul", "in": ["co", cga], "out": "cg"},
        {"op": "add", "in": [ctx_in, "cg"], "out": "c1"},
    ]
    ops += modulate("c1", csc2, csh2, "c1m", f"{n}.norm2_context")
    ops += feed_forward(f"{n}.ff_context", "c1m", "cf")
    ops += [
        {"op": "mul", "in": ["cf", cga2], "out": "cfg"},
        {"op": "add", "in": ["c1", "cfg"], "out": ctx_out},
    ]
    stage["carry"] = [ctx_out]
    return stage


VARIANTS = [
    {"name": "sd3_mmdit", "title": "Stable Diffusion 3 transformer (MMDiT, 2B)", "layers": 24, "heads": 24, "qk_norm": False,
     "pos_embed_max_size": 192},
    # SD3.5 Large: 38 joint blocks of 38 heads, q/k RMSNorm, no dual-attention layers (its config's
    # dual_attention_layers is empty: sd3-mmdit.md section 0)
    {"name": "sd35_large_mmdit", "title": "Stable Diffusion 3.5 Large transformer (MMDiT, 8B)", "layers": 38, "heads": 38,
     "qk_norm": True, "pos_embed_max_size": 192},
    # SD3.5 Medium (MMDiT-X): 24 joint blocks with q/k norms, the first 13 with dual attention, a 384^2 position table
    {"name": "sd35_medium_mmdit", "title": "Stable Diffusion 3.5 Medium transformer (MMDiT-X, 2.5B)", "layers": 24, "heads": 24,
     "qk_norm": True, "pos_embed_max_size": 384, "dual_layers": 13},
]


def program(v):
    layers = v["layers"]
    hyper = {
        # (num_layers is fixed: each joint block is a block kind of its own, generated here)
        "in_channels": 16, "patch_size": 2, "attention_head_dim": 64, "num_attention_heads": v["heads"],
        "joint_attention_dim": 4096, "pooled_projection_dim": 2048, "pos_embed_max_size": v["pos_embed_max_size"],
        # memsim's: the image side (or height and width where not 0), the VAE's downsampling, the text tokens
        # T5 tokens after the 77 of the two CLIPs (--max_sequence_length, 77 in every training script)
        "resolution": 1024, "height": 0, "width": 0, "vae_scale_factor": 8, "max_sequence_length": 77,
    }
    # The VAE stays on the GPU in fp32 and encodes every micro-batch's images (no latent cache in the full script);
    # the three text encoders encode the instance prompt once and are deleted (since diffusers 8e1b7a084a,
    # 2024-06-16; before, they stayed: _on_gpu = 1). sd3-mmdit.md section 5.
    # Counts: the VAE, CLIP-L and CLIP-G with their projections, T5-XXL's encoder (sd3-mmdit.md section 1).
    frozen = []
    for name, params, on, dtype in (("vae", 83819683, 1, "fp32"), ("text_encoder", 123650304, 0, "compute"),
                                    ("text_encoder_2", 694659840, 0, "compute"), ("text_encoder_3", 4762310656, 0, "compute")):
        hyper[f"{name}_params"] = params
        hyper[f"{name}_on_gpu"] = on
        entry = {"name": name, "params": f"{name}_params", "when": f"{name}_on_gpu"}
        if dtype != "compute":
            entry["dtype"] = dtype
        if name == "vae":  # vae.encode(pixel_values) each micro-batch, in fp32: its no-grad transients
            entry["forward"] = {"program": "sd_vae_encoder", "args": {"resolution": "resolution", "latent_channels": "in_channels"}}
        frozen.append(entry)
    # PatchEmbed's sincos position table: a persistent buffer [1, max^2, inner] (not a parameter), fp32 as made, moved
    # with the transformer (16-bit after the LoRA scripts' .to(weight_dtype)).
    frozen.append({"name": "pos_embed_buffer", "params": "pos_embed_max_size * pos_embed_max_size * inner", "dtype": "weights"})
    dims = {
        "inner": "num_attention_heads * attention_head_dim",
        "image_height": "if(height, height, resolution)",
        "image_width": "if(width, width, resolution)",
        "latent_h": "image_height // vae_scale_factor",
        "latent_w": "image_width // vae_scale_factor",
        "image_tokens": "(latent_h // patch_size) * (latent_w // patch_size)",
        "text_tokens": "77 + max_sequence_length",
    }
    inputs = {
        "latents": {"shape": ["in_channels", "latent_h", "latent_w"], "dtype": "compute"},
        # the flow-matching target, in the prediction's token layout (unpatchify's copy of the prediction, as small
        # as the latents, is left out)
        "target": {"shape": ["image_tokens", "patch_size * patch_size * in_channels"], "dtype": "compute"},
        "text": {"shape": ["text_tokens", "joint_attention_dim"], "dtype": "compute"},
        "pooled": {"shape": [1, "pooled_projection_dim"], "dtype": "compute"},
        "t_proj": {"shape": [1, 256], "dtype": "compute"},
    }
    te = "time_text_embed"
    emb_ops = [
        {"op": "conv2d", "name": "pos_embed.proj", "in": "latents", "out_channels": C, "kernel": "patch_size", "stride": "patch_size", "out": "patch_map"},
        # (+ the cropped position table, (latent + pos_embed).to(latent.dtype): an fp32 [1, tokens, inner] crop and sum,
        # transients shared by the micro-batch's samples, left out)
        {"op": "flatten_tokens", "in": "patch_map", "out": "patches"},
        *mlp_embedding(f"{te}.timestep_embedder", "t_proj", C, "t", "t3"),
        *mlp_embedding(f"{te}.text_embedder", "pooled", C, "p", "p3"),
        {"op": "add", "in": ["t3", "p3"], "out": "temb"},
        {"op": "linear", "name": "context_embedder", "in": "text", "out_features": C, "out": "ctx0"},
    ]
    stages = [joint_block(i, i == layers - 1, f"ctx{i}", f"ctx{i + 1}", v["qk_norm"], i < v.get("dual_layers", 0))
              for i in range(layers)]
    head_ops = dit_head("x", "patch_size * patch_size * in_channels", "pred_tokens")
    return {
        "memsim_architecture": 1,
        "name": v["name"],
        "title": v["title"],
        "source": "diffusers v0.36.0 src/diffusers/models/transformers/transformer_sd3.py (SD3Transformer2DModel), "
                  "attention.py (JointTransformerBlock, FeedForward), attention_processor.py (JointAttnProcessor2_0), "
                  "embeddings.py (PatchEmbed, CombinedTimestepTextProjEmbeddings), normalization.py (AdaLayerNormZero, "
                  "AdaLayerNormContinuous). docs/research/sd3-mmdit.md. Generated by tools/programs/sd3.py",
        "lora_targets": "to_k,to_q,to_v,to_out.0",
        # diffusers checkpoints each block with torch.utils.checkpoint(..., use_reentrant=False)
        "checkpoint_reentrant": False,
        # AttnProcessor2_0 (and the joint processors) call F.scaled_dot_product_attention; diffusers picks them when
        # torch has it (attention_processor.py Attention.__init__), the eager AttnProcessor before torch 2.0
        "attention_code": "torch_sdpa",
        "model_types": [],
        "hyperparameters": hyper,
        "frozen_modules": frozen,
        "dims": dims,
        "inputs": inputs,
        "embeddings": {"ops": emb_ops, "output": "patches", "carry": ["temb", "ctx0"]},
        "blocks": stages,
        "head": {"input": "x", "ops": head_ops},
    }


def main():
    write_programs([(v["name"], program(v)) for v in VARIANTS], "sd3.py")


if __name__ == "__main__":
    main()
