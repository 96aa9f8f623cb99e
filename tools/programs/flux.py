#!/usr/bin/env python3
"""Writes src/core/catalog/architectures/flux_dit.json: FLUX.1's transformer (diffusers FluxTransformer2DModel), an
MMDiT with 19 double-stream and 38 single-stream blocks, as a memsim model program.

What each stage does, and why, is in docs/research/flux-dit.md (diffusers v0.36.0):

- the embeddings: x_embedder on the packed latents (2 x 2 patches of the VAE's 16 channels: 64 per token),
  context_embedder on the T5 hidden states, and time_text_embed (timestep, guidance and pooled CLIP projections,
  summed into temb, a carry every block's modulation reads);
- each double-stream block (FluxTransformerBlock) is a block kind of its own, run once and checkpointed (diffusers
  wraps each block in _gradient_checkpointing_func): the image stream is the tensor passed on, the text stream a
  carry from one block to the next. AdaLayerNormZero modulates each stream (LayerNorm without affine, * (1 + scale)
  + shift of one row per sample), q and k get a per-head RMSNorm, the text's q, k, v are concatenated before the
  image's, rotary embeddings apply to the joint q and k, SDPA attends over all of it, and the output is split back
  into the text's and the image's rows;
- a stage joins the text and image rows (torch.cat, text first) before the single-stream blocks, which run as one
  repeated kind on the joint rows (attention and the MLP in parallel, their outputs concatenated along features
  into proj_out), each checkpointed;
- the head keeps the image rows, applies norm_out (AdaLayerNormContinuous) and proj_out, and the loss is the MSE
  of the prediction against the flow-matching target (noise - latents).

Not modelled: diffusers' fp16 clip, encoder_hidden_states.clip(-65504, 65504) on the text rows of each double block
and hidden_states.clip(...) on the joint rows of each single block where the stream is fp16: a copy whose backward
keeps its input, 2 bytes an element per block, in fp16 runs only (not bf16, and not an NF4 base's fp32 stream).

Usage: python3 tools/programs/flux.py [--check]   (--check: exit 1 if a checked-in file differs)
"""
from common import mlp_embedding, write_programs

C = "inner"  # num_attention_heads * attention_head_dim


def modulation(prefix, temb_in, chunks, tag):
    """AdaLayerNormZero / AdaLayerNormZeroSingle / AdaLayerNormContinuous's emb: linear(silu(temb)) chunked along
    dim 1 (views of one [1, chunks * inner] row)."""
    ops = [
        {"op": "silu", "in": temb_in, "out": f"{tag}_ta"},
        {"op": "linear", "name": f"{prefix}.linear", "in": f"{tag}_ta", "out_features": f"{chunks} * inner", "out": f"{tag}_emb"},
    ]
    rows = []
    for k in range(chunks):
        ops.append({"op": "slice", "in": f"{tag}_emb", "start": f"{k} * inner", "size": C, "out": f"{tag}_m{k}"})
        rows.append(f"{tag}_m{k}")
    return ops, rows


def modulate(x, scale, shift, out, norm_name):
    """norm(x) * (1 + scale[:, None]) + shift[:, None], the norm a LayerNorm without affine (eps 1e-6). The 1 + scale
    row is one new row per sample, left out."""
    return [
        {"op": "layer_norm", "name": norm_name, "in": x, "affine": False, "out": f"{out}_n"},
        {"op": "mul", "in": [f"{out}_n", scale], "out": f"{out}_s"},
        {"op": "add", "in": [f"{out}_s", shift], "out": out},
    ]


def feed_forward(prefix, x, out):
    """FeedForward(dim, dim_out=dim, activation_fn="gelu-tanh"): net.0 GELU(dim, 4 dim, approximate="tanh") is a
    linear then gelu, net.1 dropout (p 0), net.2 the linear back."""
    return [
        {"op": "linear", "name": f"{prefix}.net.0.proj", "in": x, "out_features": "4 * inner", "out": f"{out}_h"},
        {"op": "gelu", "in": f"{out}_h", "tanh": True, "out": f"{out}_g"},
        {"op": "linear", "name": f"{prefix}.net.2", "in": f"{out}_g", "out_features": C, "out": out},
    ]


