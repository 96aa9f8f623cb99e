// Unsloth's own tensors (FrameworkSpec::unsloth_kernels): its checkpointing buffers, its dequantization buffer and
// its three loss paths. Sources: docs/research/unsloth.md, a reading of unslothai/unsloth (HEAD 015bdef0 and the
// release tags it names) and unslothai/unsloth-zoo (HEAD ce232d6c). What the kernels save inside a layer is in
// activations.cpp beside the other frameworks' rules (linear_inputs, layer_forward).
#include "checked.h"
#include "step_builder.h"

namespace memsim {

void StepBuilder::unsloth_labels() {
  if (unsloth_labels_made_) return;
  unsloth_labels_made_ = true;
  unsloth_labels_.gc_buffer = program_.label("Unsloth checkpointing GPU buffer (offloaded layer inputs come back into it)");
  unsloth_labels_.weight_buffer = program_.label("Unsloth dequantization buffer (largest 4-bit linear, 16-bit, and its fp32 absmax)");
  unsloth_labels_.ce_chunk = program_.label("Unsloth fused cross-entropy: one chunk's logits, fp32 upcast and gradient");
  unsloth_labels_.grad_inputs = program_.label("Unsloth fused cross-entropy: lm_head input gradient made in the forward (saved)");
}

bool StepBuilder::unsloth_gc() const {
  return unsloth() && cfg_.training.activation_offload && resolved_.checkpointing == Checkpointing::Full;
}

// unsloth_zoo gradient_checkpointing.py initialize_unsloth_gradient_checkpointing: GPU_BUFFERS of
// INITIAL_GPU_BUFFER_SIZE = 2 * 256 * 2048 elements of the model dtype, one per device (a second one with double
// buffering), allocated once and grown by resize_ when a larger input comes (a new storage, the old one freed).
void StepBuilder::unsloth_gc_buffers(bool grow) {
  if (!unsloth_gc() || resolved_.unsloth_gc == UnslothGc::Offload) return;
  unsloth_labels();
  const int buffers = resolved_.unsloth_gc == UnslothGc::SmartDouble ? 2 : 1;
  for (int i = 0; i < buffers; ++i) {
    int64_t want = mul(dims_.e_res, int64_t{2} * 256 * 2048);
    // The forward grows buffer A to the input's size; buffer B grows only from the second step, at the start of a
    // forward, when more than 512 MiB are free (assumed: memsim does not decide it from the free memory). Below a
    // 512-token max_seq_length the smart checkpointer is unpatched and nothing grows.
    if (grow && (i == 0 || iter_ >= 2) && cfg_.training.sequence_length >= 512) want = std::max(want, mul(dims_.e_res, dims_.Tn, dims_.h));
    if (want <= gc_buffer_bytes_[i]) continue;
    const uint32_t grown = program_.alloc(Component::Activations, want, unsloth_labels_.gc_buffer);
    if (gc_buffer_[i] != UINT32_MAX) drop(gc_buffer_[i]);
    gc_buffer_[i] = grown, gc_buffer_bytes_[i] = want;
  }
}

// UnslothCheckpointFunction.forward offloads argument 0 only when it has more than MINIMUM_SIZE = 2 MiB / element
// size elements (1,048,576 in 16 bits) and the layer is not the last checkpoint after the first pass; below a
// 512-token max_seq_length "unsloth" is plain checkpointing (apply_unsloth_gradient_checkpointing). The offloaded
// checkpointer of 2024 sends every layer's input.
bool StepBuilder::unsloth_offloads(int64_t layer) const {
  if (resolved_.unsloth_gc == UnslothGc::Offload) return true;
  if (cfg_.training.sequence_length < 512) return false;
  if (mul(dims_.Tn, dims_.h) <= (int64_t{2} << 20) / dims_.e_res) return false;
  return !(layer == shape_.num_layers - 1 && iter_ >= 2);
}

// fast_dequantize(use_global_buffer=True) from unsloth 144190bd (tag 2025-02): WEIGHT_BUFFER of the largest 4-bit
// linear that matmul_lora dequantizes, in the compute dtype, and ABSMAX_BUFFER of its fp32 absmax (one per 64-element
// block, bitsandbytes' NF4 blocksize), kept for the run.
void StepBuilder::unsloth_weight_buffer() {
  if (!unsloth() || !resolved_.unsloth_weight_buffer) return;
  int64_t largest = 0;
  // (One linear's: a routed expert's projections are 4-bit linears of their own. The dense layer's list is the
  // template of layers an all-MoE model has none of.)
  auto consider = [&](const std::vector<ParamTensor>& ts) {
    for (const auto& t : ts)
      if (t.quantized) largest = std::max(largest, one_linear_numel(t, cfg_.model.mlp_gated));
  };
  if (shape_.num_dense_layers > 0) consider(shape_.layer);
  consider(shape_.moe_layer);
  if (largest == 0) return;
  unsloth_labels();
  program_.alloc(Component::Overhead, add(mul(dims_.e, largest), mul(4, ceil_div(largest, 64))), unsloth_labels_.weight_buffer);
}

// The loss's forward under Unsloth (LossImpl UnslothLogits, CutCrossEntropy, UnslothFusedCe). `saved` already holds
// the final norm's output where lm_head reads it.
void StepBuilder::unsloth_loss_forward(LossImpl loss, std::vector<uint32_t>& saved) {
  const int32_t post = -1;
  const int64_t e = dims_.e, tv = mul(dims_.T, dims_.V);
  switch (loss) {
    case LossImpl::UnslothLogits: {
      // unsloth/kernels/cross_entropy_loss.py Fast_CrossEntropyLoss: the logits, cast to the model dtype
      // (CausalLM_fast_forward: logits.to(dtype)), are saved with an fp32 loss and logsumexp per row; above
      // MAX_FUSED_SIZE = 65536 columns the logsumexp is [rows, chunks] and then reduced.
      const uint32_t hd = head_dequant();
      saved.push_back(act(mul(e, tv), labels_.logits, post));
      drop_if(hd);
      const int64_t chunks = ceil_div(dims_.V, 65536);
      const uint32_t per_chunk = chunks > 1 ? tmp(mul(4, dims_.T, chunks), labels_.lse_loss, post) : UINT32_MAX;
      saved.push_back(act(mul(4, dims_.T), labels_.lse_loss, post));
      drop_if(per_chunk);
      break;
    }
    case LossImpl::CutCrossEntropy:
      // cut_cross_entropy.linear_cross_entropy: logits are made block by block in on-chip memory, never whole; it
      // keeps the hidden states (the final norm's output, saved already) and an fp32 logsumexp per token. Its
      // other internals are the library's and not pinned here (docs/research/unsloth.md 2b).
      saved.push_back(act(mul(4, dims_.T), labels_.lse_loss, post));
      break;
    case LossImpl::UnslothFusedCe: {
      // unsloth_zoo fused_losses/cross_entropy_loss.py: grad_inputs = torch.empty_like(hidden_states), filled
      // chunk by chunk by torch.func.grad_and_value over F.linear + cross_entropy(logits.float()), and saved for the
      // backward. n_chunks = ceil(fp32 logits / target / 4) * 4 (get_chunk_size). Per chunk: the 16-bit logits, the
      // fp32 upcast and an fp32 gradient, an estimate (the compiled accumulate_chunk decides; not pinned).
      unsloth_labels();
      saved.push_back(act(mul(e, dims_.T, dims_.h), unsloth_labels_.grad_inputs, post));
      const int64_t n = mul(4, ceil_div(mul(4, tv), mul(4, resolved_.unsloth_ce_target_bytes)));
      const int64_t rows = ceil_div(dims_.T, n);
      const uint32_t chunk = tmp(mul(add(e, 8), rows, dims_.V), unsloth_labels_.ce_chunk, post);
      drop(chunk);
      break;
    }
    default: break;
  }
}

// The loss's backward under Unsloth: returns the gradient of the final norm's output.
uint32_t StepBuilder::unsloth_loss_backward(LossImpl loss) {
  const int32_t post = -1;
  const int64_t e = dims_.e;
  switch (loss) {
    case LossImpl::UnslothLogits: {
      // Backward writes dloss * softmax into the saved logits (tl.store(logits_ptr + col_offsets, ...)) and returns
      // that buffer: no new [tokens, vocab] tensor. lm_head's matmul backward makes the input's gradient.
      const uint32_t hd = head_dequant();
      const uint32_t dy = tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);
      drop_if(hd);
      return dy;
    }
    case LossImpl::CutCrossEntropy:
      // The input's gradient, from logits recomputed block by block.
      return tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);
    case LossImpl::UnslothFusedCe:
      // grad_inputs * scale_factor: a new tensor; the saved one goes with the rest of `saved`.
      return tmp(mul(e, dims_.Tn, dims_.h), labels_.dres, post);
    default: return UINT32_MAX;
  }
}

}  // namespace memsim
