// A model program (architecture.h) through one micro-batch: the embeddings, the repeated block and the head, op by op.
// Forward allocates each op's output and what autograd saves for its backward; an activation goes once its last
// reader has run unless an op saved it (a view keeps its base). Backward walks the ops in reverse: each input that
// requires grad gets its gradient (a second gradient of the same tensor is added into the first, as autograd's
// InputBuffer does), the output's gradient and the op's saved tensors go. The engines (ZeRO, FSDP, DDP buckets, the
// optimizer, checkpointing) are the built-in families' own: gather(), alloc_layer_grads() and friends per slot.
//
// What each op saves, and why (torch's derivatives.yaml and the modules' forward):
// - linear / conv2d: the input for the weight's gradient when the weight trains (under autocast a cast copy per
//   module, as for every linear: linear_inputs), LoRA's inputs where PEFT targets the module;
// - layer_norm: native_layer_norm saves its input, mean and rstd (fp32, one each per row);
// - gelu and silu: their input; relu and tanh: their output; dropout: a 1-byte mask (the one dropout rule, step_builder.h);
// - attention: SDPA's flash / memory-efficient kernels keep q, k, v, the output and an fp32 logsumexp per head and
//   row; the eager form (ViTSelfAttention, BERT's) keeps q, k, v and the probabilities (the one attention_probs rule);
// - layer_scale and mul by a parameter: the input, where the scale trains; mul of two activations (SwiGLU's
//   silu(x1) * x2): each factor, for the other's gradient;
// - window_attention (Swin's, eager): q, k, v and the softmax's output (with its 16-bit copy under autocast);
// - scale, copy and space_to_depth save nothing;
// - batch_norm2d: its input and the batch's mean and inverse deviation (fp32, per channel); max_pool2d: its input and
//   the int64 index of each output;
// - relu and add in place (nn.ReLU(inplace=True), out += identity) write their first input and make nothing new;
// - add, concat, mean_tokens, global_avg_pool, resize_tokens, the views (flatten_tokens, unflatten_tokens,
//   select_token, slice) and parameters save nothing;
// - cross_entropy: log_softmax's output (fp32 under autocast, where cross_entropy runs in fp32).
#include <algorithm>
#include <array>

#include "architecture.h"
#include "checked.h"
#include "ops.h"
#include "step_builder.h"