def rms(name, x, out, variant=None):
    """torch.nn.RMSNorm(attention_head_dim, eps=1e-6) over each head's columns (FluxAttention from v0.35): PyTorch's
    composite rms_norm upcasts to fp32, saves that copy and rsqrt, and returns the input's dtype, as transformers'
    RMSNorm does (flux-dit.md section 7). diffusers' own RMSNorm (v0.30-v0.34) is rms_norm's "variant": "diffusers"."""
    op = {"op": "rms_norm", "name": name, "in": x, "unit": "attention_head_dim", "out": out}
    if variant:
        op["variant"] = variant
    return op


def dit_head(x, out_features, pred="pred"):
    """norm_out (AdaLayerNormContinuous: scale, then shift) and proj_out of the image rows `x`, and the MSE of the
    prediction against the flow-matching target."""
    ops, (scale, shift) = modulation("norm_out", "temb", 2, "o")
    return ops + modulate(x, scale, shift, "om", "norm_out.norm") + [
        {"op": "linear", "name": "proj_out", "in": "om", "out_features": out_features, "out": pred},
        {"op": "mse_loss", "in": [pred, "target"], "out": "loss"},
    ]


def double_block(i, ctx_in, ctx_out):
    """FluxTransformerBlock (transformer_flux.py), its attention FluxAttnProcessor (joint: text rows first)."""
    n = f"transformer_blocks.{i}"
    ops, (sh, sc, ga, sh2, sc2, ga2) = modulation(f"{n}.norm1", "temb", 6, "i")
    cops, (csh, csc, cga, csh2, csc2, cga2) = modulation(f"{n}.norm1_context", "temb", 6, "c")
    ops += cops
    ops += modulate("x", sc, sh, "xm", f"{n}.norm1.norm")
    ops += modulate(ctx_in, csc, csh, "cm", f"{n}.norm1_context.norm")
    a = f"{n}.attn"
    for p, src in (("to_q", "q"), ("to_k", "k"), ("to_v", "v")):
        ops.append({"op": "linear", "name": f"{a}.{p}", "in": "xm", "out_features": C, "out": src})
    for p, src in (("add_q_proj", "cq"), ("add_k_proj", "ck"), ("add_v_proj", "cv")):
        ops.append({"op": "linear", "name": f"{a}.{p}", "in": "cm", "out_features": C, "out": src})
    ops += [
        rms(f"{a}.norm_q", "q", "qn"),
        rms(f"{a}.norm_k", "k", "kn"),
        rms(f"{a}.norm_added_q", "cq", "cqn"),
        rms(f"{a}.norm_added_k", "ck", "ckn"),
        {"op": "concat", "in": ["cqn", "qn"], "out": "jq"},
        {"op": "concat", "in": ["ckn", "kn"], "out": "jk"},
        {"op": "concat", "in": ["cv", "v"], "out": "jv"},
        {"op": "rotary", "in": "jq", "out": "rq"},
        {"op": "rotary", "in": "jk", "out": "rk"},
        {"op": "attention", "in": ["rq", "rk", "jv"], "heads": "num_attention_heads", "cast_out": True, "out": "ao"},
        {"op": "slice", "in": "ao", "axis": "tokens", "start": 0, "size": "text_tokens", "out": "cao"},
        {"op": "slice", "in": "ao", "axis": "tokens", "start": "text_tokens", "size": "image_tokens", "out": "iao"},
        {"op": "linear", "name": f"{a}.to_out.0", "in": "iao", "out_features": C, "out": "io"},
        {"op": "linear", "name": f"{a}.to_add_out", "in": "cao", "out_features": C, "out": "co"},
        # the image stream: gate, residual, modulated MLP, gate, residual
        {"op": "mul", "in": ["io", ga], "out": "ig"},
        {"op": "add", "in": ["x", "ig"], "out": "x1"},
    ]
    ops += modulate("x1", sc2, sh2, "x1m", f"{n}.norm2")
    ops += feed_forward(f"{n}.ff", "x1m", "f")
    ops += [
        {"op": "mul", "in": ["f", ga2], "out": "fg"},
        {"op": "add", "in": ["x1", "fg"], "out": "y"},
        # the text stream likewise
        {"op": "mul", "in": ["co", cga], "out": "cg"},
        {"op": "add", "in": [ctx_in, "cg"], "out": "c1"},
    ]
    ops += modulate("c1", csc2, csh2, "c1m", f"{n}.norm2_context")
    ops += feed_forward(f"{n}.ff_context", "c1m", "cf")
    ops += [
        {"op": "mul", "in": ["cf", cga2], "out": "cfg"},
        {"op": "add", "in": ["c1", "cfg"], "out": ctx_out},
    ]
    return {"name": n, "repeat": 1, "input": "x", "ops": ops, "output": "y", "carry": [ctx_out]}


