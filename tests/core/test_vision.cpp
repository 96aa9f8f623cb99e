// A vision-language model in LLaVA's layout (model.vision_tower, src/core/vision_step.cpp): the tower's weights and
// its no_grad forward, the projector's saved tensors and gradients, the splice, the HF config.json import and the
// field errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/architecture.h"
#include "core/model.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// LLaVA-1.5-7B (its HF config.json) with LoRA on one GPU under the HF Trainer, pure bf16, no checkpointing.
Config llava(int64_t micro_batch = 2, int64_t sequence = 1024) {
  Config c = single_gpu_config("llava-1.5-7b-hf.json", micro_batch, sequence);
  c.peft.method = "lora";
  return c;
}

bool has_error(const Config& c, const std::string& field) {
  for (const auto& e : validate(c))
    if (e.field == field) return true;
  return false;
}

constexpr int64_t kTowerParams = 303507456;     // CLIPVisionModel of clip-vit-large-patch14-336
constexpr int64_t kProjectorParams = 20979712;  // 1024 x 4096 + 4096 + 4096 x 4096 + 4096

}  // namespace

TEST_CASE("LLaVA-1.5-7B counts the published total: decoder, tower and projector", "[vision]") {
  const Config c = llava();
  const ModelShape s = model_shape_of(c.model);
  CHECK(s.params_total == 7063427072);
  int64_t tower = 0, projector = 0;
  for (const auto& t : s.pre) {
    if (t.part == ParamTensor::Part::VisionTower) {
      tower += t.numel;
      CHECK(t.frozen);
    }
    if (t.part == ParamTensor::Part::Projector) {
      projector += t.numel;
      CHECK(!t.frozen);
    }
  }
  CHECK(tower == kTowerParams);
  CHECK(projector == kProjectorParams);
  CHECK(s.image_tokens == 576);
  CHECK(s.projector_widths == std::vector<int64_t>{1024, 4096, 4096});
}

TEST_CASE("LoRA leaves the tower and the projector alone, the projector trains where it is asked to", "[vision]") {
  Config c = llava();
  c.peft.target_modules = "q_proj,k_proj,v_proj";  // names CLIP's attention uses too; LLaVA's targets skip the tower
  ModelShape s = model_shape_of(c.model);
  apply_peft(s, c.peft);
  for (const auto& t : s.pre) {
    CHECK(t.name.find("lora_") == std::string::npos);
    if (t.part == ParamTensor::Part::Projector) CHECK(!t.frozen);
  }
  const int64_t lora = 32 * 3 * (8 * 4096 + 4096 * 8);  // r = 8 on q, k and v of the decoder's 32 layers
  // auto under PEFT: frozen with the base (TRL, ms-swift); true: LLaVA's scripts train it beside the adapters.
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == lora);
  // It runs in forward and keeps nothing for backward, nor does the tower's selected hidden state stay.
  CHECK(live(r.devices[0].program, "backward", "projector") == 0);
  CHECK(live(r.devices[0].program, "backward", "vision tower") == 0);
  c.training.train_projector = "true";
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == lora + kProjectorParams);
  // Without PEFT the projector trains with the decoder (auto), and the tower stays frozen.
  Config full = llava();
  full.peft.method = "none";
  r = simulate(full);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == r.params_total - kTowerParams);
}

TEST_CASE("the tower runs under no_grad and keeps its hidden states only until the projector has read them", "[vision]") {
  Config c = llava(2, 1024);
  c.training.train_projector = "true";
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  const int64_t hidden = 2 * 577 * 1024 * 2;  // two images' [577, 1024] bf16 hidden state
  // output_hidden_states: every block's output is alive at once before the projector runs ...
  CHECK(live(p, "backward", "vision tower block y", true) == 24 * hidden);
  // ... and at the end of the forward only the second-to-last, which linear_1 saves (its patch rows are a view).
  CHECK(live(p, "backward", "vision tower block y") == hidden);
  CHECK(live(p, "backward", "vision tower embeddings") == 0);
  // The projector saves linear_1's output for GELU and GELU's output for linear_2: [2 x 576, 4096] bf16 each.
  CHECK(live(p, "backward", "projector linear output") == 2 * 576 * 4096 * 2);
  CHECK(live(p, "backward", "projector GELU output") == 2 * 576 * 4096 * 2);
  CHECK(live(p, "backward", "image token mask") == 2 * 1024);
  // masked_scatter's contiguous mask and int64 prefix sum over the embeddings' elements, gone by backward.
  CHECK(live(p, "backward", "masked_scatter", true) == 9 * 2 * 1024 * 4096);
  CHECK(live(p, "backward", "masked_scatter") == 0);
  // The pixels (fp32 [3, 336, 336] per image) stay with the batch until its backward; nothing of the tower or the
  // projector outlives the step.
  CHECK(live(p, "backward", "pixel values") == 2 * 3 * 336 * 336 * 4);
  for (const char* label : {"vision tower", "projector", "image", "pixel values", "gradient of the image"})
    CHECK(live(p, "optimizer", label) == 0);
  // The tower's weights are frozen bf16 weights; the projector holds gradients and Adam's states.
  CHECK(has_label(p, "gradient of the image features"));
}

