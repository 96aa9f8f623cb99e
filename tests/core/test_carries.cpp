// Carries between a program's stages (architecture.h ArchCarry, program_step.cpp): a UNet-shaped toy with a timestep
// embedding every block reads, skip connections the up path concatenates, text embeddings read by cross-attention,
// and an mse_loss head; and the Stable Diffusion 1.x UNet written with them (sd_unet, tools/programs/sd_unet.py). The ledger of every variant balances (each tensor allocated once, freed once, nothing of the
// step left but the weights and optimizer states); a carry lives as long as its readers need it, and its gradient
// adds up over its readers until its producer's backward.
#include <catch2/catch.hpp>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/advice.h"
#include "core/architecture.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

// A two-level UNet: conv_in (skip0), a resnet block reading temb (skip1), a strided conv, a transformer block with
// self- and cross-attention (repeated), an up block that upsamples and concatenates both skips, GroupNorm, SiLU and
// conv_out, then the mse_loss against the noise.
const char* kToyUnet = R"({
  "memsim_architecture": 1,
  "name": "toy_unet",
  "title": "a two-level UNet for the carry tests",
  "source": "tests/core/test_carries.cpp",
  "lora_targets": "to_q,to_k,to_v",
  "hyperparameters": {"channels": 32, "latent": 8, "text_rows": 7, "text_width": 16, "mid_blocks": 2},
  "inputs": {
    "latents": {"shape": [4, "latent", "latent"], "dtype": "compute"},
    "noise": {"shape": [4, "latent", "latent"], "dtype": "compute"},
    "t_proj": {"shape": [1, 32]},
    "text": {"shape": ["text_rows", "text_width"], "dtype": "compute"}
  },
  "embeddings": {
    "ops": [
      {"op": "linear", "name": "time_embedding.linear_1", "in": "t_proj", "out_features": 64, "out": "t1"},
      {"op": "silu", "in": "t1", "out": "t2"},
      {"op": "linear", "name": "time_embedding.linear_2", "in": "t2", "out_features": 64, "out": "temb"},
      {"op": "conv2d", "name": "conv_in", "in": "latents", "out_channels": "channels", "kernel": 3, "stride": 1, "padding": 1, "out": "h0"}
    ],
    "output": "h0",
    "carry": ["temb", "h0"]
  },
  "blocks": [
    {"name": "resnet", "repeat": 1, "input": "x", "carry": ["y"], "ops": [
      {"op": "group_norm", "name": "down.norm1", "in": "x", "groups": 8, "out": "n1"},
      {"op": "silu", "in": "n1", "out": "a1"},
      {"op": "conv2d", "name": "down.conv1", "in": "a1", "out_channels": "channels", "kernel": 3, "stride": 1, "padding": 1, "out": "c1"},
      {"op": "silu", "in": "temb", "out": "ta"},
      {"op": "linear", "name": "down.time_emb_proj", "in": "ta", "out_features": "channels", "out": "tp"},
      {"op": "add", "in": ["c1", "tp"], "out": "c1t"},
      {"op": "group_norm", "name": "down.norm2", "in": "c1t", "groups": 8, "out": "n2"},
      {"op": "silu", "in": "n2", "out": "a2"},
      {"op": "conv2d", "name": "down.conv2", "in": "a2", "out_channels": "channels", "kernel": 3, "stride": 1, "padding": 1, "out": "c2"},
      {"op": "add", "in": ["x", "c2"], "out": "y"}
    ], "output": "y"},
    {"name": "downsample", "repeat": 1, "input": "x", "ops": [
      {"op": "conv2d", "name": "down.downsample", "in": "x", "out_channels": "channels", "kernel": 3, "stride": 2, "padding": 1, "out": "y"}
    ], "output": "y"},
    {"name": "transformer", "repeat": "mid_blocks", "input": "x", "ops": [
      {"op": "group_norm", "name": "mid.norm", "in": "x", "groups": 8, "out": "n"},
      {"op": "flatten_tokens", "in": "n", "out": "f"},
      {"op": "copy", "in": "f", "out": "tok"},
      {"op": "layer_norm", "name": "mid.norm1", "in": "tok", "out": "l1"},
      {"op": "linear", "name": "mid.attn1.to_q", "in": "l1", "out_features": "channels", "bias": false, "out": "q"},
      {"op": "linear", "name": "mid.attn1.to_k", "in": "l1", "out_features": "channels", "bias": false, "out": "k"},
      {"op": "linear", "name": "mid.attn1.to_v", "in": "l1", "out_features": "channels", "bias": false, "out": "v"},
      {"op": "attention", "in": ["q", "k", "v"], "heads": 4, "out": "o"},
      {"op": "add", "in": ["tok", "o"], "out": "r1"},
      {"op": "layer_norm", "name": "mid.norm2", "in": "r1", "out": "l2"},
      {"op": "linear", "name": "mid.attn2.to_q", "in": "l2", "out_features": "channels", "bias": false, "out": "q2"},
      {"op": "linear", "name": "mid.attn2.to_k", "in": "text", "out_features": "channels", "bias": false, "out": "k2"},
      {"op": "linear", "name": "mid.attn2.to_v", "in": "text", "out_features": "channels", "bias": false, "out": "v2"},
      {"op": "attention", "in": ["q2", "k2", "v2"], "heads": 4, "out": "o2"},
      {"op": "add", "in": ["r1", "o2"], "out": "r2"},
      {"op": "unflatten_tokens", "in": "r2", "height": 4, "out": "u"},
      {"op": "copy", "in": "u", "out": "img"},
      {"op": "add", "in": ["img", "x"], "out": "y"}
    ], "output": "y"},
    {"name": "up", "repeat": 1, "input": "x", "ops": [
      {"op": "upsample_nearest", "in": "x", "scale": 2, "out": "up"},
      {"op": "concat", "in": ["up", "y"], "axis": "channels", "out": "cat1"},
      {"op": "conv2d", "name": "up.conv1", "in": "cat1", "out_channels": "channels", "kernel": 3, "stride": 1, "padding": 1, "out": "c1"},
      {"op": "concat", "in": ["c1", "h0"], "axis": "channels", "out": "cat2"},
      {"op": "conv2d", "name": "up.conv2", "in": "cat2", "out_channels": "channels", "kernel": 3, "stride": 1, "padding": 1, "out": "c2"}
    ], "output": "c2"}
  ],
  "head": {
    "input": "x",
    "ops": [
      {"op": "group_norm", "name": "conv_norm_out", "in": "x", "groups": 8, "out": "n"},
      {"op": "silu", "in": "n", "out": "a"},
      {"op": "conv2d", "name": "conv_out", "in": "a", "out_channels": 4, "kernel": 3, "stride": 1, "padding": 1, "out": "pred"},
      {"op": "mse_loss", "in": ["pred", "noise"], "out": "loss"}
    ]
  }
})";

