// Internal to the core: the state shared by the files that build a training step: train_step.cpp (setup and
// iterations), model_states.cpp, sharding.cpp, optimizer_step.cpp, schedule.cpp, activations.cpp (what autograd
// saves in forward and frees in backward, per layer), attention_mask.cpp, loss.cpp, encoder_decoder.cpp and
// unsloth.cpp.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "architecture.h"
#include "dp_gradients.h"
#include "frameworks.h"
#include "fsdp_reduce.h"
#include "fsdp_unshard.h"
#include "model.h"
#include "step.h"
#include "tables.h"
#include "train_step.h"
#include "zero3_prefetch.h"

namespace memsim {

// selective_log_softmax of 16-bit logits runs a row at a time, each row's log_softmax saved (TRL's GRPO, PPO and DPO
// losses): past this many rows the last replayed block stands for the rest (one tensor of their rows), so that a huge
// micro-batch stays a bounded number of events. logps_rows(k, blocks, b): the rows of block k.
constexpr int64_t kMaxLogpsRows = 64;
inline int64_t logps_rows(int64_t k, int64_t blocks, int64_t b) { return k + 1 < blocks ? 1 : b - (blocks - 1); }

// What one parameter tensor costs (model_states.cpp), for the step's files. `dt`: the dtypes resolved beside the
// recipe (ShardPlan::dtypes).
int64_t param_storage_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const PeftConfig& peft, const ParamDtypes& dt);
int64_t param_grad_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt);
int64_t param_optimizer_bytes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt,
                              const OptimizerSpec& opt, bool include_paged);
// The element size of a trainable tensor's optimizer states, and of the fp32 master copy it needs (0: none).
struct OptimizerDtypes {
  int64_t state_bytes = 4, master_bytes = 0;
};
OptimizerDtypes optimizer_dtypes(const ParamTensor& t, const PrecisionRecipe& pr, const ParamDtypes& dt);

// Parameters of the decay group in HF Trainer (get_decay_parameter_names): everything but norms and biases.
inline bool decays(const ParamTensor& t) {
  return t.kind == ParamKind::Matmul || t.kind == ParamKind::Embedding || t.kind == ParamKind::Adapter;
}

// Every parameter tensor this device holds: its pipeline stage's layers, and the embeddings / head where the
// stage has them.
template <typename F>
void for_each_param(const StepContext& ctx, F&& f) {
  const ModelShape& s = ctx.shape;
  if (ctx.has_pre)
    for (const auto& t : s.pre) f(t);
  for (int64_t l = ctx.first_layer; l < std::min(ctx.end_layer, s.num_layers); ++l)
    for (const auto& t : s.params_of(l)) f(t);
  if (ctx.has_post)
    for (const auto& t : s.post) f(t);
}

// A value per parameter tensor of the model, computed on first use. The layers share a few parameter lists (all
// dense layers one), so a step that asks about each of its thousands of layer tensors, several times, computes
// a few dozen. A tensor outside the model's lists (a shard, a flat partition) is computed every time.
template <typename T>
class PerTensor {
 public:
  explicit PerTensor(const ModelShape& s) {
    std::vector<const std::vector<ParamTensor>*> all = {&s.pre, &s.layer, &s.moe_layer, &s.post, &s.first_encoder_layer,
                                                        &s.decoder_layer, &s.first_decoder_layer};
    for (const auto& k : s.block_kinds) all.push_back(&k);
    for (const auto* l : all)
      lists_.push_back({l->data(), l->data() + l->size(), std::vector<T>(l->size()), std::vector<bool>(l->size())});
  }
  template <typename F>
  T get(const ParamTensor& t, F&& compute) {
    const std::less<const ParamTensor*> below;
    for (auto& l : lists_) {
      if (below(&t, l.begin) || !below(&t, l.end)) continue;
      const size_t i = static_cast<size_t>(&t - l.begin);
      if (!l.known[i]) l.values[i] = compute(t), l.known[i] = true;
      return l.values[i];
    }
    return compute(t);
  }

 private:
  struct List {
    const ParamTensor *begin, *end;
    std::vector<T> values;
    std::vector<bool> known;
  };
  std::vector<List> lists_;
};

// Per micro-batch sizes in elements, and element sizes in bytes.
struct ActDims {
  int64_t b, s, T;         // micro-batch, sequence, tokens
  int64_t Tn;              // tokens seen by norms, dropout and the residual stream: T / t with sequence parallel
  int64_t h, h_q, h_kv, f; // hidden, query width (heads x head_dim), key/value width, MLP width
  int64_t a, g, V;         // query heads, key/value heads, vocabulary
  int64_t e;               // bytes of saved matmul activations (2 for bf16/fp16 compute, 4 for fp32)
  int64_t e_res;           // bytes of the residual stream (4 under autocast over fp32 weights)
  // torch.autocast: matmuls cast their inputs to 16 bits and the fp32-list ops (layer_norm, softmax, the loss)
  // compute in fp32, over fp32 weights (amp_*: each matmul also casts its weight) or 16-bit ones (*_autocast).
  bool amp;
  bool padded = false;     // some row holds pad tokens (MicroBatchShape::padded)
};

// transformers' 4-D attention mask of one micro-batch (Resolved::mask, mask_forward): the tensor the layers share,
// and the lowest layer that keeps it until its backward (a checkpoint's saved input, or the memory-efficient kernel
// keeping it by reference); without one it goes when the forward leaves the layers.
struct MaskInFlight {
  bool on = false;                  // this micro-batch's attention gets the mask
  uint32_t tensor = UINT32_MAX;     // the shared mask while it lives
  int64_t holder = -1;
};

// One layer's saved tensors, split at the attention/MLP boundary so backward frees them in order.
struct SavedLayer {
  std::vector<uint32_t> attn;  // norm 1 and attention
  std::vector<uint32_t> mlp;   // norm 2 and MLP
  std::vector<uint32_t> cross; // encoder-decoder: a decoder block's cross-attention and its norm
  std::vector<uint32_t> ops;   // model programs: the op that saved each tensor of `attn` (program_step.cpp)
  std::vector<int32_t> holds;  // model programs: the carries this stage saved or its checkpoint keeps (one hold each)
};

// A model program's carry while a micro-batch is in flight (architecture.h ArchCarry, program_step.cpp).
struct CarryState {
  uint32_t id = UINT32_MAX;    // the tensor, while it lives
  uint32_t grad = UINT32_MAX;  // its gradient, summed over its readers' backwards until its producer's
  int32_t holds = 0;           // stages whose saved tensors (or checkpoint) include it, until their backward
  bool read = false;           // its last reader's forward has run
  bool req = false;            // it requires grad
  int64_t bytes = 0;           // its element size
};

// What one micro-batch keeps between its forward and its backward (several are in flight in a pipeline).
// A layer's copies in torch.autocast's weight cache (autocast_casts): its fp32 weights' as one tensor, and its fp32
// LoRA matrices' one tensor each (each a small block of the allocator's own, as the cache holds them).
struct LayerCasts {
  uint32_t weights = UINT32_MAX;
  std::vector<uint32_t> adapters;
  bool live() const { return weights != UINT32_MAX || !adapters.empty(); }
};

