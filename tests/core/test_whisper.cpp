// Whisper as a model program (whisper, tools/programs/whisper.py; docs/research/whisper.md) and the ops it brought
// (conv1d, an embedding tied to the head, a frozen parameter, cross-entropy over every label row): exact counts, one
// encoder and one decoder layer's saved sets in closed form, the tied weight's gradient, the ledger, bad input.
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/model.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

// whisper-tiny's shapes (the program's defaults), full fine-tuning in pure bf16, SDPA, no checkpointing, one GPU.
Config whisper(const std::string& args = "") {
  Config c;
  c.model.architecture = "whisper";
  c.model.architecture_args = args;
  c.training.framework = "hf_trainer";
  c.training.precision = "bf16_pure";
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = "none";
  c.training.attention = "sdpa";
  c.training.micro_batch_size = 2;
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  c.hardware.gpu = "h100-sxm";
  return c;
}

int64_t before_backward(Config c, const std::string& args) {
  c.model.architecture_args = args;
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  return activations_before_backward(c);
}

}  // namespace

TEST_CASE("whisper: exact counts, the frozen encoder positions and the tied head counted once", "[architecture][whisper]") {
  // openai/whisper-tiny: 37,760,640 (WhisperForConditionalGeneration.num_parameters(); proj_out is
  // model.decoder.embed_tokens, counted once). By hand: conv1 92,544, conv2 442,752, encoder positions 576,000, four
  // encoder layers of 1,774,080, the encoder's norm 768, the token embedding 51,865 x 384 = 19,916,160, the decoder
  // positions 172,032, four decoder layers of 2,365,824, the decoder's norm 768.
  const ModelShape s = model_shape_of(whisper().model);
  CHECK(s.params_total == 37760640);
  // embed_positions.requires_grad_(False): counted, never trained, even in full fine-tuning.
  CHECK(trainable_numel(s) == 37760640 - 1500 * 384);
  int64_t head = 0;
  for (const auto& t : s.post) head += t.numel;
  CHECK(head == 51865 * 384 + 2 * 384);  // proj_out's weight lives with the head; the embedding owns none
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("whisper", "", a).empty());
  CHECK(a->tied_head == "proj_out");
  CHECK(a->tokens == 1500);  // 3,000 log-mel frames, halved by conv2's stride
  CHECK(a->label_bytes == 8 * 448);  // one int64 label per decoder row
  // PEFT's all-linear leaves the tied output layer out, as it leaves out get_output_embeddings().
  Config lora = whisper();
  lora.peft.method = "lora";
  lora.peft.lora_rank = 8;
  lora.peft.target_modules = "all-linear";
  lora.peft.adapter_dtype = "fp32";
  ModelShape ls = model_shape_of(lora.model);
  apply_peft(ls, lora.peft, false);
  for (const auto& t : ls.post) CHECK(t.name.find("lora") == std::string::npos);
}

TEST_CASE("whisper: one encoder layer's and one decoder layer's saved sets in closed form", "[architecture][whisper]") {
  const int64_t b = 2, h = 384, heads = 6, S = 1500, T = 64;
  const int64_t N = b * S, M = b * T;
  const Config c = whisper();
  const std::string base = "target_length=64,";
  // Encoder layer, pure bf16 under SDPA: its input (the norm's) 2Nh, the norm's output (q, k and v's input) 2Nh, the
  // contiguous q, k, v copies 6Nh, SDPA's output 2Nh and logsumexp 4 heads N, the residual sum (the second norm's
  // input) 2Nh, that norm's output 2Nh, fc1's output (GELU's input) 8Nh and GELU's output (fc2's input) 8Nh; two
  // norms' mean and rstd 16N. (The scaled q and the projections' outputs go once copied.)
  CHECK(before_backward(c, base + "encoder_layers=2") - before_backward(c, base + "encoder_layers=1") ==
        32 * N * h + 16 * N + 4 * heads * N);
  // Decoder layer: the same for its causal self-attention and MLP over M rows, plus the cross-attention's norm
  // output and q copy, SDPA output and its residual sum (2Mh each), a third norm's 8M and a second logsumexp; k and v
  // are the encoder's rows: 2 x 2 b S h.
  CHECK(before_backward(c, base + "decoder_layers=2") - before_backward(c, base + "decoder_layers=1") ==
        40 * M * h + 24 * M + 8 * heads * M + 4 * N * h);
}