Config toy_config(const std::string& precision, const std::string& ckpt, const std::string& peft) {
  Config c;
  c.model.architecture = kToyUnet;
  c.training.framework = "hf_loop";
  c.training.precision = precision;
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = ckpt;
  c.training.micro_batch_size = 2;
  c.peft.method = peft;
  c.peft.target_modules = "to_q,to_k,to_v";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

int64_t params_of(const std::string& program) {
  Config c = toy_config("fp32", "none", "none");
  c.model.architecture = program;
  return model_shape_of(c.model).params_total;
}

// diffusers' LoRA recipe on a UNet program: rank 4 on the attentions' four linears (fp32 adapters), 16-bit weights
// under autocast, one GPU, micro-batch 1.
Config unet_lora(const std::string& program, const std::string& ckpt = "none") {
  Config c;
  c.model.architecture = program;
  c.training.framework = "hf_loop";
  c.training.precision = "fp16_autocast";
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = ckpt;
  c.training.micro_batch_size = 1;
  c.peft.method = "lora";
  c.peft.lora_rank = 4;
  c.peft.lora_alpha = 4;
  c.peft.target_modules = "to_k,to_q,to_v,to_out.0";
  c.peft.adapter_dtype = "fp32";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

}  // namespace

TEST_CASE("carries: a toy UNet decodes, counts its parameters, and its ledger balances in every variant", "[architecture]") {
  REQUIRE(first_error(kToyUnet).empty());
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture(kToyUnet, "", a).empty());
  REQUIRE(a->carries.size() == 3);
  // temb: made by the embeddings, read by the resnet (block 0); h0: the embeddings' output, read by the up block (4);
  // y: the resnet's output, read by the downsample (its input) and the up block.
  CHECK(a->carries[0].name == "temb");
  CHECK(a->carries[0].producer == -1);
  CHECK(a->carries[0].last_reader == 0);
  CHECK(a->carries[1].last_reader == 4);
  CHECK(a->carries[2].producer == 0);
  CHECK(a->carries[2].last_reader == 4);
  CHECK(a->label_bytes == 0);  // the mse_loss target is an input, not a label
  // Parameters: time embedding 32*64+64 + 64*64+64; conv_in 4*32*9+32; resnet 2 norms (2*32 each), 2 convs
  // (32*32*9+32 each), time_emb_proj 64*32+32; downsample 32*32*9+32; per transformer block a norm (64), two layer
  // norms (64 each), to_q/k/v 32*32 each (attn1), to_q 32*32 and to_k/to_v 16*32 each (attn2); up convs 64*32*9+32
  // each; conv_norm_out 64; conv_out 32*4*9+4.
  const int64_t conv3 = 32 * 32 * 9 + 32;
  const int64_t expected = (32 * 64 + 64) + (64 * 64 + 64) + (4 * 32 * 9 + 32) + (2 * 64 + 2 * conv3 + 64 * 32 + 32) + conv3 +
                           2 * (3 * 64 + 3 * 32 * 32 + 32 * 32 + 2 * 16 * 32) + 2 * (64 * 32 * 9 + 32) + 64 + (32 * 4 * 9 + 4);
  CHECK(params_of(kToyUnet) == expected);
  for (const char* precision : {"fp32", "amp_fp16", "amp_bf16", "bf16_pure"})
    for (const char* ckpt : {"none", "full"})
      for (const char* peft : {"none", "lora"}) {
        const Config c = toy_config(precision, ckpt, peft);
        INFO(precision << " " << ckpt << " " << peft);
        std::string errors;
        for (const auto& e : validate(c)) errors += e.field + ": " + e.message + "\n";
        INFO(errors);
        REQUIRE(errors.empty());
        const Result r = simulate(c);
        REQUIRE(r.ok);
        CHECK(ledger_problem(r.devices[0].program).empty());
      }
  // Two micro-batches and ZeRO-3 over two GPUs: the carries are per micro-batch.
  Config c = toy_config("amp_bf16", "full", "none");
  c.training.gradient_accumulation_steps = 2;
  c.parallel.zero_stage = 3;
  c.parallel.data_parallel_size = 2;
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
}

