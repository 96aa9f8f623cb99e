#!/usr/bin/env python3
"""Writes src/core/catalog/architectures/sd_unet.json and sdxl_unet.json: the Stable Diffusion 1.x and SDXL UNets
(diffusers UNet2DConditionModel) as memsim model programs.

Each program has a fixed layout of stages (SD 1.x: 4 levels, 2 layers per block, one transformer block per
attention, 88 stages; SDXL: 3 levels, no attention in the first, 2 and 10 transformer blocks per attention, linear
projections and the text_time add_embedding), so they are generated rather than written by hand; the channel
counts, heads, text width and resolution stay hyperparameters. What each stage does, and why, is in docs/research/diffusion-unet.md (diffusers v0.36.0):

- a ResnetBlock2D is one stage, checkpointable (diffusers checkpoints each resnet, v0.20 on), except the mid
  block's first resnet, which diffusers runs outside any checkpoint; an up resnet's concatenation of its skip is a
  stage of its own before it, outside the checkpoint;
- a Transformer2DModel is three stages: its GroupNorm, proj_in and the token view (never checkpointed); each
  BasicTransformerBlock (checkpointed, as diffusers does from v0.20); the contiguous copy, proj_out and the
  residual add (never checkpointed);
- Downsample2D and Upsample2D are stages of their own, never checkpointed;
- the skips (conv_in's output, each down resnet's or attention's output, each downsampler's) are carries that
  the up path concatenates before each resnet, the last pushed first (unet_2d_condition.py: down_block_res_samples);
- temb (the time embedding) is a carry every resnet reads; the text embeddings an input every attn2 reads.

Usage: python3 tools/programs/sd_unet.py [--check]   (--check: exit 1 if a checked-in file differs)
"""
from common import mlp_embedding, write_programs



def resnet(name, cin, cout, checkpoint=True, carry_out=None):
    """diffusers ResnetBlock2D (models/resnet.py): norm1, SiLU, conv1, + time_emb_proj(SiLU(temb)), norm2, SiLU,
    dropout (p 0: its input), conv2, (conv_shortcut where cin != cout), (x + h) / output_scale_factor."""
    ops = []
    x = "x"
    ops += [
        {"op": "group_norm", "name": f"{name}.norm1", "in": x, "groups": "groups", "out": "n1"},
        {"op": "silu", "in": "n1", "out": "a1"},
        {"op": "conv2d", "name": f"{name}.conv1", "in": "a1", "out_channels": cout, "kernel": 3, "stride": 1, "padding": 1, "out": "c1"},
        {"op": "silu", "in": "temb", "out": "ta"},
        {"op": "linear", "name": f"{name}.time_emb_proj", "in": "ta", "out_features": cout, "out": "tp"},
        {"op": "add", "in": ["c1", "tp"], "out": "h1"},
        {"op": "group_norm", "name": f"{name}.norm2", "in": "h1", "groups": "groups", "out": "n2"},
        {"op": "silu", "in": "n2", "out": "a2"},
        {"op": "conv2d", "name": f"{name}.conv2", "in": "a2", "out_channels": cout, "kernel": 3, "stride": 1, "padding": 1, "out": "c2"},
    ]
    shortcut = x
    if cin != cout:
        ops.append({"op": "conv2d", "name": f"{name}.conv_shortcut", "in": x, "out_channels": cout, "kernel": 1, "stride": 1, "out": "sc"})
        shortcut = "sc"
    ops += [
        {"op": "add", "in": [shortcut, "c2"], "out": "sum"},
        {"op": "scale", "in": "sum", "out": "y"},  # / output_scale_factor (1.0): a new tensor
    ]
    stage = {"name": name, "repeat": 1, "input": "x", "ops": ops, "output": "y"}
    if not checkpoint:
        stage["checkpoint"] = False
    if carry_out:
        stage["carry"] = ["y"]
        rename(stage, "y", carry_out)
    return stage


