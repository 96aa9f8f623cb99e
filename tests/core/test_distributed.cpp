// Distributed layouts: each sharding engine's per-GPU model states against the bytes-per-parameter its
// documentation states, and the activation effects of context, expert and interleaved pipeline parallelism
// against their closed forms.
#include <catch2/catch.hpp>

#include "core/model.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

Config llama3_8b_on(int64_t dp, const std::string& framework, const std::string& precision, int64_t zero) {
  Config c = single_gpu_config("llama-3-8b.json", 1, 2048);
  c.training.framework = framework;
  c.training.precision = precision;
  c.training.activation_checkpointing = "full";
  c.parallel.data_parallel_size = dp;
  c.parallel.zero_stage = zero;
  c.hardware.gpu = "h100-sxm";
  return c;
}

constexpr double kParams = 8030261248.0;  // Llama-3-8B (test_params)

double per_param(int64_t bytes) { return static_cast<double>(bytes) / kParams; }

int64_t live_before(const DeviceResult& d, const std::string& phase, Component c) {
  return live_bytes_before_phase(d.program, phase, c);
}

// The most bytes alive at once of the tensors `counts` picks, read during the first phase whose name starts with
// `phase`, at the events whose tensor `peak_at` picks (every one by default).
template <typename Pick, typename At = bool (*)(const Tensor&)>
int64_t most_live_in(const StepProgram& p, const std::string& phase, Pick&& counts,
                     At&& peak_at = [](const Tensor&) { return true; }) {
  uint32_t begin = 0, end = static_cast<uint32_t>(p.events.size());
  for (size_t i = 0; i < p.phases.size(); ++i)
    if (p.phases[i].name.rfind(phase, 0) == 0) {
      begin = p.phases[i].first_event;
      if (i + 1 < p.phases.size()) end = p.phases[i + 1].first_event;
      break;
    }
  int64_t live = 0, most = 0;
  for (uint32_t i = 0; i < end; ++i) {
    const Tensor& t = p.tensors[p.events[i].tensor];
    if (!counts(t)) continue;
    live += (p.events[i].op == Event::Op::Alloc ? 1 : -1) * t.bytes;
    if (i >= begin && peak_at(t)) most = std::max(most, live);
  }
  return most;
}

// Away from the root's units (embeddings, head): the middle layers of a 32-layer model.
bool mid_layer(const Tensor& t) { return t.layer >= 4 && t.layer < 24; }

}  // namespace

TEST_CASE("FSDP2 mixed precision keeps fp32 shards only: 16 bytes per parameter over N", "[distributed][fsdp]") {
  // torchtitan / torchtune MixedPrecisionPolicy(param bf16, reduce fp32): the sharded parameter is the fp32
  // master, its gradient shard fp32, AdamW's two states fp32: (4 + 4 + 8) Psi / N, with dim-0 chunking rounding
  // each tensor's rows up (MEMORY_FORMULAS.md 2.6).
  for (int64_t n : {8, 64}) {
    Config c = llama3_8b_on(n, "torchtitan", "bf16_mixed", 3);
    Result r = simulate(c);
    REQUIRE(r.ok);
    const ModelStates& m = r.model_states;
    INFO("N = " << n);
    CHECK(per_param(m.weights_bytes) * n == Approx(4.0).epsilon(0.002));
    CHECK(per_param(m.gradients_bytes) * n == Approx(4.0).epsilon(0.002));
    CHECK(per_param(m.optimizer_bytes) * n == Approx(8.0).epsilon(0.002));
  }
}

TEST_CASE("FSDP2's side streams: all-gather buffers and gradient shards in pools of their own", "[distributed][fsdp][streams]") {
  // _fsdp_collectives.py: foreach_all_gather allocates its output under all_gather_copy_in_stream and
  // foreach_reduce the reduce-scatter output (the sharded gradient) under reduce_scatter_stream; the caching
  // allocator never hands one stream's cached block to another. In forward an all-gather output waits for the
  // next group's unshard, so two are live at once; in backward each goes after its copy-out.
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 3);
  Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  int live = 0, most_forward = 0, most_backward = 0;
  bool backward = false;
  size_t phase = 0;
  for (uint32_t i = 0; i < p.events.size(); ++i) {
    while (phase < p.phases.size() && p.phases[phase].first_event <= i)
      backward = p.phases[phase++].name.rfind("backward", 0) == 0;
    const Tensor& t = p.tensors[p.events[i].tensor];
    const std::string& label = p.labels[t.label];
    if (label == "gradient shard") CHECK(t.stream == Stream::ReduceScatter);
    if (label.rfind("FSDP2 all-gather output", 0) != 0) continue;
    CHECK(t.stream == Stream::AllGather);
    live += p.events[i].op == Event::Op::Alloc ? 1 : -1;
    (backward ? most_backward : most_forward) = std::max(backward ? most_backward : most_forward, live);
  }
  CHECK(most_forward == 2);
  CHECK(most_backward == 1);
  CHECK(live == 0);
}