def single_block():
    """FluxSingleTransformerBlock: attention and the MLP side by side on the joint rows, no to_out (pre_only)."""
    n = "single_transformer_blocks"
    ops, (sh, sc, ga) = modulation(f"{n}.norm", "temb", 3, "s")
    ops += modulate("x", sc, sh, "xm", f"{n}.norm.norm")
    a = f"{n}.attn"
    ops += [
        {"op": "linear", "name": f"{n}.proj_mlp", "in": "xm", "out_features": "4 * inner", "out": "mh"},
        {"op": "gelu", "in": "mh", "tanh": True, "out": "mg"},
        {"op": "linear", "name": f"{a}.to_q", "in": "xm", "out_features": C, "out": "q"},
        {"op": "linear", "name": f"{a}.to_k", "in": "xm", "out_features": C, "out": "k"},
        {"op": "linear", "name": f"{a}.to_v", "in": "xm", "out_features": C, "out": "v"},
        rms(f"{a}.norm_q", "q", "qn"),
        rms(f"{a}.norm_k", "k", "kn"),
        {"op": "rotary", "in": "qn", "out": "rq"},
        {"op": "rotary", "in": "kn", "out": "rk"},
        {"op": "attention", "in": ["rq", "rk", "v"], "heads": "num_attention_heads", "cast_out": True, "out": "ao"},
        {"op": "concat", "in": ["ao", "mg"], "axis": "features", "out": "cat"},
        {"op": "linear", "name": f"{n}.proj_out", "in": "cat", "out_features": C, "out": "po"},
        {"op": "mul", "in": ["po", ga], "out": "pg"},
        {"op": "add", "in": ["x", "pg"], "out": "y"},
    ]
    return {"name": n, "repeat": "num_single_layers", "input": "x", "ops": ops, "output": "y"}