def rename(stage, old, new):
    """Renames a stage's tensor (a carry's name is its tensor's name in the stage that makes it)."""
    for op in stage["ops"]:
        if op["out"] == old:
            op["out"] = new
        if isinstance(op.get("in"), list):
            op["in"] = [new if t == old else t for t in op["in"]]
        elif op.get("in") == old:
            op["in"] = new
    if stage["output"] == old:
        stage["output"] = new
    if "carry" in stage:
        stage["carry"] = [new if t == old else t for t in stage["carry"]]


def transformer(name, ch, heads, side, residual, carry_out=None, linear=False, layers=1):
    """diffusers Transformer2DModel with `layers` BasicTransformerBlocks: three stages (the blocks one kind, repeated).
    linear: use_linear_projection (SD 2.x, SDXL): proj_in and proj_out are Linears on the tokens; matmul copies the
    permuted view to flatten it, and saves that copy; the output's contiguous copy is read by the residual add only."""
    if linear:
        t2d_in_ops = [
            {"op": "group_norm", "name": f"{name}.norm", "in": "x", "groups": "groups", "out": "n"},
            {"op": "flatten_tokens", "in": "n", "out": "f"},  # permute(0, 2, 3, 1).reshape(B, H W, C): a view
            {"op": "copy", "in": "f", "out": "fc"},           # matmul's contiguous copy of it
            {"op": "linear", "name": f"{name}.proj_in", "in": "fc", "out_features": ch, "out": "tokens"},
        ]
    else:
        t2d_in_ops = [
            {"op": "group_norm", "name": f"{name}.norm", "in": "x", "groups": "groups", "out": "n"},
            {"op": "conv2d", "name": f"{name}.proj_in", "in": "n", "out_channels": ch, "kernel": 1, "stride": 1, "out": "p"},
            # permute(0, 2, 3, 1).reshape(B, H W, C): a view of proj_in's output, which norm1 reads
            {"op": "flatten_tokens", "in": "p", "out": "tokens"},
        ]
    t2d_in = {"name": f"{name} (norm, proj_in)", "repeat": 1, "input": "x", "checkpoint": False, "ops": t2d_in_ops, "output": "tokens"}
    # One block: its module path; several (a kind that repeats): the path without the block's index.
    b = f"{name}.transformer_blocks.0" if layers == 1 else f"{name}.transformer_blocks"
    block = {"name": b, "repeat": layers, "input": "h", "ops": [
        {"op": "layer_norm", "name": f"{b}.norm1", "in": "h", "out": "l1"},
        {"op": "linear", "name": f"{b}.attn1.to_q", "in": "l1", "out_features": ch, "bias": False, "out": "q"},
        {"op": "linear", "name": f"{b}.attn1.to_k", "in": "l1", "out_features": ch, "bias": False, "out": "k"},
        {"op": "linear", "name": f"{b}.attn1.to_v", "in": "l1", "out_features": ch, "bias": False, "out": "v"},
        {"op": "attention", "in": ["q", "k", "v"], "heads": heads, "out": "o"},
        {"op": "linear", "name": f"{b}.attn1.to_out.0", "in": "o", "out_features": ch, "out": "o1"},
        {"op": "scale", "in": "o1", "out": "o2"},  # / rescale_output_factor (1.0)
        {"op": "add", "in": ["o2", "h"], "out": "r1"},
        {"op": "layer_norm", "name": f"{b}.norm2", "in": "r1", "out": "l2"},
        {"op": "linear", "name": f"{b}.attn2.to_q", "in": "l2", "out_features": ch, "bias": False, "out": "q2"},
        {"op": "linear", "name": f"{b}.attn2.to_k", "in": "text", "out_features": ch, "bias": False, "out": "k2"},
        {"op": "linear", "name": f"{b}.attn2.to_v", "in": "text", "out_features": ch, "bias": False, "out": "v2"},
        {"op": "attention", "in": ["q2", "k2", "v2"], "heads": heads, "out": "o3"},
        {"op": "linear", "name": f"{b}.attn2.to_out.0", "in": "o3", "out_features": ch, "out": "o4"},
        {"op": "scale", "in": "o4", "out": "o5"},
        {"op": "add", "in": ["o5", "r1"], "out": "r2"},
        {"op": "layer_norm", "name": f"{b}.norm3", "in": "r2", "out": "l3"},
        # GEGLU: proj to 2 x 4C, chunk(2) (views), hidden * gelu(gate)
        {"op": "linear", "name": f"{b}.ff.net.0.proj", "in": "l3", "out_features": f"8 * {ch}", "out": "pr"},
        {"op": "slice", "in": "pr", "start": 0, "size": f"4 * {ch}", "out": "hs"},
        {"op": "slice", "in": "pr", "start": f"4 * {ch}", "size": f"4 * {ch}", "out": "gate"},
        {"op": "gelu", "in": "gate", "out": "g"},
        {"op": "mul", "in": ["hs", "g"], "out": "m"},
        {"op": "linear", "name": f"{b}.ff.net.2", "in": "m", "out_features": ch, "out": "f"},
        {"op": "add", "in": ["f", "r2"], "out": "y"},
    ], "output": "y"}
    if linear:
        out_ops = [
            {"op": "linear", "name": f"{name}.proj_out", "in": "y", "out_features": ch, "out": "po"},
            # reshape(B, H, W, C).permute(0, 3, 1, 2).contiguous(): a copy, which the residual add reads
            {"op": "unflatten_tokens", "in": "po", "height": side, "out": "u"},
            {"op": "copy", "in": "u", "out": "img"},
            {"op": "add", "in": ["img", residual], "out": "out"},
        ]
    else:
        out_ops = [
            # reshape(B, H, W, C).permute(0, 3, 1, 2).contiguous(): a copy, which proj_out saves
            {"op": "unflatten_tokens", "in": "y", "height": side, "out": "u"},
            {"op": "copy", "in": "u", "out": "img"},
            {"op": "conv2d", "name": f"{name}.proj_out", "in": "img", "out_channels": ch, "kernel": 1, "stride": 1, "out": "po"},
            {"op": "add", "in": ["po", residual], "out": "out"},
        ]
    t2d_out = {"name": f"{name} (proj_out)", "repeat": 1, "input": "y", "checkpoint": False, "ops": out_ops, "output": "out"}
    if carry_out:
        t2d_out["carry"] = ["out"]
        rename(t2d_out, "out", carry_out)
    return [t2d_in, block, t2d_out]