namespace memsim {

namespace {

bool contains(const std::vector<uint32_t>& v, uint32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

// The program being run: the model's, or a vision-language model's tower (vision_step.cpp) while it runs.
const Architecture& StepBuilder::running_program() const {
  return frozen_run_ ? *frozen_run_ : in_tower_ ? *shape_.vision_tower : *shape_.program;
}

int64_t StepBuilder::input_dtype_bytes(InputDtype d) const {
  return d == InputDtype::Compute ? dims_.e : d == InputDtype::Int64 ? 8 : 4;
}

const ArchStage& StepBuilder::program_stage(ProgramStage st, int32_t layer) const {
  const Architecture& a = running_program();
  return st == ProgramStage::Embeddings ? a.embeddings : st == ProgramStage::Block ? a.block_of(layer) : a.head;
}

const std::vector<ParamTensor>& StepBuilder::program_params(ProgramStage st, int32_t layer) const {
  static const std::vector<ParamTensor> none;  // a frozen module's forward: its weights train nowhere
  if (frozen_run_) return none;
  if (in_tower_)
    return st == ProgramStage::Embeddings ? shape_.tower_embeddings : st == ProgramStage::Head ? shape_.tower_head : shape_.tower_block;
  return st == ProgramStage::Embeddings ? shape_.pre : st == ProgramStage::Head ? shape_.post : shape_.params_of(layer);
}

// Whether the parameter `name` of this slot trains (has a gradient): itself, or the trainable copy PEFT's
// modules_to_save runs in its place (model.cpp apply_peft).
// `trained`: the slot's parameters that have a gradient.
static bool param_trains(const std::vector<const ParamTensor*>& trained, std::string_view module, std::string_view suffix) {
  constexpr std::string_view copy = "modules_to_save.";
  for (const ParamTensor* t : trained) {
    const std::string_view n = t->name;
    if (names_param(n, module, suffix) || (n.starts_with(copy) && names_param(n.substr(copy.size()), module, suffix)))
      return true;
  }
  return false;
}

// Per op of a stage: whether its own parameters train (or PEFT wraps it, kOpTrains) and whether its weight is
// quantized (kOpQuantized), once per stage kind: every forward and backward of a stage plans it again, and the
// names' lookups were most of a program's simulation time.
const std::vector<char>& StepBuilder::stage_op_flags(ProgramStage st, int32_t layer) const {
  const Architecture& a = running_program();
  const ArchStage& s = program_stage(st, layer);
  const size_t slot = st == ProgramStage::Embeddings ? 0 : st == ProgramStage::Head ? 1 : 2 + static_cast<size_t>(a.kind_of_layer[static_cast<size_t>(layer)]);
  auto& cache = frozen_run_ ? frozen_trains_[frozen_index_] : in_tower_ ? tower_trains_ : program_trains_;
  if (cache.size() < 2 + a.blocks.size()) cache.resize(2 + a.blocks.size());
  std::vector<char>& v = cache[slot];
  if (v.size() == s.ops.size()) return v;
  const auto& all_params = program_params(st, layer);
  // The slot's parameters that train, and those stored quantized, each listed once: under PEFT few train, and the
  // ops' lookups below then search a short list instead of every parameter of the slot.
  std::vector<const ParamTensor*> params, quantized;
  for (const auto& t : all_params) {
    if (has_grad(t)) params.push_back(&t);
    if (t.quantized) quantized.push_back(&t);
  }
  v.assign(s.ops.size(), 0);
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ArchOp& op = s.ops[i];
    switch (op.kind) {
      case OpKind::Parameter: v[i] = param_trains(params, op.name, ""); break;
      case OpKind::Embedding:  // a tied one's weight is the head's (Architecture::tied_head)
        // (Exactly the shared weight: a modules_to_save copy of the head would be untied, refused in validation.)
        if (op.tied) {
          const ParamTensor* tied = in_tower_ || frozen_run_ ? nullptr : tied_weight();
          v[i] = tied && has_grad(*tied);
        } else {
          v[i] = param_trains(params, op.name, ".weight");
        }
        break;
      case OpKind::Linear:
      case OpKind::Conv1d:
      case OpKind::Conv2d: {
        v[i] = param_trains(params, op.name, ".weight") || param_trains(params, op.name, ".bias") ||
               (module_info(op.module.c_str()).targeted && !in_tower_ && !frozen_run_);
        if (any_quantized_ && op.kind == OpKind::Linear)
          for (const ParamTensor* t : quantized)
            if (names_param(t->name, op.name, ".weight")) v[i] |= kOpQuantized;
        break;
      }
      case OpKind::LayerNorm:
      case OpKind::GroupNorm:
      case OpKind::BatchNorm2d: v[i] = param_trains(params, op.name, ".weight") || param_trains(params, op.name, ".bias"); break;
      case OpKind::RmsNorm: v[i] = param_trains(params, op.name, ".weight"); break;
      case OpKind::LayerScale: v[i] = param_trains(params, op.name, ".lambda1"); break;
      case OpKind::SsdMixer:
        for (const char* p : {".out_proj.weight", ".norm.weight", ".conv1d.weight", ".A_log", ".D", ".dt_bias"})
          if (param_trains(params, op.name, p)) v[i] = 1;
        break;
      case OpKind::Moe:
        for (const char* p : {".experts.up_proj", ".experts.down_proj", ".gate.weight"})
          if (param_trains(params, op.name, p)) v[i] = 1;
        break;
      default: break;
    }
  }
  return v;
}

// mamba_ssm v2.2.2 ssd_chunk_state.py _chunk_state_bwd_db (and _chunk_scan_bwd_dC, _bmm_chunk_bwd alike):
// nheads_ngroups_ratio / max(min(cdiv(batch x nchunks x nheads, sm_count), nheads_ngroups_ratio), 1) splits, rounded
// up, each with an fp32 buffer; sm_count is the card's (GpuSpec::multiprocessors), the A100's for a custom card.
int64_t StepBuilder::ssd_splits(int64_t batch_chunks, int64_t heads, int64_t groups) const {
  const GpuSpec* gpu = find_gpu(cfg_.hardware.gpu);
  const int64_t sms = gpu ? gpu->multiprocessors : find_gpu("a100-80gb")->multiprocessors;
  const int64_t ratio = std::max<int64_t>(1, heads / std::max<int64_t>(1, groups));
  const int64_t per = std::max<int64_t>(std::min(ceil_div(mul(batch_chunks, heads), sms), ratio), 1);
  return ceil_div(ratio, per);
}

// Whether a copy op copies: its `when`, and for a causal LM's shifted logits the loss path the framework and versions
// resolve (transformers shifts a copy of the logits before 4.49, the labels from then on: frameworks.cpp hf_loss_path).
bool StepBuilder::copies(const ArchOp& op) const {
  if (!op.when) return false;
  if (!op.shifted_logits) return true;
  const LossImpl l = resolved_.loss;
  return l == LossImpl::HfShift || l == LossImpl::HfFp32Logits || l == LossImpl::HfShiftFp32;
}

// Whether a grouped-query attention op's kernel takes k and v repeated for every query head (kv_repeated's rule for
// the built-in layers): transformers' repeat_kv before eager and before SDPA without enable_gqa, and the math kernel
// for more than one kv head. A program builds no padding mask, so SDPA from enable_gqa on takes them as they are.
bool StepBuilder::program_repeats_kv(const ArchOp& op) const {
  if (op.kv_heads == 0 || op.kv_heads >= op.heads) return false;
  const Attention a = resolved_.attention;
  return a == Attention::SdpaRepeatKv || a == Attention::Eager || (a == Attention::SdpaMath && op.kv_heads > 1);
}

// A bitsandbytes linear's weight dequantized to the compute dtype for one matmul (MatMul4Bit, MatMul8bitLt:
// autograd/_functions.py), alive while the matmul runs; UINT32_MAX where the op's weight is not quantized.
uint32_t StepBuilder::program_dequant(ProgramStage st, int32_t layer, size_t i) {
  const ArchStage& s = program_stage(st, layer);
  if (!(stage_op_flags(st, layer)[i] & kOpQuantized)) return UINT32_MAX;
  const ArchOp& op = s.ops[i];  // a linear: weight [out_features, in]
  return tmp(mul(dequant_bytes(), op.out_features, s.tensors[static_cast<size_t>(op.in[0])].shape.back()), labels_.dequant, layer);
}

StepBuilder::ProgramPlan StepBuilder::plan_program(ProgramStage st, int32_t layer, bool input_req, int64_t input_bytes) const {
  ProgramPlan p;
  plan_program(p, st, layer, input_req, input_bytes);
  return p;
}

void StepBuilder::plan_program(ProgramPlan& p, ProgramStage st, int32_t layer, bool input_req, int64_t input_bytes) const {
  const ArchStage& s = program_stage(st, layer);
  const std::vector<char>& flags = stage_op_flags(st, layer);
  const size_t n = s.tensors.size();
  p.bytes.assign(n, dims_.e);
  p.req.assign(n, false);
  p.root.resize(n);
  p.op_trains.assign(s.ops.size(), false);
  for (size_t t = 0; t < n; ++t) p.root[t] = static_cast<int32_t>(t);
  // The program's inputs (pixel values) come from the collator in fp32; the stage input in the dtype it was made in.
  // A carry from an earlier stage: as its producer made it.
  for (size_t t = 0; t < n; ++t) {
    if (s.tensors[t].producer >= 0) continue;
    const int32_t c = s.tensors[t].carry;
    if (static_cast<int32_t>(t) == s.input) p.bytes[t] = input_bytes, p.req[t] = input_req;
    else if (c >= 0 && static_cast<size_t>(c) < carry_.size()) p.bytes[t] = carry_[c].bytes, p.req[t] = carry_[c].req;
    else p.bytes[t] = input_dtype_bytes(s.tensors[t].dtype), p.req[t] = false;
  }
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ArchOp& op = s.ops[i];
    const int32_t o = op.out;
    bool req = false;
    int64_t widest = 0;
    for (int32_t t : op.in) req = req || p.req[t], widest = std::max(widest, p.bytes[t]);
    switch (op.kind) {
      case OpKind::Parameter:
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = dims_.e_res;  // fp32 under autocast over fp32 weights, else the weights' dtype
        break;
      case OpKind::Embedding:  // the weight's dtype (embedding is on none of autocast's lists)
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = dims_.e_res;
        break;
      case OpKind::SsdMixer:  // out_proj's output: the compute dtype (F.linear under autocast, or the weights')
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = dims_.e;
        break;
      case OpKind::Moe:  // final_hidden_states.to(hidden_states.dtype): the input's
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = p.bytes[op.in[0]];
        break;
      case OpKind::Cast: {  // x itself where it has the dtype already
        const int64_t to = op.cast_to == CastTo::Fp32 ? 4 : op.cast_to == CastTo::Compute ? dims_.e : dims_.e_res;
        if (to == p.bytes[op.in[0]]) p.root[o] = p.root[op.in[0]];
        p.bytes[o] = to;
        break;
      }
      case OpKind::Linear:
      case OpKind::Conv1d:
      case OpKind::Conv2d: {
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        // bitsandbytes' Linear4bit / Linear8bitLt return their input's dtype (nn/modules.py: out.to(inp_dtype)), an
        // fp32 input's under autocast (docs/research/flux-dit.md section 6).
        p.bytes[o] = (flags[i] & kOpQuantized) ? p.bytes[op.in[0]] : dims_.e;
        break;
      }
      case OpKind::LayerNorm:
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = dims_.amp ? 4 : widest;  // layer_norm is on autocast's fp32 list
        break;
      case OpKind::RmsNorm:  // weight * x.to(input dtype): the input's dtype (or the weight's, if wider)
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        // diffusers': (x * rstd).to(weight dtype) * weight where the weight is 16-bit, else the fp32 product * weight:
        // the weight's dtype either way (e_res, as a parameter op's).
        p.bytes[o] = op.diffusers ? dims_.e_res : widest;
        break;
      case OpKind::GroupNorm:  // on autocast's fp32 list (a 16-bit input is cast to fp32 first)
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = dims_.amp ? 4 : widest;
        break;
      case OpKind::BatchNorm2d:  // on none of autocast's lists: cuDNN takes 16-bit input with fp32 weights
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = widest;
        break;
      case OpKind::Relu:
      case OpKind::Add:  // in place: the output is the (first) input's storage, in its dtype
        if (op.inplace) p.root[o] = p.root[op.in[0]], widest = p.bytes[op.in[0]];
        p.bytes[o] = widest;
        break;
      case OpKind::Attention:
      case OpKind::WindowAttention: p.bytes[o] = op.cast_out ? p.bytes[op.in[0]] : dims_.e; break;
      case OpKind::Rotary:  // transformers': cos and sin in the residual stream's dtype, which the products promote to
        p.bytes[o] = op.hf_rotary ? std::max(widest, dims_.e_res) : widest;
        break;
      case OpKind::Copy:  // no copy: x itself
        if (!copies(op)) p.root[o] = p.root[op.in[0]];
        p.bytes[o] = widest;
        break;
      case OpKind::Unpad:  // nothing padded: a full slice, and contiguous() of it is itself
        if (op.size == s.tensors[op.in[0]].shape[0]) p.root[o] = p.root[op.in[0]];
        p.bytes[o] = widest;
        break;
      case OpKind::LayerScale:  // x * lambda1: type promotion with the parameter's dtype (fp32 under autocast)
        p.op_trains[i] = (flags[i] & kOpTrains) != 0;
        p.bytes[o] = std::max(widest, dims_.e_res);
        break;
      case OpKind::Mul: {  // x * s: s's gradient reads x; type promotion as layer_scale's
        const int32_t sp = s.tensors[op.in[1]].producer;
        p.op_trains[i] = s.tensors[op.in[1]].is_parameter && sp >= 0 && p.op_trains[sp];
        p.bytes[o] = widest;
        break;
      }
      case OpKind::ResizeTokens:  // the table itself where the grid matches (a view), else a new interpolated one
        p.root[o] = op.size == s.tensors[op.in[0]].shape[0] ? p.root[op.in[0]] : o;
        p.bytes[o] = widest;
        break;
      case OpKind::CrossEntropy:
      case OpKind::MseLoss: p.bytes[o] = 4; break;
      case OpKind::Dropout:
      case OpKind::DropPath:
        p.root[o] = op.p_at(layer) > 0 ? o : p.root[op.in[0]];  // p = 0: aten _dropout and timm's drop_path return their input
        p.bytes[o] = widest;
        break;
      case OpKind::FlattenTokens:
      case OpKind::UnflattenTokens:
      case OpKind::SelectToken:
      case OpKind::Slice:
        p.root[o] = p.root[op.in[0]];  // a view
        p.bytes[o] = widest;
        break;
      default: p.bytes[o] = widest; break;  // concat and add promote; gelu, relu and dropout keep the dtype
    }
    p.req[o] = req || p.op_trains[i];
  }
}

uint32_t StepBuilder::program_label(ProgramStage st, int32_t layer, int32_t tensor, const char* what) {
  const Architecture& a = running_program();
  const size_t slot = st == ProgramStage::Embeddings ? 0 : st == ProgramStage::Head ? 1 : 2 + static_cast<size_t>(a.kind_of_layer[static_cast<size_t>(layer)]);
  auto& labels = frozen_run_ ? frozen_labels_[frozen_index_] : in_tower_ ? tower_labels_ : program_labels_;
  if (labels.size() < 2 + a.blocks.size()) labels.resize(2 + a.blocks.size());
  auto& cache = labels[slot];
  const ArchStage& s = program_stage(st, layer);
  if (cache.empty()) cache.assign(s.tensors.size() * 3, UINT32_MAX);
  const size_t k = static_cast<size_t>(tensor) * 3 + (what[0] == 'g' ? 1 : what[0] == 'c' ? 2 : 0);
  if (cache[k] == UINT32_MAX) {
    // Built in one string: a program with many block kinds (FLUX.1's) makes a few thousand labels per simulation.
    const std::string_view stage = slot == 0 ? "embeddings" : slot == 1 ? "head" : std::string_view(a.block_names[slot - 2]);
    const ArchTensor& t = s.tensors[static_cast<size_t>(tensor)];
    const char* op = t.producer >= 0 ? op_name(s.ops[static_cast<size_t>(t.producer)].kind) : "input";
    std::string text;
    text.reserve(64);
    text += what[0] == 'g' ? "gradient of " : what[0] == 'c' ? "compute-dtype copy of " : "";
    if (frozen_run_) text += frozen_name_, text += " forward ";
    else if (in_tower_) text += "vision tower ";
    text += stage, text += ' ', text += t.name, text += " (", text += op, text += ')';
    cache[k] = program_.label(std::move(text));
  }
  return cache[k];
}

// One stage's forward. `in`: the stage input (block, head), owned by the caller unless own_input. Under no_grad_ (a
// checkpointed block's first forward) nothing is saved: every intermediate goes after its last reader.
uint32_t StepBuilder::program_forward(ProgramStage st, int32_t layer, uint32_t in, bool in_req, int64_t in_bytes,
                                      SavedLayer& saved, bool own_input, uint32_t inputs, int32_t input_carry) {
  const ArchStage& s = program_stage(st, layer);
  const StageScratch::Frame frame(stage_scratch_);
  StageScratch& sc = frame.buffers;
  plan_program(sc.plan, st, layer, in_req, in_bytes);
  const ProgramPlan& p = sc.plan;
  const size_t n = s.tensors.size();
  std::vector<uint32_t>& id = sc.id;
  id.assign(n, UINT32_MAX);
  std::vector<int32_t>& keeps = sc.keeps;  // ops that saved the tensor's storage (by root)
  keeps.assign(n, 0);
  std::vector<bool>& owned = sc.owned;
  owned.assign(n, true);
  // Per root: the carry it is (the carry's state owns it: kept by holds, not by this stage), or -1.
  std::vector<int32_t>& carried = sc.carried;
  carried.assign(n, -1);
  for (size_t t = 0; t < n; ++t)
    if (s.tensors[t].producer < 0) {
      const bool is_input = static_cast<int32_t>(t) == s.input;
      carried[t] = is_input ? input_carry : s.tensors[t].carry;
      // The program's inputs live in f.inputs; a carry in its state.
      id[t] = is_input ? in : carried[t] >= 0 ? carry_[static_cast<size_t>(carried[t])].id : inputs;
      owned[t] = is_input && own_input && carried[t] < 0;
    }
  // (A checkpointed block's recomputation makes its carries again for its own backward only: there they are its own.)
  if (!program_recompute_)
    for (const auto& [t, c] : s.exports) carried[p.root[t]] = c;
  const int64_t b = dims_.b;
  auto bytes_of = [&](int32_t t) { return mul(p.bytes[t], b, s.tensors[static_cast<size_t>(t)].numel()); };
  auto rows_of = [&](int32_t t) {
    const auto& sh = s.tensors[static_cast<size_t>(t)].shape;
    return mul(b, s.tensors[static_cast<size_t>(t)].numel() / sh.back());
  };
  // What an op saves: an existing tensor (its storage stays until the op's backward) or a new one.
  std::vector<uint32_t>& transient = sc.transient;
  transient.clear();
  // (A tensor the caller owns, the stage input under a checkpoint or the program's inputs, lives past the stage's
  // backward anyway.)
  auto keep = [&](int32_t op, int32_t t) {
    if (no_grad_) return;
    if (carried[p.root[t]] >= 0) return hold_carry(carried[p.root[t]], saved);
    if (!owned[p.root[t]]) return;
    ++keeps[p.root[t]];
    saved.attn.push_back(id[p.root[t]]);
    saved.ops.push_back(static_cast<uint32_t>(op));
  };
  auto save_new = [&](int32_t op, int64_t bytes, uint32_t label) {
    if (no_grad_) return transient.push_back(tmp(bytes, label, layer));
    saved.attn.push_back(act(bytes, label, layer));
    saved.ops.push_back(static_cast<uint32_t>(op));
  };
  // A tensor whose last reader has run goes, with its views, unless saved or owned by the caller.
  auto release = [&](int32_t t) {
    const int32_t r = p.root[t];
    if (carried[r] >= 0 || !owned[r] || keeps[r] > 0 || id[r] == UINT32_MAX || (s.output >= 0 && r == p.root[s.output])) return;
    drop(id[r]);
    id[r] = UINT32_MAX;
  };
  // Per root: the last op that reads it or any of its views.
  std::vector<int32_t>& last = sc.last;
  last.assign(n, -1);
  for (size_t t = 0; t < n; ++t) last[p.root[t]] = std::max(last[p.root[t]], s.last_reader[t]);

  for (size_t i = 0; i < s.ops.size(); ++i) {
    const ArchOp& op = s.ops[i];
    const int32_t o = op.out, oi = static_cast<int32_t>(i);
    const int32_t x = op.in.empty() ? -1 : op.in[0];
    const bool req = p.req[o];
    switch (op.kind) {
      case OpKind::Parameter: owned[o] = false; break;  // a weight: the engines hold it
      case OpKind::FlattenTokens:
      case OpKind::UnflattenTokens:
      case OpKind::SelectToken:
      case OpKind::Slice: break;  // views: the root's storage
      case OpKind::DropPath:
        // timm: x.div(keep_prob) (a transient), times a [batch, 1, 1] random tensor in x's dtype, which the product
        // saves. torchvision's StochasticDepth divides the noise instead (noise.div_(survival_rate); input * noise).
        if (op.p_at(layer) > 0) {
          const uint32_t scaled = op.noise_scaled ? UINT32_MAX : tmp(bytes_of(o), labels_.attn_tmp, layer);
          id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
          if (scaled != UINT32_MAX) drop(scaled);
          if (req) save_new(oi, mul(p.bytes[o], b), labels_.hidden_mask);
        }
        break;
      case OpKind::Embedding:  // embedding_backward reads only the ids (an input the batch holds anyway)
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::Cast:  // _to_copy's backward casts the gradient back: nothing saved
        if (p.root[o] == o) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::SsdMixer: {
        // MambaSplitConv1dScanCombinedFn.forward (docs/research/mamba2.md 1.2): the conv's output xBC [T, cd]; the
        // scan's dt and dA_cumsum [b, H, chunks, Q] fp32, its chunk states [b, chunks, H, P, N] fp32 and again in
        // the activations' dtype, the final states [b, H, P, N] fp32 and CB [b, chunks, g, Q, Q] fp32, alive
        // together; the scan's output out_x [T, di] (saved); the gated norm's output [T, di] and rstd [g T] fp32
        // (saved); out_proj's output. save_for_backward keeps zxbcdt (this op's input), out_x and rstd: nothing of the
        // conv, the states or the norm's output, which backward recomputes.
        const int64_t T = rows_of(x), a = p.bytes[x];
        const int64_t di = mul(op.heads, op.head_dim), cd = add(di, mul(2, op.groups, op.state));
        const int64_t L = s.tensors[x].shape[0], chunks = ceil_div(L, op.chunk);
        const int64_t bc = mul(b, chunks);
        const uint32_t conv = tmp(mul(a, T, cd), labels_.attn_tmp, layer);
        const uint32_t dt = tmp(mul(8, bc, op.heads, op.chunk), labels_.attn_tmp, layer);
        const uint32_t states32 = tmp(mul(4, bc, di, op.state), labels_.attn_tmp, layer);
        const uint32_t states = tmp(mul(a, bc, di, op.state), labels_.attn_tmp, layer);
        const uint32_t final_states = tmp(mul(4, b, di, op.state), labels_.attn_tmp, layer);
        const uint32_t cb = tmp(mul(4, bc, op.groups, mul(op.chunk, op.chunk)), labels_.attn_tmp, layer);
        const bool save = req && !no_grad_;
        if (ssd_label_ == UINT32_MAX) ssd_label_ = program_.label("SSD scan output out_x (saved)");
        const uint32_t out_x = save ? act(mul(a, T, di), ssd_label_, layer) : tmp(mul(a, T, di), ssd_label_, layer);
        const uint32_t normed = tmp(mul(a, T, di), labels_.norm_scaled, layer);
        const uint32_t rstd = save ? act(mul(4, op.groups, T), labels_.norm_rstd, layer) : tmp(mul(4, op.groups, T), labels_.norm_rstd, layer);
        // Under autocast: outproj_weight.to(the autocast dtype), a plain cast autocast does not cache, which
        // save_for_backward keeps (ssd_combined.py l.817, l.822).
        uint32_t weight_copy = UINT32_MAX;
        if (dims_.amp && recipe_.autocast_copy_bytes > 0)
          weight_copy = tmp(mul(recipe_.autocast_copy_bytes, op.out_features, di), labels_.cast, layer);
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        // The function's locals go as it returns; final_states with the mixer (return_final_states at 4.46).
        for (uint32_t t : {conv, dt, states32, states, cb, normed, final_states}) drop(t);
        if (weight_copy != UINT32_MAX) {
          if (save) saved.attn.push_back(weight_copy), saved.ops.push_back(static_cast<uint32_t>(i));
          else drop(weight_copy);
        }
        if (save) {
          saved.attn.push_back(out_x), saved.ops.push_back(static_cast<uint32_t>(i));
          saved.attn.push_back(rstd), saved.ops.push_back(static_cast<uint32_t>(i));
        } else {
          drop(out_x), drop(rstd);
        }
        if (req) keep(oi, x);
        break;
      }
      case OpKind::Moe: {
        // NemotronHMoE's routed part (transformers 5, docs/research/nemotron3-moe.md sections 2-3), over T tokens of
        // width d, S = top_k x T (token, expert) pairs, f = the experts' width.
        // - The router: F.linear(x.float(), weight.float()), each .float() a copy where the tensor is 16-bit (under
        //   autocast F.linear casts both again, to the autocast dtype, and the sigmoid after it keeps that dtype);
        //   the matmul keeps the weight's copy where x needs a gradient and x's where the router trains; the
        //   sigmoid keeps its output where the routing weights need a gradient; the choice (+ the fp32
        //   e_score_correction_bias, a -inf mask) is fp32 and kept by nothing.
        // - grouped_mm_experts_forward: the pairs' tokens gathered (hidden_states[perm // top_k], a local until the
        //   function returns), cast to the weights' dtype where they differ (_grouped_mm's input.to(weight.dtype):
        //   grouped_mm is not autocast-enabled, so the experts run in the weights' dtype), the up GEMM (its input
        //   kept where up_proj trains), act_fn = relu then square (relu's output kept where it needs a gradient;
        //   the up output goes when act_fn returns), the down GEMM (the square kept where down_proj trains; its output
        //   a local until the function returns, and kept by the product with the routing weights where those need a
        //   gradient), the product in the promoted dtype, its unsorted copy (weighted_out[inv_perm], a local until
        //   the return), the sum over top_k (fp32 under autocast: sum is on its fp32 list) and the cast back. The
        //   sort's permutation and its inverse ([S] int64) are kept by the index ops' backward.
        const int64_t T = rows_of(x), d = s.tensors[x].shape.back(), a = p.bytes[x];
        const int64_t E = op.experts, S = mul(op.top_k, T), f = op.expert_width;
        const int64_t rd = dims_.amp ? dims_.e : 4;   // the router's logits and sigmoid, and so the routing weights
        const int64_t ec = recipe_.weight_bytes;      // the experts' GEMMs and what they make
        const int64_t w = std::max(ec, rd);           // the weighted outputs: the down GEMM's dtype times the weights'
        const int64_t sb = dims_.amp ? 4 : w;         // the sum over top_k
        const std::vector<const ParamTensor*> trained = [&] {
          std::vector<const ParamTensor*> v;
          for (const auto& t : program_params(st, layer))
            if (has_grad(t)) v.push_back(&t);
          return v;
        }();
        const bool router_trains = param_trains(trained, op.name, ".gate.weight");
        const bool up_trains = param_trains(trained, op.name, ".experts.up_proj");
        const bool down_trains = param_trains(trained, op.name, ".experts.down_proj");
        const bool save = req && !no_grad_, grad_x = save && p.req[x];
        const bool routing_grad = save && (p.req[x] || router_trains);  // the routing weights need a gradient
        const bool chain_grad = save && (p.req[x] || up_trains || down_trains);
        auto save_or_tmp = [&](bool kept, int64_t bytes, uint32_t label) {
          if (!kept) return tmp(bytes, label, layer);
          const uint32_t t = act(bytes, label, layer);
          saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i));
          return t;
        };
        auto transient_if = [&](bool kept, uint32_t t) {
          if (!kept && t != UINT32_MAX) drop(t);
        };
        // The router.
        const bool amp_cast = dims_.amp && rd != 4;
        const bool x_kept = save && router_trains;
        const uint32_t x32 = a != 4 ? save_or_tmp(x_kept && !amp_cast, mul(4, T, d), labels_.router) : UINT32_MAX;
        const uint32_t w32 = recipe_.weight_bytes != 4 ? save_or_tmp(grad_x && !amp_cast, mul(4, E, d), labels_.router) : UINT32_MAX;
        const uint32_t x_in = amp_cast ? save_or_tmp(x_kept, mul(rd, T, d), labels_.router) : x32;
        const uint32_t w_in = amp_cast ? save_or_tmp(grad_x, mul(rd, E, d), labels_.router) : w32;
        if (!amp_cast && x_kept && x32 == UINT32_MAX) keep(oi, x);  // fp32 x: x.float() is x
        const uint32_t logits = tmp(mul(rd, T, E), labels_.router, layer);
        transient_if(x_kept, x_in);
        transient_if(grad_x, w_in);
        if (amp_cast) drop_if(x32), drop_if(w32);
        const uint32_t probs = save_or_tmp(routing_grad, mul(rd, T, E), labels_.router);
        drop(logits);
        const uint32_t choice = tmp(mul(4, T, E), labels_.router, layer);
        const uint32_t masked = tmp(mul(4, T, E), labels_.router, layer);
        drop(choice);
        const uint32_t picked = save_or_tmp(routing_grad || chain_grad, mul(8 + rd, T, op.top_k), labels_.router);  // indices, weights
        drop(masked);
        // The experts.
        const uint32_t perm = save_or_tmp(routing_grad || chain_grad, mul(16, S), labels_.expert_in);
        const uint32_t gathered = save_or_tmp(save && up_trains && a == ec, mul(a, S, d), labels_.expert_in);
        const uint32_t gathered_cast = a != ec ? save_or_tmp(save && up_trains, mul(ec, S, d), labels_.expert_in) : UINT32_MAX;
        const uint32_t up = tmp(mul(ec, S, f), labels_.expert_out, layer);
        transient_if(save && up_trains, gathered_cast);
        const bool relu_kept = save && (p.req[x] || up_trains);
        const uint32_t relu = save_or_tmp(relu_kept, mul(ec, S, f), labels_.expert_out);
        const uint32_t square = save_or_tmp(save && down_trains, mul(ec, S, f), labels_.expert_out);
        transient_if(relu_kept, relu);  // act_fn returns: relu's output goes unless kept, and so does the up output
        drop(up);
        const uint32_t down = save_or_tmp(routing_grad, mul(ec, S, d), labels_.expert_out);
        transient_if(save && down_trains, square);
        const uint32_t weighted = tmp(mul(w, S, d), labels_.expert_out, layer);
        const uint32_t unsorted = tmp(mul(w, S, d), labels_.expert_out, layer);
        drop(weighted);
        const uint32_t summed = sb != a ? tmp(mul(sb, T, d), labels_.expert_out, layer) : UINT32_MAX;
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);  // the sum, or its cast to x's dtype
        drop_if(summed);
        // The function returns: its locals go.
        drop(unsorted);
        transient_if(save && up_trains && a == ec, gathered);
        transient_if(routing_grad, down);
        transient_if(routing_grad, probs);
        transient_if(routing_grad || chain_grad, picked);
        transient_if(routing_grad || chain_grad, perm);
        break;
      }
      case OpKind::Linear:
      case OpKind::Conv1d:
      case OpKind::Conv2d: {
        uint32_t cast = UINT32_MAX;
        // HF ViTPatchEmbeddings casts fp32 pixels to the projection's dtype (pixel_values.to(expected_dtype)) where
        // autocast does not: a copy in the compute dtype, which the conv then reads.
        if (!dims_.amp && p.bytes[x] != dims_.e) cast = act(mul(dims_.e, b, s.tensors[x].numel()), program_label(st, layer, x, "cast"), layer);
        const bool conv = op.kind != OpKind::Linear;
        const int64_t width = op.kind == OpKind::Conv2d ? mul(s.tensors[x].shape[0], mul(op.kernel, op.kernel))
                              : conv                    ? mul(s.tensors[x].shape[0], op.kernel)
                                                        : s.tensors[x].shape.back();
        // A convolution's im2col view of its input: the cuDNN kernel saves the input itself; the element count is
        // what counts.
        const int64_t rows = conv ? ceil_div(mul(b, s.tensors[x].numel()), width) : rows_of(x);
        const bool low = cast != UINT32_MAX || p.bytes[x] < 4;
        std::vector<uint32_t>& lin = linear_saved_;  // (reused: a vector per linear was a heap allocation each)
        lin.clear();
        const bool self = !no_grad_ && linear_inputs(layer, {op.module.c_str()}, width, lin, rows, low);
        for (uint32_t t : lin) {
          if (no_grad_) transient.push_back(t);
          else saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i));
        }
        // Linear4bit casts an input of another dtype to the compute dtype first (x.to(compute_dtype)), and PEFT's
        // 4-bit LoRA layer clones the base output before adding the adapter's (tuners/lora/bnb.py: result.clone()).
        const bool qw = (stage_op_flags(st, layer)[i] & kOpQuantized) != 0;
        const uint32_t in_cast = qw && p.bytes[x] != dims_.e ? tmp(mul(dims_.e, b, s.tensors[x].numel()), labels_.dequant, layer) : UINT32_MAX;
        if (no_grad_ && ckpt_graph_ && qw && !program_recompute_ && p.req[x])
          checkpoint_graph_inputs(layer, {op.module.c_str()}, width, rows, id[p.root[x]]);
        const uint32_t deq = program_dequant(st, layer, i);
        // Autocast's 16-bit copy of an fp32 weight outside the blocks (a block's are autocast_casts'): the head's
        // output layer (the tied matrix too), the embeddings' convolutions. The matmul keeps it for its input's
        // gradient (loss.cpp counts lm_head's so).
        uint32_t weight_copy = UINT32_MAX;
        if (st != ProgramStage::Block && dims_.amp && recipe_.autocast_copy_bytes > 0 && !qw)
          for (const auto& t : program_params(st, layer))
            if (names_param(t.name, op.name, ".weight")) weight_copy = tmp(mul(recipe_.autocast_copy_bytes, t.numel), labels_.cast, layer);
        const uint32_t base_out = qw && !no_grad_ && module_info(op.module.c_str()).targeted ? tmp(bytes_of(o), labels_.attn_tmp, layer) : UINT32_MAX;
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (weight_copy != UINT32_MAX) {
          if (!no_grad_ && (p.req[x] || p.op_trains[i])) saved.attn.push_back(weight_copy), saved.ops.push_back(static_cast<uint32_t>(i));
          else transient.push_back(weight_copy);
        }
        drop_if(base_out);
        drop_if(deq);
        drop_if(in_cast);
        if (cast != UINT32_MAX) {
          if (self) saved.attn.push_back(cast), saved.ops.push_back(static_cast<uint32_t>(i));
          else drop(cast);
        } else if (self) {
          keep(oi, x);
        }
        break;
      }
      case OpKind::LayerNorm:
      case OpKind::GroupNorm: {
        // native_layer_norm and native_group_norm save their input and fp32 mean and rstd (derivatives.yaml): per row,
        // or per sample and group. Both are on autocast's fp32 list: under autocast a 16-bit input is first cast to
        // fp32, and that copy is what they read and save.
        const bool cast = dims_.amp && p.bytes[x] != 4;
        const bool save = req && !no_grad_;
        const int64_t copy = mul(4, b, s.tensors[x].numel());
        const uint32_t x32 = !cast ? UINT32_MAX : save ? act(copy, labels_.norm_x32, layer) : tmp(copy, labels_.norm_x32, layer);
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (req) {
          if (cast && save) saved.attn.push_back(x32), saved.ops.push_back(static_cast<uint32_t>(i));
          else if (!cast) keep(oi, x);
          save_new(oi, op.kind == OpKind::LayerNorm ? mul(8, rows_of(x)) : mul(8, b, op.groups), labels_.norm_rstd);
        }
        if (cast && !save) drop(x32);
        break;
      }
      case OpKind::Gelu:
      case OpKind::Silu:
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (req) keep(oi, x);
        break;
      case OpKind::RmsNorm: {
        // rstd per row, or per row and unit (a per-head norm)
        const int64_t norm_rows = mul(rows_of(x), op.unit > 0 ? s.tensors[x].shape.back() / op.unit : 1);
        // transformers' Qwen2RMSNorm / LlamaRMSNorm: x32 = x.to(float32) (x itself where it is fp32) and rstd [rows]
        // fp32, saved by pow and by x32 * rstd where x needs a gradient; the fp32 product, cast back to x's dtype (the
        // product itself for fp32 x), which weight * (...) saves where the weight trains; the output.
        // diffusers' RMSNorm: x.to(float32).pow(2) saves the fp32 copy, x * rstd saves x itself and rstd, and the fp32
        // product is cast to the weight's dtype only where that is 16-bit.
        const int64_t n = mul(b, s.tensors[x].numel());
        const bool fp32_in = p.bytes[x] == 4, grad_in = req && !no_grad_ && p.req[x], grad_w = req && !no_grad_ && p.op_trains[i];
        const bool cast_back = op.diffusers ? dims_.e_res < 4 : !fp32_in;  // the fp32 product cast to 16 bits
        const int64_t cast_bytes = op.diffusers ? dims_.e_res : p.bytes[x];
        auto make = [&](int64_t bytes, uint32_t label, bool saved_later) { return saved_later ? act(bytes, label, layer) : tmp(bytes, label, layer); };
        const uint32_t x32 = fp32_in ? UINT32_MAX : make(mul(4, n), labels_.norm_x32, grad_in);
        const uint32_t rstd = make(mul(4, norm_rows), labels_.norm_rstd, grad_in);
        const uint32_t prod = make(mul(4, n), labels_.norm_scaled, !cast_back && grad_w);
        const uint32_t cast = cast_back ? make(mul(cast_bytes, n), labels_.norm_scaled, grad_w) : UINT32_MAX;
        if (cast_back) drop(prod);
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        auto save = [&](uint32_t t) { saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i)); };
        if (grad_in) {
          if (op.diffusers || fp32_in) keep(oi, x);
          if (x32 != UINT32_MAX) save(x32);
          save(rstd);
        } else {
          if (x32 != UINT32_MAX) drop(x32);
          drop(rstd);
        }
        const uint32_t scaled = cast_back ? cast : prod;
        if (grad_w) save(scaled);
        else drop(scaled);
        break;
      }
      case OpKind::Relu:
      case OpKind::Tanh:  // the backwards read the result (derivatives.yaml: threshold_backward, tanh_backward,
      case OpKind::Sigmoid:  // sigmoid_backward)
        if (!op.inplace) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (req) keep(oi, o);  // in place: the result is the input's storage
        break;
      case OpKind::UpsampleNearest:  // upsample_nearest2d's backward needs only the sizes
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::MseLoss: {
        // prediction.float() and target.float(): fp32 copies of 16-bit tensors (fp32 ones are themselves), which
        // mse_loss saves for its backward (derivatives.yaml mse_loss: self, target).
        if (mse_copy_label_ == UINT32_MAX) mse_copy_label_ = program_.label("mse_loss fp32 copy (saved)");
        for (int32_t t : op.in) {
          if (p.bytes[t] == 4) {
            if (req) keep(oi, t);
          } else if (req) {
            save_new(oi, mul(4, b, s.tensors[t].numel()), mse_copy_label_);
          } else {
            transient.push_back(tmp(mul(4, b, s.tensors[t].numel()), mse_copy_label_, layer));
          }
        }
        id[o] = act(4, program_label(st, layer, o, "out"), layer);  // the loss
        break;
      }
      case OpKind::BatchNorm2d:
        // cudnn_batch_norm / native_batch_norm save the input and the batch's mean and inverse deviation, fp32 [C]
        // each; the weight is the module's.
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (req) {
          keep(oi, x);
          save_new(oi, mul(8, s.tensors[x].shape[0]), labels_.norm_rstd);
        }
        break;
      case OpKind::MaxPool2d:  // max_pool2d_with_indices: the input and the int64 index of each output
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (req) {
          keep(oi, x);
          if (pool_indices_label_ == UINT32_MAX) pool_indices_label_ = program_.label("max_pool indices (saved)");
          save_new(oi, mul(8, b, s.tensors[o].numel()), pool_indices_label_);
        }
        break;
      case OpKind::GlobalAvgPool:  // the mean's backward needs only the shape
      case OpKind::Scale:          // a scalar's product: its backward needs only the scalar
      case OpKind::SpaceToDepth:   // cat of strided views: its backward needs only the sizes
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::Copy:
        if (copies(op)) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::PadToWindows:  // pad's backward needs only the sizes
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::Unpad:
        if (p.root[o] == o) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::WindowAttention: {
        // Per window of w rows: scores = q k^T (the compute dtype), + the bias (fp32 under autocast: the table is an
        // fp32 weight, so the sum is promoted), + the shift mask (in that dtype), softmax (autocast's fp32 list; its
        // output saved), cast back to the compute dtype for attn @ v under autocast (saved by the matmul).
        // q.matmul(k.transpose(-2, -1)) and attn.matmul(v) fold the batch and head dims with reshape, which copies
        // an operand sliced out of the fused qkv output (its dims do not merge: aten/src/ATen/native/LinearAlgebra.cpp
        // _matmul_impl, tensor.expand(...).reshape(...)), and bmm saves the copy; an operand of its own (q * scale)
        // is saved as it is. So backward reads copies of k and v, not the qkv output (a saved-set check on torch
        // 1.13's autograd graph: tools/calibrate/check_programs_torch.py).
        const int32_t q = op.in[0], k = op.in[1], v = op.in[2];
        const bool grad = req && !no_grad_;
        auto operand = [&](int32_t t) {  // the copy bmm reads, or UINT32_MAX where it reads t itself
          const int32_t from = s.tensors[static_cast<size_t>(t)].producer;
          if (from < 0 || s.ops[static_cast<size_t>(from)].kind != OpKind::Slice) {
            if (req) keep(oi, t);
            return UINT32_MAX;
          }
          return grad ? act(bytes_of(t), labels_.attn_tmp, layer) : tmp(bytes_of(t), labels_.attn_tmp, layer);
        };
        std::array<uint32_t, 3> copies{operand(q), operand(k), UINT32_MAX};
        const int64_t s2 = mul(op.heads, b, mul(s.tensors[q].shape[0], op.window));
        const int64_t biased = dims_.amp ? 4 : dims_.e;
        uint32_t cur = tmp(mul(dims_.e, s2), labels_.scores, layer);
        const uint32_t with_bias = tmp(mul(biased, s2), labels_.scores, layer);
        drop(cur), cur = with_bias;
        if (op.masked) {
          const uint32_t with_mask = tmp(mul(biased, s2), labels_.scores, layer);
          drop(cur), cur = with_mask;
        }
        const uint32_t probs = grad ? act(mul(biased, s2), labels_.probs, layer) : tmp(mul(biased, s2), labels_.probs, layer);
        drop(cur);
        uint32_t probs_cast = UINT32_MAX;
        if (dims_.amp) probs_cast = grad ? act(mul(dims_.e, s2), labels_.probs, layer) : tmp(mul(dims_.e, s2), labels_.probs, layer);
        copies[2] = operand(v);
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        for (uint32_t t : {probs, probs_cast, copies[0], copies[1], copies[2]}) {
          if (t == UINT32_MAX) continue;
          if (grad) saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i));
          else drop(t);
        }
        break;
      }
      case OpKind::Dropout:
        if (op.p_at(layer) > 0) {
          std::vector<uint32_t> mask;
          id[o] = dropout(UINT32_MAX, mul(b, s.tensors[o].numel()), p.bytes[o], true, program_label(st, layer, o, "out"), layer, mask, false);
          for (uint32_t t : mask) {
            if (no_grad_ || !req) transient.push_back(t);
            else saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i));
          }
        }
        break;
      case OpKind::Attention: {
        const int32_t q = op.in[0], k = op.in[1];
        const int64_t rows = s.tensors[q].shape[0], kv_rows = s.tensors[k].shape[0];
        id[o] = UINT32_MAX;
        // Under autocast the kernel reads compute-dtype copies of wider inputs (fp32 q, k, v after a bitsandbytes
        // linear), and saves those.
        // Grouped-query attention where the resolved kernel takes k and v repeated for every query head
        // (program_repeats_kv): repeat_kv's copies, which the kernel reads and saves in their place.
        const int64_t groups = program_repeats_kv(op) ? op.heads / op.kv_heads : 1;
        uint32_t in_copy[3] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
        for (int j = 0; j < 3; ++j) {
          const int32_t t = op.in[static_cast<size_t>(j)];
          const int64_t copies = j > 0 ? groups : 1;
          const bool cast = dims_.amp && p.bytes[t] > dims_.e;
          uint32_t repeated = UINT32_MAX;
          if (copies > 1) {
            const int64_t bytes = mul(p.bytes[t], b, s.tensors[t].numel(), copies);
            repeated = req && !no_grad_ && !cast ? act(bytes, labels_.attn_tmp, layer) : tmp(bytes, labels_.attn_tmp, layer);
          }
          if (cast) {
            const int64_t bytes = mul(dims_.e, b, s.tensors[t].numel(), copies);
            in_copy[j] = req && !no_grad_ ? act(bytes, labels_.attn_tmp, layer) : tmp(bytes, labels_.attn_tmp, layer);
            if (repeated != UINT32_MAX) drop(repeated);  // the kernel reads the cast copy
          } else {
            in_copy[j] = repeated;
          }
        }
        // diffusers' .to(query.dtype) of the kernel's output: where that is another dtype, the kernel's own output is
        // a tensor apart (saved by its backward) and the op's output its cast copy.
        const bool cast_copy = op.cast_out && p.bytes[o] != dims_.e;
        // A packed op (Qwen2-VL's tower, VisionAttention) before transformers 4.54: the micro-batch's n rows as one
        // sequence, with a block-diagonal [1, n, n] mask built in this block (Resolved::packed_attention and
        // packed_mask, frameworks.cpp; docs/research/qwen2-vl.md section 2). From 4.54 it calls the kernel once per
        // sample (per unit: Qwen2.5-VL's windows), one after another.
        const PackedAttention packing = op.packed ? resolved_.packed_attention : PackedAttention::PerSample;
        const int64_t n = mul(b, rows);
        std::vector<uint32_t> masks;
        if (op.packed && resolved_.packed_mask != PackedMask::None)  // torch.zeros(..., bool), or torch.full in q's dtype
          masks.push_back(tmp(mul(resolved_.packed_mask == PackedMask::Bool ? 1 : dims_.e, mul(n, n)), labels_.attn_tmp, layer));
        const bool math = packing == PackedAttention::SdpaMathMask || resolved_.attention == Attention::SdpaMath;
        if (packing == PackedAttention::SdpaMathMask && resolved_.packed_mask == PackedMask::Bool)
          masks.push_back(tmp(mul(dims_.e, mul(n, n)), labels_.attn_tmp, layer));  // the math path's float bias
        const bool scores_over_all = packing == PackedAttention::EagerMask || packing == PackedAttention::SdpaMathMask;
        if (resolved_.attention == Attention::Eager || math) {
          // q k^T, scaled, softmax, dropout, @ v; the probs that attn @ v reads are saved (attention_probs), with q,
          // k and v for the two matmuls. Generic eager attention: under autocast softmax converts to fp32 and writes
          // fp32. The packed op is Qwen2-VL's, whose eager softmax is explicitly fp32 (dtype=torch.float32) and cast
          // back (.to(q.dtype)) with or without autocast. SDPA's math path keeps the compute dtype.
          // Scores over all n rows at once (packed, before 4.54), else per sample or per unit; a packed op's calls
          // from 4.54 run one after another, so what they do not keep is one call's at a time.
          const int64_t unit = op.unit > 0 ? std::min(op.unit, rows) : rows;
          int64_t s2 = scores_over_all ? mul(op.heads, mul(n, n)) : mul(op.heads, b, mul(rows / unit, mul(unit, unit)));
          if (op.packed && !scores_over_all && (no_grad_ || !req)) s2 = mul(op.heads, mul(unit, unit));
          if (kv_rows != rows) s2 = mul(op.heads, b, mul(rows, kv_rows));  // cross-attention (neither packed nor in units)
          const uint32_t scores = tmp(mul(dims_.e, s2), labels_.scores, layer);
          const uint32_t scaled = tmp(mul(dims_.e, s2), labels_.scores, layer);
          drop(scores);
          for (uint32_t t : masks) drop(t);  // added to the scores: the add's backward needs neither
          masks.clear();
          std::vector<uint32_t> probs;
          const bool fp32_softmax = op.packed && !math;
          const SoftmaxFlow flow = math           ? SoftmaxFlow{dims_.e, false, dims_.e, true, op.p_at(layer) > 0}
                                   : fp32_softmax ? SoftmaxFlow{dims_.e, dims_.e != 4, 4, false, op.p_at(layer) > 0}
                                                  : SoftmaxFlow{dims_.e, dims_.amp, dims_.amp ? 4 : dims_.e, true, op.p_at(layer) > 0};
          attention_probs(layer, s2, flow, !no_grad_ && req, probs, scaled);
          const uint32_t ctx = tmp(bytes_of(o), labels_.attn_tmp, layer);
          id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);  // permute(...).contiguous()
          drop(ctx);
          for (uint32_t t : probs) {
            if (no_grad_ || !req) drop(t);
            else saved.attn.push_back(t), saved.ops.push_back(static_cast<uint32_t>(i));
          }
        } else {
          // SDPA 4.51-4.53 over the packed mask: a bool mask made an additive bias in q's dtype
          // (convert_boolean_attn_mask; from 4.53 the mask is that float already), copied with its keys padded to a
          // multiple of 8 where they are not (PyTorch's memory-efficient path pads the unexpanded bias:
          // aten/src/ATen/native/transformers/attention.cpp preprocess_mask, mem_eff_alignment = 8, pad_bias), which
          // the kernel reads and its backward keeps. flash_attention_2 at 4.53.0 builds a mask it never reads.
          uint32_t bias = UINT32_MAX;
          if (packing == PackedAttention::SdpaEfficientMask) {
            if (resolved_.packed_mask == PackedMask::Bool) bias = tmp(mul(dims_.e, mul(n, n)), labels_.attn_tmp, layer);
            else bias = masks.back(), masks.pop_back();
            if (n % 8 != 0) {
              const uint32_t padded = tmp(mul(dims_.e, mul(n, round_up(n, 8))), labels_.attn_tmp, layer);
              drop(bias);
              bias = padded;
            }
          }
          for (uint32_t t : masks) drop(t);
          masks.clear();
          const uint32_t kernel_out = cast_copy ? (req && !no_grad_ ? act(mul(dims_.e, b, s.tensors[o].numel()), labels_.attn_tmp, layer)
                                                                  : tmp(mul(dims_.e, b, s.tensors[o].numel()), labels_.attn_tmp, layer))
                                                : UINT32_MAX;
          id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
          if (kernel_out != UINT32_MAX) {
            if (req && !no_grad_) saved.attn.push_back(kernel_out), saved.ops.push_back(static_cast<uint32_t>(i));
            else drop(kernel_out);
          }
          if (req) {
            if (kernel_out == UINT32_MAX) keep(oi, o);
            const int64_t rows_lse = dims_.e == 4 ? round_up(rows, 32) : rows;  // the efficient kernel pads to 32
            save_new(oi, mul(4, op.heads, b, rows_lse), labels_.lse);
            // SDPA in fp32 cannot use flash; with native GQA (enable_gqa) the efficient kernel refuses and SDPA falls
            // back to the math kernel, which saves the fp32 softmax, as the built-in layers model it (HF PR #46960).
            if (dims_.e == 4 && resolved_.attention == Attention::Sdpa && op.kv_heads > 0 && op.kv_heads < op.heads && groups == 1)
              save_new(oi, mul(4, op.heads, b, mul(rows, kv_rows)), labels_.softmax);
          }
          if (bias != UINT32_MAX) {
            if (req && !no_grad_) saved.attn.push_back(bias), saved.ops.push_back(static_cast<uint32_t>(i));
            else drop(bias);
          }
        }
        for (int j = 0; j < 3; ++j) {
          const uint32_t c = in_copy[j];
          if (c == UINT32_MAX) {
            if (req) keep(oi, op.in[static_cast<size_t>(j)]);
          } else if (req && !no_grad_) {
            saved.attn.push_back(c), saved.ops.push_back(static_cast<uint32_t>(i));
          } else {
            drop(c);
          }
        }
        break;
      }
      case OpKind::Rotary: {
        if (op.hf_rotary) {
          // apply_rotary_pos_emb on each head's first rotary_dims (q_rot, a view): rotate_half's cat(-x2, x1) (the
          // negation a temporary of its own), the two products in cos's dtype, their sum; where the rotation covers
          // part of each head, cat(q_embed, q_pass) is the output. cos and sin are shared; nothing of x's size is saved.
          const int64_t pb = p.bytes[o];
          const int64_t d = s.tensors[x].shape[1] / op.heads, rd = op.size > 0 ? op.size : d;
          const int64_t rot = mul(b, s.tensors[x].numel() / d, rd);
          const uint32_t neg = tmp(mul(p.bytes[x], rot / 2), labels_.attn_tmp, layer);
          const uint32_t half = tmp(mul(p.bytes[x], rot), labels_.attn_tmp, layer);
          drop(neg);
          const uint32_t by_cos = tmp(mul(pb, rot), labels_.attn_tmp, layer);
          const uint32_t by_sin = tmp(mul(pb, rot), labels_.attn_tmp, layer);
          drop(half);
          if (rd == d) {
            id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
            drop(by_cos), drop(by_sin);
          } else {
            const uint32_t sum = tmp(mul(pb, rot), labels_.attn_tmp, layer);
            drop(by_cos), drop(by_sin);
            id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
            drop(sum);
          }
          break;
        }
        // apply_rotary_emb: x.float() * cos, then x_rotated.float() * sin, both fp32 products alive as their sum is
        // made, then the sum cast to x's dtype (the output); the products save the shared cos and sin tables only.
        const int64_t n32 = mul(4, b, s.tensors[x].numel());
        const uint32_t products = tmp(mul(2, n32), labels_.attn_tmp, layer);
        const uint32_t sum = tmp(n32, labels_.attn_tmp, layer);
        drop(products);
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        drop(sum);
        break;
      }
      case OpKind::Concat:
      case OpKind::Add:
      case OpKind::MeanTokens:  // mean's backward needs only the shape
        if (!op.inplace) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);  // a += b writes a
        break;
      case OpKind::ResizeTokens:  // interpolate's backward needs only the sizes
        if (p.root[o] == o) id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        break;
      case OpKind::LayerScale:  // lambda1's gradient reads the input; the input's reads lambda1, a weight
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (p.op_trains[i]) keep(oi, x);
        break;
      case OpKind::Mul: {  // a's gradient reads b and b's reads a (a parameter b: the module holds it)
        const int32_t y = op.in[1];
        id[o] = act(bytes_of(o), program_label(st, layer, o, "out"), layer);
        if (s.tensors[y].is_parameter) {
          if (p.op_trains[i]) keep(oi, x);
        } else {
          if (p.req[y]) keep(oi, x);
          if (p.req[x]) keep(oi, y);
        }
        break;
      }
      case OpKind::CrossEntropy: {
        // log_softmax over the classes (fp32 under autocast: a converted copy first), saved for nll's backward.
        const int64_t classes = mul(b, s.tensors[x].numel());
        const uint32_t conv = dims_.amp && p.bytes[x] != 4 ? tmp(mul(4, classes), labels_.logits_fp32, layer) : UINT32_MAX;
        save_new(oi, mul(dims_.amp ? 4 : p.bytes[x], classes), labels_.lse_loss);
        if (conv != UINT32_MAX) drop(conv);
        id[o] = act(4, program_label(st, layer, o, "out"), layer);  // the loss
        break;
      }
    }
    for (uint32_t t : transient) drop(t);
    transient.clear();
    // Inputs whose last reader this was go (views: when the root's last reader has run).
    for (int32_t t : op.in)
      if (last[p.root[t]] == oi) release(t);
  }
  // The carries it makes pass to their state, which frees them once nothing needs them; recomputed, they go now
  // unless an op of the block saved them.
  for (const auto& [t, c] : s.exports) {
    const int32_t r = p.root[t];
    if (program_recompute_) {
      if (keeps[r] == 0 && id[r] != UINT32_MAX && r != p.root[s.output]) drop(id[r]), id[r] = UINT32_MAX;
      continue;
    }
    CarryState& cs = carry_[static_cast<size_t>(c)];
    cs.id = id[r], cs.req = p.req[t], cs.bytes = p.bytes[t], cs.read = false;
  }
  // The head's loss is a scalar the loop keeps until backward; nothing else of a stage outlives it but the output.
  const int32_t out = s.output >= 0 ? s.output : s.ops.back().out;
  output_carry_ = carried[p.root[out]];
  // Saved by an op of this stage, or a view of a tensor someone else owns (the previous stage, which saved it): either
  // way the next stage reads it but does not free it.
  output_kept_ = keeps[p.root[out]] > 0 || (!owned[p.root[out]] && carried[p.root[out]] < 0);
  return id[p.root[out]];
}