struct InFlight {
  // The model chunk this forward runs: layers [first, end) of this device, with the embeddings (pre) and the head
  // and loss (post) where the chunk has them. One chunk per device except in the interleaved schedule.
  int64_t first = 0, end = 0;
  bool pre = false, post = false;
  bool owns_inputs = true;  // the chunk that reads the micro-batch's ids and labels (the first one)
  uint32_t inputs = UINT32_MAX;
  std::vector<SavedLayer> saved;                                // per layer of this device
  std::vector<std::vector<std::pair<int64_t, uint32_t>>> host;  // offloaded tensors (bytes, label) per layer
  std::vector<uint32_t> loss_saved, gathered_post, embed_saved;
  std::vector<LayerCasts> casts;
  // A vision-language model (vision_step.cpp): the batch's pixel values; per projector linear the input it saved, per
  // GELU its saved input (UINT32_MAX: none); the image-token mask masked_scatter keeps. A trained tower's hidden
  // states (each block's input, kept until that block's backward), what its stages saved, and per block whether its
  // input requires grad and its element size.
  uint32_t pixels = UINT32_MAX, image_mask = UINT32_MAX;
  std::vector<uint32_t> projector_inputs, gelu_inputs;
  std::vector<uint32_t> tower_hidden;
  int64_t tower_selected_bytes = 0;
  bool tower_ckpt = false;  // the tower's blocks are checkpointed (training.vit_gradient_checkpointing)
  // A patch merger's norm (Qwen2-VL's ln_q) where a gradient flows through it: what it saved that is the step's to
  // free (LayerNorm: its input, a frozen tower's hidden state, and fp32 mean and rstd; RMSNorm: the fp32 copy and
  // rstd where the tower trains, the cast where its weight does).
  bool merger_norm = false;
  std::vector<uint32_t> merger_saved;
  SavedLayer tower_pre;
  std::vector<SavedLayer> tower_saved;
  std::vector<bool> tower_req;
  std::vector<int64_t> tower_bytes;
  uint32_t held_logits = UINT32_MAX;
  std::vector<uint32_t> graph_attrs;  // tensors its graph's nodes hold as attributes (StepBuilder::graph_attr_)
  // Encoder-decoder (encoder_decoder.cpp): what outlives one stack. enc_keep goes after the encoder's backward,
  // dec_keep after the decoder's, out_keep with the model outputs the training loop holds.
  std::vector<uint32_t> enc_final_saved, dec_embed_saved, enc_keep, dec_keep, out_keep;
  uint32_t enc_out = UINT32_MAX;
  ActDims dims{};  // a run of varying shapes: this micro-batch's shape, which its backward uses again
  MaskInFlight mask;
  // Model programs (program_step.cpp): what the embeddings and the head saved, and per block (then the head) whether
  // its input requires grad and its element size.
  SavedLayer program_pre, program_post;
  std::vector<bool> program_req;
  std::vector<int64_t> program_bytes;
  std::vector<int32_t> program_input_carry;  // per block (then the head): the carry its input is, or -1
  // Per block: the stage before it saved the block's input itself (an in-place ReLU's result, ResNet's last op),
  // so that stage's backward, which runs later, frees it; the block's own saved set does not.
  std::vector<bool> program_input_kept;
  std::vector<CarryState> carry;             // the program's carries (Architecture::carries)
};

// Labels of the encoder-decoder tensors, made on first use so that decoder-only programs are unchanged.
struct EncDecLabels {
  uint32_t bias, bias_grad, buckets, causal_mask, enc_out, enc_out_grad, kv_cache, ff_upcast, head_scaled, embed_out,
      embed_grad;
};

// Labels of the attention mask's tensors, made on first use so that programs without a mask are unchanged.
struct MaskLabels {
  uint32_t mask, build, buffer, copy, padded, math_qk, math_scores, math_softmax;
};

struct Labels {
  uint32_t weights, grads, grad_partition, grad_bucket, gathered, ag_buffer, rs_input, rs_output, grad_shard, main_grads, ring, a2a, grad_accum, fp8_weights, fp8_cast, fp8_input, master, state, opt_tmp, cast, ws, ws_lt;
  uint32_t inputs, residual, norm_x32, norm_rstd, norm_scaled, norm_out, norm_out_cast, q, k, v, q_rot, k_rot,
      kv_rep, attn_out, lse, scores, softmax_in, softmax, probs, attn_mask, o_out, hidden_mask, mlp_gate, mlp_up, mlp_act,
      mlp_prod, mlp_fc1, mlp_gelu, mlp_out, attn_tmp, ckpt_input, ckpt_tmp, bwd_mlp, bwd_attn, bwd_norm, dres,
      router, expert_in, expert_out, lora_in, dequant, quant_stats, p2p, logits, logits_fp32, lse_loss, loss_grad, loss_grad_bf16, flce_buffers, lm_head_in, embed_grad_dense, tied_sum, tied_pending, recv_buffer,
      logits_shifted;
};

// Labels of Unsloth's own tensors, made on first use so that other programs are unchanged.
struct UnslothLabels {
  uint32_t gc_buffer, weight_buffer, ce_chunk, grad_inputs;
};

// The state of each engine that outlives one call of the step builder, one object per engine: DeepSpeed ZeRO-3's
// fetches in zero3_prefetch.h, FSDP's unsharded parameters in fsdp_unshard.h and its gradient shards in
// fsdp_reduce.h, DDP's and ZeRO's gradient buffers in dp_gradients.h (with their logic); the pipeline's buffers
// below, what they do in sharding.cpp.

// Pipeline parallelism (torch.distributed.pipelining).
struct PipelineBuffers {
  std::vector<std::pair<int64_t, bool>> recv_made;  // stages (first layer, gradients?) with receive buffers
  std::vector<uint32_t> input_grads;               // the receive buffers' .grad until the next step
};

class StepBuilder {
 public:
  // `into`: another builder's program, which this one writes its events into (PPO's value model, ppo_step.cpp).
  explicit StepBuilder(const StepContext& ctx, StepProgram* into = nullptr);
  ~StepBuilder();
  StepProgram build();
  // A run (RunBuilder): the weights, then one optimizer step at a time into program().
  void begin_run(const RunPlan& plan);
  void run_step(int64_t k, int64_t gas);
  StepProgram& program() { return program_; }

 private:
  // train_step.cpp (setup, iterations), model_states.cpp (what a parameter costs), sharding.cpp (weights and
  // gradients through the step, the engines' hosts), optimizer_step.cpp
  void prologue();  // weights and workspaces, before the first step
  void step(int iter, int64_t mbs, int64_t gas);
  void use_shape(const MicroBatchShape& shape);  // the micro-batch's dims (dims_)
  void alloc_weights();
  void alloc_grad_bucket();  // DDP's flat gradient bucket (dp_grads_)
  void alloc_loaded_weights();  // transformers' load of a bitsandbytes base (model_load.cpp)
  void alloc_layer_grads(int64_t layer);  // first backward of an iteration: .grad of the layer's params
  void release_layer_grads(int64_t layer);  // ZeRO-2/3: the full grads go once reduced into the partition
  void gather(int64_t layer, std::vector<uint32_t>& out);  // ZeRO-3 / FSDP: all-gather the layer's params
  void ds_fetch(int64_t layer, std::vector<uint32_t>& out);  // DeepSpeed ZeRO-3: the layer's and those prefetched
  void ds_release_window();
  int64_t zero_max_live() const;  // stage3_max_live_parameters
  // A frozen reference copy that TRL's prepare_deepspeed made a DeepSpeed engine of its own: its unit's parameters
  // (labelled `label`) and those its own coordinator prefetched; then, at the pass's end, the rest of its window.
  void reference_ds_fetch(int64_t unit, uint32_t label, std::vector<uint32_t>& out);
  void reference_ds_pass_done();
  int64_t gathered_bytes(int64_t layer) const;              // the unsharded parameters of one slot
  void release_all_gather();
  void recv_buffers(int64_t stage_layer, bool grads);
  void begin_backward() { release_all_gather(), in_backward_ = true; }
  void end_backward();                                       // FSDP2: the last reduce-scatter completes
  void reshard_after_backward(int64_t layer);                // FSDP: kept unsharded params go
  void reduce_slot(int64_t layer);
  void release_grad_shards();  // zero_grad: ZeRO's partition (dp_grads_) and FSDP's gradient shards (fsdp_reduce_) go
  void optimizer_step(int iter);
  void ema_update(int iter);  // training.ema after the step (optimizer_step.cpp)
  void release_grads();       // zero_grad(set_to_none=True): every gradient the step made goes
  bool recomputed_output_owned(uint32_t out, uint32_t in) const;  // program_step.cpp
  uint32_t ema_label_ = UINT32_MAX;  // made on first use, so that other programs' labels are unchanged
  void step_in_backward(int64_t layer);
  // parallel.fsdp_shard_embeddings under FSDP2: the embedding and the head are units of their own.
  bool embedding_units() const { return cfg_.parallel.fsdp_shard_embeddings && shard_plan_.fsdp && shard_plan_.sharding == Sharding::Fsdp2; }
  void create_state(const ParamTensor& t);

