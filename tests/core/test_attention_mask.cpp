// transformers' 4-D attention mask by version and what SDPA does with it (frameworks.cpp derive_attention_mask,
// attention_mask.cpp mask_forward and sdpa_mask_inputs; docs/versions.md 5 and 6b): which micro-batches get a mask,
// the tensors each kernel keeps of it, the notes, and latest left as it was.
#include <catch2/catch.hpp>

#include <map>

#include "core/data_shape.h"
#include "core/frameworks.h"
#include "core/model.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "core/train_step.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Llama-3.2-1B (16 layers, 32 query and 8 key/value heads, head_dim 64) on one GPU, pure bf16, no checkpointing, the
// switches that other versions move set explicitly, so that only the mask differs between versions.
Config base(int64_t micro_batch, int64_t sequence) {
  Config c = single_gpu_config("llama-3.2-1b.json", micro_batch, sequence);
  c.training.optimizer_impl = "fused";
  c.training.loss = "hf_fp32_upcast";
  c.training.zero_grad_set_to_none = "true";
  c.training.softmax_saves_input = "false";
  return c;
}

Config with_versions(Config c, const char* transformers, const char* torch) {
  if (transformers) REQUIRE(apply_setting(c, std::string("versions.transformers=") + transformers).empty());
  if (torch) REQUIRE(apply_setting(c, std::string("versions.torch=") + torch).empty());
  REQUIRE(validate(c).empty());
  return c;
}

// A run of one micro-batch per step whose listed lengths vary: every micro-batch of two or more rows is padded.
Config padded_run(Config c, const char* lengths) {
  c.data.lengths = "micro_batches";
  c.data.micro_batch_lengths = lengths;
  c.data.steps = 2;
  return c;
}

struct Device {
  ModelShape shape;
  explicit Device(const Config& c) : shape(build_model_shape(c.model)) { apply_peft(shape, c.peft, false); }
  StepContext context(const Config& c) const {
    return StepContext{c, shape, *find_precision(c.training.precision), *find_optimizer(c.training.optimizer),
                       find_gpu(c.hardware.gpu)};
  }
};

// The program of a config's first step: the fixed shape's two steps, or a run's first step (its first micro-batch).
StepProgram program_of(const Config& c) {
  Device dev(c);
  const StepContext ctx = dev.context(c);
  if (!c.data.varies()) return build_train_step(ctx);
  const RunPlan plan = plan_run(c);
  RunBuilder builder(ctx, plan);
  REQUIRE(builder.next_step());
  return std::move(builder.program());
}

const std::string kMask = "attention mask, [batch, 1, seq, seq]";
const std::string kSoftmax = "SDPA math kernel: softmax";
const std::string kCopy = "attention mask: one layer's copy";
const std::string kPadded = "attention mask padded";

