// Unsloth as a framework (src/core/unsloth.cpp, docs/research/unsloth.md): the bytes its kernels, loss paths and
// buffers keep, each against the rule it comes from.
#include <catch2/catch.hpp>

#include "core/frameworks.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// A QLoRA Llama 3 8B run as the Unsloth notebooks set it up: r 16 on every linear, no dropout, 8-bit AdamW,
// use_gradient_checkpointing="unsloth" (full checkpointing with activation_offload).
Config unsloth_config(const char* version, int64_t micro_batch = 2, int64_t sequence = 2048) {
  Config c = single_gpu_config("llama-3-8b.json", micro_batch, sequence);
  c.training.framework = "unsloth";
  c.training.attention = "auto";
  c.training.optimizer = "adamw_8bit";
  c.training.activation_checkpointing = "full";
  c.training.activation_offload = true;
  c.peft.method = "lora";
  c.peft.lora_rank = 16;
  c.peft.lora_dropout = 0;
  c.peft.target_modules = "all-linear";
  c.peft.base_quantization = "nf4";
  c.peft.prepare_kbit = "false";
  c.versions.unsloth = version;
  return c;
}

Result run(const Config& c) {
  const auto errors = validate(c);
  INFO((errors.empty() ? std::string() : errors[0].message));
  REQUIRE(errors.empty());
  Result r = simulate(c);
  REQUIRE(r.ok);
  return r;
}

// The bytes of the live tensors whose label starts with `prefix`, at their most during the program.
int64_t most_live(const StepProgram& p, const std::string& prefix) {
  int64_t live = 0, most = 0;
  for (const auto& e : p.events) {
    const Tensor& t = p.tensors[e.tensor];
    if (p.labels[t.label].rfind(prefix, 0) != 0) continue;
    live += (e.op == Event::Op::Alloc ? 1 : -1) * t.bytes;
    most = std::max(most, live);
  }
  return most;
}

}  // namespace

TEST_CASE("unsloth: each loss path keeps what its kernel keeps", "[unsloth]") {
  const int64_t T = 2 * 2048, V = 128256, h = 4096;
  // Materialised 16-bit logits, saved and overwritten by their own gradient (fast_cross_entropy_loss).
  const Result logits = run(unsloth_config("2024.8"));
  CHECK(most_live(logits.devices[0].program, "logits") == 2 * T * V);
  CHECK(most_live(logits.devices[0].program, "loss backward") == 0);
  // Cut cross-entropy (2024.12): never a [tokens, vocab] tensor.
  const Result cce = run(unsloth_config("2024.12"));
  CHECK(most_live(cce.devices[0].program, "logits") == 0);
  CHECK(cce.devices[0].peak.allocated_bytes < logits.devices[0].peak.allocated_bytes);
  // unsloth_fused_ce_loss (2025.11): the input's gradient made in the forward and one chunk of a quarter of the
  // tokens (n_chunks = ceil(fp32 logits / target / 4) * 4 = 4 here) in 16-bit logits, fp32 upcast and fp32 gradient.
  const Result fused = run(unsloth_config("2025.11"));
  CHECK(most_live(fused.devices[0].program, "Unsloth fused cross-entropy: lm_head input gradient") == 2 * T * h);
  CHECK(most_live(fused.devices[0].program, "Unsloth fused cross-entropy: one chunk") == (2 + 8) * (T / 4) * V);
  // 2025.1 to 2025.10: a micro-batch of at most 1024 tokens takes the materialised logits instead.
  const Result small = run(unsloth_config("2025.1", 1, 1024));
  CHECK(most_live(small.devices[0].program, "logits") == 2 * 1024 * V);
  const Result large = run(unsloth_config("2025.1", 1, 1025));
  CHECK(most_live(large.devices[0].program, "logits") == 0);
}