TEST_CASE("a VLM costs its text-only decoder plus the tower, the projector and their tensors", "[vision]") {
  Config vlm = llava(2, 1024);
  vlm.training.train_projector = "true";
  Config text = vlm;
  text.model.vision_tower.clear();
  text.model.vision_tower_args.clear();
  const Result a = simulate(vlm), b = simulate(text);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  const int64_t weights = live_bytes_before_phase(a.devices[0].program, "forward", Component::Weights) -
                          live_bytes_before_phase(b.devices[0].program, "forward", Component::Weights);
  CHECK(weights >= (kTowerParams + kProjectorParams) * 2);
  CHECK(weights < (kTowerParams + kProjectorParams) * 2 + (int64_t{8} << 20));  // allocator rounding per tensor
  const int64_t more = a.devices[0].peak.allocated_bytes - b.devices[0].peak.allocated_bytes;
  CHECK(more > weights);
  CHECK(more < weights + (int64_t{256} << 20));  // the projector's states and saved tensors, at this size
}

TEST_CASE("with no images in the batch the tower holds its weights but does not run", "[vision]") {
  Config c = llava();
  c.data.images_per_sample = 0;
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK_FALSE(has_label(r.devices[0].program, "vision tower"));
  CHECK_FALSE(has_label(r.devices[0].program, "pixel values"));
}

TEST_CASE("the tower goes with one image per sample per 576 tokens, and the other settings are refused by field", "[vision]") {
  Config c = llava(1, 577);
  CHECK(validate(c).empty());
  c.training.sequence_length = 576;
  CHECK(has_error(c, "training.sequence_length"));
  c.training.sequence_length = 2048;
  c.data.images_per_sample = 4;
  CHECK(has_error(c, "training.sequence_length"));
  c.data.images_per_sample = 1;

  Config other = llava();
  other.model.vision_tower = "vit";
  CHECK(has_error(other, "model.vision_tower"));
  other.model.vision_tower = "no_such_program";
  CHECK(has_error(other, "model.vision_tower"));
  other = llava();
  other.model.vision_tower_args = "num_attention_heads=7";  // 7 heads do not divide 1024
  CHECK(has_error(other, "model.vision_tower_args"));
  other = llava();
  other.model.vision_tower.clear();
  CHECK(has_error(other, "model.vision_tower_args"));
  other = llava();
  other.parallel.pipeline_parallel_size = 2;
  CHECK(has_error(other, "parallel.tensor_parallel_size"));
  other = llava();
  other.training.objective = "dpo";
  CHECK(has_error(other, "training.objective"));
  other = llava();
  other.training.framework = "torchtune";
  CHECK(has_error(other, "training.framework"));
  other = llava();
  other.training.train_vision_tower = true;  // beside LoRA: refused; without PEFT it is modelled
  CHECK(has_error(other, "training.train_vision_tower"));
  other.peft.method = "none";
  CHECK(validate(other).empty());
  // The data's lengths hold the images' tokens as well.
  other = llava(1, 2048);
  other.data.lengths = "micro_batches";
  other.data.micro_batch_lengths = "1024,500";
  CHECK(has_error(other, "data.micro_batch_lengths"));
  other.data.micro_batch_lengths = "1024,700";
  CHECK(validate(other).empty());
  other.data.lengths = "samples";
  other.data.sample_lengths = "p50=800,p100=2048";  // no p0: 1 token
  CHECK(has_error(other, "data.sample_lengths"));
  other.data.sample_lengths = "p0=600,p50=800,p100=2048";
  CHECK(validate(other).empty());
  other.data.padding = "none";  // one flattened row: the images of the micro-batch are not counted by rows
  CHECK(has_error(other, "data.padding"));
}