TEST_CASE("FSDP2 over a one-rank mesh: prime-rl shards on one GPU, and torch 2.9 copies where 2.8 all-gathers",
          "[distributed][fsdp][streams]") {
  // prime-rl's setup_model calls setup_fsdp whatever the world size: fp32 DTensor shards that are the whole
  // parameters, fp32 gradients out of the reduce-scatter on its stream, 16 bytes per parameter as on N ranks.
  // torch 2.9 skips the one-rank all-gather (pytorch#160135): each unit's 16-bit copy is made on the compute stream
  // with no all-gather output; torch 2.8 all-gathers as on several ranks.
  auto count = [](const Result& r, const std::string& label, Stream stream) {
    int n = 0;
    const StepProgram& p = r.devices[0].program;
    for (const Tensor& t : p.tensors)
      if (p.labels[t.label].rfind(label, 0) == 0) {
        CHECK(t.stream == stream);
        ++n;
      }
    return n;
  };
  Config c = llama3_8b_on(1, "prime_rl", "bf16_mixed", 3);
  c.parallel.sharding = "auto";  // prime-rl's: fsdp2
  c.versions.torch = "2.9.0";
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(per_param(r.model_states.weights_bytes) == Approx(4.0).epsilon(0.002));
  CHECK(per_param(r.model_states.gradients_bytes) == Approx(4.0).epsilon(0.002));
  CHECK(per_param(r.model_states.optimizer_bytes) == Approx(8.0).epsilon(0.002));
  CHECK(count(r, "FSDP2 gradient shard", Stream::ReduceScatter) > 0);
  CHECK(count(r, "FSDP unsharded parameters (cast from the one-rank shard)", Stream::Compute) > 0);
  CHECK(count(r, "FSDP2 all-gather output", Stream::AllGather) == 0);
  auto noted = [](const Result& res) {
    for (const auto& n : res.notes)
      if (n.rfind("parallel.sharding fsdp2 on one GPU", 0) == 0) return true;
    return false;
  };
  CHECK(noted(r));

  c.versions.torch = "2.8.0";
  Result before = simulate(c);
  REQUIRE(before.ok);
  CHECK(count(before, "FSDP unsharded parameters (all-gathered)", Stream::Compute) > 0);
  CHECK(count(before, "FSDP2 all-gather output", Stream::AllGather) > 0);

  // torchtitan applies no FSDP on one GPU (parallel_dims.fsdp_enabled): nothing is sharded or unsharded there.
  c.training.framework = "torchtitan";
  Result titan = simulate(c);
  REQUIRE(titan.ok);
  CHECK(count(titan, "FSDP", Stream::Compute) == 0);
  CHECK_FALSE(noted(titan));
  CHECK(per_param(titan.model_states.weights_bytes) < 3.0);  // 16-bit weights beside an fp32 master copy
}

TEST_CASE("FSDP SHARD_GRAD_OP keeps every layer unsharded from forward to backward", "[distributed][fsdp]") {
  // MEMORY_FORMULAS.md 2.5: "unsharded params of ALL units stay resident from forward until their backward";
  // FULL_SHARD keeps only the root unit (embeddings, final norm, head: FSDP2 root reshard_after_forward=False).
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 3);
  Result full = simulate(c);
  c.parallel.zero_stage = 2;
  Result grad_op = simulate(c);
  REQUIRE(full.ok);
  REQUIRE(grad_op.ok);
  const int64_t kept_full = live_before(full.devices[0], "backward (step 2", Component::Communication);
  const int64_t kept_op = live_before(grad_op.devices[0], "backward (step 2", Component::Communication);
  // Root unit: embed_tokens + lm_head + norm in bf16 = 2 x (2 x 128256 x 4096 + 4096) bytes; torchtitan also keeps
  // the last block (apply_fsdp: reshard_after_forward = layer_id < len(layers) - 1): q, o 4096^2, k, v 1024 x 4096,
  // gate, up, down 4096 x 14336 and two norms, in bf16.
  const int64_t root = 2 * (2 * 128256LL * 4096 + 4096);
  const int64_t last_block = 2 * (2 * 4096LL * 4096 + 2 * 1024 * 4096 + 3 * 4096LL * 14336 + 2 * 4096);
  CHECK(kept_full == root + last_block);
  c.training.framework = "torchtune";  // fully_shard of every layer with the same reshard_after_forward
  c.parallel.zero_stage = 3;
  CHECK(live_before(simulate(c).devices[0], "backward (step 2", Component::Communication) == root);
  CHECK(per_param(kept_op) == Approx(2.0).epsilon(0.001));  // the whole model in bf16
  CHECK(grad_op.devices[0].peak.allocated_bytes > full.devices[0].peak.allocated_bytes);
}

TEST_CASE("FSDP2 with the embedding and output layer as units of their own keeps no root between passes", "[distributed][fsdp]") {
  // torchtune's custom_sharded_layers ['tok_embeddings', 'output'] (training/_distributed.py shard_model): each is
  // fully_shard'ed with reshard_after_forward, so nothing of them stays unsharded from forward to backward, where the
  // root unit keeps both matrices (and the final norm) through the step.
  Config c = llama3_8b_on(8, "torchtune", "bf16_pure", 3);
  c.parallel.sharding = "fsdp2";
  const Result root = simulate(c);
  c.parallel.fsdp_shard_embeddings = true;
  REQUIRE(validate(c).empty());
  const Result units = simulate(c);
  REQUIRE(root.ok);
  REQUIRE(units.ok);
  CHECK(live_before(root.devices[0], "backward (step 2", Component::Communication) == 2 * (2 * 128256LL * 4096 + 4096));
  CHECK(live_before(units.devices[0], "backward (step 2", Component::Communication) == 0);
  CHECK(units.devices[0].peak.allocated_bytes < root.devices[0].peak.allocated_bytes);
  // Only FSDP2 with full sharding has such units.
  c.parallel.sharding = "fsdp1";
  CHECK(!validate(c).empty());
}