  // activations.cpp (the layers), loss.cpp (the head and the loss), attention_mask.cpp, schedule.cpp (a micro-batch's
  // passes and their order)
  uint32_t embed_forward();
  uint32_t layer_forward(int32_t layer, uint32_t res, SavedLayer& saved, bool keep_s2, bool free_input);
  uint32_t layer_forward_post_ln(int32_t layer, uint32_t x, SavedLayer& saved, bool keep_s2, bool free_input);
  uint32_t layer_forward_checkpointed(int32_t layer, uint32_t res, SavedLayer& saved);
  // A layer below first_grad_layer_: nothing in it trains and its input needs no gradient, so autograd records
  // nothing; it runs as a no_grad forward and has no backward.
  uint32_t layer_forward_without_grad(int32_t layer, uint32_t res);
  // litgpt's LLaMA-Adapter (adapter_step.cpp): the attention over the layer's adaption prompt, gated into the
  // output; AdapterV2Linear's pre-scale output (UINT32_MAX where the method is not adapter_v2), kept by v2_keep.
  bool adapter_layer(int32_t layer) const {
    return cfg_.peft.llama_adapter() && layer >= 0 && layer >= cfg_.peft.adapter_start_layer;
  }
  uint32_t adapter_attention(int32_t layer, std::vector<uint32_t>& saved, bool q_grad);
  // PEFT's adaption_prompt (AdaptedAttention): after the attention's o_proj, the recomputed query's scores over the
  // prompt, through o_proj again and added to `out`, which it replaces (the sum is returned).
  bool peft_prompt_layer(int32_t layer) const {
    return cfg_.peft.kind() == PeftMethod::AdaptionPrompt && layer >= 0 && layer >= cfg_.peft.adapter_start_layer;
  }
  uint32_t adaption_prompt_attention(int32_t layer, std::vector<uint32_t>& saved, uint32_t out, bool q_grad);
  // PEFT's prefix tuning: the prefix keys and values (get_prompt) before the layers, each layer's cache update
  // (k and v become the prefix's rows and its own, held by the cache), and the prefix's gradients after the layers.
  void prefix_forward_begin();
  void prefix_forward_end();
  void prefix_cat(int32_t layer, std::vector<uint32_t>& saved, uint32_t& k, uint32_t& v);
  void prefix_backward();
  int64_t kv_len() const { return dims_.s + prefix_tokens_; }  // keys per sequence: the prefix's and its own
  int64_t prefix_tokens_ = 0;
  uint32_t prefix_kv_ = UINT32_MAX, prefix_label_ = UINT32_MAX;
  std::vector<uint32_t> prefix_cache_, prefix_grads_;
  uint32_t v2_pre_scale(int32_t layer, int64_t tokens, int64_t out_features, int64_t chunk_tokens = 0);
  void v2_keep(uint32_t pre, std::vector<uint32_t>& saved);
  int64_t first_grad_layer_ = 0;
  bool inputs_require_grad_ = false;  // PEFT's enable_input_require_grads under checkpointing (adaption_prompt)
  // The first adapted layer of litgpt's v1 or PEFT's adaption_prompt where nothing below it records: its input, its
  // attention norm and q/k/v need no gradient, only what comes from the gate on does.
  bool gate_only_layer(int32_t layer) const {
    return (cfg_.peft.kind() == PeftMethod::Adapter || cfg_.peft.kind() == PeftMethod::AdaptionPrompt) && !inputs_require_grad_ &&
           layer == first_grad_layer_;
  }
  uint32_t adapter_label_ = UINT32_MAX, adapter_v2_label_ = UINT32_MAX;  // made on first use
  uint32_t prompt_query_label_ = UINT32_MAX, prompt_kv_label_ = UINT32_MAX;
  uint32_t layer_forward_selective_op(int32_t layer, uint32_t res, SavedLayer& saved);
  void layer_backward(int32_t layer, uint32_t& dres, SavedLayer& saved);
  void norm_forward(int32_t layer, uint32_t res, bool& res_retained, std::vector<uint32_t>& saved,
                    std::initializer_list<const char*> consumers, bool own_res);
  // low_precision_input: the tensor already is in the compute dtype, so under autocast a trainable weight's matmul
  // saves it rather than a cast copy, and so does a 16-bit LoRA adapter's lora_A.
  bool linear_inputs(int32_t layer, std::initializer_list<const char*> modules, int64_t width, std::vector<uint32_t>& saved,
                     int64_t tokens, bool low_precision_input = false);
  int64_t out_width(const std::string& module) const;
  int64_t ring_kv_bytes(int64_t kvw) const;  // context parallel: the key/value buffers of one attention op
  void dora_inputs(int32_t layer, const std::string& module, int64_t width, std::vector<uint32_t>& saved, int64_t tokens);
  bool ia3_inputs(int32_t layer, const std::string& module, int64_t width, std::vector<uint32_t>& saved, int64_t tokens);
  bool norm_trainable(int32_t layer, std::initializer_list<const char*> consumers) const;
  void dequant(int32_t layer);
  void autocast_casts(int32_t layer, bool graph);
  void int4_forward(int32_t layer, const char* prefix, std::vector<uint32_t>& saved);
  uint32_t int4_backward(int32_t layer, const char* prefix);
  uint32_t int4_label(uint32_t& label, const char* text);
  // lm_head's weight, or the embedding it is tied to; null where the model has neither (a classification head).
  const ParamTensor* head_weight() const;
  int64_t head_grad_bytes() const;
  bool module_quantized(int32_t layer, std::string_view module) const;
  int64_t dequant_bytes() const;
  uint32_t head_dequant();
  void drop_if(uint32_t t);
  void drop_casts(LayerCasts& c);  // a layer's autocast copies go
  NormImpl norm_impl(int32_t layer) const;  // the norm kernel this layer runs (compiled layers: Fused)
  // Autocast over fp32 weights: the amp_* recipes, or the weights prepare_model_for_kbit_training made fp32.
  bool amp_fp32_weights() const { return dims_.amp && (recipe_.autocast_copy_bytes > 0 || resolved_.kbit_cast); }
  int64_t rms_out_bytes() const;   // an RMSNorm's output: weight * normed, in the weight's dtype under autocast
  int64_t norm_out_bytes() const;  // the decoder's norms (LayerNorm on autocast's fp32 list, else rms_out_bytes)
  bool gathered_inputs() const;
  void no_grad_release(std::vector<uint32_t>& saved, std::initializer_list<uint32_t> tensors);
  void no_grad_release_all(std::vector<uint32_t>& saved);
  void moe_forward_no_grad(int32_t layer);
  bool tied_sum() const;
  // The matrix the embedding and the output layer share: the built-in families' embedding when
  // model.tie_word_embeddings, a program's head linear that a tied embedding op uses (Architecture::tied_head);
  // null where nothing is tied.
  const ParamTensor* tied_weight() const;
  // How many splits of the heads the SSD backward's dB, dC and dCB kernels run over, each with its own fp32 buffer
  // (ssd_chunk_state.py _chunk_state_bwd_db, ssd_chunk_scan.py _chunk_scan_bwd_dC / _bmm_chunk_bwd: nsplits from the
  // device's SM count), for `batch_chunks` = batch x chunks.
  int64_t ssd_splits(int64_t batch_chunks, int64_t heads, int64_t groups) const;
  bool copies(const ArchOp& op) const;  // whether a program's copy op makes a copy (program_step.cpp)
  // A tied embedding's backward: its dense [V, h] gradient (`bytes`), added into the shared matrix's gradient (see
  // tied_sum).
  void tied_embedding_grad(int64_t bytes);
  void release_saved(std::vector<uint32_t>& saved, uint32_t label);
  uint32_t qk_norm_forward(int32_t layer, uint32_t x, int64_t width, int64_t heads, const char* name,
                           std::vector<uint32_t>& saved, bool out_saved);
  uint32_t fp8_input(uint32_t t, int64_t elements, int32_t layer);
  void fp8_cast(int32_t layer);
  bool trainable_module(const char* module) const;
  // What linear_inputs asks of a module (PEFT's name for it), worked out once per name: it asks for every linear
  // of every layer and micro-batch, and the answers need string matching over the parameter names.
  struct ModuleInfo {
    bool qkv = false;        // q_proj, k_proj or v_proj
    bool targeted = false;   // peft_targets
    bool trainable = false;  // its weight has a gradient: no PEFT, or trainable_module
    bool ia3 = false, dora = false;  // the PEFT method, beside the rest (a string compare per linear otherwise)
  };
  const ModuleInfo& module_info(const char* module) const;
  static std::string expert_stack(std::string_view module);
  bool bnb_keeps_input(int32_t layer, const char* module, const ModuleInfo& info, int64_t tw, bool& qkv_int8_done);
  void checkpoint_graph_inputs(int32_t layer, std::initializer_list<const char*> modules, int64_t width, int64_t tokens,
                               uint32_t input);
  int64_t adapter_bytes() const;
  int64_t weight_bytes_of(const ParamTensor& t) const;
  int64_t grad_bytes_of(const ParamTensor& t) const;
  ParamStates states_of(const ParamTensor& t) const;  // param_states(shard_plan_, ctx_, t)
  int64_t state_dtype_of(const ParamTensor& t) const;
  int64_t flat_partition_numel() const;  // this device's share of the flat optimizer partition
  int64_t zero_reduce_bucket() const;
  int64_t zero_persistence() const;
  bool zero_overlap() const;
  bool persistent(const ParamTensor& t) const;
  void norm_backward(int32_t layer, uint32_t& dres);
  void mla_forward(int32_t layer, std::vector<uint32_t>& saved);
  void moe_forward(int32_t layer, std::vector<uint32_t>& saved);
  void loss_forward(uint32_t res, std::vector<uint32_t>& saved);
  // The loss this micro-batch takes: resolved_.loss, or Unsloth's materialised logits for a small one
  // (Resolved::unsloth_logits_max_tokens).
  LossImpl loss_now() const {
    return resolved_.unsloth_logits_max_tokens > 0 && dims_.T <= resolved_.unsloth_logits_max_tokens ? LossImpl::UnslothLogits : resolved_.loss;
  }
  bool unsloth() const { return resolved_.framework->unsloth_kernels; }
  // Whether this micro-batch's attention materialises k and v for every query head (GQA): repeat_kv (HF eager and
  // older SDPA, torchtune, litgpt); transformers' enable_gqa path (use_gqa_in_sdpa) needs attention_mask None, so a
  // micro-batch with a mask repeats them too; the math kernel broadcasts a single key/value head (matmul
  // broadcasting) and repeats more than one (enable_gqa: repeat_interleave), which the matmul then saves.
  bool kv_repeated() const {
    return dims_.g < dims_.a && (resolved_.attention == Attention::SdpaRepeatKv || resolved_.attention == Attention::Eager ||
                           (resolved_.attention == Attention::Sdpa && mask_.on) ||
                           (resolved_.attention == Attention::SdpaMath && dims_.g > 1));
  }
  // SDPA's math kernel runs: chosen (sdpa_math), or taken for a masked call where the torch version has no other.
  bool math_kernel() const {
    return resolved_.attention == Attention::SdpaMath || (mask_.on && resolved_.mask.kernel == MaskKernel::Math);
  }
  // Unsloth's fast LoRA path (LoRA_MLP, LoRA_QKV, LoRA_W in unsloth/kernels/fast_lora.py): plain LoRA without dropout
  // (get_peft_model patches only lora_dropout == 0 layers); with dropout PEFT's own forward runs.
  bool unsloth_lora_kernels() const {
    return unsloth() && cfg_.peft.kind() == PeftMethod::Lora && cfg_.peft.lora_dropout == 0;
  }
  // Unsloth's use_gradient_checkpointing="unsloth": full checkpointing with activation_offload under Unsloth.
  bool unsloth_gc() const;
  uint32_t loss_backward(std::vector<uint32_t>& saved);
  bool checkpointed(int64_t layer) const;
  uint32_t forward_layer(int32_t layer, uint32_t in, SavedLayer& saved, bool own_input);
  void forward_mb(InFlight& f, std::string phase);   // phase: its name, "forward (step 1)"
  void backward_mb(InFlight& f, std::string phase);
  void run_schedule(int iter, int64_t micro_batches, int64_t gas);
  void recycle(InFlight& f);  // after its backward: f's vectors to spare_, f reset
  void reuse(InFlight& f);    // before a forward: vectors from spare_ (their contents are stale)