# The two layouts. Per level: its channels' hyperparameter (a level that repeats the one before names the same one:
# diffusers adds a conv_shortcut only where a resnet's channels change, and the generator decides it from the names;
# SD 1.x and 2.x repeat the third level's 1280 in the fourth), its heads' hyperparameter, and the
# transformer blocks per attention (0: no attention, a DownBlock2D / UpBlock2D).
SD1 = {
    "name": "sd_unet",
    "title": "Stable Diffusion 1.x UNet (diffusers UNet2DConditionModel), trained on the noise-prediction loss",
    "levels": [("ch0", "heads0", 1), ("ch1", "heads1", 1), ("ch2", "heads2", 1), ("ch2", "heads3", 0)],
    "mid_heads": "heads3", "mid_layers": 1, "linear": False, "add_embedding": False,
    "hyperparameters": {"resolution": 512, "vae_scale_factor": 8, "in_channels": 4, "out_channels": 4,
                        "ch0": 320, "ch1": 640, "ch2": 1280, "heads0": 8, "heads1": 8, "heads2": 8, "heads3": 8,
                        "groups": 32, "cross_attention_dim": 768, "text_tokens": 77},
    # AutoencoderKL (stable-diffusion-v1-5/vae) and CLIPTextModel (CLIP ViT-L/14's text tower), in weight_dtype
    "frozen": [("vae", 83653863, "compute"), ("text_encoder", 123060480, "compute")],
    "source_extra": "examples/text_to_image/train_text_to_image.py and train_text_to_image_lora.py (the loss)",
}
SDXL = {
    "name": "sdxl_unet",
    "title": "Stable Diffusion XL UNet (diffusers UNet2DConditionModel, text_time conditioning), trained on the noise-prediction loss",
    "levels": [("ch0", "heads0", 0), ("ch1", "heads1", "layers1"), ("ch2", "heads2", "layers2")],
    "mid_heads": "heads2", "mid_layers": "layers2", "linear": True, "add_embedding": True,
    "hyperparameters": {"resolution": 1024, "vae_scale_factor": 8, "in_channels": 4, "out_channels": 4,
                        "ch0": 320, "ch1": 640, "ch2": 1280, "heads0": 5, "heads1": 10, "heads2": 20,
                        "layers1": 2, "layers2": 10, "groups": 32, "cross_attention_dim": 2048, "text_tokens": 77,
                        "addition_time_embed_dim": 256, "pooled_text_dim": 1280},
    # The SDXL scripts keep the VAE in fp32 (its fp16 overflows; train_dreambooth_lora_sdxl.py, train_text_to_image_sdxl.py)
    # and the two text encoders in weight_dtype: CLIPTextModel (123,060,480) and OpenCLIP ViT-bigG's
    # CLIPTextModelWithProjection (text_encoder_2/config.json: hidden 1280, 32 layers, intermediate 5120, vocabulary
    # 49,408, 77 positions, projection 1280 without bias: 694,659,840)
    "frozen": [("vae", 83653863, "fp32"), ("text_encoder", 123060480, "compute"), ("text_encoder_2", 694659840, "compute")],
    "source_extra": "examples/dreambooth/train_dreambooth_lora_sdxl.py and examples/text_to_image/train_text_to_image_sdxl.py (the loss, add_time_ids)",
}