TEST_CASE("DTensor sequence parallel: the column-parallel linears save the all-gathered norm output", "[distributed][tp]") {
  // torchtitan's TP plan (SequenceParallel norms, ColwiseParallel(input_layouts=Shard(1))) all-gathers each norm's
  // sequence-sharded output and F.linear saves that [T, h] tensor; Megatron saves its T / t shard and all-gathers
  // again in backward (Korthikanti et al. 2022 sec. 4.2.2). Two norms per layer: 2 x 2 x (T - T / t) x h more.
  const int64_t s = 2048, h = 4096, t = 4;
  Config c = llama3_8b_on(1, "torchtune", "bf16_pure", 0);
  c.training.activation_checkpointing = "none";
  c.training.attention = "sdpa_repeat_kv";
  c.training.norm_impl = "eager_fp32";
  c.training.loss = "full_fp32";
  c.parallel.tensor_parallel_size = t;
  c.parallel.sequence_parallel = true;
  auto per_layer = [&](const std::string& framework) {
    c.training.framework = framework;
    return per_layer_activations(c);
  };
  CHECK(per_layer("torchtitan") - per_layer("torchtune") == 2 * 2 * (s - s / t) * h);
}

TEST_CASE("FSDP prefetch depth: k more blocks' parameters held while one computes", "[distributed][fsdp]") {
  // FSDP2 set_modules_to_forward_prefetch / set_modules_to_backward_prefetch (k next blocks) and FSDP1
  // forward_prefetch=True (k = 1): the prefetched blocks are unsharded while the current one runs. Llama-3-8B's
  // block in bf16: q, o 4096^2, k, v 1024 x 4096, gate, up, down 4096 x 14336 and two norms.
  const int64_t block = 2 * (2 * 4096LL * 4096 + 2 * 1024 * 4096 + 3 * 4096LL * 14336 + 2 * 4096);
  Config c = llama3_8b_on(8, "torchtune", "bf16_mixed", 3);
  auto most_gathered = [&](const char* phase) {
    Result r = simulate(c);
    REQUIRE(r.ok);
    return most_live_in(r.devices[0].program, phase, [](const Tensor& t) {
      return t.component == Component::Communication && t.stream == Stream::Compute;
    }, mid_layer);
  };
  const int64_t fwd = most_gathered("forward (step 2"), bwd = most_gathered("backward (step 2");
  c.parallel.fsdp_forward_prefetch = 2;
  CHECK(most_gathered("forward (step 2") - fwd == 2 * block);
  c.parallel.fsdp2_backward_prefetch = 3;  // the default is 1
  CHECK(most_gathered("backward (step 2") - bwd == 2 * block);
  c.parallel.sharding = "fsdp1";
  Result bad = simulate(c);
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "parallel.fsdp_forward_prefetch");
}

TEST_CASE("FSDP1 with frozen layers and reentrant checkpointing: inputs and their gradients stay, no backward prefetch",
          "[distributed][fsdp][peft]") {
  // docs/research/fsdp1-frozen-reentrant.md. The HF Trainer wraps PEFT's adapters as units of their own, so each
  // decoder layer's FlatParameter is frozen and FSDP1 (torch 2.1+) reshards it through a multi-grad hook on its
  // inputs; reentrant checkpointing recomputes the layer on leaves, which the hook holds with their .grad until
  // backward ends. And no layer forwarded without grad is marked for a pre-backward unshard, so BACKWARD_PRE
  // prefetches none of them.
  const int64_t b = 1, s = 2048, h = 4096, L = 32;
  const int64_t block = 2 * (2 * 4096LL * 4096 + 2 * 1024 * 4096 + 3 * 4096LL * 14336 + 2 * 4096);
  Config c = llama3_8b_on(2, "hf_trainer", "bf16_pure", 3);
  c.parallel.sharding = "fsdp1";
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  c.versions.transformers = "4.48";  // reentrant checkpointing by default before 5.0
  auto in_backward = [&](const Config& k, auto&& counts) {
    Result r = simulate(k);
    REQUIRE(r.ok);
    const StepProgram& p = r.devices[0].program;
    return most_live_in(p, "backward (step 2", [&](const Tensor& t) { return counts(p, t); });
  };
  auto residual_grads = [](const StepProgram& p, const Tensor& t) { return p.labels[t.label] == "gradient of the residual stream"; };
  auto gathered_layers = [](const StepProgram& p, const Tensor& t) {
    return p.labels[t.label] == "FSDP unsharded parameters (all-gathered)" && mid_layer(t);
  };
  const int64_t grad = 2 * b * s * h;
  // Every layer's input gradient is held to the end: at layer 0 the 31 above it, and its own once computed.
  CHECK(in_backward(c, residual_grads) >= (L - 1) * grad);
  // One layer unsharded at a time (its adapters, units of their own, add under 1 MiB).
  const int64_t one = in_backward(c, gathered_layers);
  CHECK(one >= block);
  CHECK(one < block + (1 << 20));
  Config before = c;
  before.versions.torch = "2.0";  // before pytorch#101982: no reshard-only hook
  CHECK(in_backward(before, residual_grads) <= 3 * grad);
  Config non_reentrant = c;
  non_reentrant.training.checkpoint_reentrant = "false";  // the layer's inputs are not leaves; its forward marks it
  CHECK(in_backward(non_reentrant, residual_grads) <= 3 * grad);
  CHECK(in_backward(non_reentrant, gathered_layers) == 2 * one);
  Config unfrozen = c;
  unfrozen.parallel.fsdp_use_orig_params = "true";  // Block units mixing in the adapters have a gradient
  CHECK(in_backward(unfrozen, residual_grads) <= 3 * grad);
  // The checkpoint inside the unit, FSDP(CheckpointWrapper(layer)) (apply_activation_checkpointing after the
  // wrap): the unit's forward runs with grad on the real activations, so neither rule applies.
  Config inside = c;
  inside.parallel.fsdp_checkpoint_in_units = true;
  CHECK(in_backward(inside, residual_grads) <= 3 * grad);
  CHECK(in_backward(inside, gathered_layers) == 2 * one);
}

