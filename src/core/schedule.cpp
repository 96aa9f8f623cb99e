// One micro-batch's forward and backward through this device's chunk of the model (embeddings, layers with their
// checkpointing, head and loss), and the order in which a step runs them: gradient accumulation on one device, and
// the pipeline schedules (GPipe, 1F1B, interleaved 1F1B) across stages, with what each micro-batch keeps in flight
// (InFlight) between its forward and its backward. Split from activations.cpp (code moved, not changed).
#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "architecture.h"
#include "checked.h"
#include "step_builder.h"

namespace memsim {

bool StepBuilder::checkpointed(int64_t l) const {
  // A model program's block kind that no checkpoint wraps (architecture.h ArchStage::checkpointable).
  if (shape_.program && l >= 0 && l < shape_.program->repeat && !shape_.program->block_of(l).checkpointable) return false;
  switch (resolved_.checkpointing) {
    case Checkpointing::Full:
    case Checkpointing::SelectiveOp: return true;
    case Checkpointing::EveryK: return l % cfg_.training.checkpoint_every_k_layers == 0;
    default: return false;
  }
}

uint32_t StepBuilder::forward_layer(int32_t l, uint32_t in, SavedLayer& sv, bool own) {
  const bool keep_s2 = resolved_.checkpointing != Checkpointing::Selective;
  return cfg_.model.post_layernorm ? layer_forward_post_ln(l, in, sv, keep_s2, own) : layer_forward(l, in, sv, keep_s2, own);
}

// Marks `t` held (graph_attr_) and lists it in `holders`, for release_graph; a tensor held already stays where it is.
void StepBuilder::hold(uint32_t t, std::vector<uint32_t>& holders) {
  if (graph_attr_.size() <= t) graph_attr_.resize(static_cast<size_t>(t) + 1, 0);
  if (graph_attr_[t] != 0) return;
  graph_attr_[t] = 1;
  holders.push_back(t);
}

void StepBuilder::hold_in_graph(uint32_t t) {
  // A recomputation's graph (checkpointing, in backward) goes with its layer's backward, and a no_grad forward
  // builds none; a non-reentrant checkpoint's first forward runs with grad (ckpt_graph_).
  if (in_backward_ || (no_grad_ && !ckpt_graph_)) return;
  if (no_grad_) program_.recategorize(t, Component::Activations);  // act() made it a temporary
  hold(t, graph_attrs_now_);
}

void StepBuilder::release_graph(std::vector<uint32_t>& attrs) {
  for (uint32_t t : attrs) {
    const uint8_t state = graph_attr_[t];
    graph_attr_[t] = 0;
    if (state == 2) program_.free(t);
  }
  attrs.clear();
}

// litgpt: `logits = model(...)` has rebound the loop's variable, and the previous micro-batch's logits and graph
// have no holder left.
void StepBuilder::release_previous_outputs() {
  if (prev_logits_ != UINT32_MAX) drop(prev_logits_), prev_logits_ = UINT32_MAX;
  release_graph(prev_graph_attrs_);
}

// The forward of one micro-batch on this device's layers [first_layer_, end_layer_). A pipeline stage other
// than the first receives its input; one other than the last sends its output, whose memory Megatron frees at
// once (schedules.py deallocate_output_tensor).
void StepBuilder::forward_mb(InFlight& f, std::string phase) {
  const std::string reference_phase = f.post && (preference() || grpo()) ? "reference " + phase : std::string();
  // TRL 0.15-0.16 generated and scored each micro-batch's completions before its forward (rollout_step.cpp); later
  // ones do where generations fall inside a step: before the replayed second micro-batch, which stands for the
  // step's later ones, with their accumulated gradients.
  const RolloutFlow& r = resolved_.rollout;
  if (grpo() && (r.per_micro_batch || (r.mid_step_generation && mb_in_step_ > 0)) && f.owns_inputs && f.pre) {
    const size_t open = phase.find('(');
    rollout(open == std::string::npos ? phase : phase.substr(open + 1, phase.size() - open - 2), iter_);
  }
  // KTO: the KL batch through the policy under no_grad before the batch's forward (preference_step.cpp).
  const bool kl = f.pre && f.post && f.owns_inputs && preference() && resolved_.preference.kl_pass &&
                  !cfg_.model.is_encoder_decoder && !shape_.program;
  program_.phase(kl ? "KL " + phase : phase);
  reuse(f);
  if (run_shapes_ && f.owns_inputs) use_shape((*run_shapes_)[next_shape_++]);
  f.dims = dims_;
  if (cfg_.model.is_encoder_decoder) return forward_encdec(f);
  if (shape_.program) return forward_program(f);
  if (kl) {
    kl_forward();
    program_.phase(phase);
  }
  f.casts.assign(static_cast<size_t>(shape_.num_layers), LayerCasts{});  // autocast's cache lives per forward
  casts_.swap(f.casts);
  const int64_t first = f.first, end = f.end;
  const size_t n = static_cast<size_t>(end - first);
  f.saved.resize(n);
  f.host.resize(n);
  for (size_t i = 0; i < n; ++i) {
    f.saved[i].attn.clear(), f.saved[i].mlp.clear(), f.saved[i].cross.clear();
    f.saved[i].attn.reserve(16), f.saved[i].mlp.reserve(12);
    f.host[i].clear();
  }
  if (f.owns_inputs)  // once per micro-batch: int64 ids and/or labels
    f.inputs = act(mul(ctx_.has_pre && ctx_.has_post ? 2 : 1, 8, dims_.T), labels_.inputs, -1);
  std::vector<uint32_t> gathered;
  uint32_t res;
  mask_ = {};
  if (f.pre) {
    gather(-1, gathered);
    if (prefix_tokens_ > 0) prefix_forward_begin();
    res = embed_forward();
    if (shape_.vision_tower) res = vision_forward(f, res);  // a VLM's tower and projector (vision_step.cpp)
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
    mask_forward();
  } else if (resolved_.framework->pp_persistent_recv) {
    recv_buffers(first, false);
    res = act(0, labels_.p2p, static_cast<int32_t>(first));  // a view of this micro-batch's receive buffer
  } else {
    res = act(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.p2p, static_cast<int32_t>(first));
  }
  const bool offload = cfg_.training.activation_offload && !unsloth_gc();
  const bool unsloth_offload = unsloth_gc();
  if (unsloth_offload) unsloth_gc_buffers(true);
  auto offload_layer = [&](int64_t i) {
    for (auto* part : {&f.saved[i].attn, &f.saved[i].mlp}) {
      for (uint32_t t : *part) f.host[i].push_back({program_.tensors[t].bytes, program_.tensors[t].label}), drop(t);
      part->clear();
    }
  };
  // PPO's training forward returns output_hidden_states (TRL's forward()): the embeddings' output and every layer's
  // (the last one's normed, the same size: its raw output stands for it) stay in `output` with the logits until the
  // next micro-batch rebinds it; where accelerate converts the wrapper's outputs to fp32, `output` holds the fp32
  // copies instead (ppo_hold_outputs).
  const bool hidden_states_kept = ppo() && !ppo_hidden_states_fp32();
  if (hidden_states_kept) hold(res, ppo_outputs_);
  for (int64_t l = first; l < end; ++l) {
    gather(l, gathered);
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[l - first];
    // A checkpointed layer's saved inputs hold the mask until its backward (reentrant: ctx.save_for_backward of
    // every tensor argument; non-reentrant: the arguments kept for the recomputation).
    const bool grad = l >= first_grad_layer_;
    if (mask_.tensor != UINT32_MAX && mask_.holder < 0 && grad && checkpointed(l)) mask_.holder = l;
    res = !grad ? layer_forward_without_grad(li, res)
          : resolved_.checkpointing == Checkpointing::SelectiveOp && !cfg_.model.post_layernorm && cfg_.model.kv_lora_rank == 0
              ? layer_forward_selective_op(li, res, sv)
          : checkpointed(l) ? layer_forward_checkpointed(li, res, sv)
                            : forward_layer(li, res, sv, true);
    if (hidden_states_kept) hold(res, ppo_outputs_);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
    // CPU activation offloading keeps one layer in flight: the previous layer's saved tensors leave the GPU.
    if (offload && l > first) offload_layer(l - 1 - first);
    // Unsloth's checkpointer copies the layer's input to the host inside the layer's forward and saves no GPU copy:
    // the input goes when the decoder loop moves on to the layer's output.
    if (unsloth_offload && unsloth_offloads(l)) offload_layer(l - first);
  }
  if (prefix_tokens_ > 0) prefix_forward_end();  // the last layer's update has replaced the prefix's views
  // No layer keeps the mask: it goes when LlamaModel.forward returns, before the head (its final norm, a small
  // tensor, is taken to run after).
  if (mask_.tensor != UINT32_MAX && mask_.holder < 0) drop(mask_.tensor), mask_.tensor = UINT32_MAX;
  f.mask = mask_;
  mask_ = {};
  // The top layer's saved tensors leave the GPU before the head: the head's own saves (the final norm's, the
  // logits') go through the same pack hook, which frees what earlier copies have finished (torchtune
  // OffloadActivations keeps a few tensors in flight, not a layer). Offloaded after the loss, the whole top layer
  // was on the GPU at the loss's peak, so one more layer could lower the peak (docs/robustness.md).
  if (offload && end > first && f.post) offload_layer(end - 1 - first);
  if (f.post) {
    gather(shape_.num_layers, gathered);
    loss_forward(res, f.loss_saved);
    release_previous_outputs();  // where the loss did not already, once the new logits exist
    // The output layer as a unit of its own reshards after its forward and is all-gathered again for backward.
    if (embedding_units()) for (uint32_t g : gathered) drop(g);
    else f.gathered_post = gathered;
  } else {
    drop(res);  // sent to the next stage
  }
  release_all_gather();  // the root's post_forward frees the last all-gather output
  if (f.post && preference()) reference_forward(reference_phase);  // then TRL's reference forward (preference_step.cpp)
  // TRL 0.18.x scored the reference inside _compute_loss, after the policy's forward.
  if (f.post && grpo() && resolved_.rollout.reference_after_policy && reference_runs()) {
    program_.phase(reference_phase);
    score_pass(dims_.b, reference_gathers(), false, true);
  }
  if (offload && end > first && !f.post) offload_layer(end - 1 - first);
  // The outermost autocast region exits here: weight copies cached in checkpointed (no_grad) forwards are
  // held by no graph and go.
  for (uint32_t l : ckpt_casts_) drop_casts(casts_[l]);
  ckpt_casts_.clear();
  casts_.swap(f.casts);
  f.embed_saved.swap(embed_saved_);
  f.held_logits = held_logits_;
  held_logits_ = UINT32_MAX;
  release_graph(prefix_cache_);  // prefix tuning's cache, where the loop drops the model's outputs with the loss
  f.graph_attrs.swap(graph_attrs_now_);
  graph_attrs_now_.clear();
}

void StepBuilder::backward_mb(InFlight& f, std::string phase) {
  if (zero_grad_pending_) {  // training.zero_grad_at before_backward: the last step's gradients go now
    program_.phase("zero_grad (before step " + std::to_string(iter_) + "'s backward)");
    release_grads();
    zero_grad_pending_ = false;
  }
  program_.phase(std::move(phase));
  if (run_shapes_) dims_ = f.dims;
  if (cfg_.model.is_encoder_decoder) return backward_encdec(f);
  if (shape_.program) return backward_program(f);
  begin_backward();
  casts_.swap(f.casts);
  embed_saved_.swap(f.embed_saved);
  mask_ = f.mask;
  const int64_t first = f.first, end = f.end;
  std::vector<uint32_t> gathered;
  uint32_t dres;
  if (f.post) {
    if (embedding_units()) gather(shape_.num_layers, f.gathered_post);
    dres = loss_backward(f.loss_saved);
    release_layer_grads(shape_.num_layers);
    if (!f.pre && !ctx_.has_pre) reshard_after_backward(shape_.num_layers);
    step_in_backward(shape_.num_layers);
    for (uint32_t g : f.gathered_post) drop(g);
    f.gathered_post.clear();
  } else if (resolved_.framework->pp_persistent_recv) {
    recv_buffers(end - 1, true);
    dres = tmp(0, labels_.p2p, static_cast<int32_t>(end - 1));  // a view of this micro-batch's gradient buffer
  } else {
    dres = tmp(mul(dims_.e_res, dims_.Tn, dims_.h), labels_.p2p, static_cast<int32_t>(end - 1));  // received from the next stage
  }
  for (int64_t l = end - 1; l >= first; --l) {
    if (l < first_grad_layer_) break;  // no graph below: the gradient stops at the first layer that trains
    const int32_t li = static_cast<int32_t>(l);
    SavedLayer& sv = f.saved[l - first];
    gather(l, gathered);
    // Back from the host: a new tensor, or under Unsloth's smart checkpointing a view of its persistent buffer.
    const bool into_buffer = unsloth_gc() && resolved_.unsloth_gc != UnslothGc::Offload;
    if (!f.host[l - first].empty())
      for (auto [bytes, label] : f.host[l - first]) sv.attn.push_back(act(into_buffer ? 0 : bytes, label, li));
    if (checkpointed(l)) {
      // Recompute with grad on the kept input, then backward through the recomputed graph. Outputs that selective
      // checkpointing kept are handed to the recomputed graph instead of being computed again.
      const uint32_t in = sv.attn.front();
      for (size_t i = 1; i < sv.attn.size(); ++i) drop(sv.attn[i]);
      sv.attn.resize(1);
      SavedLayer& re = recompute_;
      re.attn.clear(), re.mlp.clear();
      uint32_t out = forward_layer(li, in, re, false);
      // Reentrant checkpointing holds the recomputed output through the layer's backward; non-reentrant keeps only
      // what the recomputed graph saved (training.checkpoint_reentrant, auto: FrameworkSpec::checkpoint_reentrant).
      const bool reentrant = resolved_.checkpoint_reentrant;
      if (!reentrant) drop(out);
      layer_backward(li, dres, re);
      if (reentrant) drop(out);
      if (fsdp_hook_holds_inputs_) hold(in, backward_held_), hold(dres, backward_held_);  // dres: now in's .grad
      for (uint32_t t : sv.attn) drop(t);
      sv.attn.clear();
    } else {
      layer_backward(li, dres, sv);
    }
    if (mask_.tensor != UINT32_MAX && l == mask_.holder) drop(mask_.tensor), mask_.tensor = UINT32_MAX;
    release_layer_grads(l);
    reshard_after_backward(l);
    step_in_backward(l);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  if (f.pre) {
    if (prefix_tokens_ > 0) prefix_backward();
    for (auto it = embed_saved_.rbegin(); it != embed_saved_.rend(); ++it) drop(*it);
    embed_saved_.clear();
    // The embedding as a unit of its own: FSDP2's pre-backward hook all-gathers it again (though its backward reads
    // only the output's gradient and the ids).
    if (embedding_units()) gather(-1, gathered);
    // Embedding backward: a dense [V, h] gradient. Untied, it is the embedding's .grad; tied, see tied_sum.
    alloc_layer_grads(-1);
    vision_backward(f);  // a VLM's projector, created after the embeddings, runs its backward first
    // A frozen embedding (PEFT) has no backward: its input is token ids and its weight needs no gradient.
    if (cfg_.model.tie_word_embeddings && has_grad(shape_.pre.front())) tied_embedding_grad(mul(recipe_.grad_bytes, dims_.V, dims_.h));
    release_layer_grads(-1);
    reshard_after_backward(-1);
    reshard_after_backward(shape_.num_layers);
    step_in_backward(-1);
    for (uint32_t g : gathered) drop(g);
    gathered.clear();
  }
  release_graph(backward_held_);  // FSDP1's final callback (_finalize_params) removes its hooks
  // The loop lets go of the outputs, and the graph goes with them (the HF Trainer's training_step returns), or
  // holds them into the next forward.
  if (resolved_.framework->outputs_live_to_next_forward && cfg_.parallel.pipeline_parallel_size == 1) {
    release_previous_outputs();  // not expected: the forward between has released them
    std::swap(prev_logits_, f.held_logits);
    prev_graph_attrs_.swap(f.graph_attrs);
  } else {
    if (f.held_logits != UINT32_MAX) drop(f.held_logits), f.held_logits = UINT32_MAX;
    release_graph(f.graph_attrs);
  }
  // The input's gradient is sent to the previous stage; under torch.distributed.pipelining it is also the
  // receive buffer's .grad, which stays until the next step() clears it.
  if (!f.pre && resolved_.framework->pp_persistent_recv) pipeline_.input_grads.push_back(dres);
  else drop(dres);
  if (f.inputs != UINT32_MAX) drop(f.inputs);
  if (f.pixels != UINT32_MAX) drop(f.pixels), f.pixels = UINT32_MAX;
  if (mask_.tensor != UINT32_MAX) drop(mask_.tensor);  // a holder outside this chunk's layers (not expected)
  mask_ = {};
  f.mask = {};
  casts_.swap(f.casts);
  end_backward();
}

// A finished micro-batch's per-layer vectors wait in a pool for the next forward, which clears them: a pipeline
// stage runs dozens of short chunk forwards, and allocating their vectors anew cost more than filling them.
void StepBuilder::recycle(InFlight& f) {
  spare_.push_back({std::move(f.saved), std::move(f.host), std::move(f.casts)});
  f = InFlight{};
}

void StepBuilder::reuse(InFlight& f) {
  if (spare_.empty()) return;
  f.saved = std::move(spare_.back().saved);
  f.host = std::move(spare_.back().host);
  f.casts = std::move(spare_.back().casts);
  spare_.pop_back();
}

// The micro-batches of one step in the order this device runs them (Megatron schedules.py): without a
// pipeline, forward and backward alternate; GPipe runs every forward, then every backward; 1F1B warms up with
// (stages - stage - 1) forwards, then alternates, so at most (stages - stage) micro-batches are in flight.
// Interleaved 1F1B (forward_backward_pipelining_with_interleaving) runs each micro-batch through v model chunks
// per device: it warms up with (stages - stage - 1) x 2 + (v - 1) x stages chunk forwards, chunk
// (k / stages) % v of micro-batch (k / (stages v)) stages + k % stages for the k-th, and backwards in the
// reverse chunk order; the in-flight activations come out of that order (Korthikanti et al. 2022 eq. 5 puts
// the first stage at 1 + (p - 1) / (p v) of 1F1B's).
void StepBuilder::run_schedule(int iter, int64_t mbs, int64_t gas) {
  iter_ = iter;
  const int64_t p = cfg_.parallel.pipeline_parallel_size, i = ctx_.stage;
  const bool interleaved = p > 1 && cfg_.parallel.schedule() == PipelineSchedule::Interleaved1F1B;
  const int64_t v = interleaved ? cfg_.parallel.virtual_pipeline_stages : 1;
  // "forward (step 2, micro-batch 3)": the phase's name, built in one string.
  auto phase_name = [&](const char* pass, int64_t mb) {
    std::string t;
    t.reserve(64);
    t += pass;
    t += " (step ";
    t += std::to_string(iter);
    if (gas > 1 && (iter == 2 || run_shapes_)) {
      if (mb == mbs && gas > mbs) t += ", micro-batches ", t += std::to_string(mb), t += '-', t += std::to_string(gas);
      else t += ", micro-batch ", t += std::to_string(mb);
    }
    t += ')';
    return t;
  };
  auto chunk_of = [&](InFlight& f, int64_t chunk) {
    if (!interleaved) {
      f.first = ctx_.first_layer, f.end = std::min(ctx_.end_layer, shape_.num_layers);
      f.pre = ctx_.has_pre, f.post = ctx_.has_post;
      return;
    }
    const int64_t model_chunk = chunk * p + i;
    std::tie(f.first, f.end) = interleaved_chunk(shape_.num_layers, p * v, model_chunk);
    f.pre = model_chunk == 0, f.post = model_chunk == p * v - 1;
    f.owns_inputs = chunk == 0;
  };
  if (!interleaved) {
    std::vector<InFlight> flights(static_cast<size_t>(mbs));
    for (auto& f : flights) chunk_of(f, 0);
    int64_t next_f = 0, next_b = 0;
    auto F = [&]() {
      mb_in_step_ = next_f;
      if (critic_) critic_forward(phase_name("forward", next_f + 1));  // PPO: the value model's forward first
      forward_mb(flights[next_f], phase_name("forward", next_f + 1));
      ++next_f;
    };
    auto B = [&]() {
      InFlight& f = flights[next_b];
      last_backward_ = next_b == mbs - 1;
      backward_mb(f, phase_name("backward", next_b + 1));
      if (critic_) {  // PPO: the value model's backward after the policy's, then the entropy (ppo_step.cpp)
        critic_backward(phase_name("backward", next_b + 1));
        if (!last_backward_) ppo_entropy();
      }
      recycle(f), chunk_of(f, 0), ++next_b;
    };
    if (p > 1 && cfg_.parallel.schedule() == PipelineSchedule::GPipe) {
      while (next_f < mbs) F();
      while (next_b < mbs) B();
      return;
    }
    const int64_t warmup = p > 1 ? std::min(p - i - 1, mbs) : 0;
    for (int64_t k = 0; k < warmup; ++k) F();
    while (next_f < mbs) F(), B();
    while (next_b < mbs) B();
    return;
  }
  const int64_t total = mbs * v;
  std::vector<InFlight> flights(static_cast<size_t>(total));  // indexed by micro-batch * v + chunk
  auto mb_of = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  auto slot = [&](int64_t k, bool forward) {
    const int64_t c = (k / p) % v;
    return mb_of(k) * v + (forward ? c : v - 1 - c);
  };
  int64_t next_f = 0, next_b = 0;
  auto F = [&]() {
    const int64_t k = next_f++;
    if (mb_of(k) >= mbs) return;  // a partial last round (micro-batches not a multiple of the stages)
    InFlight& f = flights[static_cast<size_t>(slot(k, true))];
    chunk_of(f, (k / p) % v);
    forward_mb(f, phase_name("forward", mb_of(k) + 1));
  };
  auto B = [&]() {
    const int64_t k = next_b++;
    if (mb_of(k) >= mbs) return;
    InFlight& f = flights[static_cast<size_t>(slot(k, false))];
    last_backward_ = mb_of(k) == mbs - 1;
    backward_mb(f, phase_name("backward", mb_of(k) + 1));
    recycle(f);
  };
  const int64_t rounds = ceil_div(mbs, p) * p * v;  // virtual micro-batches, padded to whole rounds
  const int64_t warmup = std::min((p - i - 1) * 2 + (v - 1) * p, rounds);
  for (int64_t k = 0; k < warmup; ++k) F();
  while (next_f < rounds) F(), B();
  while (next_b < rounds) B();
}

}  // namespace memsim