TEST_CASE("whisper: the tied weight's gradient exists from the head's backward, once", "[architecture][whisper]") {
  // Full fine-tuning: proj_out's gradient is the shared matrix's .grad, made in the head's backward; the embedding's
  // dense gradient is added into it, a transient of its size, not a second .grad.
  Config c = whisper("target_length=64");
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const auto& p = r.devices[0].program;
  CHECK(ledger_problem(p).empty());
  // Per replayed step (one conv2 weight gradient each): the head's share of the table's gradient, then, outside
  // autocast, the sum with the embedding's that replaces it (tied_sum, as the built-in families'). Never two .grads.
  const int64_t table = 2 * 51865 * 384, conv2 = 2 * 384 * 384 * 3;  // bf16
  auto count = [&](const StepProgram& prog, int64_t& grads, int64_t& conv_grads, int64_t& most_live) {
    grads = conv_grads = most_live = 0;
    std::vector<char> live(prog.tensors.size(), 0);
    int64_t now = 0;
    for (const auto& e : prog.events) {
      const auto& t = prog.tensors[e.tensor];
      if (t.component != Component::Gradients) continue;
      if (t.bytes == conv2 && e.op == Event::Op::Alloc) ++conv_grads;
      if (t.bytes != table) continue;
      if (e.op == Event::Op::Alloc) ++grads, ++now;
      else --now;
      most_live = std::max(most_live, now);
    }
  };
  int64_t grads = 0, conv_grads = 0, most_live = 0;
  count(p, grads, conv_grads, most_live);
  CHECK(conv_grads > 0);
  CHECK(grads == 2 * conv_grads);
  CHECK(most_live == 2);  // the sum made beside the head's share, which then goes
  // Under autocast the embedding's share is added in place: one table gradient per step.
  Config amp = c;
  amp.training.precision = "amp_bf16";
  const Result ra = simulate(amp);
  REQUIRE(ra.ok);
  count(ra.devices[0].program, grads, conv_grads, most_live);
  CHECK(grads == 0);  // fp32 gradients: 4 bytes an element, not the bf16 table's size
  const int64_t table32 = 4 * 51865 * 384, conv32 = 4 * 384 * 384 * 3;
  int64_t g32 = 0, c32 = 0;
  for (const auto& t : ra.devices[0].program.tensors) {
    if (t.component == Component::Gradients && t.bytes == table32) ++g32;
    if (t.component == Component::Gradients && t.bytes == conv32) ++c32;
  }
  CHECK(c32 > 0);
  CHECK(g32 == c32);
  // LoRA on q and v with an int8 base under fp16 autocast and checkpointing: the ledger holds.
  c.training.precision = "fp16_autocast";
  c.training.activation_checkpointing = "full";
  c.peft.method = "lora";
  c.peft.base_quantization = "int8";
  c.peft.lora_rank = 32;
  c.peft.lora_alpha = 64;
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.adapter_dtype = "fp32";
  INFO(errors_of(c));
  REQUIRE(validate(c).empty());
  const Result q = simulate(c);
  REQUIRE(q.ok);
  CHECK(ledger_problem(q.devices[0].program).empty());
}

TEST_CASE("whisper: bad shapes get a field error", "[architecture][whisper]") {
  // More label rows than the decoder has positions: the slice of its position table says so.
  CHECK(first_error("whisper", "target_length=449").find("slice [0, 449) is past the 448 rows") != std::string::npos);
  // A conv1d kernel longer than its input.
  CHECK(first_error(program_edited("whisper", [](auto& j) { j["embeddings"]["ops"][0]["kernel"] = 4000; }))
            .find("conv1d's kernel 4000 exceeds the length") != std::string::npos);
  // An embedding of something other than int64 ids.
  CHECK(first_error(program_edited("whisper", [](auto& j) { j["embeddings"]["ops"][8]["in"] = "input_features"; }))
            .find("embedding reads a program input of int64 ids") != std::string::npos);
  // What a tied program does not model gets a field error naming it.
  Config c = whisper();
  c.model.tie_word_embeddings = true;
  CHECK(errors_of(c).find("model.tie_word_embeddings: model.tie_word_embeddings must be false for a model program") == 0);
  c = whisper();
  c.peft.method = "lora";
  c.peft.target_modules = "q_proj,v_proj";
  c.peft.modules_to_save = "embed_tokens";
  CHECK(errors_of(c).find("peft.modules_to_save: peft.modules_to_save names \"embed_tokens\", which is tied to proj_out") == 0);
  // A tied embedding whose width the head's linear does not have.
  CHECK(first_error(program_edited("whisper", [](auto& j) { j["embeddings"]["ops"][8]["rows"] = 1000; }))
            .find("cannot share") != std::string::npos);
}