def program(v):
    stages = []
    skips = [("skip0", "ch0")]  # conv_in's output, with its channels
    n = 0
    levels = v["levels"]
    linear = v["linear"]

    def push(ch):
        nonlocal n
        n += 1
        skips.append((f"skip{n}", ch))
        return skips[-1][0]

    def side(level):
        return f"side{level}"

    # Down blocks: CrossAttnDownBlock2D where the level has attention, else DownBlock2D; no downsampler in the last.
    cin = "ch0"
    for level, (ch, heads, layers) in enumerate(levels):
        last = level == len(levels) - 1
        for i in range(2):
            name = f"down_blocks.{level}.resnets.{i}"
            if layers != 0:
                res = f"d{level}r{i}_out"  # the attention's residual
                stages.append(resnet(name, cin, ch, carry_out=res))
                stages += transformer(f"down_blocks.{level}.attentions.{i}", ch, heads, side(level), res, carry_out=push(ch),
                                      linear=linear, layers=layers)
            else:
                stages.append(resnet(name, cin, ch, carry_out=push(ch)))
            cin = ch
        if not last:
            stages.append({"name": f"down_blocks.{level}.downsamplers.0", "repeat": 1, "input": "x", "checkpoint": False, "ops": [
                {"op": "conv2d", "name": f"down_blocks.{level}.downsamplers.0.conv", "in": "x", "out_channels": ch, "kernel": 3, "stride": 2, "padding": 1, "out": push(ch)},
            ], "output": skips[-1][0], "carry": [skips[-1][0]]})

    # Mid block: resnet (not checkpointed), attention, resnet.
    top = len(levels) - 1
    ch_top = levels[top][0]
    stages.append(resnet("mid_block.resnets.0", ch_top, ch_top, checkpoint=False, carry_out="mid_r0_out"))
    stages += transformer("mid_block.attentions.0", ch_top, v["mid_heads"], side(top), "mid_r0_out", linear=linear,
                          layers=v["mid_layers"])
    stages.append(resnet("mid_block.resnets.1", ch_top, ch_top))

    # Up blocks, from the deepest level; each resnet pops the last skip and concatenates it after the current tensor.
    prev = ch_top
    for u in range(len(levels)):
        level = top - u
        ch, heads, layers = levels[level]
        for i in range(3):
            skip, skip_ch = skips.pop()
            name = f"up_blocks.{u}.resnets.{i}"
            rin = prev if i == 0 else ch  # unet_2d_blocks.py: resnet_in_channels + res_skip_channels
            cin = f"{rin} + {skip_ch}"
            # torch.cat([hidden_states, res_hidden_states], dim=1) runs in the up block's forward, outside the
            # resnet's checkpoint, which keeps the concatenated tensor (cat itself saves nothing).
            stages.append({"name": f"{name} (cat)", "repeat": 1, "input": "x", "checkpoint": False, "ops": [
                {"op": "concat", "in": ["x", skip], "axis": "channels", "out": "cat"},
            ], "output": "cat"})
            if layers == 0:
                stages.append(resnet(name, cin, ch))
            else:
                res = f"u{u}r{i}_out"
                stages.append(resnet(name, cin, ch, carry_out=res))
                stages += transformer(f"up_blocks.{u}.attentions.{i}", ch, heads, side(level), res, linear=linear, layers=layers)
        prev = ch
        if u < len(levels) - 1:
            stages.append({"name": f"up_blocks.{u}.upsamplers.0", "repeat": 1, "input": "x", "checkpoint": False, "ops": [
                {"op": "upsample_nearest", "in": "x", "scale": 2, "out": "up"},
                {"op": "conv2d", "name": f"up_blocks.{u}.upsamplers.0.conv", "in": "up", "out_channels": ch, "kernel": 3, "stride": 1, "padding": 1, "out": "y"},
            ], "output": "y"})
    assert not skips, skips

    hyper = dict(v["hyperparameters"])
    frozen = []
    for name, params, dtype in v["frozen"]:
        hyper[f"{name}_params"] = params
        hyper[f"{name}_on_gpu"] = 1
        entry = {"name": name, "params": f"{name}_params", "when": f"{name}_on_gpu"}
        if dtype != "compute":
            entry["dtype"] = dtype
        if name == "vae":  # vae.encode(pixel_values) each micro-batch: its no-grad transients before the UNet's forward
            entry["forward"] = {"program": "sd_vae_encoder", "args": {"resolution": "resolution"}}
        frozen.append(entry)
    dims = {"side0": "resolution // vae_scale_factor"}
    for level in range(1, len(levels)):
        dims[f"side{level}"] = f"(side{level - 1} + 1) // 2"
    dims["time_dim"] = "4 * ch0"
    inputs = {
        # The noisy latents, the noise (the target), the sinusoidal timestep projection (cast to the latents' dtype)
        # and the text encoder's hidden states: all made on the GPU in the weights' dtype.
        "latents": {"shape": ["in_channels", "side0", "side0"], "dtype": "compute"},
        "noise": {"shape": ["out_channels", "side0", "side0"], "dtype": "compute"},
        "t_emb": {"shape": [1, "ch0"], "dtype": "compute"},
        "text": {"shape": ["text_tokens", "cross_attention_dim"], "dtype": "compute"},
    }
    emb_ops = [
        *mlp_embedding("time_embedding", "t_emb", "time_dim", "t", "temb"),
    ]
    if v["add_embedding"]:
        # text_time: the pooled text embeddings beside the six size and crop ids' sinusoidal projections
        # (add_time_proj, 6 x addition_time_embed_dim), through add_embedding, added to the time embedding.
        inputs["text_time"] = {"shape": [1, "pooled_text_dim + 6 * addition_time_embed_dim"], "dtype": "compute"}
        emb_ops[-1]["out"] = "temb0"
        emb_ops += [
            *mlp_embedding("add_embedding", "text_time", "time_dim", "a", "aug"),
            {"op": "add", "in": ["temb0", "aug"], "out": "temb"},
        ]
    emb_ops.append({"op": "conv2d", "name": "conv_in", "in": "latents", "out_channels": "ch0", "kernel": 3, "stride": 1, "padding": 1, "out": "skip0"})
    return {
        "memsim_architecture": 1,
        "name": v["name"],
        "title": v["title"],
        "source": "diffusers v0.36.0 src/diffusers/models/unets/unet_2d_condition.py, unet_2d_blocks.py, resnet.py, "
                  "transformers/transformer_2d.py, attention.py, attention_processor.py (AttnProcessor2_0), "
                  "activations.py (GEGLU), downsampling.py, upsampling.py; checkpoint units as from v0.20; " + v["source_extra"] +
                  ". docs/research/diffusion-unet.md. Generated by tools/programs/sd_unet.py",
        "lora_targets": "to_k,to_q,to_v,to_out.0",
        # diffusers checkpoints with torch.utils.checkpoint(..., use_reentrant=False) on torch >= 1.11
        "checkpoint_reentrant": False,
        # AttnProcessor2_0 (and the joint processors) call F.scaled_dot_product_attention; diffusers picks them when
        # torch has it (attention_processor.py Attention.__init__), the eager AttnProcessor before torch 2.0
        "attention_code": "torch_sdpa",
        "model_types": [],
        "hyperparameters": hyper,
        # The frozen models the training scripts keep on the GPU to encode each batch; a model's _on_gpu = 0: its
        # outputs cached before training (latents, text embeddings), the model not on the GPU.
        "frozen_modules": frozen,
        "dims": dims,
        "inputs": inputs,
        "embeddings": {"ops": emb_ops, "output": "skip0", "carry": ["temb", "skip0"]},
        "blocks": stages,
        "head": {
            "input": "x",
            "ops": [
                {"op": "group_norm", "name": "conv_norm_out", "in": "x", "groups": "groups", "out": "n"},
                {"op": "silu", "in": "n", "out": "a"},
                {"op": "conv2d", "name": "conv_out", "in": "a", "out_channels": "out_channels", "kernel": 3, "stride": 1, "padding": 1, "out": "pred"},
                {"op": "mse_loss", "in": ["pred", "noise"], "out": "loss"},
            ],
        },
    }