TEST_CASE("carries: a skip lives until the up block has read it, and its gradient waits for its producer", "[architecture]") {
  auto edited = [](auto&& edit) {
    auto j = nlohmann::ordered_json::parse(kToyUnet);
    edit(j);
    return j.dump();
  };
  // A carry no later stage reads is a mistake in the program.
  CHECK(first_error(edited([](auto& j) { j["embeddings"]["carry"] = {"temb", "h0", "t2"}; })) ==
        "model.architecture: carry: \"t2\" is carried but no later stage reads it");
  // A carry must be a tensor an op makes anew, in a stage that runs once, with a name no earlier stage carries.
  CHECK(first_error(edited([](auto& j) { j["blocks"][2]["carry"] = {"y"}; })) ==
        "model.architecture: blocks[2].carry: needs a block kind that runs once (repeat 1): each carry is made by one stage");
  CHECK(first_error(edited([](auto& j) { j["blocks"][1]["carry"] = {"x"}; })) ==
        "model.architecture: blocks[1].carry: \"x\" is not a tensor an op of the stage makes");
  CHECK(first_error(edited([](auto& j) { j["blocks"][0]["carry"] = {"y", "y"}; })) ==
        "model.architecture: blocks[0].carry: \"y\" is carried by an earlier stage already; carry names are unique in a program");
  CHECK(first_error(edited([](auto& j) { j["head"]["carry"] = {"n"}; })).find("head.carry: is not a stage key") != std::string::npos);
  // Shapes: concat along channels needs equal heights and widths; group_norm's groups divide the channels; an
  // upsample needs an image; mse_loss needs equal shapes; cross-attention needs q and k of equal widths.
  CHECK(first_error(edited([](auto& j) { j["blocks"][3]["ops"][1]["in"] = {"x", "y"}; })).find("concat along channels needs equal heights and widths") != std::string::npos);
  CHECK(first_error(edited([](auto& j) { j["blocks"][0]["ops"][0]["groups"] = 5; })).find("group_norm's groups (5) must divide the 32 channels") != std::string::npos);
  CHECK(first_error(edited([](auto& j) { j["head"]["ops"][3]["in"] = {"pred", "latents_missing"}; })).find("\"latents_missing\" is not produced") != std::string::npos);
  CHECK(first_error(edited([](auto& j) { j["hyperparameters"]["text_width"] = 32; j["blocks"][2]["ops"][11]["in"] = "l2"; j["blocks"][2]["ops"][12]["in"] = "l2"; })).find("inputs.text: is never read by any stage") != std::string::npos);
  CHECK(first_error(edited([](auto& j) { j["inputs"]["noise"]["dtype"] = "fp16"; })).find("inputs.noise.dtype: must be fp32") != std::string::npos);

  // The up block's concat keeps nothing, so with nothing else saving skip1 (the resnet's output, also the
  // downsample's input, which conv2d saves while its weight trains) it would go after the up block's forward. Here
  // the downsample conv saves it (full fine-tuning): it lives to the downsample's backward. Its gradient is the sum
  // of the downsample's and the up block's, alive from the up block's backward to the resnet's.
  const Config c = toy_config("fp32", "none", "none");
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  CHECK(ledger_problem(p).empty());
  // The skip's gradient: allocated in the up block's backward (the concat's), freed in the resnet's backward.
  std::map<std::string, int> grads;
  for (const auto& e : p.events)
    if (e.op == Event::Op::Alloc) ++grads[p.labels[p.tensors[e.tensor].label]];
  // (once per step: memsim replays two)
  CHECK(grads["gradient of up y (input)"] == grads["gradient of up c1 (conv2d)"]);
  CHECK(grads["gradient of up h0 (input)"] == grads["gradient of up c1 (conv2d)"]);
  CHECK(grads["gradient of up c1 (conv2d)"] == 2);
}