TEST_CASE("FSDP1 use_orig_params gives frozen weights gradients, no_sync accumulation holds them unsharded", "[distributed][fsdp][peft]") {
  // Fabric's FSDPStrategy (framework litgpt) wraps with use_orig_params=True: a Block's FlatParameter mixes the
  // frozen base weights with the LoRA matrices and has a gradient for all of it ("equivalent to not freezing those
  // parameters", PyTorch FSDP docs); its micro-batches accumulate under no_sync(), unsharded until the last.
  // Llama-3-8B's Block: q, o 4096^2, k, v 1024 x 4096, gate, up, down 4096 x 14336, two norms; 32 of them.
  const int64_t block = 2 * 4096LL * 4096 + 2 * 1024 * 4096 + 3 * 4096LL * 14336 + 2 * 4096;
  Config c = llama3_8b_on(2, "litgpt", "bf16_pure", 3);
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  c.training.gradient_accumulation_steps = 4;
  Result with = simulate(c);
  c.parallel.fsdp_use_orig_params = "false";
  Result without = simulate(c);
  REQUIRE(with.ok);
  REQUIRE(without.ok);
  // The root (embeddings, final norm, head) trains nothing, so only the Blocks' frozen weights gain a shard.
  CHECK(with.model_states.gradients_bytes - without.model_states.gradients_bytes == 2 * 32 * block / 2);
  // Before the last micro-batch's backward every Block's unsharded gradient is held: 2 bytes x its parameters.
  const int64_t held = live_before(with.devices[0], "backward (step 2, micro-batches 2-4)", Component::Gradients);
  CHECK(held >= 2 * 32 * block);
  // Syncing every micro-batch (Accelerate's sync_each_batch=True) keeps only the gradient shards between them.
  c.parallel.fsdp_use_orig_params = "auto";
  c.parallel.fsdp_no_sync = "false";
  Result synced = simulate(c);
  REQUIRE(synced.ok);
  CHECK(live_before(synced.devices[0], "backward (step 2, micro-batches 2-4)", Component::Gradients) ==
        synced.model_states.gradients_bytes);
  CHECK(synced.devices[0].peak.allocated_bytes < with.devices[0].peak.allocated_bytes);
  c.parallel.fsdp_use_orig_params = "maybe";
  Result bad = simulate(c);
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "parallel.fsdp_use_orig_params");
}

TEST_CASE("HSDP shards over the shard group only", "[distributed][fsdp]") {
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 3);
  const ModelStates eight = simulate(c).model_states;
  c.parallel.data_parallel_size = 32;
  c.parallel.shard_group_size = 8;  // 4 replicas of an 8-way shard
  const ModelStates hybrid = simulate(c).model_states;
  CHECK(hybrid.weights_bytes == eight.weights_bytes);
  CHECK(hybrid.gradients_bytes == eight.gradients_bytes);
  CHECK(hybrid.optimizer_bytes == eight.optimizer_bytes);
}