def vae_resnet(name, cin, cout):
    """diffusers ResnetBlock2D without a time embedding (temb_channels None), as the VAE's encoder builds it."""
    ops = [
        {"op": "group_norm", "name": f"{name}.norm1", "in": "x", "groups": "groups", "out": "n1"},
        {"op": "silu", "in": "n1", "out": "a1"},
        {"op": "conv2d", "name": f"{name}.conv1", "in": "a1", "out_channels": cout, "kernel": 3, "stride": 1, "padding": 1, "out": "c1"},
        {"op": "group_norm", "name": f"{name}.norm2", "in": "c1", "groups": "groups", "out": "n2"},
        {"op": "silu", "in": "n2", "out": "a2"},
        {"op": "conv2d", "name": f"{name}.conv2", "in": "a2", "out_channels": cout, "kernel": 3, "stride": 1, "padding": 1, "out": "c2"},
    ]
    shortcut = "x"
    if cin != cout:
        ops.append({"op": "conv2d", "name": f"{name}.conv_shortcut", "in": "x", "out_channels": cout, "kernel": 1, "stride": 1, "out": "sc"})
        shortcut = "sc"
    ops += [{"op": "add", "in": [shortcut, "c2"], "out": "sum"}, {"op": "scale", "in": "sum", "out": "y"}]
    return {"name": name, "repeat": 1, "input": "x", "ops": ops, "output": "y"}