  // program_step.cpp: a model program's stages (architecture.h), op by op.
  enum class ProgramStage { Embeddings, Block, Head };
  // Per tensor of a stage: element size, whether it requires grad, the tensor whose storage it is (itself, or a
  // view's base); per op: whether its own parameters train.
  struct ProgramPlan {
    std::vector<int64_t> bytes;
    std::vector<bool> req;
    std::vector<int32_t> root;
    std::vector<bool> op_trains;
  };
  const Architecture& running_program() const;
  const ArchStage& program_stage(ProgramStage st, int32_t layer) const;  // a block: layer's kind
  const std::vector<ParamTensor>& program_params(ProgramStage st, int32_t layer) const;
  uint32_t program_dequant(ProgramStage st, int32_t layer, size_t op);
  bool program_repeats_kv(const ArchOp& op) const;
  int64_t head_grads_pending_ = -1;  // backward_program: the head's layer index until its first op that trains runs
  ProgramPlan plan_program(ProgramStage st, int32_t layer, bool input_req, int64_t input_bytes) const;
  void plan_program(ProgramPlan& p, ProgramStage st, int32_t layer, bool input_req, int64_t input_bytes) const;
  // The buffers of one program_forward or program_backward call, kept for the next: a call per stage per pass
  // allocated ten vectors. A Frame takes the buffers of its depth, so a call made inside another gets its own.
  struct StageScratch {
    ProgramPlan plan;
    std::vector<uint32_t> id, transient;
    std::vector<int32_t> keeps, carried, last;
    std::vector<bool> owned;
    struct Pool {
      std::deque<StageScratch> frames;  // a deque: a deeper frame's buffers do not move a shallower one's
      size_t depth = 0;
    };
    struct Frame {
      Pool& pool;
      StageScratch& buffers;
      explicit Frame(Pool& p) : pool(p), buffers(take(p)) {}
      ~Frame() { --pool.depth; }
      Frame(const Frame&) = delete;
      Frame& operator=(const Frame&) = delete;
      static StageScratch& take(Pool& p) {
        if (p.frames.size() == p.depth) p.frames.emplace_back();
        return p.frames[p.depth++];
      }
    };
  };
  StageScratch::Pool stage_scratch_;
  uint32_t program_label(ProgramStage st, int32_t layer, int32_t tensor, const char* what);  // what: "out", "grad" or "cast"
  // input_carry: the carry the stage input is (its producer carries its output too), or -1.
  uint32_t program_forward(ProgramStage st, int32_t layer, uint32_t in, bool in_req, int64_t in_bytes, SavedLayer& saved,
                           bool own_input, uint32_t inputs, int32_t input_carry = -1);
  uint32_t program_backward(ProgramStage st, int32_t layer, uint32_t dout, bool in_req, int64_t in_bytes, SavedLayer& saved,
                            int32_t input_carry = -1);
  // Carries (CarryState): one more hold by `saved`'s stage; a stage's holds released; a carry freed once nothing
  // needs it.
  void hold_carry(int32_t c, SavedLayer& saved);
  void release_carry_holds(SavedLayer& saved);
  void settle_carry(int32_t c);
  std::vector<CarryState> carry_;  // the micro-batch in flight's (InFlight::carry while its forward or backward runs)
  int32_t output_carry_ = -1;      // set by program_forward: the carry the stage's output is, or -1
  bool output_kept_ = false;       // set by program_forward: the stage's output is freed by someone else (an op of
                                   // the stage saved it, or it is a view of a tensor the stage does not own)
  bool zero_grad_pending_ = false; // training.zero_grad_at before_backward: the last step's gradients await the next backward
  bool program_recompute_ = false; // a checkpointed block's recomputation runs (its carries are its own)
  // A frozen module's forward (program_step.cpp frozen_forwards): the program it runs while it runs, its labels.
  void frozen_forwards(uint32_t inputs);
  const Architecture* frozen_run_ = nullptr;
  std::string frozen_name_;
  size_t frozen_index_ = 0;  // which frozen module runs: its labels and plans are its own, made once per simulation
  std::vector<std::vector<std::vector<uint32_t>>> frozen_labels_;
  mutable std::vector<std::vector<std::vector<char>>> frozen_trains_;
  void forward_program(InFlight& f);
  void backward_program(InFlight& f);
  // Labels of each tensor's output, gradient and cast: the embeddings, the head, then each block kind.
  std::vector<std::vector<uint32_t>> program_labels_;
  uint32_t pool_indices_label_ = UINT32_MAX;  // made on first use, so that other programs' labels are unchanged
  uint32_t mse_copy_label_ = UINT32_MAX;      // likewise
  uint32_t ssd_label_ = UINT32_MAX;           // likewise
  int64_t input_dtype_bytes(InputDtype d) const;  // a program input's element size
  static constexpr char kOpTrains = 1, kOpQuantized = 2;  // stage_op_flags' bits
  const std::vector<char>& stage_op_flags(ProgramStage st, int32_t layer) const;
  mutable std::vector<std::vector<char>> program_trains_, tower_trains_;  // per stage slot (stage_op_flags)
  std::vector<uint32_t> linear_saved_;  // program_forward: what linear_inputs saves for one linear, consumed at once