TEST_CASE("carries: temb goes after its last reader unless a stage saved it", "[architecture]") {
  // The event index of the first free of the tensor labelled `label`, and of the first backward phase.
  auto first_free = [](const StepProgram& p, const std::string& label) {
    for (size_t i = 0; i < p.events.size(); ++i)
      if (p.events[i].op == Event::Op::Free && p.labels[p.tensors[p.events[i].tensor].label] == label) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  auto backward_start = [](const StepProgram& p) {
    for (const auto& ph : p.phases)
      if (ph.name.rfind("backward", 0) == 0) return static_cast<int64_t>(ph.first_event);
    return int64_t{-1};
  };
  // Full fine-tuning: the resnet's silu saves temb (its gradient reaches the time embedding), so it lives into
  // backward. LoRA on the attention: nothing in the resnet needs temb's gradient, so it goes after the resnet.
  for (const char* peft : {"none", "lora"}) {
    const Result r = simulate(toy_config("fp32", "none", peft));
    REQUIRE(r.ok);
    const StepProgram& p = r.devices[0].program;
    const int64_t freed = first_free(p, "embeddings temb (linear)"), bwd = backward_start(p);
    INFO(peft);
    REQUIRE(freed >= 0);
    REQUIRE(bwd >= 0);
    if (std::string(peft) == "none") {
      // ... to the end of the resnet's backward: before the embeddings' backward makes its first gradient.
      CHECK(freed > bwd);
      int64_t emb_grad = -1;
      for (size_t i = 0; i < p.events.size() && emb_grad < 0; ++i)
        if (p.events[i].op == Event::Op::Alloc && p.labels[p.tensors[p.events[i].tensor].label] == "gradient of embeddings t2 (silu)") emb_grad = static_cast<int64_t>(i);
      CHECK(freed < emb_grad);
    } else {
      CHECK(freed < bwd);
    }
  }
  // Checkpointed, the resnet keeps what it reads (temb among them) until its backward, even under LoRA.
  const Result r = simulate(toy_config("fp32", "full", "lora"));
  REQUIRE(r.ok);
  CHECK(first_free(r.devices[0].program, "embeddings temb (linear)") > backward_start(r.devices[0].program));
}

TEST_CASE("sd_unet: the SD 1.5 UNet's exact count, its LoRA, and a step through the engines", "[architecture]") {
  // 859,520,964: UNet2DConditionModel(**stable-diffusion-v1-5/unet/config.json).num_parameters().
  CHECK(params_of("sd_unet") == 859520964);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("sd_unet", "", a).empty());
  CHECK(a->carries.size() == 1 + 12 + 16);  // temb, the 12 skips, and each of the 16 attentions' residual
  // A 768 px image: a 96 x 96 latent; a resolution the VAE's factor does not divide still rounds as diffusers does.
  std::shared_ptr<const Architecture> big;
  REQUIRE(decode_architecture("sd_unet", "resolution=768", big).empty());
  CHECK(big->tokens == 96 * 96);
  // train_text_to_image_lora.py's LoRA (rank 4 on to_k, to_q, to_v, to_out.0 of all 32 attentions): 797,184, the
  // 3.2 MB fp32 file it saves.
  Config c = unet_lora("sd_unet");
  std::string errors;
  for (const auto& e : validate(c)) errors += e.field + ": " + e.message + "\n";
  INFO(errors);
  REQUIRE(errors.empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == 797184);
  CHECK(ledger_problem(r.devices[0].program).empty());
  // The frozen base in fp16 (unet.to(weight_dtype)): 2 bytes a parameter.
  CHECK(r.model_states.weights_bytes >= 2 * int64_t{859520964});
  CHECK(r.model_states.weights_bytes < 2 * int64_t{859520964} + 4 * 797184 + (1 << 20));
  // Under fp16 autocast the norms upcast: the saved GroupNorm and LayerNorm inputs are fp32 copies.
  bool x32 = false;
  for (const auto& l : r.devices[0].program.labels) x32 |= l.find("fp32") != std::string::npos;
  CHECK(x32);
  // Checkpointing the resnets and transformer blocks saves memory; full fine-tuning under amp and 16-bit
  // autocast on a built-in family are as the validator says.
  Config ck = c;
  ck.training.activation_checkpointing = "full";
  const Result rc = simulate(ck);
  REQUIRE(rc.ok);
  CHECK(rc.devices[0].peak.allocated_bytes < r.devices[0].peak.allocated_bytes);
  CHECK(ledger_problem(rc.devices[0].program).empty());
  Config full = c;
  full.peft.method = "none";
  full.training.precision = "amp_fp16";
  full.training.activation_checkpointing = "full";
  REQUIRE(validate(full).empty());
  const Result rf = simulate(full);
  REQUIRE(rf.ok);
  CHECK(ledger_problem(rf.devices[0].program).empty());
  // The built-in decoders take 16-bit weights under autocast too, with the same rule: fp16 trains adapters only.
  Config llm;
  llm.training.precision = "fp16_autocast";
  bool refused = false;
  for (const auto& e : validate(llm)) refused |= e.field == "training.precision";
  CHECK(refused);
  llm.peft.method = "lora";
  CHECK(validate(llm).empty());
  // ... but not T5's encoder-decoder path.
  Config t5 = llm;
  t5.model.is_encoder_decoder = true;
  refused = false;
  for (const auto& e : validate(t5)) refused |= e.field == "training.precision" && e.message.find("encoder-decoder") != std::string::npos;
  CHECK(refused);
}