def vae_encoder():
    """diffusers AutoencoderKL.encode (models/autoencoders/vae.py Encoder, then quant_conv) as a frozen module's
    forward: what vae.encode(pixel_values) makes, under no_grad, each micro-batch before the UNet's forward."""
    stages = []
    chans = ["ch0", "ch1", "ch2", "ch2"]  # block_out_channels [128, 256, 512, 512]
    cin = "ch0"
    for level, ch in enumerate(chans):
        for i in range(2):
            stages.append(vae_resnet(f"encoder.down_blocks.{level}.resnets.{i}", cin, ch))
            cin = ch
        if level < 3:
            # Downsample2D(padding=0): F.pad(x, (0, 1, 0, 1)) (a copy one row and column larger), then a 3x3 conv of
            # stride 2; memsim's copy keeps the input's size, and the padded conv makes the same output
            stages.append({"name": f"encoder.down_blocks.{level}.downsamplers.0", "repeat": 1, "input": "x", "ops": [
                {"op": "copy", "in": "x", "out": "padded"},
                {"op": "conv2d", "name": f"encoder.down_blocks.{level}.downsamplers.0.conv", "in": "padded", "out_channels": ch, "kernel": 3, "stride": 2, "padding": 1, "out": "y"},
            ], "output": "y"})
    stages.append(vae_resnet("encoder.mid_block.resnets.0", "ch2", "ch2"))
    a = "encoder.mid_block.attentions.0"
    # Attention(512, heads=1, norm_num_groups=32, residual_connection=True) through AttnProcessor2_0 on a 4-D input:
    # group_norm, the tokens as a view, q, k, v, SDPA with one head, to_out, back to an image (a copy), + residual.
    stages.append({"name": a, "repeat": 1, "input": "x", "ops": [
        {"op": "group_norm", "name": f"{a}.group_norm", "in": "x", "groups": "groups", "out": "n"},
        {"op": "flatten_tokens", "in": "n", "out": "t"},
        {"op": "linear", "name": f"{a}.to_q", "in": "t", "out_features": "ch2", "out": "q"},
        {"op": "linear", "name": f"{a}.to_k", "in": "t", "out_features": "ch2", "out": "k"},
        {"op": "linear", "name": f"{a}.to_v", "in": "t", "out_features": "ch2", "out": "v"},
        {"op": "attention", "in": ["q", "k", "v"], "heads": 1, "out": "o"},
        {"op": "linear", "name": f"{a}.to_out.0", "in": "o", "out_features": "ch2", "out": "o1"},
        {"op": "unflatten_tokens", "in": "o1", "height": "side3", "out": "u"},
        {"op": "copy", "in": "u", "out": "img"},
        {"op": "add", "in": ["img", "x"], "out": "sum"},
        {"op": "scale", "in": "sum", "out": "y"},
    ], "output": "y"})
    stages.append(vae_resnet("encoder.mid_block.resnets.1", "ch2", "ch2"))
    stages.append({"name": "encoder.conv_out, quant_conv", "repeat": 1, "input": "x", "ops": [
        {"op": "group_norm", "name": "encoder.conv_norm_out", "in": "x", "groups": "groups", "out": "n"},
        {"op": "silu", "in": "n", "out": "a"},
        {"op": "conv2d", "name": "encoder.conv_out", "in": "a", "out_channels": "2 * latent_channels", "kernel": 3, "stride": 1, "padding": 1, "out": "moments"},
        {"op": "conv2d", "name": "quant_conv", "in": "moments", "out_channels": "2 * latent_channels", "kernel": 1, "stride": 1, "out": "y"},
    ], "output": "y"})
    return {
        "memsim_architecture": 1,
        "name": "sd_vae_encoder",
        "title": "Stable Diffusion's VAE encoder (diffusers AutoencoderKL.encode), a frozen module's forward",
        "source": "diffusers v0.36.0 src/diffusers/models/autoencoders/autoencoder_kl.py (encode: encoder, quant_conv), vae.py "
                  "(Encoder: conv_in, DownEncoderBlock2D x 4, UNetMidBlock2D, conv_norm_out, conv_out with double_z), resnet.py, "
                  "downsampling.py (padding 0: F.pad then a stride-2 conv), attention_processor.py; stable-diffusion-v1-5/vae/config.json "
                  "(block_out_channels [128, 256, 512, 512], layers_per_block 2, latent_channels 4, norm_num_groups 32). "
                  "Generated by tools/programs/sd_unet.py",
        "attention_code": "torch_sdpa",  # the mid block's attention: AttnProcessor2_0 from torch 2.0
        "model_types": [],
        "frozen_forward": True,
        "hyperparameters": {"resolution": 512, "in_channels": 3, "ch0": 128, "ch1": 256, "ch2": 512, "latent_channels": 4, "groups": 32},
        "dims": {"side0": "resolution", "side1": "(side0 + 1) // 2", "side2": "(side1 + 1) // 2", "side3": "(side2 + 1) // 2"},
        "inputs": {"pixel_values": {"shape": ["in_channels", "resolution", "resolution"]}},
        "embeddings": {"ops": [
            {"op": "conv2d", "name": "encoder.conv_in", "in": "pixel_values", "out_channels": "ch0", "kernel": 3, "stride": 1, "padding": 1, "out": "h"},
        ], "output": "h"},
        "blocks": stages,
    }


def main():
    write_programs([(v["name"], program(v)) for v in (SD1, SDXL)] + [("sd_vae_encoder", vae_encoder())], "sd_unet.py")


if __name__ == "__main__":
    main()