  // vision_step.cpp: a vision-language model's frozen tower (its program, run under no_grad on the micro-batch's
  // images), the trained projector, and the splice of its output into the decoder's input embeddings.
  uint32_t vision_forward(InFlight& f, uint32_t embeds);
  void vision_backward(InFlight& f);
  void tower_backward(InFlight& f, uint32_t features_grad);
  bool tower_trains() const { return !shape_.tower_block.empty() && has_grad(shape_.tower_block.front()); }
  bool in_tower_ = false;  // program_stage and friends run the tower's program
  std::vector<std::vector<uint32_t>> tower_labels_;
  struct VisionLabels {  // made on first use, so that text-only models' label tables are unchanged
    bool made = false;
    uint32_t pixels, projector_out, projector_gelu, features, mask, spliced, scatter_tmp, grad_features, grad_projector,
        grad_selected, merger_norm, merger_stats;
  };
  VisionLabels vision_labels_{};

  // encoder_decoder.cpp: T5ForConditionalGeneration, encoder on the source length, decoder on the target length.
  void forward_encdec(InFlight& f);
  void backward_encdec(InFlight& f);
  void use_stack(bool decoder);
  uint32_t t5_embed(std::vector<uint32_t>& saved);
  uint32_t t5_norm(int32_t layer, uint32_t x, std::vector<uint32_t>& saved, bool own_x);
  uint32_t t5_attention(int32_t layer, std::vector<uint32_t>& A, int64_t sq, int64_t sk, uint32_t release,
                        std::vector<uint32_t>* cache);
  uint32_t t5_block_forward(int32_t layer, uint32_t x, SavedLayer& saved, bool own_x, std::vector<uint32_t>* cache);
  uint32_t t5_block_checkpointed(int32_t layer, uint32_t x, SavedLayer& saved);
  void t5_block_backward(int32_t layer, uint32_t& dres, SavedLayer& saved, uint32_t& bias_grad, uint32_t& cross_grad,
                         uint32_t& enc_out_grad);
  void t5_head_forward(uint32_t res, std::vector<uint32_t>& saved, std::vector<uint32_t>& transient);
  uint32_t t5_head_backward(std::vector<uint32_t>& saved);
  // preference_step.cpp: training.objective dpo, orpo, simpo, kto (Resolved::preference).
  void preference_labels();
  void alloc_reference_weights();
  void preference_loss_forward(std::vector<uint32_t>& saved);
  void reference_forward(const std::string& phase);
  uint32_t preference_loss_backward(std::vector<uint32_t>& saved);
  // The DPO family's pairs (dpo, orpo, simpo) and KTO's unpaired rows; GRPO has a flow of its own (rollout_step.cpp).
  bool preference() const {
    const Objective o = resolved_.preference.objective;
    return o == Objective::Dpo || o == Objective::Orpo || o == Objective::Simpo || o == Objective::Kto;
  }
  // rollout_step.cpp: training.objective grpo (Resolved::rollout).
  bool grpo() const { return resolved_.rollout.active; }
  void rollout_labels();
  void alloc_engine();
  void engine_wake(bool kv);
  void engine_sleep();
  void weight_sync(int iter);
  void rollout(const std::string& when, int iter);
  bool reference_runs() const;
  bool reference_gathers() const;
  void score_pass(int64_t rows, bool gathers, bool reward = false, bool reference = false);
  // PPO's generate (output_scores, return_dict_in_generate): each token's processed fp32 scores are kept in
  // `scores`, and the KV cache in `cache`, for the caller to free once generate() returns; the caller holds the
  // ZeRO-3 gather of the whole model around it.
  struct GenerateKept {
    std::vector<uint32_t> scores, cache;
  };
  void hf_generate(int64_t rows, GenerateKept* kept = nullptr);
  // The training forward's logits (bytes per element as computed and as the loss reads them, the completion's
  // tokens, the C + 1 positions kept and the C scored, times rows x vocabulary).
  struct GrpoLogits {
    int64_t e, el, C, kept, scored;
  };
  GrpoLogits grpo_logits() const;
  // ppo_step.cpp: training.objective ppo (RolloutFlow::ppo). The value model is a second builder over its own
  // config, writing into this program (Critic); the rollout keeps the generation's scores (logitss) to the step's
  // end; the training forward's outputs are held until the next micro-batch rebinds them.
  bool ppo() const { return resolved_.rollout.ppo; }
  // One token's keys (kv 0) or values (kv 1) in one layer's KV cache, in elements per row: transformers' caches keep
  // what attention reads, so under latent attention (DeepseekV3Attention) the keys are heads x (qk_nope + qk_rope)
  // and the values heads x v_head_dim, not the compressed latent; elsewhere the key/value width.
  int64_t kv_cache_width(int kv) const {
    const ModelConfig& m = cfg_.model;
    if (m.kv_lora_rank == 0) return dims_.h_kv;
    return kv == 0 ? mul(dims_.a, add(m.qk_nope_head_dim, m.qk_rope_head_dim)) : mul(dims_.a, m.v_head_dim);
  }
  // PPO's `output` holds fp32 copies of its hidden states: accelerate converts a 16-bit residual stream's.
  bool ppo_hidden_states_fp32() const { return ppo() && resolved_.preference.outputs_to_fp32 && dims_.e_res < 4; }
  // LoRA's dropout keeps a mask and its own output; TRL's PPOTrainer runs disable_dropout_in_model on the policy
  // (after PEFT), the reference, the value and the reward model (ppo_trainer.py v0.17 L224-227): no dropout there.
  bool lora_dropout_on() const { return cfg_.peft.lora_dropout > 0 && !ppo(); }
  struct Critic;
  void critic_setup();
  void critic_prologue();
  void critic_forward(const std::string& phase);
  void critic_backward(const std::string& phase);
  void critic_optimizer_step(int iter);
  void critic_release_grads();
  void ppo_rollout(const std::string& when);
  void ppo_score_pass(int64_t rows, bool gathers, bool logps);
  void ppo_hold_outputs(uint32_t logits);
  void ppo_entropy();
  void ppo_end_of_minibatch();
  struct PpoLabels {
    uint32_t scores = UINT32_MAX, logitss, values, prob_dist, entropy, reference_kv, hidden_fp32;
  };
  PpoLabels ppo_labels_;
  void ppo_labels();
  struct CriticDeleter {
    void operator()(Critic* c) const;  // ppo_step.cpp, where Critic is complete
  };
  std::unique_ptr<Critic, CriticDeleter> critic_;
  std::vector<uint32_t> logitss_;          // the generation's fp32 scores (batch_generation's padded_logitss)
  std::vector<uint32_t> ppo_outputs_;      // this micro-batch's `output` and `logits` (holders for hold())
  std::vector<uint32_t> ppo_prev_outputs_; // the previous micro-batch's, until the new forward returns
  uint32_t ppo_logits_ = UINT32_MAX;       // the logits the entropy reads
  uint32_t ppo_prob_dist_ = UINT32_MAX;    // the last entropy's softmax, until the next one rebinds it
  // prime-rl's FusedOutputLinear (LossImpl::VocabChunked): the RL config's fused_lm_head_chunk_size default
  // (src/prime_rl/trainer/rl/config.py at d8f290ef0).
  static constexpr int64_t kVocabChunkColumns = 2048;
  // Liger 0.8's _ChunkedSelectiveLogProbFunction streams the vocabulary in slices of this many columns
  // (_SELECTIVE_LOGPROB_VOCAB_CHUNK_SIZE in src/liger_kernel/chunked_loss/fused_linear_ppo.py at v0.8.0).
  static constexpr int64_t kLigerVocabSlice = 4096;
  void grpo_loss_forward(std::vector<uint32_t>& saved);
  uint32_t grpo_loss_backward(std::vector<uint32_t>& saved);
  // Liger's fused GRPO loss (RolloutFlow::liger): the gradients made in the forward, one completion at a time.
  bool liger_grpo() const { return resolved_.rollout.liger != RolloutFlow::LigerGrpo::None; }
  void grpo_liger_forward(std::vector<uint32_t>& saved);
  uint32_t grpo_liger_backward(std::vector<uint32_t>& saved);
  struct RolloutLabels {
    uint32_t kv = UINT32_MAX, kv_rep, gathered, logits, sampling, engine_weights, engine_kv, score_logits, scaled, logps,
        entropy, ids, reward_weights;
    // Liger's GRPO loss, made on its first use (other programs' labels stay as they were).
    uint32_t liger_weight_grad = UINT32_MAX, liger_chunk, liger_input_grad;
  };
  RolloutLabels rollout_labels_;          // made on first use, so that other programs' labels are unchanged
  uint32_t engine_weights_ = UINT32_MAX;  // the colocated vLLM engine's allocations while it is awake
  uint32_t engine_kv_ = UINT32_MAX;
  EngineBytes engine_;                    // what the engine claims, and its weights' share
  std::vector<uint32_t> rollout_ids_;     // the generation batch's ids, until the step's micro-batches are done
  int synced_iter_ = 0;                   // the optimizer step whose weights the engine last received
  int64_t mb_in_step_ = 0;                // the micro-batch forward_mb runs, from 0 within its step (unpipelined)
  // A frozen model's no-grad forward (preference_step.cpp): the autocast casts and embeddings it starts from.
  struct NoGradPass {
    uint32_t gather_label = UINT32_MAX;  // the label of each unit's all-gathered parameters; UINT32_MAX: no gathers
    // The pass runs on the reference's own DeepSpeed engine (reference_ds_fetch): each unit's parameters one by one,
    // prefetched ahead up to max_live, instead of one all-gathered unit at a time.
    bool own_engine = false;
    std::vector<uint32_t> head_gathered;  // own_engine: the head's parameters, until release_head_gathered
    std::vector<LayerCasts> casts;
    size_t embed_before = 0;
  };
  NoGradPass begin_no_grad(uint32_t gather_label, bool own_engine = false);
  void release_head_gathered(NoGradPass& pass, uint32_t gathered);
  void end_no_grad(NoGradPass& pass);
  uint32_t no_grad_trunk(NoGradPass& pass, std::vector<uint32_t>* hidden, std::vector<uint32_t>& norm,
                         const std::function<void(int64_t)>* after_layer);
  uint32_t no_grad_layers(NoGradPass& pass, std::vector<uint32_t>* hidden, const std::function<void(int64_t)>* after_layer);
  uint32_t no_grad_gathered(const NoGradPass& pass, int64_t unit);
  // eval_step.cpp: an evaluation between steps (training.eval_batch_size).
  void evaluation(int after_step);
  uint32_t eval_gathered_label_ = UINT32_MAX, eval_logits_label_ = UINT32_MAX;
  struct PreferenceLabels {
    uint32_t ref_weights = UINT32_MAX, ref_logits = UINT32_MAX, logps = UINT32_MAX, nll = UINT32_MAX, copy = UINT32_MAX,
             ref_gathered = UINT32_MAX, entropy = UINT32_MAX, row_tmp = UINT32_MAX;
  };
  PreferenceLabels pref_labels_;            // made on first use, so that other programs' labels are unchanged
  std::vector<uint32_t> pref_until_loss_;   // what the loss function holds through the reference forward
  // KTO (preference_step.cpp): the KL batch's no-grad forwards and the copies of the logits' labelled rows.
  struct KtoLabels {
    uint32_t kl_logits = UINT32_MAX, kl_gathered = UINT32_MAX, label_copies = UINT32_MAX;
  };
  KtoLabels kto_labels_;                    // made on first use, like pref_labels_
  uint32_t kl_logits_ = UINT32_MAX;         // the policy's KL logits while forward() holds them (TRL 0.8-0.16)
  void kto_labels();
  uint32_t logps_pass(NoGradPass& pass, uint32_t gather_label, uint32_t logits_label, bool logps = true,
                      bool own_engine = false);
  bool reference_own_engine() const;  // the reference copy is a DeepSpeed ZeRO-3 engine of its own
  void logps_temporaries();
  void kl_forward();
  // transformers' loss paths that shift a contiguous copy of the logits (LossImpl HfShiftFp32, HfFp32Logits, HfShift).
  void hf_shifted_loss_forward(std::vector<uint32_t>& saved);
  // TRL SFTTrainer's token accuracy and entropy after the loss (Resolved::sft_metrics, sft_metrics.cpp).
  void sft_metrics(int64_t logits_bytes);
  struct SftLabels {
    uint32_t copy = UINT32_MAX, gathered = UINT32_MAX, entropy = UINT32_MAX, argmax = UINT32_MAX;
  } sft_labels_;  // made on first use, so that other setups' labels are unchanged
  // transformers' 4-D attention mask (Resolved::mask, docs/versions.md 5 and 6b).
  void mask_labels();
  void mask_forward();  // after the embeddings: the micro-batch's shared mask and its build
  // A layer's SDPA call with the mask: the copies the kernel keeps go to `kept`, those that go with the call to
  // `gone`; the shared mask kept by reference makes the layer its holder.
  void sdpa_mask_inputs(int32_t layer, std::vector<uint32_t>& kept, std::vector<uint32_t>& gone, bool keep);
  uint32_t hf_shifted_loss_backward(std::vector<uint32_t>& saved);