TEST_CASE("sdxl_unet: SDXL's exact count, its LoRA's closed form, the fp32 VAE beside it", "[architecture]") {
  // 2,567,463,684: UNet2DConditionModel(**stable-diffusion-xl-base-1.0/unet/config.json).num_parameters().
  CHECK(params_of("sdxl_unet") == 2567463684);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("sdxl_unet", "", a).empty());
  CHECK(a->tokens == 128 * 128);  // 1024 px through the VAE's factor 8
  CHECK(a->repeat == 122);        // 10- and 2-block transformer kinds repeat
  REQUIRE(a->frozen_modules.size() == 3);
  CHECK(a->frozen_modules[0].fp32);  // the VAE, fp32 in the SDXL scripts
  CHECK(!a->frozen_modules[2].fp32);
  Config c = unet_lora("sdxl_unet", "full");
  c.training.optimizer = "adamw_8bit";
  REQUIRE(validate(c).empty());
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
  // LoRA of rank r on a transformer block of width C with 2,048-wide text: attn1's four C x C linears, 8 r C;
  // attn2's to_q and to_out (4 r C) and its to_k and to_v from the text (2 r (2048 + C)): r (14 C + 4096). SDXL
  // has 10 blocks of 640 and 60 of 1280.
  const int64_t rank = 4;
  CHECK(r.params_trainable == rank * (10 * (14 * 640 + 4096) + 60 * (14 * 1280 + 4096)));
  // Beside it: the fp32 VAE and the fp16 text encoders.
  CHECK(r.model_states.other_models_bytes == 4 * int64_t{83653863} + 2 * (int64_t{123060480} + 694659840));
  // Latents cached and text embeddings precomputed: nothing beside it.
  Config cached = c;
  cached.model.architecture_args = "vae_on_gpu=0,text_encoder_on_gpu=0,text_encoder_2_on_gpu=0";
  const Result rc = simulate(cached);
  REQUIRE(rc.ok);
  CHECK(rc.model_states.other_models_bytes == 0);
  // A frozen module's dtype is compute or fp32.
  CHECK(first_error(program_edited("sdxl_unet", [](auto& j) { j["frozen_modules"][0]["dtype"] = "int8"; })) ==
        "model.architecture: frozen_modules[0].dtype: must be compute (the dtype the scripts cast it to), fp32, or weights (the trained model's own dtype: a buffer that moves with it)");
}