TEST_CASE("Megatron: 18 bytes per parameter, 6 + 12/d with the distributed optimizer", "[distributed][megatron]") {
  // Megatron-LM docs/source/api-guide/dist_optimizer.md: bf16 params + fp32 main grads, fp32 main params and
  // Adam states: 2 + 4 + 12 = 18; the distributed optimizer shards the 12 over the data-parallel ranks.
  Config c = llama3_8b_on(8, "megatron", "bf16_mixed", 0);
  ModelStates m = simulate(c).model_states;
  CHECK(per_param(m.weights_bytes) == Approx(2.0));
  CHECK(per_param(m.gradients_bytes) == Approx(4.0));  // main grads are fp32 under bf16 (arguments.py)
  CHECK(per_param(m.optimizer_bytes) == Approx(12.0));
  c.parallel.zero_stage = 1;
  m = simulate(c).model_states;
  CHECK(per_param(m.weights_bytes + m.gradients_bytes) == Approx(6.0));
  CHECK(per_param(m.optimizer_bytes) * 8 == Approx(12.0).epsilon(1e-6));
  // The main-grad buffer exists from model load: no .grad tensors come and go in backward.
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(live_before(r.devices[0], "forward (step 1", Component::Gradients) == m.gradients_bytes);
  c.parallel.zero_stage = 2;
  CHECK_FALSE(simulate(c).ok);  // Megatron does not shard gradients or parameters
}

TEST_CASE("context parallel: each rank saves what a cp-times shorter sequence saves", "[distributed][cp]") {
  // Ring attention keeps only the local sequence chunk's activations (flash output and logsumexp included);
  // the rotating key/value buffers are transients.
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 3);
  c.training.activation_checkpointing = "none";
  c.training.sequence_length = 2048;
  const int64_t short_seq = live_before(simulate(c).devices[0], "backward (step 2", Component::Activations);
  c.training.sequence_length = 8192;
  c.parallel.context_parallel_size = 4;
  c.parallel.data_parallel_size = 2;  // the shard group stays dp x cp = 8
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(live_before(r.devices[0], "backward (step 2", Component::Activations) == short_seq);
  CHECK(r.devices[0].device_count == 8);
  c.training.sequence_length = 8190;  // not a multiple of 2 x cp
  Result bad = simulate(c);
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "parallel.context_parallel_size");
}

TEST_CASE("context parallel: the all-gather rotater's key/value buffer grows with cp at a fixed length per rank", "[distributed][cp]") {
  // torch _attention.py _AllGatherRotater (torchtitan's default): cp x the local keys and values in one buffer for
  // the whole ring loop, plus next_kv = cat(k, v); the all-to-all rotater holds two chunks whatever the degree.
  // The config runs SDPA with native GQA (single_gpu_config), so a chunk is 2 x bf16 x tokens x the 8 KV heads' width.
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 3);
  c.training.activation_checkpointing = "none";
  auto ring_bytes = [&](int64_t cp) {
    c.parallel.context_parallel_size = cp;
    c.parallel.data_parallel_size = 8 / cp;
    c.training.sequence_length = 2048 * cp;  // 2048 tokens on every rank
    Result r = simulate(c);
    REQUIRE(r.ok);
    int64_t most = 0;
    const StepProgram& p = r.devices[0].program;
    for (const Tensor& t : p.tensors)
      if (p.labels[t.label].rfind("ring attention", 0) == 0) most = std::max(most, t.bytes);
    return most;
  };
  const int64_t chunk = 2 * 2 * 2048LL * 1024;
  const int64_t two = ring_bytes(2), four = ring_bytes(4);
  CHECK(four - two == 2 * chunk);
  c.parallel.cp_rotate_method = "alltoall";
  CHECK(ring_bytes(4) == ring_bytes(2));
  CHECK(ring_bytes(4) == four - 3 * chunk);
}

TEST_CASE("expert parallel: each rank holds num_experts / ep experts", "[distributed][ep]") {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/mixtral-8x7b.json")));
  REQUIRE(p.ok);
  ModelShape whole = build_model_shape(p.config.model);
  ModelShape split = whole;
  apply_expert_parallel(split, 8);
  // Per layer: 8 experts x 3 x 4096 x 14336 routed parameters, of which one expert stays per rank.
  const int64_t expert = 3LL * 4096 * 14336;
  CHECK(whole.params_per_moe_layer - split.params_per_moe_layer == 7 * expert);
  Config c = p.config;
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 4096;
  c.parallel.data_parallel_size = 8;
  c.parallel.expert_parallel_size = 8;
  c.parallel.zero_stage = 1;
  Result r = simulate(c);
  REQUIRE(r.ok);
  c.parallel.expert_parallel_size = 3;
  Result bad = simulate(c);
  REQUIRE_FALSE(bad.ok);
  CHECK(bad.errors[0].field == "parallel.expert_parallel_size");
}

