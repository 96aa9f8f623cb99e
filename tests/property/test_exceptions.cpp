// The named mechanisms behind exceptions to the relations of test_relations.cpp, each shown on one setup.
#include <catch2/catch.hpp>

#include <utility>

#include "core/catalog.h"
#include "core/serialize.h"
#include "core/simulate.h"

using namespace memsim;

namespace {
int64_t optimizer_bytes(const Config& c) {
  Result r = simulate(c);
  REQUIRE(r.ok);
  return r.devices[0].model_states.optimizer_bytes;
}

// `c` trained in fp32 (no master copy, so the optimizer states alone differ) with `optimizer` under DeepSpeed on two
// GPUs, unsharded and under ZeRO-1.
std::pair<Config, Config> zero0_and_zero1(Config c, const char* optimizer) {
  c.training.precision = "fp32";
  c.training.optimizer = optimizer;
  c.parallel.sharding = "deepspeed";
  c.parallel.data_parallel_size = 2;
  c.peft.method = "none";
  Config z0 = c, z1 = c;
  z0.parallel.zero_stage = 0;
  z1.parallel.zero_stage = 1;
  return {z0, z1};
}

// A small decoder of one attention head (head_dim = hidden), for the mechanisms that show only where tensors are
// small: 16 tokens of micro-batch 1.
Config tiny_model(int64_t hidden, int64_t layers, int64_t intermediate, int64_t vocab) {
  Config c;
  c.model.hidden_size = hidden;
  c.model.num_hidden_layers = layers;
  c.model.num_attention_heads = 1;
  c.model.num_key_value_heads = 1;
  c.model.head_dim = 0;
  c.model.intermediate_size = intermediate;
  c.model.vocab_size = vocab;
  c.training.micro_batch_size = 1;
  c.training.sequence_length = 16;
  return c;
}

// `c` fully fine-tuned and with LoRA, both simulated.
std::pair<Result, Result> full_and_lora(const Config& c) {
  Config full = c, lora = c;
  full.peft.method = "none";
  lora.peft.method = "lora";
  std::pair<Result, Result> r{simulate(full), simulate(lora)};
  REQUIRE(r.first.ok);
  REQUIRE(r.second.ok);
  return r;
}
}  // namespace

// DeepSpeed ZeRO-1/2 hand the optimizer one flat 1-D fp32 partition per parameter group (stage_1_and_2.py
// single_partition_of_fp32_groups), and Adafactor factors only tensors of two or more dimensions (transformers
// Adafactor._get_options: factored = len(param_shape) >= 2; torch.optim.Adafactor the same), so the partition gets a
// full second moment: N/dp elements instead of rows + columns per matrix. With few GPUs that is more than unsharded.
TEST_CASE("exception: ZeRO-1 with Adafactor keeps an unfactored second moment of its flat partition", "[property]") {
  const auto [z0, z1] = zero0_and_zero1(Config{}, "adafactor");  // the defaults: a Llama-2-13B shape
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  // Unsharded: rows + columns per matrix, a sliver of the weights. Flat: one fp32 per element of half the model.
  Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t weights = r0.devices[0].model_states.weights_bytes;  // fp32, whole under ZeRO-1
  CHECK(unsharded < weights / 100);
  CHECK(flat == Approx(weights / 2).epsilon(1e-6));
}

// The same flat partition under torchao's 8-bit AdamW: torchao quantizes a state only for a tensor of at least 4,096
// elements whose size is a multiple of its 256-element block (torchao/optim/adam.py _new_buffer: p.numel() >= 4096 and
// p.numel() % block_size == 0, else torch.zeros_like(p)); DeepSpeed pads the flat group to a multiple of 2 x dp only
// (stage_1_and_2.py nccl_start_alignment_factor = 2), so a partition that is not a multiple of 256 keeps two fp32
// states: 8 bytes per element of 1/dp of the model, against about 2 bytes per element of all of it unsharded.
TEST_CASE("exception: ZeRO-1 with torchao's 8-bit AdamW keeps fp32 states when its partition is off the block", "[property]") {
  const ModelPreset* gpt2 = find_model_preset("gpt2");  // 124,439,808 parameters: half is 62,219,904, not / 256
  REQUIRE(gpt2);
  Config c;
  c.model = gpt2->model;
  c.training.sequence_length = 1024;
  const auto [z0, z1] = zero0_and_zero1(c, "adamw_8bit_torchao");
  Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t params = r0.params_trainable;
  REQUIRE(params % 2 == 0);
  REQUIRE((params / 2) % 256 != 0);
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  CHECK(unsharded < params * 3);             // the large matrices quantized: about 2 bytes per element
  CHECK(flat == Approx(params / 2 * 8).epsilon(1e-4));  // the partition's two fp32 states
  CHECK(flat > unsharded);
}