TEST_CASE("What helps for a diffusion UNet: cache the latents, precompute the embeddings, keep the EMA on the host", "[architecture]") {
  Config c;
  c.model.architecture = "sdxl_unet";
  c.training.framework = "hf_loop";
  c.training.precision = "amp_fp16";
  c.training.ema = "gpu_foreach";
  c.peft.method = "none";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  std::set<std::string> ids;
  std::string vae_args;
  for (const auto& s : suggestion_candidates(c)) {
    ids.insert(s.id);
    if (s.id == "frozen_off_vae") vae_args = s.config.model.architecture_args;
  }
  for (const char* id : {"frozen_off_vae", "frozen_off_text_encoder", "frozen_off_text_encoder_2", "ema_cpu", "ema_per_parameter"}) {
    INFO(id);
    CHECK(ids.count(id) == 1);
  }
  CHECK(vae_args == "vae_on_gpu=0");
  // A built-in family has no frozen modules; without EMA there is nothing to move.
  Config llm;
  for (const auto& s : suggestion_candidates(llm)) CHECK(s.id.rfind("frozen_off_", 0) != 0);
}

TEST_CASE("carries: review findings stay fixed (a view of a carry passed on, names, EMA after zero_grad)", "[architecture]") {
  auto edited = [](auto&& edit) {
    auto j = nlohmann::ordered_json::parse(kToyUnet);
    edit(j);
    return j.dump();
  };
  // A first block that passes its input on as a view (flatten, then unflatten): the carry h0 is that block's input
  // and, through the view, the next block's; nothing later reads it by name.
  const std::string passthrough = edited([](auto& j) {
    nlohmann::ordered_json view = {{"name", "view"}, {"repeat", 1}, {"input", "x"}, {"ops", {
        {{"op", "flatten_tokens"}, {"in", "x"}, {"out", "f"}},
        {{"op", "unflatten_tokens"}, {"in", "f"}, {"height", "latent"}, {"out", "u"}}}}, {"output", "u"}};
    j["blocks"].insert(j["blocks"].begin(), view);
    j["blocks"][4]["ops"][3] = {{"op", "copy"}, {"in", "c1"}, {"out", "cat2"}};
  });
  REQUIRE(first_error(passthrough).empty());
  for (const char* ckpt : {"none", "full"}) {
    Config c = toy_config("amp_bf16", ckpt, "none");
    c.model.architecture = passthrough;
    REQUIRE(validate(c).empty());
    const Result r = simulate(c);
    REQUIRE(r.ok);
    INFO(ckpt);
    CHECK(ledger_problem(r.devices[0].program).empty());
  }
  // A carry may not take a program input's name (later stages would read the input).
  CHECK(first_error(edited([](auto& j) { j["blocks"][0]["ops"][9]["out"] = "noise"; j["blocks"][0]["output"] = "noise"; j["blocks"][0]["carry"] = {"noise"}; }))
            .find("\"noise\" is the name of a program input") != std::string::npos);
  // fp16 weights under autocast train only adapters: accelerate's GradScaler refuses fp16 gradients.
  Config full = toy_config("fp16_autocast", "none", "none");
  bool refused = false;
  for (const auto& e : validate(full)) refused |= e.field == "training.precision";
  CHECK(refused);
  // diffusers' EMA update runs after zero_grad: no gradient is live when it starts.
  Config ema = toy_config("amp_bf16", "none", "none");
  ema.training.ema = "gpu_foreach";
  const Result r = simulate(ema);
  REQUIRE(r.ok);
  CHECK(live_bytes_before_phase(r.devices[0].program, "EMA update 1", Component::Gradients) == 0);
  CHECK(live_bytes_before_phase(r.devices[0].program, "EMA update 1", Component::OtherModels) > 0);
}