// After a checkpointed block's recompute (program_forward with program_recompute_): whether its output is the
// caller's to drop. Not where it is a view of the block's input (nothing of its own was made), nor where an op of
// the block saved it (an in-place ReLU's result), which that op's backward frees.
bool StepBuilder::recomputed_output_owned(uint32_t out, uint32_t in) const { return out != in && !output_kept_; }

void StepBuilder::hold_carry(int32_t c, SavedLayer& saved) {
  if (std::find(saved.holds.begin(), saved.holds.end(), c) != saved.holds.end()) return;
  saved.holds.push_back(c);
  ++carry_[static_cast<size_t>(c)].holds;
}

void StepBuilder::release_carry_holds(SavedLayer& saved) {
  for (int32_t c : saved.holds) {
    --carry_[static_cast<size_t>(c)].holds;
    settle_carry(c);
  }
  saved.holds.clear();
}

void StepBuilder::settle_carry(int32_t c) {
  CarryState& cs = carry_[static_cast<size_t>(c)];
  if (cs.id != UINT32_MAX && cs.holds == 0 && cs.read) drop(cs.id), cs.id = UINT32_MAX;
}

// One stage's backward: `dout` is the gradient of the stage output (the head: none, its loss seeds it). Returns the
// gradient of the stage input, or UINT32_MAX where it needs none.
uint32_t StepBuilder::program_backward(ProgramStage st, int32_t layer, uint32_t dout, bool in_req, int64_t in_bytes,
                                       SavedLayer& saved, int32_t input_carry) {
  const ArchStage& s = program_stage(st, layer);
  const StageScratch::Frame frame(stage_scratch_);
  plan_program(frame.buffers.plan, st, layer, in_req, in_bytes);
  const ProgramPlan& p = frame.buffers.plan;
  const size_t n = s.tensors.size();
  const int64_t b = dims_.b;
  auto bytes_of = [&](int32_t t) { return mul(p.bytes[t], b, s.tensors[static_cast<size_t>(t)].numel()); };
  std::vector<uint32_t>& grad = frame.buffers.id;  // per tensor (a view's gradient is a tensor of its own)
  grad.assign(n, UINT32_MAX);
  if (s.output >= 0) grad[s.output] = dout;
  // A carry's gradient, summed over the later stages that read it, joins what this stage's own ops give it.
  for (const auto& [t, c] : s.exports) {
    CarryState& cs = carry_[static_cast<size_t>(c)];
    if (cs.grad == UINT32_MAX) continue;
    if (grad[t] == UINT32_MAX) grad[t] = cs.grad;
    else drop(cs.grad);
    cs.grad = UINT32_MAX;
  }
  // A gradient for input t of an op: new, or added into the one that exists (InputBuffer::add accumulates in place).
  auto give = [&](int32_t t, uint32_t g) {
    const int32_t c = s.tensors[t].producer >= 0 ? -1 : t == s.input ? input_carry : s.tensors[t].carry;
    if (c >= 0) {  // a carry's: held for its producer's backward
      CarryState& cs = carry_[static_cast<size_t>(c)];
      if (!p.req[t] || cs.grad != UINT32_MAX) return drop(g);
      cs.grad = g;
      return;
    }
    if (!p.req[t] || s.tensors[t].is_parameter || (s.tensors[t].producer < 0 && t != s.input)) return drop(g);
    if (grad[t] == UINT32_MAX) grad[t] = g;
    else drop(g);
  };
  for (size_t i = s.ops.size(); i-- > 0;) {
    const ArchOp& op = s.ops[i];
    const int32_t o = op.out;
    if (op.kind == OpKind::CrossEntropy || op.kind == OpKind::MseLoss) grad[o] = tmp(4, program_label(st, layer, o, "grad"), layer);
    const uint32_t g = grad[o];
    grad[o] = UINT32_MAX;
    // The head's parameter gradients appear with the first of its ops that makes one (lm_head's matmul backward),
    // after the loss's nodes, as the built-in heads' do (loss.cpp late_head_grad, from the H200 traces).
    if (head_grads_pending_ >= 0 && p.op_trains[i] && g != UINT32_MAX) alloc_layer_grads(head_grads_pending_), head_grads_pending_ = -1;
    // A view, or dropout with p = 0 (an in-place op's backward makes new gradients, as its out-of-place form does).
    const bool alias = p.root[o] != o && !op.inplace;
    if (g != UINT32_MAX && alias) {
      // A view's gradient is the gradient of its base (flatten, transpose, identity dropout), except select's and a
      // slice's, whose backward scatters it into zeros of the base's shape (select_backward, slice_backward).
      if (op.kind == OpKind::SelectToken || op.kind == OpKind::Slice)
        give(op.in[0], tmp(bytes_of(op.in[0]), program_label(st, layer, op.in[0], "grad"), layer)), drop(g);
      else give(op.in[0], g);
    } else if (g != UINT32_MAX && op.kind != OpKind::Parameter) {
      // Scratch of the op's own backward, alive beside its input gradients.
      std::vector<uint32_t> scratch;
      if (op.kind == OpKind::Attention) {
        const int64_t rows = s.tensors[op.in[0]].shape[0];
        const PackedAttention packing = op.packed ? resolved_.packed_attention : PackedAttention::PerSample;
        const bool over_all = packing == PackedAttention::EagerMask || packing == PackedAttention::SdpaMathMask;
        const bool math = packing == PackedAttention::SdpaMathMask || resolved_.attention == Attention::SdpaMath;
        if (resolved_.attention == Attention::Eager || math) {
          const int64_t n = mul(b, rows);  // packed: the scores span the micro-batch's rows
          const int64_t unit = op.unit > 0 ? std::min(op.unit, rows) : rows;
          int64_t s2 = over_all ? mul(op.heads, mul(n, n)) : mul(op.heads, b, mul(rows / unit, mul(unit, unit)));
          if (op.packed && !over_all) s2 = mul(op.heads, mul(unit, unit));  // one call's backward at a time (4.54 on)
          const int64_t kv_rows = s.tensors[op.in[1]].shape[0];
          if (kv_rows != rows) s2 = mul(op.heads, b, mul(rows, kv_rows));  // cross-attention
          // The softmax's gradient in the dtype it wrote: fp32 for the packed op's eager softmax and under autocast.
          const int64_t e = math ? dims_.e : (op.packed || dims_.amp) ? 4 : dims_.e;
          scratch.push_back(tmp(mul(e, s2), labels_.bwd_attn, layer));  // grad of the probs
          scratch.push_back(tmp(mul(e, s2), labels_.bwd_attn, layer));  // grad of the scores
        } else {
          scratch.push_back(tmp(mul(4, b, s.tensors[op.in[0]].numel()), labels_.bwd_attn, layer));  // flash's fp32 dq accumulator
        }
        // Grouped-query attention: the gradients of k and v for every query head, summed into the kv heads' after the
        // kernel (repeat_kv's backward; without the repeat, flash_api.cpp mha_bwd's dk_expanded and dv_expanded).
        // Where wider k or v were repeated and then cast for the kernel, the cast's backward writes the repeated
        // gradient in their dtype too, before repeat_kv's backward sums it.
        if (op.kv_heads > 0 && op.kv_heads < op.heads)
          for (int j = 1; j < 3; ++j) {
            const int32_t t = op.in[static_cast<size_t>(j)];
            const int64_t copies = mul(b, s.tensors[t].numel(), op.heads / op.kv_heads);
            scratch.push_back(tmp(mul(dims_.e, copies), labels_.bwd_attn, layer));
            if (program_repeats_kv(op) && dims_.amp && p.bytes[t] > dims_.e) scratch.push_back(tmp(mul(p.bytes[t], copies), labels_.bwd_attn, layer));
          }
      }
      // cross_entropy is log_softmax then nll_loss: nll_loss's backward writes a gradient of the log-probabilities'
      // full size, alive while log_softmax's backward writes its own (the input's gradient), as the built-in losses
      // model it from the H200 traces (loss.cpp, LossImpl::HfFp32Upcast). Under autocast a 16-bit input's log_softmax
      // ran in fp32: its fp32 gradient then lives beside the cast back to the input's dtype, nll_loss's gone.
      if (op.kind == OpKind::CrossEntropy) {
        const int64_t classes = mul(b, s.tensors[op.in[0]].numel());
        const bool upcast = dims_.amp && p.bytes[op.in[0]] != 4;
        const uint32_t nll = tmp(mul(upcast ? 4 : p.bytes[op.in[0]], classes), labels_.loss_grad, layer);
        if (upcast) {
          scratch.push_back(tmp(mul(4, classes), labels_.loss_grad, layer));
          drop(nll);
        } else {
          scratch.push_back(nll);
        }
      }
      if (op.kind == OpKind::WindowAttention) {
        // attn @ v's gradient of the probabilities (compute dtype), the softmax's of the scores (fp32 under
        // autocast, with the cast's fp32 copy of the former), alive together before q k^T's backward.
        const int64_t s2 = mul(op.heads, b, mul(s.tensors[op.in[0]].shape[0], op.window));
        scratch.push_back(tmp(mul(dims_.e, s2), labels_.bwd_attn, layer));
        if (dims_.amp) scratch.push_back(tmp(mul(4, s2), labels_.bwd_attn, layer));
        scratch.push_back(tmp(mul(dims_.amp ? 4 : dims_.e, s2), labels_.bwd_attn, layer));
      }
      // mse_loss's backward writes the fp32 copy's gradient, which .float()'s backward casts to the prediction's dtype.
      if (op.kind == OpKind::MseLoss && p.bytes[op.in[0]] != 4) scratch.push_back(tmp(mul(4, b, s.tensors[op.in[0]].numel()), labels_.bwd_mlp, layer));
      // bitsandbytes' matmul dequantizes the frozen weight again for the input's gradient.
      if (op.kind == OpKind::Linear && p.req[op.in[0]]) {
        const uint32_t deq = program_dequant(st, layer, i);
        if (deq != UINT32_MAX) scratch.push_back(deq);
      }
      // A tied embedding's dense gradient (embedding_dense_backward: [rows, width]), added into the gradient the
      // head's backward made, as the built-in families' (tied_embedding_grad, from two recorded H200 traces). An
      // untied embedding's dense gradient becomes its .grad (alloc_layer_grads counts it).
      if (op.kind == OpKind::Embedding && op.tied && p.op_trains[i]) tied_embedding_grad(mul(recipe_.grad_bytes, op.size, op.out_features));
      // MambaSplitConv1dScanCombinedFn.backward (docs/research/mamba2.md 1.2): the norm's output and the conv's
      // output recomputed, dxBC, dout @ W_out and the norm's dx; the scan's recomputed dt and dA_cumsum, CB and fp32
      // chunk states, their fp32 gradient and the state passing's two copies; dB and dC (fp32, per split of the
      // heads) and dCB. dzxbcdt is the input's gradient (below).
      if (op.kind == OpKind::SsdMixer) {
        const int32_t x = op.in[0];
        const int64_t T = mul(b, s.tensors[x].numel() / s.tensors[x].shape.back()), a = p.bytes[x];
        const int64_t di = mul(op.heads, op.head_dim), cd = add(di, mul(2, op.groups, op.state));
        const int64_t chunks = ceil_div(s.tensors[x].shape[0], op.chunk), bc = mul(b, chunks);
        const int64_t splits = ssd_splits(bc, op.heads, op.groups);
        for (int64_t bytes : {mul(a, T, di), mul(a, T, cd), mul(a, T, cd), mul(a, T, di), mul(a, T, di),
                              mul(8, bc, op.heads, op.chunk), mul(4, bc, op.groups, mul(op.chunk, op.chunk)),
                              mul(4, bc, di, op.state), mul(4, bc, di, op.state), mul(2 * a, bc, di, op.state),
                              mul(8, splits, op.groups, mul(T, op.state)), mul(4, splits, op.groups, mul(bc, op.chunk, op.chunk))})
          scratch.push_back(tmp(bytes, labels_.bwd_attn, layer));
        // out_proj's weight gradient comes out of its matmul in the compute dtype, cast to the fp32 .grad under autocast.
        if (dims_.amp && p.op_trains[i])
          for (const auto& t : program_params(st, layer))
            if (names_param(t.name, op.name, ".out_proj.weight") && has_grad(t)) scratch.push_back(tmp(mul(dims_.e, t.numel), labels_.bwd_mlp, layer));
      }
      // The MoE's routed part backward (its forward above; docs/research/nemotron3-moe.md section 3.4), each
      // gradient going once the next is made: the cast back's and the sum's (an expand, a view, whose view(T, k, d)
      // backward reshapes it: a copy [S, d], cast to the weighted outputs' dtype where the sum ran in fp32), the
      // unsorting index's (zeros [S, d], index_put); the product's: the down output's gradient (g x weights, cast to
      // the experts' dtype) and the routing weights' (g x down, summed over d), alive with the incoming one; the down
      // GEMM's input gradient, the square's (2 x relu, then times g), relu's, the up GEMM's input gradient and its
      // cast back to x's dtype; the gather's backward (index_put into zeros) is the input's gradient, beside the
      // router's: the sigmoid's and the matmul's, then the .float() cast back. The experts' weight gradients, where
      // they train, are the layer's (alloc_layer_grads).
      if (op.kind == OpKind::Moe) {
        const int32_t x = op.in[0];
        const int64_t d = s.tensors[x].shape.back(), T = mul(b, s.tensors[x].numel() / d), a = p.bytes[x];
        const int64_t rd = dims_.amp ? dims_.e : 4, ec = recipe_.weight_bytes, w = std::max(ec, rd), sb = dims_.amp ? 4 : w;
        const int64_t S = mul(op.top_k, T), f = op.expert_width;
        auto next = [&](uint32_t& chain, int64_t bytes) {  // the next gradient, then the one it was made from goes
          const uint32_t t = tmp(bytes, labels_.bwd_mlp, layer);
          drop_if(chain);
          chain = t;
        };
        uint32_t chain = sb != a ? tmp(mul(sb, T, d), labels_.bwd_mlp, layer) : UINT32_MAX;
        next(chain, mul(sb, S, d));                  // the reshaped expand
        if (sb != w) next(chain, mul(w, S, d));      // sum(dtype=fp32)'s backward casts to its input's dtype
        next(chain, mul(w, S, d));                   // the unsort's scatter
        const uint32_t g_down = tmp(mul(w, S, d), labels_.bwd_mlp, layer);
        const uint32_t g_weights = tmp(mul(w, S, d), labels_.bwd_mlp, layer);
        const uint32_t g_down_cast = w != ec ? tmp(mul(ec, S, d), labels_.bwd_mlp, layer) : UINT32_MAX;
        drop(g_weights);
        drop(chain);
        chain = g_down;
        if (g_down_cast != UINT32_MAX) drop(g_down), chain = g_down_cast;
        next(chain, mul(ec, S, f));                  // the down GEMM's input gradient
        const uint32_t twice = tmp(mul(ec, S, f), labels_.bwd_mlp, layer);  // square's backward: 2 x relu, times g
        next(chain, mul(ec, S, f));
        drop(twice);
        next(chain, mul(ec, S, f));                  // relu's input gradient
        next(chain, mul(ec, S, d));                  // the up GEMM's input gradient
        if (a != ec) next(chain, mul(a, S, d));      // the cast to the weights' dtype, back
        scratch.push_back(chain);                    // read by the gather's backward, x's gradient (below)
        scratch.push_back(tmp(mul(rd, T, op.experts), labels_.bwd_mlp, layer));  // the sigmoid's
        scratch.push_back(tmp(mul(rd, T, d), labels_.bwd_mlp, layer));            // the router's input gradient
        if (rd != a) scratch.push_back(tmp(mul(a, T, d), labels_.bwd_mlp, layer));  // .float()'s backward
      }
      // apply_rotary_emb's backward: the fp32 gradient of the cast and of each product (grad * cos, grad * sin).
      // apply_rotary_pos_emb's backward: the gradient through each product (grad * cos, grad * sin) in cos's dtype,
      // and rotate_half's (a cat's slices, negated) over the rotated part.
      if (op.kind == OpKind::Rotary && op.hf_rotary) {
        const int64_t d = s.tensors[op.in[0]].shape[1] / op.heads, rd = op.size > 0 ? op.size : d;
        const int64_t rot = mul(b, s.tensors[op.in[0]].numel() / d, rd);
        scratch.push_back(tmp(mul(2 * p.bytes[o] + p.bytes[op.in[0]], rot), labels_.bwd_attn, layer));
      } else if (op.kind == OpKind::Rotary) {
        scratch.push_back(tmp(mul(12, b, s.tensors[op.in[0]].numel()), labels_.bwd_attn, layer));
      }
      // A row broadcast over token rows (a modulation's gate or scale): its gradient is the full product, summed
      // over the rows (mul's backward, then sum_to_size).
      if (op.kind == OpKind::Mul && !s.tensors[op.in[1]].is_parameter && p.req[op.in[1]] &&
          s.tensors[op.in[1]].shape != s.tensors[op.in[0]].shape)
        scratch.push_back(tmp(bytes_of(o), labels_.bwd_mlp, layer));
      // drop_path's backward: the product's gradient, then the division's (x's gradient, below).
      if (op.kind == OpKind::DropPath && !op.noise_scaled) scratch.push_back(tmp(bytes_of(o), labels_.bwd_mlp, layer));
      // An eager RMSNorm's backward: about three fp32 temporaries of its input's size (pow, mean and mul backward,
      // as the built-in layers' norm_backward counts them).
      if (op.kind == OpKind::RmsNorm) scratch.push_back(tmp(mul(12, b, s.tensors[op.in[0]].numel()), labels_.bwd_norm, layer));
      // Under autocast a trained weight's gradient comes out of the matmul in the compute dtype and is cast to the
      // fp32 .grad (the cast's backward): a transient of the weight's size.
      if (dims_.amp && p.op_trains[i] && (op.kind == OpKind::Linear || op.kind == OpKind::Conv1d || op.kind == OpKind::Conv2d))
        for (const auto& t : program_params(st, layer))
          if (names_param(t.name, op.name, ".weight") && has_grad(t)) scratch.push_back(tmp(mul(dims_.e, t.numel), labels_.bwd_mlp, layer));
      for (int32_t t : op.in)
        if (p.req[t] && !s.tensors[t].is_parameter) give(t, tmp(bytes_of(t), program_label(st, layer, t, "grad"), layer));
      for (uint32_t t : scratch) drop(t);
      drop(g);
    } else if (g != UINT32_MAX) {
      drop(g);
    }
    // What the op saved goes with its backward (a tensor saved by several ops, with the first of them).
    for (size_t k = saved.attn.size(); k-- > 0;) {
      if (saved.ops[k] != i) continue;
      const uint32_t t = saved.attn[k];
      saved.attn.erase(saved.attn.begin() + static_cast<std::ptrdiff_t>(k));
      saved.ops.erase(saved.ops.begin() + static_cast<std::ptrdiff_t>(k));
      if (!contains(saved.attn, t)) drop(t);
    }
  }
  // Gradients nothing consumed (none in a well-formed program) go with the stage.
  for (size_t t = 0; t < n; ++t)
    if (grad[t] != UINT32_MAX && static_cast<int32_t>(t) != s.input) drop(grad[t]), grad[t] = UINT32_MAX;
  std::sort(saved.attn.begin(), saved.attn.end());
  saved.attn.erase(std::unique(saved.attn.begin(), saved.attn.end()), saved.attn.end());
  for (uint32_t t : saved.attn) drop(t);
  saved.attn.clear(), saved.ops.clear();
  release_carry_holds(saved);
  return s.input >= 0 ? grad[s.input] : UINT32_MAX;
}