  // Under a checkpoint's no_grad forward nothing is saved: what would be an activation is a temporary there.
  uint32_t act(int64_t bytes, uint32_t label, int32_t layer) {
    return program_.alloc(no_grad_ ? Component::Temporaries : Component::Activations, bytes, label, layer);
  }
  uint32_t tmp(int64_t bytes, uint32_t label, int32_t layer) { return program_.alloc(Component::Temporaries, bytes, label, layer); }
  // The input of a softmax or log_softmax: an activation when torch <= 1.10 kept it for backward (kept:
  // training.softmax_saves_input where the graph saves), else a temporary labelled `label`.
  uint32_t softmax_input(int64_t bytes, uint32_t label, int32_t layer, bool kept) {
    return kept ? act(bytes, labels_.softmax_in, layer) : tmp(bytes, label, layer);
  }
  // A tensor a graph node holds as an attribute outlives its owner's drop: it goes with the graph (release_graph).
  void drop(uint32_t t) {
    if (t < graph_attr_.size() && graph_attr_[t] != 0) {
      graph_attr_[t] = 2;
      return;
    }
    program_.free(t);
  }
  // The forward that is running builds the graph: `t` becomes an attribute of one of its nodes.
  void hold_in_graph(uint32_t t);
  // `t` lives until `holders` is released (release_graph), whoever drops it first: a micro-batch's graph, or
  // backward_held_ at the end of this backward (fsdp_hook_holds_inputs_).
  void hold(uint32_t t, std::vector<uint32_t>& holders);
  // A micro-batch's graph goes: the attributes its nodes held, freed where their owners have dropped them.
  void release_graph(std::vector<uint32_t>& attrs);
  // FrameworkSpec::outputs_live_to_next_forward: the last micro-batch's outputs and graph go now.
  void release_previous_outputs();
  // How an eager attention takes the softmax of its scores, in bytes per element: the decoders' softmax(dtype=fp32)
  // and T5's softmax(scores.float()) read scores in the compute dtype (converted to fp32 first where `convert`)
  // and write fp32, cast back for attn @ v, then drop out; BERT's softmax reads and writes the autocast dtype
  // (fp32 under autocast: the fp32 mask has promoted the scores) and drops out before the cast.
  struct SoftmaxFlow {
    int64_t input_bytes;       // the scores softmax reads
    bool convert;              // a conversion to fp32 first (decoders, T5: any dtype but fp32, except an fp16
                               // tensor outside autocast, which _softmax's half_to_float reads as it is)
    int64_t output_bytes;      // what softmax writes and saves; cast to the compute dtype when wider
    bool dropout_before_cast;  // BERT: dropout on the softmax output; decoders and T5: on the cast
    bool dropout;              // attention dropout runs (its probability above 0)
  };
  // Attention probabilities from scores of `s2` elements, up to what attn @ v reads: the one place these rules are
  // written, for every eager attention. `from`: the tensor the scores were computed from, gone once they exist.
  // What backward reads goes to `saved` as activations when `keep` (else as temporaries, for the caller to drop once
  // the call is done): the softmax output, its input under torch <= 1.10, the cast for attn @ v, or the dropout's
  // mask and output.
  void attention_probs(int32_t layer, int64_t s2, const SoftmaxFlow& flow, bool keep, std::vector<uint32_t>& saved,
                       uint32_t from = UINT32_MAX);
  // Dropout in training (nn.Dropout, F.dropout): a new output of `elements` at `out_bytes` each, saved for backward
  // (an activation) or a temporary, and a 1-byte bool mask per element that backward reads, into `saved`
  // (Korthikanti et al. 2022 sec. 4.1: the mask is sbh bytes). The input goes once the output exists, unless
  // another op saved it (free_input false). The one place this rule is written; a dropout fused with another op
  // (BERT's residual add) saves only the mask.
  uint32_t dropout(uint32_t in, int64_t elements, int64_t out_bytes, bool out_saved, uint32_t out_label, int32_t layer,
                   std::vector<uint32_t>& saved, bool free_input = true) {
    saved.push_back(act(elements, labels_.hidden_mask, layer));
    const int64_t bytes = mul(out_bytes, elements);
    const uint32_t out = out_saved ? act(bytes, out_label, layer) : tmp(bytes, out_label, layer);
    if (free_input) drop(in);
    return out;
  }