TEST_CASE("a frozen module's forward: the VAE encodes each micro-batch's images under no_grad before the UNet", "[architecture]") {
  const Config c = unet_lora("sdxl_unet", "full");
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(ledger_problem(r.devices[0].program).empty());
  // At 1024 px the fp32 VAE's first level holds 128-channel full-resolution maps (512 MiB each): with the UNet
  // checkpointed, its encode is the step's peak.
  CHECK(r.devices[0].peak_phase.find("forward") == 0);
  const StepProgram& p = r.devices[0].program;
  int64_t vae_tensors = 0;
  for (const auto& e : p.events)
    if (e.op == Event::Op::Alloc && p.labels[p.tensors[e.tensor].label].rfind("vae forward ", 0) == 0) ++vae_tensors;
  CHECK(vae_tensors > 0);
  // No part of it outlives the encode: nothing is saved for a backward it never has.
  CHECK(live_bytes_before_phase(p, "backward", Component::Temporaries) < int64_t{1} << 30);
  // Latents cached (the VAE off the GPU): no encode.
  Config cached = c;
  cached.model.architecture_args = "vae_on_gpu=0";
  const Result rc = simulate(cached);
  REQUIRE(rc.ok);
  for (const auto& l : rc.devices[0].program.labels) CHECK(l.rfind("vae forward ", 0) != 0);
  CHECK(rc.devices[0].peak.allocated_bytes < r.devices[0].peak.allocated_bytes);
  // The encoder is no model to train.
  Config vae = c;
  vae.model.architecture = "sd_vae_encoder";
  bool refused = false;
  for (const auto& e : validate(vae)) refused |= e.message.find("frozen module's forward") != std::string::npos;
  CHECK(refused);
}