// A frozen module's forward (FrozenModule::forward: the VAE encoding the batch's images), each micro-batch before
// the model's: its program under no_grad, outside autocast (the scripts call vae.encode outside the prepared model)
// in the module's dtype, its weights resident beside the model (alloc_weights); everything it makes goes, its
// output too (the latents the model reads are among its inputs).
void StepBuilder::frozen_forwards(uint32_t inputs) {
  const auto& modules = shape_.program->frozen_modules;
  frozen_labels_.resize(modules.size()), frozen_trains_.resize(modules.size());
  for (size_t m = 0; m < modules.size(); ++m) {
    const FrozenModule& fm = modules[m];
    if (!fm.forward) continue;
    const Architecture& a = *fm.forward;
    const ActDims saved_dims = dims_;
    const bool saved_no_grad = no_grad_;
    dims_.e = fm.bytes_per_param(recipe_.activation_bytes, recipe_.weight_bytes);
    dims_.e_res = dims_.e;
    dims_.amp = false;
    no_grad_ = true;
    frozen_run_ = &a;
    frozen_name_ = fm.name, frozen_index_ = m;
    SavedLayer none;
    uint32_t res = program_forward(ProgramStage::Embeddings, -1, UINT32_MAX, false, 0, none, false, inputs);
    const ProgramPlan emb = plan_program(ProgramStage::Embeddings, -1, false, 0);
    int64_t bytes = emb.bytes[a.embeddings.output];
    for (int64_t l = 0; l < a.repeat; ++l) {
      const int32_t li = static_cast<int32_t>(l);
      res = program_forward(ProgramStage::Block, li, res, false, bytes, none, true, inputs);
      bytes = plan_program(ProgramStage::Block, li, false, bytes).bytes[a.block_of(l).output];
    }
    drop(res);
    frozen_run_ = nullptr;
    no_grad_ = saved_no_grad;
    dims_ = saved_dims;
  }
}