TEST_CASE("interleaved 1F1B: the first stage holds 1 + (p - 1) / (p v) times 1F1B's activations", "[distributed][pp]") {
  // Korthikanti et al. 2022 eq. (5) and the interleaved schedule of Narayanan et al. 2021: here the in-flight
  // chunks come out of simulating Megatron's interleaved order.
  Config c = llama3_8b_on(1, "megatron", "bf16_fp32_grads", 0);
  c.training.activation_checkpointing = "full";
  c.training.gradient_accumulation_steps = 16;
  c.parallel.pipeline_parallel_size = 4;
  Result f1b = simulate(c);
  c.parallel.pipeline_schedule = "interleaved_1f1b";
  c.parallel.virtual_pipeline_stages = 2;
  Result inter = simulate(c);
  REQUIRE(f1b.ok);
  REQUIRE(inter.ok);
  // Full checkpointing saves each layer's input only: the embedding output, a received activation or the
  // previous layer's output. Count those alive at the first backward of step 2.
  auto saved_inputs = [](const DeviceResult& d) {
    uint32_t end = 0;
    for (const auto& ph : d.program.phases)
      if (ph.name.rfind("backward (step 2", 0) == 0) {
        end = ph.first_event;
        break;
      }
    int64_t live = 0;
    for (uint32_t i = 0; i < end; ++i) {
      const auto& t = d.program.tensors[d.program.events[i].tensor];
      const std::string& l = d.program.labels[t.label];
      if (l == "residual stream" || l.rfind("activation or gradient exchanged", 0) == 0)
        live += d.program.events[i].op == Event::Op::Alloc ? 1 : -1;
    }
    return live;
  };
  CHECK(saved_inputs(f1b.devices[0]) == 4 * 8);     // p micro-batches x L / p layers
  CHECK(saved_inputs(inter.devices[0]) == 11 * 4);  // (p - 1) 2 + (v - 1) p + 1 chunks x L / (p v) layers
  CHECK(static_cast<double>(saved_inputs(inter.devices[0])) / saved_inputs(f1b.devices[0]) == Approx(1.0 + 3.0 / 8.0));
  CHECK(inter.devices[0].role.find("layers 0-3, 16-19") != std::string::npos);
}

TEST_CASE("torch.distributed.pipelining keeps a receive buffer per micro-batch", "[distributed][pp]") {
  // stage.py _prepare_forward_infra / _prepare_backward_infra: every stage after the first allocates an input
  // buffer for each micro-batch, every stage before the last a gradient buffer, on the first step, and keeps them.
  // Each is [micro-batch, sequence / tp, hidden] in the residual dtype: 1 x 2048 x 4096 x 2 B = 16 MiB here.
  Config c = llama3_8b_on(1, "torchtitan", "bf16_pure", 0);
  c.parallel.pipeline_parallel_size = 4;
  c.training.gradient_accumulation_steps = 8;
  Result r = simulate(c);
  REQUIRE(r.ok);
  REQUIRE(r.devices.size() == 4);
  auto buffers = [](const DeviceResult& d) {
    int64_t n = 0;
    for (const auto& t : d.program.tensors)
      if (d.program.labels[t.label].rfind("pipeline receive buffers", 0) == 0) {
        CHECK(t.bytes == 2048 * 4096 * 2);
        ++n;
      }
    return n;
  };
  CHECK(buffers(r.devices[0]) == 8);       // gradients from stage 1
  CHECK(buffers(r.devices[1]) == 16);      // activations and gradients
  CHECK(buffers(r.devices[3]) == 8);       // activations from stage 2
  c.training.framework = "megatron";       // Megatron's p2p receives into a fresh tensor per micro-batch
  c.training.precision = "bf16_fp32_grads";
  Result m = simulate(c);
  REQUIRE(m.ok);
  CHECK(buffers(m.devices[1]) == 0);
}

TEST_CASE("uneven pipeline splits give the first and last stage their own layer counts", "[distributed][pp]") {
  Config c = llama3_8b_on(1, "megatron", "bf16_fp32_grads", 0);
  c.parallel.pipeline_parallel_size = 4;
  c.parallel.pipeline_first_stage_layers = 5;
  c.parallel.pipeline_last_stage_layers = 7;
  Result r = simulate(c);
  REQUIRE(r.ok);
  REQUIRE(r.devices.size() == 4);
  CHECK(r.devices[0].role.find("layers 0-4,") != std::string::npos);
  CHECK(r.devices[1].role.find("layers 5-14)") != std::string::npos);
  CHECK(r.devices[3].role.find("layers 25-31,") != std::string::npos);
  c.parallel.pipeline_last_stage_layers = 6;  // 21 layers left for 2 stages
  CHECK_FALSE(simulate(c).ok);
}

TEST_CASE("offload moves the optimizer to host RAM and says whether the node holds it", "[distributed][offload]") {
  // ZeRO-Offload: the fp32 master, Adam states and fp32 gradient partition live on the CPU: 16 Psi / N per GPU,
  // the per-GPU part of DeepSpeed's estimate_zero3_model_states_mem_needs (MEMORY_FORMULAS.md 2.2).
  Config c = llama3_8b_on(8, "deepspeed", "bf16_mixed", 3);
  c.parallel.offload_optimizer = "cpu";
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.model_states.optimizer_bytes == 0);
  CHECK(r.model_states.gradients_bytes == 0);
  CHECK(per_param(r.devices[0].host_bytes) * 8 == Approx(16.0).epsilon(1e-6));
  CHECK(r.host.per_node_bytes == 8 * r.devices[0].host_bytes);
  CHECK(r.host.fits);
  c.hardware.host_memory_bytes = 64LL << 30;  // 64 GiB cannot hold 8 x 16 GB
  CHECK_FALSE(simulate(c).host.fits);
  c.parallel.offload_params = "cpu";
  Result both = simulate(c);
  REQUIRE(both.ok);
  CHECK(both.model_states.weights_bytes < r.model_states.weights_bytes / 10);  // only persistent small params
  CHECK(both.devices[0].peak.allocated_bytes < r.devices[0].peak.allocated_bytes);
  // On one GPU ZeRO-Infinity still fetches each module's parameters before its forward and backward
  // (partitioned_param_coordinator.py), so a layer's bf16 weights come and go on the GPU.
  c.parallel.data_parallel_size = 1;
  Result one = simulate(c);
  REQUIRE(one.ok);
  const int64_t block = 2 * (2 * 4096LL * 4096 + 2 * 1024 * 4096 + 3 * 4096LL * 14336 + 2 * 4096);
  int64_t most = 0, live = 0;
  for (const Event& e : one.devices[0].program.events) {
    const Tensor& t = one.devices[0].program.tensors[e.tensor];
    if (one.devices[0].program.labels[t.label] != "DeepSpeed ZeRO-3 all-gathered layer parameters") continue;
    live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
    most = std::max(most, live);
  }
  CHECK(most >= block);
  c.parallel.zero_stage = 0;
  CHECK_FALSE(simulate(c).ok);  // offload needs sharding
}