TEST_CASE("an HF llava config.json imports as the decoder with its CLIP tower", "[vision][hf]") {
  const Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/llava-1.5-7b-hf.json")));
  REQUIRE(p.ok);
  const ModelConfig& m = p.config.model;
  CHECK(m.vision_tower == "clip_vision");
  CHECK(architecture_arg(m.vision_tower_args, "image_size", 0) == 336);
  CHECK(architecture_arg(m.vision_tower_args, "patch_size", 0) == 14);
  CHECK(architecture_arg(m.vision_tower_args, "num_hidden_layers", 0) == 24);
  CHECK(m.hidden_size == 4096);  // LlamaConfig's default, which the text_config leaves out
  CHECK(m.num_hidden_layers == 32);
  CHECK(m.vocab_size == 32064);
  CHECK(model_shape_of(m).params_total == 7063427072);
  bool noted = false;
  for (const auto& n : p.notes) noted |= n.find("LlamaConfig's defaults") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("a trained tower keeps its activations, or only its blocks' inputs under checkpointing, and frees them", "[vision]") {
  Config c = llava(2, 1024);
  c.peft.method = "none";  // full fine-tuning: decoder and projector train (auto) ...
  c.training.train_vision_tower = true;  // ... and the tower too, as TRL's full fine-tuning of llava-hf does
  const int64_t hidden = 2 * 577 * 1024 * 2;  // two images' [577, 1024] bf16 hidden state
  Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == r.params_total);
  const StepProgram& plain = r.devices[0].program;
  // Without checkpointing every block keeps its activations until its backward; the last block's go with the tuple.
  const int64_t saved = live(plain, "backward", "vision tower");
  CHECK(saved > 23 * hidden * 4);  // per block more than its input, q, k and v
  for (const char* label : {"vision tower", "gradient of vision tower", "projector", "image", "pixel values"})
    CHECK(live(plain, "optimizer", label) == 0);
  // With checkpointing (HF's covers CLIPEncoder's layers) the blocks keep their inputs: 24 hidden states (the
  // embeddings' and blocks 0-22's outputs; the last block's output goes). The embeddings are not checkpointed: their
  // pre-layernorm keeps its input, one more of the same size.
  c.training.activation_checkpointing = "full";
  r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& ckpt = r.devices[0].program;
  CHECK(live(ckpt, "backward", "vision tower") == 25 * hidden);
  CHECK(live(ckpt, "backward", "vision tower embeddings embedded (add)") == hidden);
  for (const char* label : {"vision tower", "gradient of vision tower", "projector", "image", "pixel values"})
    CHECK(live(ckpt, "optimizer", label) == 0);
  // The tower's gradients and optimizer states: 303,507,456 more trained parameters than with it frozen.
  Config frozen = c;
  frozen.training.train_vision_tower = false;
  const Result f = simulate(frozen);
  REQUIRE(f.ok);
  CHECK(r.params_trainable - f.params_trainable == kTowerParams);
  CHECK(r.devices[0].peak.allocated_bytes > f.devices[0].peak.allocated_bytes);
}

TEST_CASE("a tower program whose block reads a program input after its embeddings is refused (it would get no tensor)", "[vision]") {
  Config c = llava();
  auto j = nlohmann::ordered_json::parse(memsim::builtin_architecture("clip_vision"));
  j["inputs"]["extra"] = {{"shape", {"tokens", "hidden_size"}}};
  auto& ops = j["block"]["ops"];
  const nlohmann::ordered_json add = {{"op", "add"}, {"in", {"x", "extra"}}, {"out", "x_extra"}};
  ops.insert(ops.begin(), add);
  ops[1]["in"] = "x_extra";
  c.model.vision_tower = j.dump();
  c.model.vision_tower_args = "hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096,image_size=336,patch_size=14";
  bool refused = false;
  for (const auto& e : validate(c)) refused |= e.field == "model.vision_tower" && e.message.find("reads an input after its embeddings") != std::string::npos;
  CHECK(refused);
}

