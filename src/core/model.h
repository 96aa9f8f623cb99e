// Parameter tensors of a dense decoder-only transformer, as the framework allocates them. The exact
// parameter count is their sum; the step simulator allocates them one by one (allocator rounding is per
// tensor).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"

namespace memsim {

enum class ParamKind {
  Matmul,     // weight of a linear layer: cast by autocast, saved for backward, quantizable
  Embedding,  // token or position embedding table
  Norm,       // norm scale or shift
  Bias,
  Adapter,    // LoRA A/B matrices, DoRA magnitudes, IA3 vectors, prompt embeddings (the adapter dtype)
};

struct ParamTensor {
  std::string name;
  int64_t numel = 0;
  ParamKind kind = ParamKind::Matmul;
  int64_t rows = 0;  // first dimension (out_features of a linear, vocab of an embedding); numel for vectors
  bool frozen = false;     // no gradient, no optimizer state (PEFT)
  bool quantized = false;  // stored by bitsandbytes (int8 or 4-bit), GPTQ or AWQ instead of the weight dtype
  // Frozen, yet its FSDP unit holds a gradient for it (FSDP1 use_orig_params, mark_unit_gradients).
  bool unit_grad = false;
  // A convolution's weight (model programs' conv2d): PEFT's all-linear leaves it out (it matches nn.Linear only).
  bool conv = false;
  // A weight a fused kernel reads itself (Mamba-2's out_proj and conv1d inside mamba_split_conv1d_scan_combined), or
  // a 3-D expert stack that grouped_mm reads (the moe op's, transformers 5's MoE layers), or DeepSeek's router (a bare
  // parameter its MoEGate casts to fp32 itself): no nn.Linear call, so PEFT's targets and all-linear, bitsandbytes'
  // replacement and autocast's weight cache all pass it by.
  bool fused = false;
  // A vision-language model's frozen vision tower or its trained projector (ModelConfig::vision_tower), at the end of
  // `pre`: PEFT's targets and modules_to_save never reach them (LLaVA's find_all_linear_names skips
  // 'vision_tower' and 'mm_projector'; ms-swift's LLaVA target regex keeps to the language model), and the tower
  // runs under no_grad, so it never holds a gradient.
  enum class Part : uint8_t { Model, VisionTower, Projector } part = Part::Model;
};
// Whether backward computes a gradient for the tensor (its optimizer state follows `frozen` alone).
inline bool has_grad(const ParamTensor& t) { return !t.frozen || t.unit_grad; }

struct Architecture;  // architecture.h

struct ModelShape {
  std::vector<ParamTensor> pre;        // embeddings, before the first layer
  std::vector<ParamTensor> layer;      // a dense transformer layer (encoder-decoder: an encoder block)
  std::vector<ParamTensor> moe_layer;  // a mixture-of-experts layer (empty for dense models)
  int64_t num_layers = 0;
  int64_t num_dense_layers = 0;        // layers [0, num_dense_layers) are dense, the rest MoE
  int64_t num_attention_heads = 0;     // of a decoder layer (litgpt's LLaMA-Adapter gates each head's prompt)
  std::vector<ParamTensor> post;       // final norm(s) and output head
  // Encoder-decoder (T5): layers [0, num_encoder_layers) are encoder blocks, the rest decoder blocks
  // (self-attention, cross-attention, MLP). The first block of each stack also holds that stack's relative
  // attention bias, so it has its own parameter list.
  int64_t num_encoder_layers = 0;      // 0: decoder-only
  std::vector<ParamTensor> first_encoder_layer, decoder_layer, first_decoder_layer;
  int64_t params_per_layer = 0;        // of a dense layer
  int64_t params_per_moe_layer = 0;
  int64_t params_total = 0;
  int64_t params_active_per_token = 0; // with top-k routing: what one token passes through
  // A model program (model.architecture): its ops, which the step builder runs instead of a built-in family's
  // layers (program_step.cpp). Null for the built-in families.
  std::shared_ptr<const Architecture> program;
  // A vision-language model (ModelConfig::vision_tower): the tower's program (its tensors are in `pre`, marked
  // Part::VisionTower), the image tokens one image brings into the sequence (its patches: LLaVA's 'default' feature
  // select drops the class token) and the projector's widths, first to last.
  std::shared_ptr<const Architecture> vision_tower;
  int64_t image_tokens = 0;
  int64_t image_crops = 1;           // the tower's images per image (LLaVA-NeXT's base view and tiles)
  int64_t projector_rows = 0;        // rows through the projector per image (every crop's features)
  std::vector<int64_t> projector_widths;  // tower width, hidden_size, ..., hidden_size (projector_depth + 1 entries)
  // The tower's tensors per program stage as its program names them (its embeddings, a block, its head): what the
  // step builder looks up while it runs the tower (program_params). Their frozen flags follow those in `pre`.
  std::vector<ParamTensor> tower_embeddings, tower_block, tower_head;
  // A program with several block kinds (a CNN's stages): each kind's parameters, and each layer's kind. Empty where
  // the layers share one list (`layer`, with moe_layer and the encoder-decoder lists).
  std::vector<std::vector<ParamTensor>> block_kinds;
  std::vector<int32_t> kind_of_layer;