// ZeRO-Offload with ZeRO-2 keeps no gradients and no optimizer states on the GPU: the gradients are reduced into
// host partitions (stage_1_and_2.py cpu_offload: async_accumulate_grad_in_cpu_via_gpu) and the optimizer steps there.
// What full fine-tuning keeps on the GPU is then its weights alone, and LoRA keeps the same weights plus its
// adapters: more, by exactly the adapters' weights.
TEST_CASE("exception: under optimizer offload, LoRA's GPU model states are full fine-tuning's plus the adapters", "[property]") {
  const ModelPreset* gpt2 = find_model_preset("gpt2");
  REQUIRE(gpt2);
  Config c;
  c.model = gpt2->model;
  c.training.sequence_length = 1024;
  c.training.precision = "fp32";
  c.parallel.sharding = "deepspeed";
  c.parallel.data_parallel_size = 2;
  c.parallel.zero_stage = 2;
  c.parallel.offload_optimizer = "cpu";
  const auto [a, b] = full_and_lora(c);
  CHECK(a.model_states.gradients_bytes == 0);
  CHECK(a.model_states.optimizer_bytes == 0);
  CHECK(b.model_states.gradients_bytes == 0);
  CHECK(b.model_states.optimizer_bytes == 0);
  const int64_t adapter_weight_bytes = (b.params_total - a.params_total) * 4;  // fp32 adapters
  REQUIRE(adapter_weight_bytes > 0);
  CHECK(b.model_states.weights_bytes == a.model_states.weights_bytes + adapter_weight_bytes);
}

// FSDP2 shards every parameter on dim 0 and pads it to a multiple of the ranks: each rank holds ceil(rows / N) rows,
// and the unsharded parameter is a view of the all-gather output of N such shards (torch/distributed/fsdp/
// _fully_shard/_fsdp_param.py: padded_sharded_param_size, init_unsharded_param). A tensor with fewer rows than
// ranks is all padding on some ranks, and its unsharded copy grows with N. torchtune keeps the routed experts as one
// [experts, dim, hidden] parameter sharded on dim 0, so with more ranks than a rank's experts the per-GPU peak rises
// with the GPUs; torchtitan shards the experts on dim 1 in exactly that case ("to avoid padding"), and its peak falls.
TEST_CASE("exception: FSDP2's dim-0 padding makes twice the GPUs hold more where experts are fewer than ranks", "[property]") {
  Config c = tiny_model(16, 1, 64, 128);  // every dense tensor's rows divide by the ranks: only the experts pad
  c.model.num_experts = 2;
  c.model.num_experts_per_tok = 1;
  c.training.precision = "fp32";
  c.parallel.zero_stage = 3;
  c.parallel.context_parallel_size = 2;
  c.parallel.expert_parallel_size = 2;  // one expert per rank
  auto requested = [&](const char* framework, int64_t dp) {
    Config x = c;
    x.training.framework = framework;
    x.parallel.data_parallel_size = dp;  // expert shard group: dp x cp / ep = dp ranks
    const Result r = simulate(x);
    REQUIRE(r.ok);
    return r.devices[0].peak.requested_bytes;
  };
  CHECK(requested("torchtune", 4) > requested("torchtune", 2));
  CHECK(requested("torchtitan", 4) < requested("torchtitan", 2));
}

// bitsandbytes' paged optimizers put a state in unified memory, outside the caching allocator, only for a tensor of
// at least 1e5 elements (functional.py / optimizer.py get_state_buffer: "if not self.is_paged or A.numel() < 1e5:
// return torch.zeros_like(A)"). ZeRO hands the optimizer one flat partition of N / dp elements, so with more GPUs
// the partition can drop below 1e5 and its two fp32 states come onto the GPU: the per-GPU peak rises by them.
TEST_CASE("exception: a paged optimizer's partition that drops below 1e5 elements moves its states onto the GPU", "[property]") {
  Config c = tiny_model(64, 2, 1152, 2600);
  c.training.precision = "fp32";
  c.training.optimizer = "paged_adamw";
  c.parallel.sharding = "deepspeed";
  c.parallel.zero_stage = 3;
  auto run = [&](int64_t dp) {
    Config x = c;
    x.parallel.data_parallel_size = dp;
    Result r = simulate(x);
    REQUIRE(r.ok);
    return r;
  };
  const Result a = run(8), b = run(16);
  const int64_t params = a.params_trainable;
  REQUIRE(params / 8 >= 100000);  // paged on 8 GPUs
  REQUIRE(params / 16 < 100000);  // on the GPU on 16
  const int64_t states_on_gpu = 2 * 4 * ((params + 15) / 16);  // exp_avg and exp_avg_sq of the partition, fp32
  CHECK(b.devices[0].peak.requested_bytes > a.devices[0].peak.requested_bytes);
  CHECK(b.devices[0].peak.requested_bytes <= a.devices[0].peak.requested_bytes + states_on_gpu);
}