  const StepContext& ctx_;          // this device: its stage, layers and rank
  const Config& cfg_;               // the user's config, as validated
  const ModelShape& shape_;         // the model's parameter tensors, per list (embeddings, layers, head)
  const PrecisionRecipe& recipe_;   // dtypes of weights, grads, optimizer states and compute
  Resolved resolved_;               // what the framework and versions resolve to: kernels, loss, mask, optimizer
  ActDims dims_;                    // the running micro-batch's sizes (use_shape)
  Labels labels_;                   // the timeline's tensor names, interned once
  StepProgram own_program_;         // the program this builder makes, unless it writes into another's
  StepProgram& program_;            // the allocations and frees so far, replayed by the allocator model
  ShardPlan shard_plan_;            // what is sharded, over how many ranks, and how (ZeRO stage, FSDP version)
  mutable PerTensor<ParamStates> states_{shape_};  // param_states(shard_plan_, ctx_, t)
  mutable PerTensor<int64_t> grad_bytes_{shape_};  // grad_bytes_of(t)
  // module_info by name. The names are string literals or a program's op modules, which live as long as shape_
  // holds the program (its shared_ptr); a program repeats its module names in every block kind, so they are keyed
  // by content, not address.
  mutable std::unordered_map<std::string_view, ModuleInfo> module_info_;
  // norm_trainable by (parameter list, first consumer), the consumer found by its literal's address.
  mutable std::vector<std::pair<std::pair<const std::vector<ParamTensor>*, const char*>, bool>> norm_trainable_;
  int64_t adapter_bytes_ = 2;  // adapter_bytes(), from the config once
  int64_t free_at_load_bytes_ = 0;  // the GPU less its context: what cudaMemGetInfo reports before the model loads
  int64_t shard_ranks_ = 1;  // ranks of the shard group
  // A no-grad pass unshards each unit around its forward: sharded weights over several ranks, or FSDP over one
  // (one_rank_fsdp2), which still makes each unit's 16-bit copy.
  bool unshards_units() const { return shard_weights_ && (shard_ranks_ > 1 || shard_plan_.fsdp); }
  bool shard_opt_ = false, shard_grads_ = false, shard_weights_ = false;
  // A builder writing into another's program (PPO's value model): the two models are one DeepSpeed engine, whose
  // reduce buckets the other builder allocates.
  bool shares_engine_ = false;
  bool in_backward_ = false;
  // The checkpointed forward running under no_grad_ is a non-reentrant checkpoint's: torch runs it with grad, and
  // what its nodes hold as attributes stays with the graph (hold_in_graph, checkpoint_graph_inputs).
  bool ckpt_graph_ = false;
  // A checkpointed layer's forward under no_grad: layer_forward runs its ops, and each intermediate goes when its
  // last reader has run instead of being saved (no_grad_release). no_grad_norm_out_ is the last norm's output.
  bool no_grad_ = false;
  uint32_t no_grad_norm_out_ = UINT32_MAX;
  Zero3Prefetch zero3_;     // DeepSpeed ZeRO-3's fetch window
  Zero3Prefetch reference_zero3_;  // a reference copy's own engine's window (TRL's prepare_deepspeed)
  class Zero3Host;          // what zero3_ asks of this step (sharding.cpp)
  FsdpUnshard fsdp_unshard_;  // FSDP1/FSDP2's unsharded parameters
  class FsdpHost;             // what fsdp_unshard_ asks of this step (sharding.cpp)
  FsdpReduce fsdp_reduce_;    // FSDP1/FSDP2's gradient shards, reduce-scatter inputs and no_sync accumulation
  class FsdpReduceHost;       // what fsdp_reduce_ asks of this step (sharding.cpp)
  PipelineBuffers pipeline_;  // pipeline parallelism's receive buffers (sharding.cpp recv_buffers, schedule.cpp)
  DataParallelGradients dp_grads_;            // DDP's bucket and its views, ZeRO's partition and ipg buckets
  class DpGradientsHost;                      // what dp_grads_ asks of this step (sharding.cpp)
  mutable int64_t gathered_cache_[4] = {-1, -1, -1, -1};  // gathered_bytes of the embeddings, head, dense, MoE layer
  mutable int64_t flat_numel_cache_ = -1;     // flat_partition_numel()
  // The backward running is the step's last for its chunk: FSDP under pipeline parallelism or no_sync reduces
  // after it.
  bool last_backward_ = true;
  std::vector<std::vector<uint32_t>> grads_;  // live .grad tensors per slot: 0 embeddings, l + 1 layer l, L + 1 head
  std::vector<bool> grad_created_;
  std::vector<bool> states_created_;  // optimizer in backward: per slot
  std::vector<LayerCasts> casts_;             // autocast weight copies alive, per layer
  std::vector<uint32_t> ckpt_casts_;          // layers whose casts were made under a checkpoint's no_grad
  SavedLayer recompute_;
  struct Spare {
    std::vector<SavedLayer> saved;
    std::vector<std::vector<std::pair<int64_t, uint32_t>>> host;
    std::vector<LayerCasts> casts;
  };
  std::vector<Spare> spare_;
  std::vector<uint32_t> embed_saved_;         // post-LN embedding norm and dropout
  uint32_t held_logits_ = UINT32_MAX;         // logits the training loop keeps until after backward
  // Tensors an autograd node holds as an attribute, not through save_for_backward, so that backward does not
  // release them and they live as long as the graph: bitsandbytes before 0.43.2 keeps every 4-bit linear's input
  // (autograd/_functions.py MatMul4Bit.forward: ctx.tensors = (A, B); bitsandbytes#1270, in 0.43.2, keeps only B).
  // Per tensor id: 0 not held, 1 held, 2 held and dropped by its owner (freed with the graph). The running
  // forward's go to its InFlight::graph_attrs.
  std::vector<uint8_t> graph_attr_;
  std::vector<uint32_t> graph_attrs_now_;
  // A training loop that rebinds its outputs only after the next forward (FrameworkSpec::
  // outputs_live_to_next_forward): the last micro-batch's logits and its graph's attributes until then.
  uint32_t prev_logits_ = UINT32_MAX;
  std::vector<uint32_t> prev_graph_attrs_;
  bool bnb_input_in_graph_ = false;           // the last linear_inputs call found a bitsandbytes linear that keeps its input
  uint32_t int8_copy_label_ = UINT32_MAX;     // made on first use, so that other programs' labels are unchanged
  // GPTQ/AWQ tensors' labels (int4_forward), made on first use so that other programs are unchanged.
  struct { uint32_t unpack = UINT32_MAX, weight = UINT32_MAX, input = UINT32_MAX, backward = UINT32_MAX; } int4_labels_;
  // FSDP1's reshard-only hook (_register_post_backward_reshard_only_hook) on a frozen layer unit calls
  // register_multi_grad_hook on the forward's inputs that require grad. Reentrant checkpointing recomputes the
  // layer on leaves (detach_variable), and for a leaf the hook's closure holds its AccumulateGrad node, which holds
  // the tensor, until _finalize_params removes the handle at the end of backward: each checkpointed layer's input
  // and the input gradient AccumulateGrad writes into its .grad stay until then (backward_held_).
  bool fsdp_hook_holds_inputs_ = false;
  std::vector<uint32_t> backward_held_;
  uint32_t tied_pending_ = UINT32_MAX;        // tied weights, a later micro-batch: lm_head's gradient in the engine
  bool any_quantized_ = false;
  const std::vector<MicroBatchShape>* run_shapes_ = nullptr;  // a run of varying shapes: every micro-batch's
  size_t next_shape_ = 0;                                     // ... and the next forward's index into them
  EncDecLabels encdec_labels_{};
  bool encdec_labels_made_ = false;
  MaskLabels mask_labels_{};
  bool mask_labels_made_ = false;
  MaskInFlight mask_;  // the micro-batch whose forward or backward is running
  int64_t enc_s_ = 0, dec_s_ = 0;  // encoder (source) and decoder (target) tokens per sequence
  int iter_ = 1;                   // the optimizer step being replayed (1-based)
  UnslothLabels unsloth_labels_{};
  bool unsloth_labels_made_ = false;
  void unsloth_labels();
  // unsloth.cpp
  void unsloth_gc_buffers(bool grow);  // create (grow false) or grow to this micro-batch's input (true)
  bool unsloth_offloads(int64_t layer) const;  // whether smart checkpointing sends this layer's input to the host
  void unsloth_weight_buffer();
  void unsloth_loss_forward(LossImpl loss, std::vector<uint32_t>& saved);
  uint32_t unsloth_loss_backward(LossImpl loss);
  // Unsloth's smart checkpointing (UnslothGc::Smart): the persistent GPU buffers the offloaded inputs come back to,
  // grown to the largest micro-batch's tokens x hidden and never shrunk.
  uint32_t gc_buffer_[2] = {UINT32_MAX, UINT32_MAX};
  int64_t gc_buffer_bytes_[2] = {0, 0};
};

}  // namespace memsim