TEST_CASE("unsloth: smart checkpointing reloads into one buffer and keeps the last layer's input", "[unsloth]") {
  const int64_t T = 2 * 2048, h = 4096;
  // 2025.2: the offloaded checkpointer; 2025.3: the smart one. Both offload every layer input of this size in the
  // first step; the smart one has its buffer of tokens x hidden (grown from 2 MiB) and keeps the last input after.
  const Result offload = run(unsloth_config("2025.2"));
  const Result smart = run(unsloth_config("2025.3"));
  CHECK(most_live(offload.devices[0].program, "Unsloth checkpointing GPU buffer") == 0);
  // resize_ makes the grown storage before the initial 2 MiB one goes.
  const int64_t initial = 2 * 2 * 256 * 2048;
  CHECK(most_live(smart.devices[0].program, "Unsloth checkpointing GPU buffer") == 2 * T * h + initial);
  // Double buffering (2026.6): a second buffer of the same size from the second step.
  const Result twice = run(unsloth_config("2026.6"));
  CHECK(most_live(twice.devices[0].program, "Unsloth checkpointing GPU buffer") == 2 * 2 * T * h + initial);
  // The persistent dequantization buffer from 2025.2: Llama 3 8B's largest linear is 14336 x 4096, in bf16, and
  // its fp32 absmax per 64 elements.
  const int64_t w = int64_t{14336} * 4096;
  CHECK(most_live(smart.devices[0].program, "Unsloth dequantization buffer") == 2 * w + 4 * (w / 64));
  CHECK(most_live(run(unsloth_config("2025.1")).devices[0].program, "Unsloth dequantization buffer") == 0);
  // An MoE under transformers 4: each routed expert's projection is a 4-bit linear of its own, so the buffer holds
  // the largest one (here the dense MLP's), not memsim's stack of all experts (found by the ERNIE-4.5 notebook case).
  Config moe = unsloth_config("2025.3", 1, 512);
  moe.versions.transformers = "4.56.2";
  moe.model.num_experts = 64;
  moe.model.num_experts_per_tok = 6;
  moe.model.moe_intermediate_size = 1536;
  moe.model.first_k_dense_replace = 1;
  CHECK(most_live(run(moe).devices[0].program, "Unsloth dequantization buffer") == 2 * w + 4 * (w / 64));
  moe.model.first_k_dense_replace = 0;  // every layer MoE: q_proj's 4096 x 4096 outgrows one expert's 1536 x 4096
  const int64_t one = int64_t{4096} * 4096;
  CHECK(most_live(run(moe).devices[0].program, "Unsloth dequantization buffer") == 2 * one + 4 * (one / 64));
  // Under 512 tokens of max_seq_length "unsloth" is plain checkpointing: nothing goes to the host, no buffer grows.
  const Result short_seq = run(unsloth_config("2025.3", 8, 256));
  CHECK(most_live(short_seq.devices[0].program, "Unsloth checkpointing GPU buffer") == initial);
}

TEST_CASE("unsloth: the LoRA kernels keep less than PEFT's layers on the same run", "[unsloth]") {
  // Without checkpointing every layer's saved set stays: LoRA_MLP keeps X, e and g where PEFT's LoRA keeps the
  // gate, up, activation and product besides each adapter's X @ A. (Unsloth's RoPE rotates q and k in place where
  // HF's makes rotated copies and frees the projections: the same bytes saved in pure bf16.)
  Config u = unsloth_config("latest", 1, 1024);
  u.training.activation_checkpointing = "none";
  u.training.activation_offload = false;
  Config hf = u;
  hf.training.framework = "hf_trainer";
  hf.training.loss = "fused_linear";  // the same loss's footprint aside
  u.training.loss = "cut_cross_entropy";
  hf.training.norm_impl = "fused";
  hf.training.attention = "sdpa_repeat_kv";
  hf.peft.adapter_dtype = "bf16";
  const int64_t per_layer_unsloth = per_layer_activations(u);
  const int64_t per_layer_hf = per_layer_activations(hf);
  const int64_t T = 1024, f = 14336;
  // PEFT's extra: silu(gate) and its product [T, f] each, and X @ A [T, 16] of 7 adapters.
  CHECK(per_layer_hf - per_layer_unsloth == 2 * (2 * T * f) + 7 * 2 * T * 16);
}

TEST_CASE("unsloth: validation keeps it to what it models", "[unsloth]") {
  Config c = unsloth_config("latest");
  c.parallel.zero_stage = 3;
  c.parallel.data_parallel_size = 2;
  CHECK(!validate(c).empty());
  c = unsloth_config("latest");
  c.training.activation_checkpointing = "none";  // activation_offload is Unsloth's checkpointing here
  const auto e = validate(c);
  REQUIRE(e.size() == 1);
  CHECK(e[0].field == "training.activation_offload");
}