// FSDP1 with use_orig_params=True (Fabric's default, litgpt): a unit whose FlatParameter mixes frozen and trainable
// tensors has a gradient for all of it (PyTorch FSDP docs: "equivalent to not freezing those parameters"), so LoRA
// keeps gradients for the frozen weights of every unit it adapts, and adds its adapters' weights and gradients. Only
// the optimizer skips the base: with an optimizer without state (plain SGD), a model whose layers outweigh its
// embeddings, and adapters on every linear, LoRA holds more than full fine-tuning.
TEST_CASE("exception: FSDP1 with use_orig_params gives LoRA the base's gradients, so stateless SGD holds more", "[property]") {
  Config c = tiny_model(16, 2, 64, 100);
  c.model.tie_word_embeddings = true;
  c.training.framework = "litgpt";
  c.training.precision = "fp32";
  c.training.optimizer = "sgd";
  c.parallel.data_parallel_size = 2;
  c.parallel.zero_stage = 3;
  c.peft.target_modules = "all-linear";
  const auto [a, b] = full_and_lora(c);
  REQUIRE(a.model_states.optimizer_bytes == 0);
  // One rank's share of the gradients is more than every adapter's fp32 gradient: it holds the base's too.
  const int64_t adapter_params = b.params_total - a.params_total;
  CHECK(b.model_states.gradients_bytes > 4 * adapter_params);
  CHECK(b.model_states.weights_bytes + b.model_states.gradients_bytes >
        a.model_states.weights_bytes + a.model_states.gradients_bytes);
}

// bitsandbytes' 8-bit optimizers keep 32-bit states for a tensor under min_8bit_size = 4,096 elements
// (optim/optimizer.py Optimizer2State.init_state: "if p.numel() < self.args.min_8bit_size" -> fp32 state1/state2).
// ZeRO-1 hands the optimizer one flat partition, 1/dp of the trainable elements; below 4,096 it keeps 8 bytes per
// element, where unsharded the one large tensor was quantized: LoRA adapters on a 512-wide down_proj (its lora_A is
// 8 x 512 = 4,096 elements, the rest 384) on two GPUs.
TEST_CASE("exception: ZeRO-1 with bitsandbytes' 8-bit AdamW keeps fp32 states for a partition under 4096 elements", "[property]") {
  Config c = tiny_model(16, 1, 512, 100);
  c.model.mlp_gated = false;
  c.peft.method = "lora";
  c.peft.lora_rank = 8;
  c.peft.target_modules = "o_proj,down_proj";
  auto [z0, z1] = zero0_and_zero1(c, "adamw_8bit");
  z0.peft = z1.peft = c.peft;
  const Result r0 = simulate(z0);
  REQUIRE(r0.ok);
  const int64_t trainable = r0.params_trainable;
  REQUIRE(trainable == 4096 + 384);
  const int64_t unsharded = optimizer_bytes(z0), flat = optimizer_bytes(z1);
  CHECK(flat == trainable / 2 * 8);  // two fp32 states of the 2,240-element partition
  CHECK(unsharded < flat);           // the 4,096-element lora_A quantized: about 2 bytes per element
}

// DoRA's forward makes two weight-sized transients for the detached column norm (peft tuners/lora/dora.py
// DoraLinearLayer: the base weight cast to x's dtype, plus scaling * lora_weight). Without checkpointing they exist
// only in the forward; with it, each layer's recomputation makes them again inside backward, beside what backward
// holds (gradients, the residual stream's gradient, FSDP's unsharded units). Where weights outweigh activations (a
// wide layer, 16 tokens) that is more than the hidden state the relation allows; with LoRA the same setup holds it.
TEST_CASE("exception: DoRA's weight-sized forward transients return in the recomputation, inside backward", "[property]") {
  const char* link =
      "memsim=2&hidden_size=128&num_hidden_layers=2&num_attention_heads=2&num_key_value_heads=1&head_dim=0&"
      "intermediate_size=64&vocab_size=100&attention_bias=true&norm_type=layernorm&mlp_gated=false&attention_dropout=0.1&"
      "hidden_dropout=0.1&micro_batch_size=1&sequence_length=16&framework=hf_trainer&precision=fp32&compile=true&"
      "method=dora&lora_rank=1&num_virtual_tokens=1&data_parallel_size=1&zero_stage=2&sharding=fsdp1&"
      "context_parallel_size=2&host_memory_bytes=17179869184&c=fawfya";
  const Parsed p = config_from_fragment(link);
  REQUIRE(p.ok);
  const int64_t hidden_state_bytes = 4 * 16 * 128;
  auto requested = [&](const char* method, const char* checkpointing) {
    Config c = p.config;
    c.peft.method = method;
    c.training.activation_checkpointing = checkpointing;
    const Result r = simulate(c);
    REQUIRE(r.ok);
    return r.devices[0].peak.requested_bytes;
  };
  CHECK(requested("dora", "full") > requested("dora", "none") + hidden_state_bytes);
  CHECK(requested("lora", "full") <= requested("lora", "none") + hidden_state_bytes);
}