bool has_note(const Config& c, const std::string& prefix) {
  for (const auto& n : version_notes(c))
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("attention mask: torch 2.0 keeps the s^2 softmax of a padded micro-batch per layer, torch 2.1 does not",
          "[versions][attention_mask]") {
  // transformers 4.40 hands SDPA a mask only for a padded micro-batch: 512 tokens, two rows, lengths that vary.
  const int64_t L = 16, a = 32, b = 2, s = 512;
  const Config run = padded_run(base(b, s), "512,384");
  const StepProgram p20 = program_of(with_versions(run, "4.40", "2.0.1"));
  const StepProgram p21 = program_of(with_versions(run, "4.40", "2.1.2"));
  // torch 2.0: the math kernel keeps [b, a, s, s] bf16 softmax in every layer until its backward.
  CHECK(live(p20, "backward", kSoftmax) == L * a * b * s * s * 2);
  // 2.1.2: the memory-efficient kernel keeps the mask it is given: the one shared [b, 1, s, s] bf16 mask (512 keys
  // are aligned), by reference, until the first layer's backward. No s^2 per head, no copy per layer.
  CHECK(live(p21, "backward", kSoftmax, true) == 0);
  CHECK(live(p21, "backward", kMask) == b * s * s * 2);
  CHECK(live(p21, "backward", kPadded) == 0);
  CHECK(live(p21, "backward", kCopy) == 0);
  // Both build a mask for the forward; on 2.0 nothing keeps it past the layers (add_ into the scores).
  CHECK(has_label(p20, kMask));
  CHECK(live(p20, "backward", kMask) == 0);
  // The whole saved set differs by at least the softmax of every layer.
  CHECK(live_bytes_before_phase(p20, "backward", Component::Activations) -
            live_bytes_before_phase(p21, "backward", Component::Activations) >=
        L * a * b * s * s * 2);
  // The same run unpadded (one length throughout: fixed-length rows) gets no mask from transformers 4.40: flash.
  const StepProgram unpadded = program_of(with_versions(padded_run(base(b, s), "512"), "4.40", "2.0.1"));
  CHECK_FALSE(has_label(unpadded, kMask));
  CHECK_FALSE(has_label(unpadded, kSoftmax));
}

TEST_CASE("attention mask: transformers 4.35 builds it for every micro-batch, 4.40 and later not without padding",
          "[versions][attention_mask]") {
  const int64_t b = 2, s = 512;
  Config c = base(b, s);  // a fixed shape: no padding information, taken as unpadded
  c.training.attention = "auto";
  // 4.35 on torch 2.0: eager attention (SDPA is the default from 4.36 with torch 2.1.1), and the mask all the same.
  const Config c435 = with_versions(c, "4.35", "2.0.1");
  REQUIRE(resolve(c435).attention == Attention::Eager);
  REQUIRE(resolve(c435).mask.build == MaskBuild::Prepared);
  const StepProgram p435 = program_of(c435);
  CHECK(live(p435, "forward", kMask, true) == 0);
  CHECK(live(p435, "backward", kMask, true) == b * s * s * 2);
  // Eager attention's addition keeps nothing of it: it goes with the forward...
  CHECK(live(p435, "backward", kMask) == 0);
  // ... unless checkpointed layers hold it as a saved input until the first layer's backward.
  Config ckpt = c435;
  ckpt.training.activation_checkpointing = "full";
  CHECK(live(program_of(ckpt), "backward", kMask) == b * s * s * 2);
  CHECK(has_note(c435, "attention mask: from transformers 4.35.0: transformers up to 4.35 builds"));

  // 4.40 and 4.57 with torch 2.2: SDPA, and no mask without padding, as latest.
  for (const char* tf : {"4.40", "4.57"}) {
    INFO(tf);
    const Config v = with_versions(c, tf, "2.2");
    CHECK(resolve(v).attention != Attention::Eager);
    CHECK_FALSE(has_label(program_of(v), kMask));
    CHECK_FALSE(has_note(v, "attention mask"));
    Config latest = c;
    REQUIRE(apply_setting(latest, "versions.torch=2.2").empty());
    latest.training.attention = "sdpa_repeat_kv";
    Config stated = v;
    stated.training.attention = "sdpa_repeat_kv";
    CHECK(simulate(stated).devices[0].peak.allocated_bytes == simulate(latest).devices[0].peak.allocated_bytes);
  }
  // Under torch.compile transformers 4.40+ keeps the mask while compiling: every micro-batch gets one.
  Config compiled = with_versions(c, "4.45", "2.2");
  compiled.training.compile = true;
  CHECK(live(program_of(compiled), "backward", kMask, true) > 0);
  CHECK(has_note(compiled, "attention mask: from transformers 4.45.0 and torch 2.2.0: from transformers#30070 (4.40) "
                           "SDPA gets no mask when nothing is padded, but not under torch.compile"));
  // A padded run under 4.57 gets the boolean mask, which torch converts into a bf16 copy in every layer's call; the
  // memory-efficient kernel keeps each copy (512 keys: aligned, no padding).
  const StepProgram p457 = program_of(with_versions(padded_run(base(b, s), "512,384"), "4.57", "2.2"));
  CHECK(live(p457, "backward", kMask, true) == b * s * s);  // booleans
  CHECK(live(p457, "backward", kCopy) == 16 * b * s * s * 2);
}

TEST_CASE("attention mask: 4.38's buffer and per-layer copies, 4.39 without padding", "[versions][attention_mask]") {
  const int64_t b = 2, s = 512;
  Config c = base(b, s);
  c.model.max_position_embeddings = 8192;  // Llama 3.2's 131072 would make b x P^2 x 2 bytes fit no GPU
  const StepProgram p438 = program_of(with_versions(c, "4.38.2", "2.2"));
  // The causal_mask buffer: max_position_embeddings^2 booleans with the weights.
  CHECK(live(p438, "forward", "causal_mask buffer") == int64_t{8192} * 8192);
  // The repeated [b, 1, P, P] mask in bf16 during the forward, and every layer's [b, 1, s, s] indexed copy kept by
  // the memory-efficient kernel.
  CHECK(live(p438, "backward", kMask, true) == b * int64_t{8192} * 8192 * 2);
  CHECK(live(p438, "backward", kCopy) == 16 * b * s * s * 2);
  // 4.39 hands SDPA a materialised mask even unpadded (the shared one, kept by reference), 4.40 none.
  CHECK(live(program_of(with_versions(c, "4.39", "2.2")), "backward", kMask) == b * s * s * 2);
  CHECK_FALSE(has_label(program_of(with_versions(c, "4.40", "2.2")), kMask));
}

TEST_CASE("attention mask: 4.38-4.39 outside the Llama family keep the 4.36-4.37 builders", "[versions][attention_mask]") {
  // The same shape as a Mistral (model_type mistral, max_position_embeddings 32768): its 4.38-4.39 forward still calls
  // _prepare_4d_causal_attention_mask_for_sdpa, so no P^2 buffer (2 GiB per row at P = 32768) and no mask unpadded.
  const int64_t b = 2, s = 512;
  for (const char* type : {"mistral", "qwen2"}) {
    Config c = base(b, s);
    c.model.model_type = type;
    c.model.max_position_embeddings = 32768;
    for (const char* version : {"4.38.2", "4.39.3"}) {
      CAPTURE(type, version);
      const StepProgram p = program_of(with_versions(c, version, "2.2"));
      CHECK_FALSE(has_label(p, "causal_mask buffer"));
      CHECK_FALSE(has_label(p, kMask));
      // A padded micro-batch gets the [b, 1, s, s] mask as under 4.37.
      CHECK(live(program_of(with_versions(padded_run(c, "512,384"), version, "2.2")), "backward", kMask) ==
            live(program_of(with_versions(padded_run(c, "512,384"), "4.37.2", "2.2")), "backward", kMask));
    }
  }
  // Gemma was added in 4.38 as a copy of Llama's reworked code: it keeps the buffer.
  Config g = base(b, s);
  g.model.model_type = "gemma";
  g.model.max_position_embeddings = 8192;
  CHECK(live(program_of(with_versions(g, "4.38.2", "2.2")), "forward", "causal_mask buffer") == int64_t{8192} * 8192);
}

TEST_CASE("attention mask: the memory-efficient kernel pads an unaligned mask, per head on torch 2.1.0",
          "[versions][attention_mask]") {
  const int64_t L = 16, a = 32, b = 2, s = 500;  // 500 keys: not a multiple of 8 nor 16
  const Config c = base(b, s);                   // transformers 4.39: a mask for every micro-batch
  // 2.1.0 pads after expanding over the heads: [b, a, s, 512] per layer; 2.1.2 pads the mask itself: [b, 1, s, 504].
  CHECK(live(program_of(with_versions(c, "4.39", "2.1.0")), "backward", kPadded) == L * b * a * s * 512 * 2);
  CHECK(live(program_of(with_versions(c, "4.39", "2.1.2")), "backward", kPadded) == L * b * s * 504 * 2);
  // The shared mask is not what the kernel keeps then: it goes with the forward.
  CHECK(live(program_of(with_versions(c, "4.39", "2.1.2")), "backward", kMask) == 0);
}

TEST_CASE("attention mask: which micro-batches of a run are padded", "[run][attention_mask]") {
  Config c = base(4, 1024);
  c.data.lengths = "samples";
  c.data.sample_lengths = "p0=100,p50=400,p100=1024";
  c.data.steps = 20;
  for (const auto& mb : plan_run(c).micro_batches) CHECK(mb.padded);  // four drawn samples differ in length
  c.data.padding = "none";
  for (const auto& mb : plan_run(c).micro_batches) CHECK_FALSE(mb.padded);  // flattened: no pad token
  c.data.padding = "max_length";
  for (const auto& mb : plan_run(c).micro_batches) CHECK(mb.padded);
  c.data.padding = "longest";
  c.data.sample_lengths = "p0=512,p100=512";  // every sample as long: nothing to pad
  for (const auto& mb : plan_run(c).micro_batches) CHECK_FALSE(mb.padded);
  c.data.pad_to_multiple_of = 64;  // ... unless the collator rounds the row up
  c.data.sample_lengths = "p0=500,p100=500";
  for (const auto& mb : plan_run(c).micro_batches) CHECK(mb.padded);
  c.data.pad_to_multiple_of = 1;
  c.training.micro_batch_size = 1;  // one sample per row: its own length
  for (const auto& mb : plan_run(c).micro_batches) CHECK_FALSE(mb.padded);
  // Listed lengths: padded where they vary and a micro-batch has several rows.
  c.data.lengths = "micro_batches";
  c.data.micro_batch_lengths = "512,380";
  for (const auto& mb : plan_run(c).micro_batches) CHECK_FALSE(mb.padded);
  c.training.micro_batch_size = 2;
  for (const auto& mb : plan_run(c).micro_batches) CHECK(mb.padded);
  c.data.micro_batch_lengths = "512";
  for (const auto& mb : plan_run(c).micro_batches) CHECK_FALSE(mb.padded);
  // run_may_pad says so of the run before it is planned; the note of a padding-only version follows it.
  CHECK_FALSE(run_may_pad(c));
  Config v = with_versions(c, "4.45", "2.2");
  CHECK_FALSE(has_note(v, "attention mask"));
  v.data.micro_batch_lengths = "512,380";
  CHECK(run_may_pad(v));
  CHECK(has_note(v, "attention mask: from transformers 4.45.0 and torch 2.2.0: from transformers#30070 (4.40)"));
  v.data.lengths = "samples";
  v.data.sample_lengths = "p0=100,p100=1024";
  CHECK(run_may_pad(v));
  v.data.padding = "none";
  CHECK_FALSE(run_may_pad(v));
  CHECK_FALSE(run_may_pad(base(4, 1024)));  // a fixed shape
}

TEST_CASE("attention mask: latest models no mask, flash_attention_2 never gets one", "[versions][attention_mask]") {
  // latest transformers: none, whatever torch and the data say (memsim's model before versions were inputs).
  const Config run = padded_run(base(2, 512), "512,384");
  for (const char* attention : {"sdpa", "sdpa_repeat_kv", "eager"}) {
    Config c = run;
    c.training.attention = attention;
    REQUIRE(apply_setting(c, "versions.torch=2.0.1").empty());
    CHECK(resolve(c).mask.build == MaskBuild::None);
    CHECK_FALSE(has_label(program_of(c), kMask));
  }
  // flash_attention_2 takes the 2-D mask (and unpads), in every version.
  Config fa2 = with_versions(run, "4.35", "2.0.1");
  fa2.training.attention = "flash_attention_2";
  CHECK(resolve(fa2).mask.build == MaskBuild::None);
  // Not transformers' model code: torchtune's attention builds no such mask.
  Config tune = with_versions(run, "4.35", "2.0.1");
  tune.training.framework = "torchtune";
  CHECK(resolve(tune).mask.build == MaskBuild::None);
}

TEST_CASE("attention mask: every mask tensor goes by the end of its step", "[versions][attention_mask][property]") {
  // Over versions, kernels, checkpointing, precisions and padded or unpadded runs: what a step allocates with a
  // mask label it also frees, and no tensor id is freed twice.
  int checked = 0;
  for (const char* tf : {"4.35", "4.37", "4.38", "4.39", "4.45", "4.57"})
    for (const char* torch : {"2.0.1", "2.1.0", "2.4"})
      for (const char* attention : {"auto", "eager", "sdpa"})
        for (const char* ckpt : {"none", "full", "every_k"})
          for (const char* precision : {"bf16_pure", "bf16_mixed"})
            for (const char* lengths : {"500,384", "512"}) {
              Config c = padded_run(base(2, 512), lengths);
              c.model.num_hidden_layers = 3;
              c.model.max_position_embeddings = 1024;
              c.training.attention = attention;
              c.training.activation_checkpointing = ckpt;
              c.training.precision = precision;
              c = with_versions(c, tf, torch);
              INFO(config_to_fragment(c));
              Device dev(c);
              const StepContext ctx = dev.context(c);
              const RunPlan plan = plan_run(c);
              RunBuilder builder(ctx, plan);
              std::vector<uint8_t> alive;
              while (builder.next_step()) {
                StepProgram& p = builder.program();
                alive.resize(p.tensors.size(), 0);
                int bad = 0;
                std::map<uint32_t, int64_t> masks;  // live mask-labelled tensors
                for (const Event& e : p.events) {
                  const Tensor& t = p.tensors[e.tensor];
                  const std::string& label = p.labels[t.label];
                  const bool mask = label.rfind("attention mask", 0) == 0 || label.rfind("SDPA math", 0) == 0;
                  if (e.op == Event::Op::Alloc) {
                    bad += alive[e.tensor] != 0, alive[e.tensor] = 1;
                    if (mask) masks[e.tensor] = t.bytes;
                  } else {
                    bad += alive[e.tensor] != 1, alive[e.tensor] = 0;
                    masks.erase(e.tensor);
                  }
                }
                CHECK(bad == 0);
                CHECK(masks.empty());
                p.events.clear();
                p.phases.clear();
                p.recycle_freed_ids();
              }
              ++checked;
            }
  CHECK(checked == 6 * 3 * 3 * 3 * 2 * 2);
}