TEST_CASE("impossible layouts are refused with what would make them valid", "[distributed][bad-input]") {
  Config c = llama3_8b_on(8, "torchtitan", "bf16_mixed", 1);
  Result r = simulate(c);
  REQUIRE_FALSE(r.ok);
  CHECK(r.errors[0].message.find("FSDP has no optimizer-only sharding") != std::string::npos);
  c = llama3_8b_on(1, "megatron", "bf16_fp32_grads", 0);
  c.parallel.pipeline_parallel_size = 4;
  c.parallel.pipeline_schedule = "interleaved_1f1b";
  c.parallel.virtual_pipeline_stages = 3;  // 12 chunks of 32 layers: the first 8 chunks get 3, the rest 2
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[0].role.find("layers 0-2, 12-14, 24-25") != std::string::npos);
  c.parallel.virtual_pipeline_stages = 9;  // 36 chunks for 32 layers
  r = simulate(c);
  REQUIRE_FALSE(r.ok);
  CHECK(r.errors[0].field == "parallel.pipeline_parallel_size");
  c = llama3_8b_on(1 << 20, "torchtitan", "bf16_mixed", 3);  // a million GPUs neither overflow nor hang
  c.parallel.tensor_parallel_size = 8;
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.model_states.weights_bytes > 0);
}

TEST_CASE("fp8 with Transformer Engine: 1-byte saved linear inputs and 2 bytes per linear weight", "[fp8]") {
  // linear.py _Linear.forward saves the input cast to fp8 (or its fp8 transpose) and keeps weight_fp8 and
  // weight_t_fp8 as buffers. Per layer against bf16: the two norm outputs (T h each) and the down projection's
  // input (T f) drop from 2 bytes to 1, and o_proj keeps an fp8 copy of the attention output (T h_q).
  auto layer_bytes = [](const std::string& precision) {
    auto saved = [&](int64_t layers) {
      Config c = llama3_8b_on(1, "megatron", precision, 0);
      c.training.activation_checkpointing = "none";
      c.training.sequence_length = 1024;
      c.model.num_hidden_layers = layers;
      Result r = simulate(c);
      REQUIRE(r.ok);
      return live_before(r.devices[0], "backward", Component::Activations);
    };
    return saved(2) - saved(1);
  };
  const int64_t T = 1024, h = 4096, f = 14336, hq = 4096;
  CHECK(layer_bytes("fp8_te") - layer_bytes("bf16_fp32_grads") == -(T * h) - (T * h) - T * f + T * hq);
  Config c = llama3_8b_on(1, "megatron", "fp8_te", 0);
  Result te = simulate(c);
  c.training.precision = "bf16_fp32_grads";
  Result bf16 = simulate(c);
  REQUIRE(te.ok);
  REQUIRE(bf16.ok);
  ModelShape shape = build_model_shape(c.model);
  const int64_t linear = shape.num_layers * matmul_numel(shape.layer);  // TE modules: the layers, not lm_head
  CHECK(live_before(te.devices[0], "forward (step 1", Component::Weights) -
            live_before(bf16.devices[0], "forward (step 1", Component::Weights) ==
        2 * linear);
}

TEST_CASE("fp8 all-gather halves FSDP's unsharded linear weights", "[fp8][fsdp]") {
  Config c = llama3_8b_on(8, "torchtitan", "fp8_torchao", 3);
  c.parallel.zero_stage = 2;  // every layer stays unsharded until its backward: the whole model at once
  const int64_t bf16 = live_before(simulate(c).devices[0], "backward (step 2", Component::Communication);
  c.training.precision = "fp8_torchao_fp8_allgather";
  const int64_t fp8 = live_before(simulate(c).devices[0], "backward (step 2", Component::Communication);
  ModelShape shape = build_model_shape(c.model);
  CHECK(bf16 - fp8 == shape.num_layers * matmul_numel(shape.layer));  // the output layer stays 16-bit
}