// One micro-batch's forward through the program on this device (no pipeline: the whole model).
void StepBuilder::forward_program(InFlight& f) {
  const Architecture& a = *shape_.program;
  dims_.s = a.tokens;
  dims_.T = mul(dims_.b, a.tokens);
  dims_.Tn = dims_.T;
  f.dims = dims_;
  const int64_t L = shape_.num_layers;
  f.casts.assign(static_cast<size_t>(L), LayerCasts{});  // autocast's cache lives per forward
  casts_.swap(f.casts);
  f.saved.assign(static_cast<size_t>(L), SavedLayer{});
  f.host.assign(static_cast<size_t>(L), {});
  int64_t input_bytes = a.label_bytes;
  for (const auto& t : a.inputs) input_bytes = add(input_bytes, mul(input_dtype_bytes(t.dtype), t.numel()));
  // A frozen module's forward reads the batch's own inputs (the images the VAE encodes), collated in fp32.
  for (const auto& fm : a.frozen_modules)
    if (fm.forward)
      for (const auto& t : fm.forward->inputs) input_bytes = add(input_bytes, mul(input_dtype_bytes(t.dtype), t.numel()));
  f.inputs = act(mul(dims_.b, input_bytes), labels_.inputs, -1);  // the collated batch: fp32 inputs, int64 labels
  frozen_forwards(f.inputs);
  std::vector<uint32_t> gathered;
  gather(-1, gathered);
  SavedLayer& pre = f.program_pre;
  pre = {};
  carry_.assign(a.carries.size(), CarryState{});
  // The carries whose last reader is stage `at` (-1 the embeddings, L the head) or before may go once it has run,
  // except the one the stage passes on as the next one's input (its output a view of it): that one waits for the
  // next stage.
  auto read_by = [&](int64_t at, int32_t passed_on) {
    for (size_t c = 0; c < a.carries.size(); ++c)
      if (a.carries[c].last_reader <= at && !carry_[c].read && static_cast<int32_t>(c) != passed_on)
        carry_[c].read = true, settle_carry(static_cast<int32_t>(c));
  };
  uint32_t res = program_forward(ProgramStage::Embeddings, -1, UINT32_MAX, false, 0, pre, false, f.inputs);
  int32_t in_carry = output_carry_;
  // A stage that saved its own output (torchvision ResNet's blocks end in ReLU(inplace=True), whose backward reads
  // its result: derivatives.yaml threshold_backward) keeps it until its own backward, which runs after the next
  // stage's: the next stage reads it but must not free it (nor save it into its own, earlier-freed set).
  bool in_kept = output_kept_;
  for (uint32_t g : gathered) drop(g);
  gathered.clear();
  const ProgramPlan emb = plan_program(ProgramStage::Embeddings, -1, false, 0);
  bool req = emb.req[a.embeddings.output];
  int64_t bytes = emb.bytes[a.embeddings.output];
  f.program_req.assign(static_cast<size_t>(L + 1), false);
  f.program_bytes.assign(static_cast<size_t>(L + 1), 0);
  f.program_input_carry.assign(static_cast<size_t>(L + 1), -1);
  f.program_input_kept.assign(static_cast<size_t>(L), false);
  for (int64_t l = 0; l < L; ++l) {
    const int32_t li = static_cast<int32_t>(l);
    gather(l, gathered);
    f.program_req[static_cast<size_t>(l)] = req;
    f.program_bytes[static_cast<size_t>(l)] = bytes;
    f.program_input_carry[static_cast<size_t>(l)] = in_carry;
    autocast_casts(li, !checkpointed(l));
    SavedLayer& sv = f.saved[static_cast<size_t>(l)];
    if (checkpointed(l)) {
      // A checkpoint keeps its inputs (the carries it reads among them) and runs the block under no_grad; the
      // weights' casts made there are held by no graph and go when the forward's autocast region exits.
      if (in_carry >= 0) hold_carry(in_carry, sv);
      else sv.attn.push_back(res), sv.ops.push_back(UINT32_MAX);
      for (const auto& t : a.block_of(l).tensors)
        if (t.carry >= 0) hold_carry(t.carry, sv);
      if (casts_[l].live()) ckpt_casts_.push_back(static_cast<uint32_t>(l));
      // A non-reentrant checkpoint's first forward runs with grad and keeps what bitsandbytes' nodes hold as
      // attributes (checkpoint_graph_inputs); diffusers checkpoints so (use_reentrant=False).
      no_grad_ = true;
      ckpt_graph_ = !resolved_.checkpoint_reentrant;
      f.program_input_kept[static_cast<size_t>(l)] = in_kept;
      res = program_forward(ProgramStage::Block, li, res, req, bytes, sv, false, f.inputs, in_carry);
      no_grad_ = false;
      ckpt_graph_ = false;
    } else {
      res = program_forward(ProgramStage::Block, li, res, req, bytes, sv, !in_kept, f.inputs, in_carry);
    }
    in_carry = output_carry_;
    in_kept = output_kept_;
    read_by(l, in_carry);
    const ProgramPlan blk = plan_program(ProgramStage::Block, li, req, bytes);
    req = blk.req[a.block_of(l).output];
    bytes = blk.bytes[a.block_of(l).output];
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  f.program_req[static_cast<size_t>(L)] = req;
  f.program_bytes[static_cast<size_t>(L)] = bytes;
  f.program_input_carry[static_cast<size_t>(L)] = in_carry;
  gather(L, gathered);
  SavedLayer& post = f.program_post;
  post = {};
  f.loss_saved.clear();
  f.loss_saved.push_back(program_forward(ProgramStage::Head, static_cast<int32_t>(L), res, req, bytes, post, !in_kept, f.inputs, in_carry));
  read_by(L, -1);
  f.carry = std::move(carry_);
  carry_.clear();
  if (embedding_units()) for (uint32_t g : gathered) drop(g);
  else f.gathered_post = gathered;
  release_all_gather();
  for (uint32_t l : ckpt_casts_) drop_casts(casts_[l]);
  ckpt_casts_.clear();
  casts_.swap(f.casts);
  f.graph_attrs.swap(graph_attrs_now_);  // what the graph's nodes hold as attributes goes with the graph
  graph_attrs_now_.clear();
}

void StepBuilder::backward_program(InFlight& f) {
  dims_ = f.dims;
  begin_backward();
  casts_.swap(f.casts);
  carry_ = std::move(f.carry);
  f.carry.clear();
  const int64_t L = shape_.num_layers;
  std::vector<uint32_t> gathered;
  // The head: its loss seeds the gradient.
  if (embedding_units()) gather(L, f.gathered_post);
  for (uint32_t t : f.loss_saved) drop(t);
  f.loss_saved.clear();
  head_grads_pending_ = L;  // allocated by program_backward at the head's first op that trains
  uint32_t dres = program_backward(ProgramStage::Head, static_cast<int32_t>(L), UINT32_MAX, f.program_req[static_cast<size_t>(L)],
                                   f.program_bytes[static_cast<size_t>(L)], f.program_post, f.program_input_carry[static_cast<size_t>(L)]);
  if (head_grads_pending_ >= 0) alloc_layer_grads(L), head_grads_pending_ = -1;  // no op of the head trains
  release_layer_grads(L);
  step_in_backward(L);
  for (uint32_t g : f.gathered_post) drop(g);
  f.gathered_post.clear();
  for (int64_t l = L - 1; l >= 0; --l) {
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[static_cast<size_t>(l)];
    const bool req = f.program_req[static_cast<size_t>(l)];
    const int64_t bytes = f.program_bytes[static_cast<size_t>(l)];
    const int32_t in_carry = f.program_input_carry[static_cast<size_t>(l)];
    gather(l, gathered);
    alloc_layer_grads(l);
    if (checkpointed(l)) {
      // Recompute with grad on the kept input, then backward through the recomputed graph (non-reentrant: the
      // recomputed output is not held).
      const uint32_t in = in_carry >= 0 ? carry_[static_cast<size_t>(in_carry)].id : sv.attn.front();
      SavedLayer& re = recompute_;
      re.attn.clear(), re.mlp.clear(), re.ops.clear(), re.holds.clear();
      program_recompute_ = true;
      const uint32_t out = program_forward(ProgramStage::Block, li, in, req, bytes, re, false, f.inputs, in_carry);
      program_recompute_ = false;
      const bool reentrant = resolved_.checkpoint_reentrant;
      const bool own_out = recomputed_output_owned(out, in);
      if (!reentrant && own_out) drop(out);
      const uint32_t din = program_backward(ProgramStage::Block, li, dres, req, bytes, re, in_carry);
      if (reentrant && own_out) drop(out);
      dres = din;
      if (in_carry < 0 && !f.program_input_kept[static_cast<size_t>(l)]) drop(in);
      sv.attn.clear(), sv.ops.clear();
      release_carry_holds(sv);
    } else {
      dres = program_backward(ProgramStage::Block, li, dres, req, bytes, sv, in_carry);
    }
    drop_casts(casts_[l]);
    release_layer_grads(l);
    reshard_after_backward(l);
    step_in_backward(l);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  if (embedding_units()) gather(-1, gathered);
  alloc_layer_grads(-1);
  const uint32_t d = program_backward(ProgramStage::Embeddings, -1, dres, false, 0, f.program_pre);
  if (d != UINT32_MAX) drop(d);
  release_layer_grads(-1);
  reshard_after_backward(-1);
  reshard_after_backward(L);
  step_in_backward(-1);
  for (uint32_t g : gathered) drop(g);
  gathered.clear();
  drop(f.inputs);
  f.inputs = UINT32_MAX;
  // (Every carry went with its last hold and its gradient with its producer's backward; a carry nothing required
  // grad for may still hold one.)
  for (auto& cs : carry_) {
    if (cs.grad != UINT32_MAX) drop(cs.grad);
    if (cs.id != UINT32_MAX) drop(cs.id);
  }
  carry_.clear();
  casts_.swap(f.casts);
  release_graph(f.graph_attrs);  // the loop lets go of the loss, and the graph goes with it
  end_backward();
}

}  // namespace memsim
