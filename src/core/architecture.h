// Model programs: a family written as data. A program (versioned JSON, src/core/catalog/architectures/*.json, or a
// user's file) names its hyperparameters with defaults, derives dimensions from them, and lists the ops of three
// stages: the embeddings, one block repeated `repeat` times, and the head with its loss. Each op comes from the op
// vocabulary (ops.h), which says what parameters it owns, what shape it makes and what autograd saves for it; the
// step builder runs a program through the same engines (sharding, checkpointing, the optimizer, the allocator) as
// the built-in families. docs/extending.md "A model family" shows the format with the ViT program.
//
// The decoder checks a program completely before anything runs it: an unknown op or key, a tensor read before it is
// produced (which is also how a cycle shows: ops run in the order written), a shape that does not fit, a dimension
// that is not a positive integer. Each error names its field ("model.architecture: block.ops[3].in: ...").
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model.h"
#include "versions.h"

namespace memsim {

enum class OpKind {
  Parameter,    // a learned tensor used directly (ViT's cls_token, position_embeddings)
  Conv2d,       // nn.Conv2d (patch embeddings, CNN layers)
  BatchNorm2d,  // nn.BatchNorm2d in training mode (batch statistics)
  MaxPool2d,    // nn.MaxPool2d
  GlobalAvgPool,  // nn.AdaptiveAvgPool2d((1, 1)) then flatten: [C, H, W] -> [1, C]
  FlattenTokens,  // [C, H, W] -> [H W, C]: flatten(2).transpose(1, 2), a view
  UnflattenTokens,  // [H W, C] -> [C, H, W]: the inverse view (ConvNeXt's permute back to channels first)
  Concat,       // torch.cat along the token axis
  Add,          // elementwise sum (residual adds, position embeddings)
  LayerNorm,    // nn.LayerNorm
  RmsNorm,      // eager RMSNorm: transformers' (Qwen2RMSNorm: an fp32 copy, rstd, weight * normed.to(dtype)) or diffusers'
  Linear,       // nn.Linear
  Attention,    // multi-head attention over q, k, v (the kernel from the config: eager or SDPA)
  Gelu,         // nn.GELU (exact or tanh)
  Silu,         // nn.functional.silu (SwiGLU's gate)
  Relu,         // nn.ReLU
  Tanh,         // nn.Tanh
  Sigmoid,      // torch.sigmoid (CLIP's quick_gelu: x * sigmoid(1.702 x))
  Dropout,      // nn.Dropout
  SelectToken,  // x[:, i, :], a view (the class token)
  Slice,        // x[..., start:start + size], a view (q, k and v of a fused qkv linear); or of token rows
  LayerScale,   // x * lambda1, a learned per-channel scale (DINOv2's Dinov2LayerScale, CaiT)
  Mul,          // x * s: s a parameter that broadcasts over x (ConvNeXt's layer_scale), an activation of x's shape or a row
  MeanTokens,   // x[:, start:].mean(dim=1): the mean of the token rows from `start` (DINOv2's classifier input)
  ResizeTokens, // a positional table interpolated to `rows` rows (DINOv2's interpolate_pos_encoding)
  DropPath,     // stochastic depth on a residual branch (timm's DropPath)
  Scale,        // x * a constant (q * head_dim ** -0.5): a new tensor, nothing saved
  Copy,         // a contiguous copy (F.pad, torch.roll, a window partition's reshape); with `when` false, x itself
  SpaceToDepth, // [H W, C] -> [H W / 4, 4 C]: each 2 x 2 neighbourhood's rows side by side (Swin's PatchMerging)
  PadToWindows, // an [H, W] map of rows padded to whole windows (F.pad: a copy, even with no padding)
  Unpad,        // the padded map's first `rows` rows again (x[:, :H, :W, :].contiguous(): a copy where padded)
  WindowAttention,  // eager attention within windows of `window` rows, plus a learned relative position bias
  CrossEntropy, // the classification loss over the last dimension
  GroupNorm,    // nn.GroupNorm over an image's channels (diffusers' ResnetBlock2D, Transformer2DModel)
  UpsampleNearest,  // F.interpolate(x, scale_factor=s, mode="nearest") of an image (diffusers' Upsample2D)
  MseLoss,      // F.mse_loss(prediction.float(), target.float()): a diffusion model's loss on the predicted noise
  Rotary,       // diffusers' apply_rotary_emb on q or k: fp32 products with shared cos/sin tables, cast back
  Conv1d,       // nn.Conv1d over [channels, length] (Whisper's front end)
  Embedding,    // nn.Embedding: int64 ids [rows] -> [rows, width] (a decoder's token embedding)
  Cast,         // x.to(dtype): a copy in another dtype, or x itself where it has that dtype already
  SsdMixer,     // Mamba-2's mixer after in_proj: mamba_ssm's fused conv1d, SSD scan, gated RMSNorm and out_proj
  Moe,          // a mixture of experts' routed part: transformers 5's sigmoid router and grouped_mm experts (NemotronHMoE)
};

// What a cast op converts to: fp32, the compute dtype (autocast's or the weights'), or the weights' storage dtype.
enum class CastTo : uint8_t { Fp32, Compute, Weights };

// What a program input holds per element: the collator's fp32 (pixel values), the compute dtype (latents and text
// embeddings a frozen encoder made on the GPU in the weights' dtype), or int64 (ids, timesteps).
enum class InputDtype : uint8_t { Fp32, Compute, Int64 };

// A tensor of the program, per sample (the micro-batch dimension is implicit): images [C, H, W], token rows
// [tokens, width]. `dtype` is what its producer makes (ops.cpp).
struct ArchTensor {
  std::string name;
  std::vector<int64_t> shape;
  int32_t producer = -1;     // op index in its stage; -1: the stage's input or a program input
  bool is_parameter = false; // a Parameter op's output: a weight, not an activation
  int32_t carry = -1;        // a stage input read from an earlier stage's carry (Architecture::carries); else -1
  InputDtype dtype = InputDtype::Fp32;  // a program input's element type (inputs.<name>.dtype)
  int64_t numel() const;     // per sample
};

struct ArchOp {
  OpKind kind{};
  std::string name;          // module path (parameters are name + ".weight" / ".bias"); PEFT targets its last part
  std::string module;        // PEFT's short module name (module_name of the weight)
  std::vector<int32_t> in;   // tensor indices in the stage
  int32_t out = -1;
  int64_t out_features = 0;  // Linear; Conv2d: out_channels
  int64_t kernel = 0, stride = 0;  // Conv2d, MaxPool2d; UpsampleNearest: stride is the scale factor
  int64_t padding = 0;       // Conv2d, MaxPool2d: zeros (or -inf) on each side
  int64_t groups = 1;        // Conv2d: channel groups (depthwise: the channels)
  int64_t heads = 0;         // Attention, WindowAttention
  int64_t kv_heads = 0;      // Attention: key and value heads (grouped-query attention); 0: as many as heads
  int64_t window = 0;        // WindowAttention: rows per window (window_size x window_size)
  int64_t index = 0;         // SelectToken; Slice: the first column; UnflattenTokens, SpaceToDepth, PadToWindows: the height
  int64_t size = 0;          // Slice: the columns; ResizeTokens, Unpad: the rows; Rotary: rotary_dims per head
  double p = 0.0;            // Dropout, DropPath; Attention's dropout on the probabilities
  // A block op's probability that depends on the block's index (`layer` in its expression: timm's stochastic depth
  // rises linearly over the blocks), one per block; empty where it is the same for every block.
  // p_per_layer[i] is block p_first_layer + i's (the blocks of one kind).
  std::vector<double> p_per_layer;
  int64_t p_first_layer = 0;
  double p_at(int64_t layer) const {
    const int64_t i = layer - p_first_layer;
    return p_per_layer.empty() || i < 0 || i >= static_cast<int64_t>(p_per_layer.size()) ? p : p_per_layer[static_cast<size_t>(i)];
  }
  bool bias = false;         // Linear, Conv2d, LayerNorm (LayerNorm: elementwise_affine's bias)
  bool tanh = false;         // Gelu: approximate="tanh"
  bool noise_scaled = false; // DropPath: the noise is divided by the keep probability, not the input (torchvision)
  bool when = true;          // Copy: whether the copy happens (a shifted window's roll: only where the shift is not 0)
  bool masked = false;       // WindowAttention: shifted windows add a mask to the scores
  bool packed = false;       // Attention: the micro-batch's samples as one sequence with a block-diagonal mask
  int64_t unit = 0;          // Attention: rows that attend together within a sample (windows); 0: the whole sample.
                             // RmsNorm: the columns normalized together (a per-head norm: head_dim); 0: the width
  bool affine = true;        // LayerNorm: elementwise_affine (weight, and bias where `bias`); false: no parameters
  bool cast_out = false;     // Attention: the output cast to q's dtype (diffusers' processors: .to(query.dtype))
  bool rows = false;         // Slice: of token rows (x[:, start:start + size]) rather than of the last dimension
  bool hf_rotary = false;    // Rotary: transformers' apply_rotary_pos_emb (variant transformers), not diffusers'
  bool diffusers = false;    // RmsNorm: diffusers' RMSNorm (normalization.py), which multiplies the input itself by
                             // the fp32 rstd and casts to the weight's dtype only where that is 16-bit
  bool features = false;     // Concat: along the features (last dimension) rather than the token rows
  bool channels = false;     // Concat: along an image's channels (torch.cat(..., dim=1) of [N, C, H, W])
  bool inplace = false;      // Relu, Add: writes into its (first) input, which it then is (nn.ReLU(inplace=True), +=)
  bool tied = false;         // Embedding: its weight is the head's output linear's (tie_word_embeddings)
  CastTo cast_to = CastTo::Fp32;  // Cast
  // SsdMixer: head_dim (P), state (N, d_state), chunk (Q, the SSD kernel's chunk_size); heads, groups, kernel (the
  // depthwise conv's width) and out_features (out_proj's) use the fields above; bias is out_proj's, conv_bias conv1d's.
  int64_t head_dim = 0, state = 0, chunk = 0;
  bool conv_bias = true;
  // Moe: the routed experts, the experts each token goes to (top_k) and one expert's hidden width (its up_proj's rows).
  int64_t experts = 0, top_k = 0, expert_width = 0;
  bool shifted_logits = false;  // Copy: a causal LM's shifted logits, copied only where the loss path copies them
  bool frozen = false;       // Parameter: requires_grad_(False) (Whisper's sinusoidal encoder positions): a weight
                             // that never trains, even in full fine-tuning
  ParamKind param_kind = ParamKind::Embedding;  // Parameter
};

struct ArchStage {
  std::vector<ArchTensor> tensors;
  std::vector<ArchOp> ops;
  int32_t input = -1;   // the tensor the stage receives (block, head); -1 for the embeddings
  int32_t output = -1;  // what it passes on (embeddings, block); -1 for the head, which ends in its loss
  // Per tensor: the index of the last op that reads it in forward (-1: none).
  std::vector<int32_t> last_reader;
  // (tensor, carry index): what the stage passes on to later stages besides its output ("carry").
  std::vector<std::pair<int32_t, int32_t>> exports;
  // A block kind a checkpoint may wrap ("checkpoint": false: the framework never wraps it, as diffusers' UNet leaves
  // each Transformer2DModel's norm and projections, its samplers and the mid block's first resnet outside).
  bool checkpointable = true;
};

// A tensor a stage passes on to later stages besides its output, which any later stage reads by name: a UNet's skip
// connections, a timestep embedding every block reads, an encoder's output that cross-attention reads. It lives
// until its last reader has run and every stage that saved it (or checkpointed a block that reads it) has run its
// backward; its gradient adds up over its readers until the stage that made it runs its backward (program_step.cpp).
struct ArchCarry {
  std::string name;
  ArchTensor tensor;          // its shape
  int64_t producer = -1;      // the stage that makes it: -1 the embeddings, else the block's index
  int64_t last_reader = -1;   // the last stage that reads it: a block's index, or `repeat` for the head
};

// How a program serves as a vision-language model's tower (model.vision_tower; vision_step.cpp): which hidden state
// the features are read from, how many rows of it make one image token, and the projector after it. A program without
// a "vision_tower" object is LLaVA's use of a CLIP program: the second-to-last of all the hidden states
// (output_hidden_states=True), its patch rows without the class token, LlavaMultiModalProjector.
struct TowerSpec {
  bool declared = false;               // the program has "vision_tower" (and may then leave out its head)
  std::string module = "vision_tower"; // the state_dict prefix of the tower's tensors (Qwen2-VL: "visual")
  int64_t width = 0;                   // the features' width (the tower's hidden size)
  int64_t feature_rows = 0;            // rows of the selected hidden state per image the features come from
  int64_t merge = 1;                   // feature rows per image token (Qwen2-VL's spatial merge: 2 x 2 = 4)
  int64_t feature_layer = -2;          // the hidden_states index of the features (-1: the last block's output)
  bool all_hidden_states = true;       // every block's output kept until the projector has run
  // llava_mlp: LlavaMultiModalProjector (model.projector_depth linears with GELU between); patch_merger: Qwen2-VL's
  // PatchMerger (a LayerNorm over the tower's width, merge rows side by side, Linear, GELU, Linear).
  enum class Projector : uint8_t { LlavaMlp, PatchMerger } projector = Projector::LlavaMlp;
  // patch_merger: the width it maps to (the decoder's hidden size; 0: not declared), whether its ln_q is an RMSNorm
  // (Qwen2.5-VL's Qwen2RMSNorm, a weight only) rather than a LayerNorm, and whether its output is gathered back into
  // the processor's order (Qwen2.5-VL's reverse_indices after its window order: a copy of the features).
  int64_t out_width = 0;
  std::string out_width_name;  // the hyperparameter out_width names, where it names one ("hidden_size")
  bool rms_merger = false;
  bool reordered = false;
  // LLaVA-NeXT's anyres (a CLIP program's dims "crops", "image_tokens" and "image_newline"): the tower runs on `crops`
  // images per image (the base view and the tiles of the best grid pinpoint), the projector on all their feature rows,
  // and pack_image_features makes them `image_tokens` rows (the base view's, and the tiles' unpadded with a learned
  // image_newline row per row of patches). 1, 0 (feature_rows / merge) and false elsewhere.
  int64_t crops = 1;
  int64_t image_tokens = 0;
  bool newline = false;
  int64_t tokens_per_image() const { return image_tokens > 0 ? image_tokens : feature_rows / std::max<int64_t>(1, merge); }
  int64_t projector_rows_per_image() const { return crops * (feature_rows / std::max<int64_t>(1, merge)); }
};

// A frozen model that sits on the GPU beside the program's own and trains with it without a graph ("frozen_modules":
// the VAE and text encoder of diffusers' training scripts, which encode each batch). Its weights are resident in the
// compute dtype (the scripts' weight_dtype); its no-grad forward's transients are not modelled yet.
struct FrozenModule {
  std::string name;
  int64_t params = 0;
  bool fp32 = false;  // "dtype": "fp32" (the SDXL scripts' VAE), else the compute dtype
  bool weights_dtype = false;  // "dtype": "weights": the trained model's own storage dtype (SD3's position buffer,
                               // which moves with the transformer: fp32 in full fine-tuning, 16-bit after .to(dtype))
  int64_t bytes_per_param(int64_t compute_bytes, int64_t weight_bytes) const { return fp32 ? 4 : weights_dtype ? weight_bytes : compute_bytes; }
  std::string when;   // the hyperparameter its "when" names (vae_on_gpu), where it names one: 0 takes it off the GPU
  // The program its no-grad forward runs each micro-batch before the model's (the VAE encoding the batch's images:
  // "forward": {"program": "sd_vae_encoder", "args": {"resolution": "resolution"}}), decoded with its arguments; null
  // where it declares none (its transients are then not modelled).
  std::shared_ptr<const struct Architecture> forward;
};

struct Architecture {
  std::string name, title, source;
  std::vector<FrozenModule> frozen_modules;   // those present (their "when" holds)
  bool frozen_forward = false;                // "frozen_forward": a frozen module's forward (no head, no loss)
  TowerSpec tower;                            // "vision_tower": its use as a tower; a tower-only program has no head
  std::vector<std::string> model_types;       // HF model_type values this program reads (config.json import)
  std::string lora_targets;                   // LoRA's default target_modules for the family (PEFT's mapping)
  // The linears bitsandbytes leaves unquantized under a quantized base ("not_quantized": the framework's
  // modules_to_not_convert for the family), matched as its replace_with_bnb_linear matches them: a module whose
  // path is the key or contains the key followed by a dot.
  std::vector<std::string> not_quantized;
  // "checkpoint_reentrant": how the family's own code calls torch.utils.checkpoint, where it decides rather than the
  // framework (diffusers' models: use_reentrant=False); -1 where the program does not say.
  int8_t checkpoint_reentrant = -1;
  // "attention_code": where the family's own code computes attention rather than transformers' attn_implementation,
  // so that training.attention auto follows torch's version: torch_sdpa calls F.scaled_dot_product_attention whenever
  // torch has it (2.0 on: nn.MultiheadAttention with need_weights=False, diffusers' AttnProcessor2_0, timm's
  // fused_attn) and materialises the scores before; eager always does (its own matmul and softmax).
  enum class AttentionCode : int8_t { Framework, TorchSdpa, Eager };
  AttentionCode attention_code = AttentionCode::Framework;
  // "transformers_sdpa_since": the first transformers release whose class for the family supports SDPA, which is
  // then its default (with torch >= 2.1.1); before it, eager. 0.0.0 where the program does not say: transformers'
  // own default from 4.36 (docs/versions.md 7b).
  Version transformers_sdpa_since{};
  // The head's output linear whose weight a tied embedding op uses (transformers' tie_word_embeddings: Whisper's
  // proj_out and model.decoder.embed_tokens); empty where nothing is tied. The weight is the head's parameter, so
  // its gradient exists from the head's backward on, as the shared tensor's .grad does in PyTorch.
  std::string tied_head;
  std::vector<std::pair<std::string, double>> values;  // hyperparameters and dims, as evaluated
  std::vector<std::pair<std::string, double>> defaults;  // the hyperparameters, as the program declares them
  // Hyperparameters that an op reads as a flag by name ("bias": "use_bias", "when": "vae_on_gpu"): on or off, which
  // the page shows as a checkbox.
  std::vector<std::string> switches;
  int64_t repeat = 0;                         // blocks in all
  std::vector<ArchTensor> inputs;             // the data a micro-batch brings (pixel_values: fp32)
  int64_t label_bytes = 8;                    // per sample: the int64 labels, one per row the loss scores (0 for mse_loss)
  ArchStage embeddings, head;
  // The block kinds in the order they run ("block" declares one; "blocks" several, as a CNN's stages, whose first
  // block changes the shape), how many times each runs, and each block's kind.
  std::vector<ArchStage> blocks;
  std::vector<std::string> block_names;       // what the timeline calls each kind ("block" where there is one)
  std::vector<int32_t> kind_of_layer;         // per block, 0 to repeat - 1
  std::vector<ArchCarry> carries;             // in the order the stages make them
  const ArchStage& block_of(int64_t layer) const { return blocks[static_cast<size_t>(kind_of_layer[static_cast<size_t>(layer)])]; }
  // Every stage in the order it runs: the embeddings, each block kind, the head.
  std::vector<const ArchStage*> stages() const {
    std::vector<const ArchStage*> all = {&embeddings};
    for (const auto& k : blocks) all.push_back(&k);
    all.push_back(&head);
    return all;
  }
  int64_t tokens = 0;                         // rows of the first block's input, per sample (an image: H x W)
  int64_t width = 0;                          // its last dimension (an image: its channels)
};

// What a program error names: the field that holds the program, and a message that locates the problem inside it.
struct ArchitectureError {
  std::string field;
  std::string message;
};

// The built-in programs (src/core/catalog/architectures/*.json, embedded at build time), by name.
const std::vector<std::string_view>& catalog_architecture_files();
std::vector<std::string> builtin_architecture_names();
// The text of a built-in program, or empty.
std::string_view builtin_architecture(std::string_view name);
// The name of the built-in program that reads an HF model_type whose assumptions (its "requires") the config.json
// text meets, or empty; where programs read the type but none fits, `mismatch` says what each needs.
std::string architecture_for_model_type(std::string_view model_type, const std::string& config_json, std::string& mismatch);
// The built-in program that builds a timm model (its "architecture" in a timm config.json, "resnet50") and the
// arguments that make it; false where no program declares the name (timm_models).
bool architecture_for_timm(std::string_view timm_name, std::string& program, std::string& args);
std::vector<std::string> timm_model_names();  // every name some built-in program declares

// Decodes model.architecture (a built-in program's name, or a program as inline JSON text) with the overrides of
// model.architecture_args ("image_size=384, num_labels=10"). On success `out` holds the program and the result is
// empty; otherwise it holds every error found, each naming `field` (model.architecture or model.architecture_args).
std::vector<ArchitectureError> decode_architecture(const std::string& spec, const std::string& args,
                                                   std::shared_ptr<const Architecture>& out);
// A program file's text without its layout (keys keep their order), for a config or link to carry; text that is not
// JSON comes back as it is, for the decoder to report.
std::string compact_architecture(const std::string& text);
// Whether a dropped or pasted text is a model program (it names the program format).
bool looks_like_architecture(std::string_view text);
// model.architecture_args with one hyperparameter set: its entry taken out and appended, and left out where the value
// is the program's default, so that the arguments list only what differs.
std::string set_architecture_arg(const std::string& args, const std::string& name, double value, double default_value);
// The same with the value as written ("" takes the argument out): what a link's architecture_args~= applies.
std::string set_architecture_arg_text(const std::string& args, const std::string& name, const std::string& text);
// The value model.architecture_args gives `name`, or `fallback` where it gives none (or not a number).
double architecture_arg(const std::string& args, const std::string& name, double fallback);
// LoRA's default targets for a model section: its program's lora_targets (all-linear where it names none); empty
// for the built-in families.
std::string default_lora_targets(const ModelConfig& m);
// A decoded program's hyperparameter or dimension, by name (0 if absent).
double architecture_value(const Architecture& a, std::string_view name);

// How a decoded program serves as a tower: its "vision_tower", or for a program without one (CLIP's), LLaVA's use.
TowerSpec tower_spec(const Architecture& a);
// Whether the model's vision tower has a packed attention op (Qwen2-VL's: the micro-batch's patches as one sequence).
bool tower_packs_attention(const ModelConfig& m);
// The image tokens one image brings into a vision-language model's sequence (model.vision_tower): its tower's patches
// (LLaVA's 'default' feature select drops the class token); 0 without a tower, or with one that does not decode.
int64_t vision_image_tokens(const ModelConfig& m);

// The parameter tensors of a program (embeddings -> pre, block -> layer, head -> post), as its modules allocate
// them in order. The shape keeps the program for the step builder.
ModelShape build_program_shape(std::shared_ptr<const Architecture> a);
// The shape of a validated model section: its program's, or the built-in family's (build_model_shape).
ModelShape model_shape_of(const ModelConfig& m);
// The hyperparameter names a built-in program declares (what an HF config.json import reads for it).
std::vector<std::string> architecture_hyperparameters(std::string_view name);
// Each hyperparameter of a built-in program with the JSON pointer where an HF config.json keeps it: the program's
// hf_keys, or "/name" (the key is the name).
std::vector<std::pair<std::string, std::string>> architecture_hf_keys(std::string_view name);

}  // namespace memsim