TEST_CASE("LoRA under tensor parallelism splits with its base linears", "[distributed][peft][tp]") {
  // Megatron-Core / NeMo LoRA (ParallelLinearAdapter): on column-parallel q and v, lora_B splits its outputs and
  // lora_A stays whole. Llama-3-8B, rank 8 on q_proj and v_proj, TP 2: per layer A_q 8 x 4096 + B_q 4096 x 8 / 2
  // + A_v 8 x 4096 + B_v 1024 x 8 / 2, fp32 gradients.
  Config c = llama3_8b_on(1, "megatron", "bf16_pure", 0);
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "q_proj,v_proj";
  c.parallel.tensor_parallel_size = 2;
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t per_layer = 8 * 4096 + 4096 * 8 / 2 + 8 * 4096 + 1024 * 8 / 2;
  CHECK(r.model_states.gradients_bytes == 32 * per_layer * 4);
  c.parallel.pipeline_parallel_size = 2;  // and with a pipeline: each stage holds its layers' adapters
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.devices[0].model_states.gradients_bytes == 16 * per_layer * 4);
  c.peft.base_quantization = "nf4";
  r = simulate(c);
  REQUIRE_FALSE(r.ok);
  CHECK(r.errors[0].field == "peft.base_quantization");
}

TEST_CASE("modules_to_save trains a copy beside the frozen original", "[peft]") {
  // peft/utils/other.py ModulesToSaveWrapper: original_module stays (frozen) and modules_to_save["default"] is a
  // deepcopy that trains, so lm_head counts twice in the total and once in the trainable parameters.
  Config c = single_gpu_config("llama-3-8b.json", 1, 512);
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  const Result base = simulate(c);
  c.peft.modules_to_save = "lm_head";
  const Result saved = simulate(c);
  REQUIRE(base.ok);
  REQUIRE(saved.ok);
  const int64_t head = 128256LL * 4096;
  CHECK(saved.params_total - base.params_total == head);
  CHECK(saved.params_trainable - base.params_trainable == head);
}

TEST_CASE("QLoRA under FSDP shards the quantized storage", "[peft][fsdp]") {
  // FSDP over a bitsandbytes base (FSDP-QLoRA, bnb_4bit_quant_storage): each rank holds 1/N of the packed 4-bit
  // weights and their statistics; the adapters' states shard too.
  Config c = single_gpu_config("llama-3-8b.json", 1, 1024);
  c.peft.method = "lora";
  c.peft.target_modules = "all-linear";
  c.peft.base_quantization = "nf4";
  c.peft.adapter_dtype = "fp32";  // the same adapters under both frameworks (torchtune's would take the model's bf16)
  c.peft.prepare_kbit = "false";  // ... and the same 16-bit embedding and head (torchtune calls no kbit preparation)
  const ModelStates one = simulate(c).model_states;
  c.training.framework = "torchtune";
  c.parallel.data_parallel_size = 8;
  c.parallel.zero_stage = 3;
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(static_cast<double>(r.model_states.weights_bytes) == Approx(static_cast<double>(one.weights_bytes) / 8).epsilon(0.01));
  CHECK(static_cast<double>(r.model_states.optimizer_bytes) == Approx(static_cast<double>(one.optimizer_bytes) / 8).epsilon(0.01));
}

TEST_CASE("DeepSpeed ZeRO-3 prefetches ahead to stage3_max_live_parameters, on the all-gather stream", "[distributed][zero]") {
  // partitioned_param_coordinator.py fetch_sub_module: once the trace is known, every module call prefetches while
  // fewer than max_live elements are gathered, a parameter at a time; so in step 2 the gathered working set reaches
  // max_live and overshoots it by less than one parameter. Llama-3-8B's largest layer parameter is an MLP matrix of
  // 4096 x 14336 elements; the embedding and head (128256 x 4096) are larger still, so the window is read mid-model.
  Config c = llama3_8b_on(8, "deepspeed", "bf16_mixed", 3);
  const int64_t mlp = 4096LL * 14336;
  auto most_gathered = [&](const char* phase) {
    Result r = simulate(c);
    REQUIRE(r.ok);
    const StepProgram& p = r.devices[0].program;
    auto gathered = [&](const Tensor& t) { return p.labels[t.label] == "DeepSpeed ZeRO-3 all-gathered layer parameters"; };
    for (const Tensor& t : p.tensors)
      if (gathered(t)) CHECK(t.stream == Stream::AllGather);  // overlap_comm, the stage-3 default
    return most_live_in(p, phase, gathered, mid_layer);
  };
  for (const char* phase : {"forward (step 2", "backward (step 2"}) {
    INFO(phase);
    const int64_t elems = most_gathered(phase) / 2;  // bf16
    CHECK(elems >= 1000000000);
    CHECK(elems < 1000000000 + 2 * mlp);  // the overshoot, and the module computing
    c.parallel.zero_max_live_parameters = 300000000;
    const int64_t lower = most_gathered(phase) / 2;
    CHECK(lower >= 300000000);
    CHECK(lower < 300000000 + 2 * mlp);
    c.parallel.zero_max_live_parameters = 0;
  }
  c.parallel.zero_overlap_comm = "false";  // then the gathers share the compute stream's pool
  Result r = simulate(c);
  REQUIRE(r.ok);
  for (const Tensor& t : r.devices[0].program.tensors)
    if (r.devices[0].program.labels[t.label] == "DeepSpeed ZeRO-3 all-gathered layer parameters") CHECK(t.stream == Stream::Compute);
}