  bool encoder_decoder() const { return num_encoder_layers > 0; }
  bool is_moe(int64_t l) const { return l >= num_dense_layers; }
  const std::vector<ParamTensor>& params_of(int64_t l) const {
    if (!kind_of_layer.empty()) return block_kinds[static_cast<size_t>(kind_of_layer[static_cast<size_t>(l)])];
    if (encoder_decoder())
      return l == 0 ? first_encoder_layer : l < num_encoder_layers ? layer
             : l == num_encoder_layers ? first_decoder_layer : decoder_layer;
    return is_moe(l) ? moe_layer : layer;
  }
  // Every distinct layer parameter list with the number of layers that have it.
  template <typename F>
  void for_each_layer_kind(F&& f) { each_kind(*this, f); }
  template <typename F>
  void for_each_layer_kind(F&& f) const { each_kind(*this, f); }

 private:
  template <typename S, typename F>
  static void each_kind(S& s, F& f) {
    if (!s.block_kinds.empty()) {
      for (size_t k = 0; k < s.block_kinds.size(); ++k)
        f(s.block_kinds[k], static_cast<int64_t>(std::count(s.kind_of_layer.begin(), s.kind_of_layer.end(), static_cast<int32_t>(k))));
      return;
    }
    if (s.encoder_decoder()) {
      const int64_t dec = s.num_layers - s.num_encoder_layers;
      f(s.first_encoder_layer, int64_t{1});
      f(s.layer, s.num_encoder_layers - 1);
      f(s.first_decoder_layer, int64_t{dec > 0 ? 1 : 0});
      f(s.decoder_layer, dec > 0 ? dec - 1 : 0);
      return;
    }
    f(s.layer, s.num_dense_layers);
    f(s.moe_layer, s.num_layers - s.num_dense_layers);
  }
};

// Requires a validated config (validate.h); throws RangeError if a count leaves int64.
ModelShape build_model_shape(const ModelConfig& m);

// Freezes the base, adds adapters to the targeted linears, marks the quantized weights (PEFT + bitsandbytes).
// params_total then includes the adapters; params_trainable counts what has gradients.
// quantize_head: the base quantization converts the output head too (litgpt through Lightning's plugin).
void apply_peft(ModelShape& shape, const PeftConfig& peft, bool quantize_head = false);
bool is_expert_param(const ParamTensor& t);  // a routed expert's weight of a built-in MoE layer (mlp.experts.)
// The elements of one nn.Linear of a weight: the whole tensor, or for a routed expert's stack one expert's projection
// (transformers 4 keeps each expert's gate, up and down as linears of their own; gate and up share memsim's stack).
int64_t one_linear_numel(const ParamTensor& t, bool mlp_gated);
// transformers 5's MoE layers (Resolved::moe_experts_parameters): the routed experts are 3-D parameters of one module,
// which PEFT's target_modules, bitsandbytes and autocast's weight cache pass by, as a model program's `fused` ones.
void mark_expert_parameters(ModelShape& shape);
// FSDP1 with use_orig_params=True: each unit (a layer; the embeddings with the head as the root) that trains any
// tensor keeps a gradient for its frozen, unquantized tensors too (ParamTensor::unit_grad). In forward the module's
// parameters are views of the FlatParameter, which requires grad (flat_param.py _use_unsharded_views), so autograd
// computes those gradients, and the linears save their inputs for them; only the optimizer skips them.
void mark_unit_gradients(ModelShape& shape);
// One tensor-parallel rank's share of every parameter (params_total becomes per rank).
void apply_tensor_parallel(ModelShape& shape, const ModelConfig& m, int64_t t);
// One expert-parallel rank's share of the routed experts (num_experts / ep of them; router and shared experts
// stay whole).
void apply_expert_parallel(ModelShape& shape, int64_t ep);
int64_t trainable_numel(const ModelShape& s);
// A vision-language model's projector trains (training.train_projector; auto: unless PEFT freezes the base), and its
// tower (training.train_vision_tower): the tensors' frozen flags follow. Nothing changes without a tower.
bool projector_trains(const TrainingConfig& t, const PeftConfig& peft);
void apply_vision_training(ModelShape& shape, bool projector, bool tower);

// The short name of a parameter's module ("self_attn.q_proj.weight" -> "q_proj"; an nn.Sequential member keeps its
// parent: "attn1.to_out.0.weight" -> "to_out.0"), as PEFT targets it.
std::string module_name(const std::string& param_name);
// The same, as a view into `param_name` (the simulation compares it per linear call; no allocation).
std::string_view module_name_view(std::string_view param_name);
// Whether `param` is the parameter `module` + `suffix` ("x.to_q" + ".weight"), compared without building the name.
inline bool names_param(std::string_view param, std::string_view module, std::string_view suffix) {
  return param.size() == module.size() + suffix.size() && param.starts_with(module) && param.ends_with(suffix);
}
// Every comma-separated item of a list field (target_modules, modules_to_save, ...), trimmed; empty items skipped.
std::vector<std::string> list_items(const std::string& list);
bool peft_targets(const PeftConfig& peft, const std::string& module);
// peft.target_modules names a fused q/k/v linear (c_attn, query_key_value, Wqkv or qkv_proj): one adapter on it.
bool targets_fused_qkv(const PeftConfig& peft);
bool ia3_feedforward(const PeftConfig& peft, const std::string& module);
bool ln_tuning_targets(const PeftConfig& peft, const std::string& module);
int64_t virtual_tokens(const PeftConfig& peft);  // prompt tuning: positions added to every sequence

int64_t sum_numel(const std::vector<ParamTensor>& tensors);
int64_t matmul_numel(const std::vector<ParamTensor>& tensors);  // what autocast casts: linear weights

}  // namespace memsim