def program():
    double_layers = 19
    hyper = {
        # (num_layers, the 19 double-stream blocks, is fixed: each is a block kind of its own, generated here)
        "in_channels": 64, "num_single_layers": 38, "attention_head_dim": 128,
        "num_attention_heads": 24, "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": 1,
        # memsim's: the image side (or height and width where not 0), the VAE's downsampling, the T5 tokens
        "resolution": 1024, "height": 0, "width": 0, "vae_scale_factor": 8, "max_sequence_length": 512,
    }
    # The VAE (16 latent channels), CLIP-L's CLIPTextModel and T5-XXL's encoder: flux-dit.md section 1
    frozen = []
    for name, params in (("vae", 83819683), ("text_encoder", 123060480), ("text_encoder_2", 4762310656)):
        hyper[f"{name}_params"] = params
        hyper[f"{name}_on_gpu"] = 1
        frozen.append({"name": name, "params": f"{name}_params", "when": f"{name}_on_gpu"})
    dims = {
        "inner": "num_attention_heads * attention_head_dim",
        "image_height": "if(height, height, resolution)",
        "image_width": "if(width, width, resolution)",
        # FluxPipeline._pack_latents: latents of side // vae_scale_factor, in 2 x 2 patches
        "image_tokens": "(image_height // vae_scale_factor // 2) * (image_width // vae_scale_factor // 2)",
        "text_tokens": "max_sequence_length",
        "joint_tokens": "text_tokens + image_tokens",
    }
    inputs = {
        # packed noisy latents, the flow-matching target (noise - latents), T5 hidden states, CLIP's pooled output,
        # and the timestep's and guidance's sinusoidal projections (Timesteps(256), cast to the pooled dtype): all
        # made on the GPU in the weights' dtype
        "latents": {"shape": ["image_tokens", "in_channels"], "dtype": "compute"},
        "target": {"shape": ["image_tokens", "in_channels"], "dtype": "compute"},
        "text": {"shape": ["text_tokens", "joint_attention_dim"], "dtype": "compute"},
        "pooled": {"shape": [1, "pooled_projection_dim"], "dtype": "compute"},
        "t_proj": {"shape": [1, 256], "dtype": "compute"},
        "g_proj": {"shape": [1, 256], "dtype": "compute"},
    }
    te = "time_text_embed"
    emb_ops = [
        {"op": "linear", "name": "x_embedder", "in": "latents", "out_features": C, "out": "img"},
        *mlp_embedding(f"{te}.timestep_embedder", "t_proj", C, "t", "t3"),
        *mlp_embedding(f"{te}.guidance_embedder", "g_proj", C, "g", "g3"),
        {"op": "add", "in": ["t3", "g3"], "out": "tg"},
        *mlp_embedding(f"{te}.text_embedder", "pooled", C, "p", "p3"),
        {"op": "add", "in": ["tg", "p3"], "out": "temb"},
        {"op": "linear", "name": "context_embedder", "in": "text", "out_features": C, "out": "ctx0"},
    ]
    stages = [double_block(i, f"ctx{i}", f"ctx{i + 1}") for i in range(double_layers)]
    # FluxTransformer2DModel (v0.30) concatenates the streams once before the single blocks; from v0.33 each single
    # block concatenates and splits them itself, which keeps the same bytes (flux-dit.md).
    stages.append({"name": "single_transformer_blocks (cat)", "repeat": 1, "input": "x", "checkpoint": False, "ops": [
        {"op": "concat", "in": [f"ctx{double_layers}", "x"], "out": "joint"},
    ], "output": "joint"})
    stages.append(single_block())
    head_ops = [{"op": "slice", "in": "x", "axis": "tokens", "start": "text_tokens", "size": "image_tokens", "out": "img"}]
    head_ops += dit_head("img", "in_channels")
    return {
        "memsim_architecture": 1,
        "name": "flux_dit",
        "title": "FLUX.1 transformer (MMDiT, 12B)",
        "source": "diffusers v0.36.0 src/diffusers/models/transformers/transformer_flux.py (FluxTransformer2DModel, "
                  "FluxTransformerBlock, FluxSingleTransformerBlock, FluxAttnProcessor), embeddings.py "
                  "(CombinedTimestepGuidanceTextProjEmbeddings, FluxPosEmbed, apply_rotary_emb), normalization.py "
                  "(AdaLayerNormZero, AdaLayerNormZeroSingle, AdaLayerNormContinuous, RMSNorm), attention.py "
                  "(FeedForward, GELU); black-forest-labs/FLUX.1-dev transformer/config.json. docs/research/flux-dit.md. "
                  "Generated by tools/programs/flux.py",
        "lora_targets": "to_k,to_q,to_v,to_out.0",
        # diffusers checkpoints each block with torch.utils.checkpoint(..., use_reentrant=False)
        "checkpoint_reentrant": False,
        # AttnProcessor2_0 (and the joint processors) call F.scaled_dot_product_attention; diffusers picks them when
        # torch has it (attention_processor.py Attention.__init__), the eager AttnProcessor before torch 2.0
        "attention_code": "torch_sdpa",
        "model_types": [],
        "hyperparameters": hyper,
        # The frozen models diffusers' Flux scripts keep on the GPU to encode each batch (the VAE's encode is not
        # modelled as a forward here); _on_gpu = 0: latents or text embeddings cached before training.
        "frozen_modules": frozen,
        "dims": dims,
        "inputs": inputs,
        "embeddings": {"ops": emb_ops, "output": "img", "carry": ["temb", "ctx0"]},
        "blocks": stages,
        "head": {"input": "x", "ops": head_ops},
    }


def main():
    write_programs([("flux_dit", program())], "flux.py")


if __name__ == "__main__":
    main()
