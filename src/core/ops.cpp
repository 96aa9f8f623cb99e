// The op vocabulary's shapes and parameters (ops.h). Parameter names follow the modules' state_dict keys, so that
// PEFT's target_modules and HF Trainer's decay groups see what they see in PyTorch.
#include "ops.h"

#include "checked.h"

namespace memsim {

namespace {

using K = OpKey;

int64_t prod(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n = mul(n, d);
  return n;
}

// `row` is one row [1, C] per sample that broadcasts over the token rows [T, C] of `x` (a modulation's scale,
// shift or gate: diffusers' AdaLayerNormZero chunks).
bool row_of(const ArchTensor& row, const ArchTensor& x) {
  return row.shape.size() == 2 && x.shape.size() == 2 && row.shape[0] == 1 && row.shape[1] == x.shape[1];
}


}  // namespace

std::string dims_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

int64_t ArchTensor::numel() const { return prod(shape); }

const std::vector<OpSpec>& op_specs() {
  static const std::vector<OpSpec> specs = {
      {OpKind::Parameter, "parameter", {{"shape", K::Dim, true}, {"kind", K::Choice, false}, {"frozen", K::Flag, false}}, true,
       "nn.Parameter used as it is (ViT cls_token [1, 1, h] and position_embeddings [1, tokens, h], modeling_vit.py "
       "ViTEmbeddings); frozen: a weight with requires_grad_(False), counted and stored but never trained (Whisper's "
       "sinusoidal encoder positions, modeling_whisper.py WhisperEncoder: embed_positions.requires_grad_(False))"},
      {OpKind::Conv2d, "conv2d",
       {{"in", K::Tensor, true}, {"out_channels", K::Dim, true}, {"kernel", K::Dim, true}, {"stride", K::Dim, true},
        {"padding", K::Dim, false}, {"groups", K::Dim, false}, {"bias", K::Flag, false}},
       true,
       "torch.nn.Conv2d: weight [out, in / groups, k, k], bias [out]; output (H + 2 padding - k) // stride + 1 per "
       "side"},
      {OpKind::BatchNorm2d, "batch_norm2d", {{"in", K::Tensor, true}}, true,
       "torch.nn.BatchNorm2d(C) in training mode: weight and bias [C] (running_mean and running_var are buffers, "
       "2 x C fp32, not parameters); aten cudnn_batch_norm / native_batch_norm save the input and the batch's mean "
       "and inverse deviation, fp32 [C] each (derivatives.yaml)"},
      {OpKind::MaxPool2d, "max_pool2d",
       {{"in", K::Tensor, true}, {"kernel", K::Dim, true}, {"stride", K::Dim, false}, {"padding", K::Dim, false}},
       false,
       "torch.nn.MaxPool2d: max_pool2d_with_indices saves its input and the int64 indices of each output "
       "(derivatives.yaml); output (H + 2 padding - k) // stride + 1 per side, stride defaulting to the kernel"},
      {OpKind::GlobalAvgPool, "global_avg_pool", {{"in", K::Tensor, true}}, false,
       "torch.nn.AdaptiveAvgPool2d((1, 1)) then torch.flatten(x, 1) (torchvision ResNet.forward): [C, H, W] -> "
       "[1, C]; the mean's backward needs only the shape"},
      {OpKind::FlattenTokens, "flatten_tokens", {{"in", K::Tensor, true}}, false,
       "x.flatten(2).transpose(1, 2): [C, H, W] -> [H W, C], a view (ViTPatchEmbeddings.forward)"},
      {OpKind::UnflattenTokens, "unflatten_tokens", {{"in", K::Tensor, true}, {"height", K::Dim, true}}, false,
       "x.permute(0, 3, 1, 2) of an [H, W, C] map, as torchvision's ConvNeXt (Permute([0, 3, 1, 2]) in CNBlock, "
       "LayerNorm2d.forward): [H W, C] -> [C, height, H W / height], a view"},
      {OpKind::Concat, "concat", {{"in", K::Tensors, true}, {"axis", K::Choice, false}}, false,
       "torch.cat over token rows of equal width (axis tokens, dim=1) or over features of equal rows (axis features, "
       "dim=-1): a new tensor in the promoted dtype"},
      {OpKind::Add, "add", {{"in", K::Tensors, true}, {"inplace", K::Flag, false}}, false,
       "elementwise a + b of equal shapes (a parameter of the same shape broadcasts over the batch), or an image [C, H, "
       "W] plus one row [1, C] per sample broadcast over its height and width (diffusers ResnetBlock2D: hidden_states "
       "+ temb[:, :, None, None]), or token rows plus one row (AdaLayerNormZero: + shift_msa[:, None]); inplace: a += b (torchvision Bottleneck: out += identity), which writes a and "
       "makes nothing new"},
      {OpKind::LayerNorm, "layer_norm", {{"in", K::Tensor, true}, {"bias", K::Flag, false}, {"affine", K::Flag, false}}, true,
       "torch.nn.LayerNorm(width): weight and bias [width]; affine false: nn.LayerNorm(width, "
       "elementwise_affine=False), no parameters (diffusers AdaLayerNormZero's norm)"},
      {OpKind::RmsNorm, "rms_norm", {{"in", K::Tensor, true}, {"unit", K::Dim, false}, {"variant", K::Choice, false}}, true,
       "transformers' eager RMSNorm (Qwen2RMSNorm, LlamaRMSNorm): x.to(float32), * rsqrt(mean(x^2) + eps), then "
       "weight * x.to(input dtype); weight [width]. Saves the fp32 copy and rstd, and the cast result where the weight "
       "trains. variant diffusers: diffusers v0.36 models/normalization.py RMSNorm, x * rsqrt(x.to(float32).pow(2)"
       ".mean(-1) + eps), cast to the weight's dtype where that is 16-bit, * weight. unit: the columns normalized "
       "together, weight [unit] (Flux's norm_q over each head's head_dim)"},
      {OpKind::Linear, "linear", {{"in", K::Tensor, true}, {"out_features", K::Dim, true}, {"bias", K::Flag, false}},
       true, "torch.nn.Linear: weight [out, in], bias [out]"},
      {OpKind::Attention, "attention",
       {{"in", K::Tensors, true}, {"heads", K::Dim, true}, {"kv_heads", K::Dim, false}, {"dropout", K::Probability, false},
        {"packed", K::Flag, false}, {"unit", K::Dim, false}, {"cast_out", K::Flag, false}}, false,
       "softmax(q k^T / sqrt(d)) v over `heads` heads, bidirectional; q [tokens, heads x d], k and v [tokens or another "
       "sequence's rows (cross-attention), heads x d]. packed: the "
       "micro-batch's samples as one sequence that attends within each sample (Qwen2-VL's tower: cu_seqlens), which "
       "before transformers 4.54 builds a block-diagonal [1, N, N] mask over all N rows in every block (eager, "
       "SDPA) and, with eager or 3-D SDPA inputs (before 4.51: the math path), scores over all of them. unit: rows that "
       "attend together within a sample (Qwen2.5-VL's windows of 64 patches), where the kernel attends per unit. Under "
       "autocast the kernel reads (and saves) compute-dtype copies of fp32 q, k, v (autocast_mode.cpp: "
       "scaled_dot_product_attention is lower_precision_fp). cast_out: the output cast to q's dtype, as diffusers' "
       "processors do (FluxAttnProcessor, AttnProcessor2_0: hidden_states.to(query.dtype)). kv_heads: grouped-query "
       "attention, k and v [rows, kv_heads x d]; where the resolved attention repeats them for every query head "
       "(transformers' repeat_kv: eager, SDPA before enable_gqa, the math kernel) the kernel reads and saves those "
       "copies, and where it does not (flash, SDPA's enable_gqa) its backward expands dk and dv to every head "
       "(flash_api.cpp mha_bwd: dk_expanded, dv_expanded) before summing them"},
      {OpKind::Gelu, "gelu", {{"in", K::Tensor, true}, {"tanh", K::Flag, false}}, false, "torch.nn.GELU"},
      {OpKind::Silu, "silu", {{"in", K::Tensor, true}}, false,
       "torch.nn.functional.silu: silu_backward reads its input (derivatives.yaml)"},
      {OpKind::Relu, "relu", {{"in", K::Tensor, true}, {"inplace", K::Flag, false}}, false,
       "torch.nn.ReLU; inplace: nn.ReLU(inplace=True) (torchvision ResNet), relu_ writes its input and saves the "
       "result, which is then that tensor"},
      {OpKind::Tanh, "tanh", {{"in", K::Tensor, true}}, false, "torch.nn.Tanh (tanh_backward reads its result)"},
      {OpKind::Sigmoid, "sigmoid", {{"in", K::Tensor, true}}, false,
       "torch.sigmoid (sigmoid_backward reads its result, derivatives.yaml); CLIP's QuickGELUActivation is "
       "input * torch.sigmoid(1.702 * input) (transformers activations.py): scale, sigmoid and mul"},
      {OpKind::Dropout, "dropout", {{"in", K::Tensor, true}, {"p", K::Probability, true}}, false, "torch.nn.Dropout"},
      {OpKind::SelectToken, "select_token", {{"in", K::Tensor, true}, {"index", K::Dim, false}}, false,
       "x[:, index, :], a view of one token row (ViTForImageClassification: sequence_output[:, 0, :])"},
      {OpKind::Slice, "slice", {{"in", K::Tensor, true}, {"start", K::Dim, true}, {"size", K::Dim, true}, {"axis", K::Choice, false}}, false,
       "x[..., start:start + size], a view of columns of the last dimension (timm Attention: qkv.reshape(B, N, 3, "
       "heads, d).permute(2, 0, 3, 1, 4), then q, k, v = qkv[0], qkv[1], qkv[2]); axis tokens: x[:, start:start + "
       "size] of token rows (diffusers FluxTransformerBlock: the joint attention's output split into the text's and "
       "the image's rows)"},
      {OpKind::DropPath, "drop_path", {{"in", K::Tensor, true}, {"p", K::Probability, true}, {"noise_scaled", K::Flag, false}}, false,
       "timm layers/drop.py drop_path (v0.3.2 models/layers/drop.py): x.div(keep_prob) * random_tensor, one random "
       "value per sample; the identity at p = 0"},
      {OpKind::Mul, "mul", {{"in", K::Tensors, true}}, false,
       "elementwise x * s, s a parameter that broadcasts over x (torchvision ConvNeXt CNBlock: self.layer_scale [C, 1, "
       "1] * self.block(input)), an activation of x's shape (SwiGLU: silu(x1) * x2) or one row [1, C] per sample "
       "broadcast over x's token rows (diffusers FluxTransformerBlock: gate_msa.unsqueeze(1) * attn_output); each "
       "factor is saved where the other's gradient needs it (derivatives.yaml mul: self's gradient reads other, "
       "other's reads self)"},
      {OpKind::LayerScale, "layer_scale", {{"in", K::Tensor, true}}, true,
       "transformers models/dinov2/modeling_dinov2.py Dinov2LayerScale: hidden_state * lambda1, lambda1 [width]"},
      {OpKind::MeanTokens, "mean_tokens", {{"in", K::Tensor, true}, {"start", K::Dim, false}}, false,
       "x[:, start:].mean(dim=1) (Dinov2ForImageClassification: patch_tokens.mean(dim=1)); mean's backward needs "
       "only the shape"},
      {OpKind::ResizeTokens, "resize_tokens", {{"in", K::Tensor, true}, {"rows", K::Dim, true}}, false,
       "transformers Dinov2Embeddings.interpolate_pos_encoding: the position table bicubically interpolated to the "
       "image's patch grid, a new tensor; the table itself where the grid matches"},
      {OpKind::Scale, "scale", {{"in", K::Tensor, true}}, false,
       "x * a Python number (torchvision shifted_window_attention: q = q * (C // num_heads) ** -0.5): a new tensor; "
       "a scalar's product saves nothing (derivatives.yaml mul.Scalar)"},
      {OpKind::Copy, "copy", {{"in", K::Tensor, true}, {"when", K::Flag, false}, {"shifted_logits", K::Flag, false}}, false,
       "a contiguous copy of x: F.pad with zero pads (constant_pad_nd clones), torch.roll, a permute(...).reshape(...) "
       "of a window partition or its reverse; none of them saves anything. `when` false: no copy (the roll of a "
       "window that is not shifted). shifted_logits: a causal LM's logits[..., :-1, :].contiguous(), which "
       "transformers makes before 4.49 and not after (ForCausalLMLoss shifts the labels: the loss path the versions "
       "decide, frameworks.cpp hf_loss_path)"},
      {OpKind::SpaceToDepth, "space_to_depth", {{"in", K::Tensor, true}, {"height", K::Dim, true}}, false,
       "torchvision PatchMerging: torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :], "
       "x[..., 1::2, 1::2, :]], -1) of an [H, W, C] map: [H W, C] -> [H W / 4, 4 C], a new tensor; cat saves nothing"},
      {OpKind::PadToWindows, "pad_to_windows", {{"in", K::Tensor, true}, {"height", K::Dim, true}, {"window", K::Dim, true}}, false,
       "torchvision shifted_window_attention: F.pad(input, (0, 0, 0, pad_r, 0, pad_b)) to multiples of the window on "
       "both sides of an [H, W, C] map (height H, W = rows / H): a new tensor, also with no padding (constant_pad_nd "
       "clones); its backward needs only the sizes"},
      {OpKind::Unpad, "unpad", {{"in", K::Tensor, true}, {"rows", K::Dim, true}}, false,
       "torchvision shifted_window_attention: x[:, :H, :W, :].contiguous() of the padded map (rows = H W): the map "
       "itself where nothing was padded, else a copy"},
      {OpKind::WindowAttention, "window_attention",
       {{"in", K::Tensors, true}, {"heads", K::Dim, true}, {"window", K::Dim, true}, {"masked", K::Flag, false}}, false,
       "torchvision shifted_window_attention (eager, whatever the config's kernel): attn = q.matmul(k.transpose(-2, "
       "-1)) per window of `window` rows, + the relative position bias gathered from the table (the fourth input, a "
       "parameter [(2 w - 1)^2, heads]; fp32 under autocast, so the sum is fp32), + the shift mask where masked, "
       "softmax (saved), attn.matmul(v) (saves the probabilities, cast to the compute dtype under autocast, and v); "
       "q.matmul saves q and k"},
      {OpKind::CrossEntropy, "cross_entropy", {{"in", K::Tensor, true}}, false,
       "torch.nn.CrossEntropyLoss over the last dimension, one int64 label per sample: log_softmax (saved) then "
       "nll_loss, whose backward writes a full-size gradient beside log_softmax's (fp32 under autocast, then cast "
       "back), as loss.cpp's built-in losses do from the H200 traces; the head's parameter gradients appear after "
       "them, with its first op that trains"},
      {OpKind::GroupNorm, "group_norm", {{"in", K::Tensor, true}, {"groups", K::Dim, true}}, true,
       "torch.nn.GroupNorm(groups, C) of an image [C, H, W]: weight and bias [C]; native_group_norm saves its input "
       "and the fp32 mean and rstd per sample and group (derivatives.yaml); on autocast's fp32 list, so under "
       "autocast it reads an fp32 copy of a 16-bit input and writes fp32"},
      {OpKind::UpsampleNearest, "upsample_nearest", {{"in", K::Tensor, true}, {"scale", K::Dim, true}}, false,
       "F.interpolate(x, scale_factor=scale, mode=\"nearest\") of an image [C, H, W] (diffusers Upsample2D): "
       "[C, scale H, scale W], a new tensor; upsample_nearest2d's backward needs only the sizes"},
      {OpKind::MseLoss, "mse_loss", {{"in", K::Tensors, true}}, false,
       "F.mse_loss(prediction.float(), target.float(), reduction=\"mean\") (diffusers train_text_to_image.py): "
       "the fp32 copies of a 16-bit prediction and target, which mse_loss saves (derivatives.yaml: self, target)"},
      {OpKind::Rotary, "rotary",
       {{"in", K::Tensor, true}, {"variant", K::Choice, false}, {"heads", K::Dim, false}, {"rotary_dims", K::Dim, false}}, false,
       "diffusers v0.36 models/embeddings.py apply_rotary_emb (use_real, unbind dim -1) on q or k token rows: "
       "(x.float() * cos + x_rotated.float() * sin).to(x.dtype), a new tensor in x's dtype; the products save only "
       "the cos and sin tables ([tokens, head_dim] fp32, made once per forward by FluxPosEmbed and shared by every "
       "block), so nothing of x's size. variant transformers: apply_rotary_pos_emb (modeling_llama.py, "
       "modeling_bamba.py) over x's `heads`, on the first rotary_dims of each head (partial_rotary_factor; all of "
       "it where 0): q_rot * cos + rotate_half(q_rot) * sin in the dtype of cos, the residual stream's (fp32 under "
       "autocast with fp32 weights), then cat with the rest of each head, a new tensor in that dtype"},
      {OpKind::Conv1d, "conv1d",
       {{"in", K::Tensor, true}, {"out_channels", K::Dim, true}, {"kernel", K::Dim, true}, {"stride", K::Dim, true},
        {"padding", K::Dim, false}, {"bias", K::Flag, false}},
       true,
       "torch.nn.Conv1d over [channels, length]: weight [out, in, k], bias [out]; output length (L + 2 padding - k) "
       "// stride + 1 (Whisper's conv1 and conv2, modeling_whisper.py WhisperEncoder)"},
      {OpKind::Cast, "cast", {{"in", K::Tensor, true}, {"dtype", K::Choice, true}}, false,
       "x.to(dtype): fp32 (Mamba2Block: residual.to(torch.float32); Mamba2ForCausalLM: logits.float()), compute (the "
       "autocast or weight dtype) or weights (x.to(norm.weight.dtype)); a new tensor, or x itself where its dtype is "
       "that already (Tensor.to returns self); its backward casts the gradient back"},
      {OpKind::SsdMixer, "ssd_mixer",
       {{"in", K::Tensor, true}, {"heads", K::Dim, true}, {"head_dim", K::Dim, true}, {"groups", K::Dim, true},
        {"state", K::Dim, true}, {"kernel", K::Dim, true}, {"chunk", K::Dim, true}, {"out_features", K::Dim, true},
        {"bias", K::Flag, false}, {"conv_bias", K::Flag, false}},
       true,
       "Mamba-2's mixer after in_proj as transformers' Mamba2Mixer.cuda_kernels_forward trains it: mamba_ssm "
       "ops/triton/ssd_combined.py mamba_split_conv1d_scan_combined (v2.2.2 MambaSplitConv1dScanCombinedFn) over "
       "zxbcdt [T, 2 di + 2 g N + H] (di = heads x head_dim): the depthwise causal conv1d over xBC [T, di + 2 g N], "
       "the chunked SSD scan, the gated RMSNorm (weight [di]) and out_proj [out_features, di]. Parameters conv1d.weight "
       "[di + 2 g N, 1, kernel], conv1d.bias, dt_bias, A_log, D [heads], norm.weight [di], out_proj.weight "
       "(docs/research/mamba2.md section 1.2)"},
      {OpKind::Moe, "moe",
       {{"in", K::Tensor, true}, {"experts", K::Dim, true}, {"top_k", K::Dim, true}, {"width", K::Dim, true}},
       true,
       "A mixture of experts' routed part as transformers 5 trains it (models/nemotron_h NemotronHMoE without its "
       "shared expert, which a program writes as linears): NemotronHTopkRouter's weight [experts, d] run in fp32 "
       "(F.linear(x.float(), weight.float())), a sigmoid, top_k experts a token (norm_topk_prob, "
       "routed_scaling_factor), and NemotronHExperts' 3-D parameters up_proj [experts, width, d] and down_proj "
       "[experts, d, width] (no gate; squared ReLU) through integrations/moe.py grouped_mm_experts_forward: the "
       "top_k x tokens (token, expert) pairs sorted by expert, two grouped GEMMs, the fp32 routing weights, the "
       "pairs unsorted and summed. The 3-D parameters are no nn.Linear: PEFT's target_modules, bitsandbytes and "
       "autocast's weight cache pass them by (docs/research/nemotron3-moe.md sections 2-3)"},
      {OpKind::Embedding, "embedding",
       {{"in", K::Tensor, true}, {"rows", K::Dim, true}, {"out_features", K::Dim, true}, {"tied", K::Flag, false}}, true,
       "torch.nn.Embedding(rows, out_features) of int64 ids [n]: weight [rows, out_features], output [n, out_features] "
       "in the weight's dtype (embedding is on none of autocast's lists); its backward reads only the ids. tied: the "
       "weight is the head's output linear's (PreTrainedModel.tie_weights: WhisperForConditionalGeneration's proj_out "
       "and model.decoder.embed_tokens), counted once"},
  };
  return specs;
}

const OpSpec* find_op(std::string_view name) {
  for (const auto& s : op_specs())
    if (name == s.name) return &s;
  return nullptr;
}

const char* op_name(OpKind kind) {
  for (const auto& s : op_specs())
    if (s.kind == kind) return s.name;
  return "op";
}

std::string op_names() {
  std::string t;
  for (const auto& s : op_specs()) t += (t.empty() ? "" : ", ") + std::string(s.name);
  return t;
}

bool op_shape(const ArchOp& op, const std::vector<const ArchTensor*>& in, const std::vector<int64_t>& param_shape,
              std::vector<int64_t>& out, std::string& error) {
  auto rows = [&](const ArchTensor* t, const char* what) {
    if (t->shape.size() == 2) return true;
    error = std::string(what) + " needs token rows [tokens, width]; " + t->name + " is " + dims_text(t->shape);
    return false;
  };
  switch (op.kind) {
    case OpKind::Parameter:
      out = param_shape;
      return true;
    case OpKind::Conv2d:
    case OpKind::MaxPool2d: {
      const char* what = op.kind == OpKind::Conv2d ? "conv2d" : "max_pool2d";
      const auto& s = in[0]->shape;
      if (s.size() != 3) return error = std::string(what) + " needs an image [channels, height, width]; " + in[0]->name + " is " + dims_text(s), false;
      const int64_t h = add(s[1], 2 * op.padding), w = add(s[2], 2 * op.padding);
      if (op.kernel > h || op.kernel > w)
        return error = std::string(what) + "'s kernel " + std::to_string(op.kernel) + " exceeds " + in[0]->name + " " + dims_text(s) + (op.padding ? " with its padding" : ""), false;
      if (op.kind == OpKind::MaxPool2d && 2 * op.padding > op.kernel)
        return error = "max_pool2d's padding must be at most half its kernel (PyTorch's rule)", false;
      if (op.kind == OpKind::Conv2d && (s[0] % op.groups != 0 || op.out_features % op.groups != 0))
        return error = "conv2d's groups (" + std::to_string(op.groups) + ") must divide its in channels (" + std::to_string(s[0]) + ") and out_channels (" + std::to_string(op.out_features) + ")", false;
      out = {op.kind == OpKind::Conv2d ? op.out_features : s[0], (h - op.kernel) / op.stride + 1, (w - op.kernel) / op.stride + 1};
      return true;
    }
    case OpKind::Conv1d: {
      const auto& s = in[0]->shape;
      if (s.size() != 2 || in[0]->is_parameter)
        return error = "conv1d needs an activation [channels, length]; " + in[0]->name + " is " + dims_text(s), false;
      const int64_t l = add(s[1], 2 * op.padding);
      if (op.kernel > l)
        return error = "conv1d's kernel " + std::to_string(op.kernel) + " exceeds the length of " + in[0]->name + " " + dims_text(s) + (op.padding ? " with its padding" : ""), false;
      out = {op.out_features, (l - op.kernel) / op.stride + 1};
      return true;
    }
    case OpKind::Cast:
      if (in[0]->is_parameter) return error = "cast needs an activation; " + in[0]->name + " is a parameter", false;
      out = in[0]->shape;
      return true;
    case OpKind::SsdMixer: {
      if (!rows(in[0], "ssd_mixer")) return false;
      if (op.heads % op.groups != 0)
        return error = "ssd_mixer's groups (" + std::to_string(op.groups) + ") must divide its heads (" + std::to_string(op.heads) + ")", false;
      const int64_t di = mul(op.heads, op.head_dim);
      const int64_t width = add(mul(2, di), add(mul(2, op.groups, op.state), op.heads));
      if (in[0]->shape[1] != width)
        return error = "ssd_mixer reads in_proj's output of 2 x heads x head_dim + 2 x groups x state + heads = " + std::to_string(width) +
                       " columns; " + in[0]->name + " is " + dims_text(in[0]->shape) + " (Mamba-2 needs num_heads x head_dim = expand x hidden_size)", false;
      if (op.kernel < 2 || op.kernel > 4)
        return error = "ssd_mixer's conv kernel is " + std::to_string(op.kernel) + "; causal_conv1d's kernels take widths 2 to 4", false;
      out = {in[0]->shape[0], op.out_features};
      return true;
    }
    case OpKind::Moe:
      if (in[0]->is_parameter) return error = "moe needs an activation; " + in[0]->name + " is a parameter", false;
      if (!rows(in[0], "moe")) return false;
      if (op.top_k > op.experts)
        return error = "moe's top_k (" + std::to_string(op.top_k) + ") must be at most its experts (" + std::to_string(op.experts) + ")", false;
      if (double(op.experts) * double(op.expert_width) * double(in[0]->shape[1]) > 1e12)
        return error = "moe's experts hold more than 10^12 elements per projection", false;
      out = in[0]->shape;
      return true;
    case OpKind::Embedding: {
      const auto& s = in[0]->shape;
      if (s.size() != 1 || in[0]->is_parameter || in[0]->dtype != InputDtype::Int64 || in[0]->producer >= 0)
        return error = "embedding reads a program input of int64 ids [n] (\"dtype\": \"int64\"); " + in[0]->name + " is not one", false;
      if (double(op.size) * double(op.out_features) > 1e12) return error = "embedding's weight [rows, out_features] holds more than 10^12 elements", false;
      out = {s[0], op.out_features};
      return true;
    }
    case OpKind::BatchNorm2d:
    case OpKind::GlobalAvgPool: {
      const auto& s = in[0]->shape;
      const char* what = op.kind == OpKind::BatchNorm2d ? "batch_norm2d" : "global_avg_pool";
      if (s.size() != 3 || in[0]->is_parameter)
        return error = std::string(what) + " needs an image activation [channels, height, width]; " + in[0]->name + " is " + dims_text(s), false;
      out = op.kind == OpKind::BatchNorm2d ? s : std::vector<int64_t>{1, s[0]};
      return true;
    }
    case OpKind::FlattenTokens: {
      const auto& s = in[0]->shape;
      if (s.size() == 2 && !in[0]->is_parameter) {  // [channels, length]: a transpose (WhisperEncoder: permute(0, 2, 1))
        out = {s[1], s[0]};
        return true;
      }
      if (s.size() != 3) return error = "flatten_tokens needs [channels, height, width] or [channels, length]; " + in[0]->name + " is " + dims_text(s), false;
      out = {mul(s[1], s[2]), s[0]};
      return true;
    }
    case OpKind::UnflattenTokens: {
      const auto& s = in[0]->shape;
      if (s.size() != 2) return error = "unflatten_tokens needs token rows [tokens, width]; " + in[0]->name + " is " + dims_text(s), false;
      if (s[0] % op.index != 0)
        return error = "unflatten_tokens' height " + std::to_string(op.index) + " does not divide the " + std::to_string(s[0]) + " rows of " + in[0]->name, false;
      out = {s[1], op.index, s[0] / op.index};
      return true;
    }
    case OpKind::Mul:
      if (in.size() != 2) return error = "mul needs two inputs: an activation and a parameter", false;
      if (in[0]->is_parameter)
        return error = "mul multiplies an activation (first) by a parameter or an activation (second); " + in[0]->name + " is a parameter", false;
      if (!in[1]->is_parameter && in[1]->shape != in[0]->shape && !row_of(*in[1], *in[0]))
        return error = "mul of two activations needs equal shapes, or token rows and one row [1, width]; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape), false;
      {  // broadcast: aligned from the right, each of the parameter's dimensions equals the activation's or is 1
        const auto &ps = in[1]->shape, &xs = in[0]->shape;
        bool fits = ps.size() <= xs.size();
        for (size_t k = 0; fits && k < ps.size(); ++k) {
          const int64_t d = ps[ps.size() - 1 - k];
          fits = d == 1 || d == xs[xs.size() - 1 - k];
        }
        if (!fits)
          return error = "mul's parameter must broadcast over the activation (each dimension, from the right, equal or 1); " + in[1]->name + " is " + dims_text(ps) + ", " + in[0]->name + " " + dims_text(xs), false;
      }
      out = in[0]->shape;
      return true;
    case OpKind::Scale:
    case OpKind::Copy:
      if (in[0]->is_parameter) return error = "the input must be an activation, not the parameter " + in[0]->name, false;
      out = in[0]->shape;
      return true;
    case OpKind::SpaceToDepth: {
      const auto& s = in[0]->shape;
      if (s.size() != 2) return error = "space_to_depth needs token rows [tokens, width]; " + in[0]->name + " is " + dims_text(s), false;
      const int64_t h = op.index, w = op.index > 0 && s[0] % op.index == 0 ? s[0] / op.index : 0;
      if (w == 0 || h % 2 != 0 || w % 2 != 0)
        return error = "space_to_depth needs an even height (" + std::to_string(h) + ") that divides the " + std::to_string(s[0]) + " rows of " + in[0]->name + " into an even width", false;
      out = {s[0] / 4, mul(4, s[1])};
      return true;
    }
    case OpKind::PadToWindows: {
      const auto& s = in[0]->shape;
      if (s.size() != 2 || in[0]->is_parameter) return error = "pad_to_windows needs token rows [tokens, width]; " + in[0]->name + " is " + dims_text(s), false;
      if (s[0] % op.index != 0)
        return error = "pad_to_windows' height " + std::to_string(op.index) + " does not divide the " + std::to_string(s[0]) + " rows of " + in[0]->name, false;
      const int64_t w = s[0] / op.index;
      const auto whole = [&](int64_t d) { return ceil_div(d, op.window) * op.window; };
      out = {mul(whole(op.index), whole(w)), s[1]};
      return true;
    }
    case OpKind::Unpad: {
      const auto& s = in[0]->shape;
      if (s.size() != 2 || in[0]->is_parameter) return error = "unpad needs token rows [tokens, width]; " + in[0]->name + " is " + dims_text(s), false;
      if (op.size > s[0]) return error = "unpad's " + std::to_string(op.size) + " rows exceed the " + std::to_string(s[0]) + " rows of " + in[0]->name, false;
      out = {op.size, s[1]};
      return true;
    }
    case OpKind::WindowAttention: {
      if (in.size() != 4) return error = "window_attention needs four inputs: q, k, v and the relative position bias table", false;
      for (int k = 0; k < 3; ++k)
        if (!rows(in[static_cast<size_t>(k)], "window_attention")) return false;
      if (in[0]->shape != in[1]->shape || in[0]->shape != in[2]->shape)
        return error = "window_attention needs q, k and v of equal shapes; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape) + ", " + in[2]->name + " " + dims_text(in[2]->shape), false;
      if (!in[3]->is_parameter) return error = "window_attention's fourth input must be the bias table, a parameter; " + in[3]->name + " is not", false;
      if (in[0]->shape[0] % op.window != 0)
        return error = "window_attention's window of " + std::to_string(op.window) + " rows does not divide the " + std::to_string(in[0]->shape[0]) + " rows of " + in[0]->name + " (pad the map to whole windows first: pad_to_windows)", false;
      if (in[0]->shape[1] % op.heads != 0)
        return error = "window_attention's heads (" + std::to_string(op.heads) + ") must divide the width of q", false;
      out = in[0]->shape;
      return true;
    }
    case OpKind::Concat: {
      if (in.size() < 2) return error = "concat needs at least two inputs", false;
      if (op.channels) {  // images of equal height and width, channels add up
        int64_t c = 0;
        for (const auto* t : in) {
          if (t->shape.size() != 3 || t->is_parameter)
            return error = "concat along channels needs images [channels, height, width]; " + t->name + " is " + dims_text(t->shape), false;
          if (t->shape[1] != in[0]->shape[1] || t->shape[2] != in[0]->shape[2])
            return error = "concat along channels needs equal heights and widths; " + t->name + " is " + dims_text(t->shape) + ", " + in[0]->name + " " + dims_text(in[0]->shape), false;
          c = add(c, t->shape[0]);
        }
        out = {c, in[0]->shape[1], in[0]->shape[2]};
        return true;
      }
      if (op.features) {  // equal rows, widths add up
        int64_t w = 0;
        for (const auto* t : in) {
          if (!rows(t, "concat")) return false;
          if (t->shape[0] != in[0]->shape[0])
            return error = "concat along features needs equal rows; " + t->name + " is " + dims_text(t->shape) + ", " + in[0]->name + " " + dims_text(in[0]->shape), false;
          w = add(w, t->shape[1]);
        }
        out = {in[0]->shape[0], w};
        return true;
      }
      int64_t n = 0;
      for (const auto* t : in) {
        if (!rows(t, "concat")) return false;
        if (t->shape[1] != in[0]->shape[1])
          return error = "concat needs equal widths; " + t->name + " is " + dims_text(t->shape) + ", " + in[0]->name + " " + dims_text(in[0]->shape), false;
        n = add(n, t->shape[0]);
      }
      out = {n, in[0]->shape[1]};
      return true;
    }
    case OpKind::Add:
      if (in.size() != 2) return error = "add needs two inputs", false;
      // An image plus one row per sample, broadcast over height and width (diffusers ResnetBlock2D:
      // hidden_states + temb[:, :, None, None]).
      if (in[0]->shape.size() == 3 && in[1]->shape.size() == 2 && in[1]->shape[0] == 1 && in[1]->shape[1] == in[0]->shape[0] &&
          !in[0]->is_parameter && !in[1]->is_parameter && !op.inplace) {
        out = in[0]->shape;
        return true;
      }
      if (row_of(*in[1], *in[0]) && !in[0]->is_parameter && !in[1]->is_parameter && !op.inplace) {  // token rows + a row
        out = in[0]->shape;
        return true;
      }
      if (in[0]->shape != in[1]->shape)
        return error = "add needs equal shapes; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape), false;
      if (in[0]->is_parameter && in[1]->is_parameter) return error = "add needs an activation among its inputs", false;
      out = in[0]->shape;
      return true;
    case OpKind::RmsNorm:
      if (op.unit > 0 && (in[0]->shape.empty() || in[0]->shape.back() % op.unit != 0))
        return error = "rms_norm's unit (" + std::to_string(op.unit) + ") must divide the last dimension of " + in[0]->name + " " + dims_text(in[0]->shape), false;
      [[fallthrough]];
    case OpKind::LayerNorm:
    case OpKind::Gelu:
    case OpKind::Silu:
    case OpKind::Relu:
    case OpKind::Tanh:
    case OpKind::Sigmoid:
    case OpKind::Dropout:
      if (in[0]->is_parameter) return error = "the input must be an activation, not the parameter " + in[0]->name, false;
      out = in[0]->shape;
      return true;
    case OpKind::Linear:
      if (in[0]->shape.empty()) return error = "linear needs an input with a last dimension", false;
      out = in[0]->shape;
      out.back() = op.out_features;
      return true;
    case OpKind::Attention: {
      if (in.size() != 3) return error = "attention needs three inputs: q, k and v", false;
      for (const auto* t : in)
        if (!rows(t, "attention")) return false;
      // Cross-attention (diffusers' attn2: k and v from the text embeddings) has other rows for k and v than for q.
      // Grouped-query attention: k and v have kv_heads of q's head width.
      if (op.kv_heads > 0) {
        if (op.packed || op.unit > 0) return error = "attention's kv_heads is for self- or cross-attention over whole samples, not packed or unit attention", false;
        if (op.heads % op.kv_heads != 0)
          return error = "attention's kv_heads (" + std::to_string(op.kv_heads) + ") must divide its heads (" + std::to_string(op.heads) + ")", false;
        if (in[0]->shape[1] % op.heads != 0)
          return error = "attention's heads (" + std::to_string(op.heads) + ") must divide the width of q", false;
        const int64_t d = in[0]->shape[1] / op.heads;
        if (in[1]->shape[1] != d * op.kv_heads)
          return error = "attention with kv_heads " + std::to_string(op.kv_heads) + " needs k " + std::to_string(d * op.kv_heads) + " wide (kv_heads x q's head width " + std::to_string(d) + "); " + in[1]->name + " is " + dims_text(in[1]->shape), false;
        if (in[2]->shape[1] % op.kv_heads != 0)
          return error = "attention's kv_heads (" + std::to_string(op.kv_heads) + ") must divide the width of v", false;
      } else if (in[0]->shape[1] != in[1]->shape[1]) {
        return error = "attention needs q and k of equal widths; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape), false;
      }
      if (in[0]->shape[0] != in[1]->shape[0] && (op.packed || op.unit > 0))
        return error = "packed or unit attention attends within its own rows: q and k need equal rows; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape), false;
      if (in[1]->shape[0] != in[2]->shape[0])
        return error = "attention needs k and v over the same tokens; " + in[1]->name + " is " + dims_text(in[1]->shape) + ", " + in[2]->name + " " + dims_text(in[2]->shape), false;
      if (op.kv_heads == 0 && (in[0]->shape[1] % op.heads != 0 || in[2]->shape[1] % op.heads != 0))
        return error = "attention's heads (" + std::to_string(op.heads) + ") must divide the widths of q and v", false;
      out = {in[0]->shape[0], op.kv_heads > 0 ? in[2]->shape[1] / op.kv_heads * op.heads : in[2]->shape[1]};
      return true;
    }
    case OpKind::SelectToken:
      if (!rows(in[0], "select_token")) return false;
      if (op.index >= in[0]->shape[0])
        return error = "select_token's index " + std::to_string(op.index) + " is past the " + std::to_string(in[0]->shape[0]) + " rows of " + in[0]->name, false;
      out = {1, in[0]->shape[1]};
      return true;
    case OpKind::Slice:
      if (op.rows) {
        if (!rows(in[0], "slice along tokens")) return false;
        if (op.index + op.size > in[0]->shape[0])
          return error = "slice [" + std::to_string(op.index) + ", " + std::to_string(op.index + op.size) + ") is past the " +
                         std::to_string(in[0]->shape[0]) + " rows of " + in[0]->name, false;
        out = {op.size, in[0]->shape[1]};
        return true;
      }
      if (op.index + op.size > in[0]->shape.back())
        return error = "slice [" + std::to_string(op.index) + ", " + std::to_string(op.index + op.size) + ") is past the " +
                       std::to_string(in[0]->shape.back()) + " columns of " + in[0]->name, false;
      out = in[0]->shape;
      out.back() = op.size;
      return true;
    case OpKind::LayerScale:
    case OpKind::DropPath:
      if (in[0]->is_parameter) return error = "the input must be an activation, not the parameter " + in[0]->name, false;
      out = in[0]->shape;
      return true;
    case OpKind::MeanTokens:
      if (!rows(in[0], "mean_tokens")) return false;
      if (op.index >= in[0]->shape[0])
        return error = "mean_tokens' start " + std::to_string(op.index) + " leaves none of the " + std::to_string(in[0]->shape[0]) + " rows of " + in[0]->name, false;
      out = {1, in[0]->shape[1]};
      return true;
    case OpKind::ResizeTokens:
      if (!rows(in[0], "resize_tokens")) return false;
      out = {op.size, in[0]->shape[1]};
      return true;
    case OpKind::GroupNorm: {
      const auto& s = in[0]->shape;
      if (s.size() != 3 || in[0]->is_parameter)
        return error = "group_norm needs an image activation [channels, height, width]; " + in[0]->name + " is " + dims_text(s), false;
      if (s[0] % op.groups != 0)
        return error = "group_norm's groups (" + std::to_string(op.groups) + ") must divide the " + std::to_string(s[0]) + " channels of " + in[0]->name, false;
      out = s;
      return true;
    }
    case OpKind::UpsampleNearest: {
      const auto& s = in[0]->shape;
      if (s.size() != 3 || in[0]->is_parameter)
        return error = "upsample_nearest needs an image activation [channels, height, width]; " + in[0]->name + " is " + dims_text(s), false;
      out = {s[0], mul(s[1], op.stride), mul(s[2], op.stride)};
      if (double(out[1]) * double(out[2]) * double(out[0]) > 1e12) return error = "upsample_nearest makes more than 10^12 elements per sample", false;
      return true;
    }
    case OpKind::Rotary:
      if (in[0]->is_parameter) return error = "rotary needs an activation; " + in[0]->name + " is a parameter", false;
      if (!rows(in[0], "rotary")) return false;
      if (!op.hf_rotary && (op.heads > 0 || op.size > 0))
        return error = "rotary's heads and rotary_dims are the transformers variant's: add \"variant\": \"transformers\"", false;
      if (op.hf_rotary) {
        if (op.heads < 1 || in[0]->shape[1] % op.heads != 0)
          return error = "rotary (transformers) needs heads that divide the width of " + in[0]->name + " (" + std::to_string(in[0]->shape[1]) + ")", false;
        if (op.size > in[0]->shape[1] / op.heads || op.size % 2 != 0)
          return error = "rotary's rotary_dims (" + std::to_string(op.size) + ") must be even and at most the head width " + std::to_string(in[0]->shape[1] / op.heads), false;
      }
      out = in[0]->shape;
      return true;
    case OpKind::MseLoss:
      if (in.size() != 2) return error = "mse_loss needs two inputs: the prediction and the target", false;
      if (in[0]->shape != in[1]->shape)
        return error = "mse_loss needs a prediction and a target of equal shapes; " + in[0]->name + " is " + dims_text(in[0]->shape) + ", " + in[1]->name + " " + dims_text(in[1]->shape), false;
      if (in[0]->is_parameter || in[1]->is_parameter) return error = "mse_loss reads activations, not parameters", false;
      out = {};
      return true;
    case OpKind::CrossEntropy:
      if (in[0]->shape.empty() || in[0]->shape.size() > 2 || in[0]->is_parameter)
        return error = "cross_entropy reads rows of class scores [rows, classes] (one label per row); " + in[0]->name + " is " + dims_text(in[0]->shape), false;
      out = {};
      return true;
  }
  return error = "unknown op", false;
}

void op_params(const ArchOp& op, const std::vector<const ArchTensor*>& in, const std::vector<int64_t>& param_shape,
               std::vector<ParamTensor>& params) {
  auto param = [&](const std::string& suffix, int64_t numel, ParamKind kind, int64_t rows) {
    params.push_back({op.name + suffix, numel, kind, rows});
  };
  switch (op.kind) {
    case OpKind::Parameter: {
      const int64_t n = prod(param_shape);
      params.push_back({op.name, n, op.param_kind, param_shape.empty() ? n : param_shape.front()});
      params.back().frozen = op.frozen;
      break;
    }
    case OpKind::Conv2d: {
      const int64_t c = in[0]->shape[0] / op.groups;
      param(".weight", mul(op.out_features, c, mul(op.kernel, op.kernel)), ParamKind::Matmul, op.out_features);
      params.back().conv = true;
      if (op.bias) param(".bias", op.out_features, ParamKind::Bias, op.out_features);
      break;
    }
    case OpKind::Conv1d: {
      param(".weight", mul(op.out_features, in[0]->shape[0], op.kernel), ParamKind::Matmul, op.out_features);
      params.back().conv = true;
      if (op.bias) param(".bias", op.out_features, ParamKind::Bias, op.out_features);
      break;
    }
    case OpKind::SsdMixer: {  // Mamba2Mixer.__init__'s order: conv1d, (in_proj,) dt_bias, A_log, norm, D, out_proj
      const int64_t di = mul(op.heads, op.head_dim), conv = add(di, mul(2, op.groups, op.state));
      param(".conv1d.weight", mul(conv, op.kernel), ParamKind::Matmul, conv);
      params.back().conv = true, params.back().fused = true;  // causal_conv1d reads the weight as it is stored
      if (op.conv_bias) param(".conv1d.bias", conv, ParamKind::Bias, conv);
      param(".dt_bias", op.heads, ParamKind::Bias, op.heads);
      param(".A_log", op.heads, ParamKind::Embedding, op.heads);  // elementwise: autocast does not cast it
      param(".norm.weight", di, ParamKind::Norm, di);
      param(".D", op.heads, ParamKind::Embedding, op.heads);
      param(".out_proj.weight", mul(op.out_features, di), ParamKind::Matmul, op.out_features);
      params.back().fused = true;  // read by the kernel, never called: no adapter, quantization or autocast cache reaches it
      if (op.bias) param(".out_proj.bias", op.out_features, ParamKind::Bias, op.out_features);
      break;
    }
    case OpKind::Moe: {  // NemotronHMoE.__init__'s order: experts (up_proj, down_proj), then the router (gate)
      const int64_t d = in[0]->shape[1], stack = mul(op.experts, op.expert_width, d);
      param(".experts.up_proj", stack, ParamKind::Matmul, op.experts);  // (rows: the first dimension, the experts)
      params.back().fused = true;  // nn.Parameter of NemotronHExperts, read by grouped_mm: no module of its own
      param(".experts.down_proj", stack, ParamKind::Matmul, op.experts);
      params.back().fused = true;
      param(".gate.weight", mul(op.experts, d), ParamKind::Matmul, op.experts);
      params.back().fused = true;  // NemotronHTopkRouter's nn.Parameter, cast to fp32 by its forward
      break;
    }
    case OpKind::Embedding:  // a tied one uses the head linear's weight
      if (!op.tied) param(".weight", mul(op.size, op.out_features), ParamKind::Embedding, op.size);
      break;
    case OpKind::LayerScale: {  // an elementwise scale: HF Trainer's decay group has it, autocast does not cast it
      const int64_t w = in[0]->shape.back();
      param(".lambda1", w, ParamKind::Embedding, w);
      break;
    }
    case OpKind::BatchNorm2d:
    case OpKind::GroupNorm: {
      const int64_t c = in[0]->shape[0];
      param(".weight", c, ParamKind::Norm, c);
      param(".bias", c, ParamKind::Norm, c);
      break;
    }
    case OpKind::LayerNorm: {
      if (!op.affine) break;
      const int64_t w = in[0]->shape.back();
      param(".weight", w, ParamKind::Norm, w);
      if (op.bias) param(".bias", w, ParamKind::Norm, w);
      break;
    }
    case OpKind::RmsNorm: {
      const int64_t w = op.unit > 0 ? op.unit : in[0]->shape.back();
      param(".weight", w, ParamKind::Norm, w);
      break;
    }
    case OpKind::Linear: {
      const int64_t w = in[0]->shape.back();
      param(".weight", mul(op.out_features, w), ParamKind::Matmul, op.out_features);
      if (op.bias) param(".bias", op.out_features, ParamKind::Bias, op.out_features);
      break;
    }
    default: break;
  }
}

}  // namespace memsim
