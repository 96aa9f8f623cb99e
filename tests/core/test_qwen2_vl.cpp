// Qwen2-VL (model.vision_tower = qwen2_vl_vision, src/core/catalog/architectures/qwen2_vl_vision.json): the
// native-resolution tower's weights and image tokens (the processor's smart_resize, written as the program's dims),
// the patch merger as the projector, what the step keeps, the HF config.json import and the field errors.
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/advice.h"
#include "core/catalog.h"
#include "core/model.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

// Qwen2-VL-7B-Instruct (its HF config.json) with LoRA on one GPU under the HF Trainer, pure bf16, no checkpointing.
Config qwen2_vl(int64_t micro_batch = 1, int64_t sequence = 1024, const std::string& tower_args = "") {
  Config c = single_gpu_config("qwen2-vl-7b-instruct.json", micro_batch, sequence);
  c.peft.method = "lora";
  if (!tower_args.empty()) c.model.vision_tower_args += "," + tower_args;
  return c;
}

bool has_error(const Config& c, const std::string& field) {
  for (const auto& e : validate(c))
    if (e.field == field) return true;
  return false;
}

// Derived from modeling_qwen2_vl.py's modules at embed_dim 1280, depth 32, mlp_ratio 4 (the published total,
// 8,291,375,616, is their sum with Qwen2-7B's language model at vocabulary 152,064):
// patch_embed 1280 x 3 x 2 x 14 x 14 = 1,505,280; per block 19,677,440 (norm1, norm2, qkv with bias, proj, fc1, fc2).
constexpr int64_t kTowerParams = 1505280 + 32 * int64_t{19677440};
// PatchMerger: ln_q (2 x 1280), mlp.0 (5120 x 5120 + 5120), mlp.2 (3584 x 5120 + 3584).
constexpr int64_t kMergerParams = 2560 + 5120 * 5120 + 5120 + 3584 * 5120 + 3584;

int64_t image_tokens(const std::string& args) {
  ModelConfig m;
  m.vision_tower = "qwen2_vl_vision";
  m.vision_tower_args = args;
  return vision_image_tokens(m);
}

}  // namespace

TEST_CASE("Qwen2-VL-7B counts the published total: language model, tower and merger", "[vision][qwen2_vl]") {
  const Config c = qwen2_vl();
  const ModelShape s = model_shape_of(c.model);
  CHECK(s.params_total == 8291375616);
  int64_t tower = 0, merger = 0;
  for (const auto& t : s.pre) {
    if (t.part == ParamTensor::Part::VisionTower) {
      tower += t.numel;
      CHECK(t.name.rfind("visual.", 0) == 0);
    }
    if (t.part == ParamTensor::Part::Projector) {
      merger += t.numel;
      CHECK(t.name.rfind("visual.merger.", 0) == 0);
    }
  }
  CHECK(tower == kTowerParams);
  CHECK(merger == kMergerParams);
  CHECK(s.projector_widths == std::vector<int64_t>{5120, 5120, 3584});
  bool block_named = false;  // state_dict paths: visual.blocks.N.attn.qkv.weight
  for (const auto& t : s.pre) block_named |= t.name == "visual.blocks.31.attn.qkv.weight";
  CHECK(block_named);
}

TEST_CASE("an image's tokens follow the processor's smart_resize", "[vision][qwen2_vl]") {
  // Python's image_processing_qwen2_vl.smart_resize, factor 28, min_pixels 3136, then (h / 14)(w / 14) / 4:
  CHECK(image_tokens("") == 256);                                    // 448 x 448: the defaults
  CHECK(image_tokens("image_height=480,image_width=640") == 391);     // 476 x 644, a COCO image
  CHECK(image_tokens("image_height=1080,image_width=1920") == 2691);  // 1092 x 1932, under the hub's max_pixels
  CHECK(image_tokens("image_height=1080,image_width=1920,max_pixels=1003520") == 1222);  // shrunk to 728 x 1316
  CHECK(image_tokens("image_height=30,image_width=60") == 6);         // grown to 56 x 84 (min_pixels)
  CHECK(image_tokens("image_height=70,image_width=70") == 4);         // round(2.5) is 2: Python rounds half to even
}

TEST_CASE("the frozen tower keeps one hidden state at a time, a frozen merger keeps nothing", "[vision][qwen2_vl]") {
  Config c = qwen2_vl(2, 1024, "image_height=480,image_width=640");  // 1,564 patches, 391 tokens per image
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  const int64_t hidden = 2 * 1564 * 1280 * 2;  // two images' [1564, 1280] bf16 hidden state
  // No output_hidden_states: a block's input goes once the block ran, so at most its input and its output at once.
  CHECK(live(p, "backward", "vision tower block y", true) == 2 * hidden);
  CHECK(live(p, "backward", "vision tower") == 0);
  CHECK(live(p, "backward", "projector") == 0);  // LoRA freezes the merger (auto), which saves nothing
  CHECK(live(p, "backward", "patch merger") == 0);
  CHECK(live(p, "backward", "image token mask") == 0);
  CHECK(live(p, "backward", "pixel values") == 2 * 1564 * 1176 * 4);  // fp32 [patches, 3 x 2 x 14 x 14] per image
  CHECK(r.params_trainable == 2523136);  // r = 8 on the language model's q and v only
}

TEST_CASE("a trained merger saves its norm's input and statistics, its linears' inputs and GELU's", "[vision][qwen2_vl]") {
  Config c = qwen2_vl(2, 1024, "image_height=480,image_width=640");
  c.training.train_projector = "true";
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const StepProgram& p = r.devices[0].program;
  const int64_t rows = 2 * 391;
  CHECK(r.params_trainable == 2523136 + kMergerParams);
  // ln_q's input (the last block's output), its fp32 mean and rstd per patch row, and its output (mlp.0's input).
  CHECK(live(p, "backward", "vision tower block y") == 2 * 1564 * 1280 * 2);
  CHECK(live(p, "backward", "patch merger LayerNorm mean") == 8 * 2 * 1564);
  CHECK(live(p, "backward", "patch merger LayerNorm output") == rows * 5120 * 2);
  CHECK(live(p, "backward", "projector linear output") == rows * 5120 * 2);  // GELU's input
  CHECK(live(p, "backward", "projector GELU output") == rows * 5120 * 2);    // mlp.2's input
  for (const char* label : {"vision tower", "projector", "patch merger", "image", "pixel values"})
    CHECK(live(p, "optimizer", label) == 0);
}

TEST_CASE("a trained Qwen2-VL tower runs every block's backward and frees what it kept", "[vision][qwen2_vl]") {
  Config c = qwen2_vl(1, 1024, "image_height=448,image_width=448");
  c.peft.method = "none";
  c.training.train_vision_tower = true;
  c.training.activation_checkpointing = "full";
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == r.params_total);
  const StepProgram& p = r.devices[0].program;
  // Under checkpointing each block keeps its input: the embeddings' output and 31 blocks' outputs, and the last
  // block's output, which the merger's norm saves; the embeddings' linear keeps the pixels' bf16 copy or nothing.
  const int64_t hidden = 1024 * 1280 * 2;
  CHECK(live(p, "backward", "vision tower block y") == 32 * hidden);
  for (const char* label : {"vision tower", "gradient of vision tower", "projector", "patch merger", "image", "pixel values"})
    CHECK(live(p, "optimizer", label) == 0);
}

TEST_CASE("an HF qwen2_vl config.json imports as Qwen2 with its tower", "[vision][qwen2_vl][hf]") {
  const Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/qwen2-vl-7b-instruct.json")));
  REQUIRE(p.ok);
  const ModelConfig& m = p.config.model;
  CHECK(m.vision_tower == "qwen2_vl_vision");
  CHECK(architecture_arg(m.vision_tower_args, "depth", 0) == 32);
  CHECK(architecture_arg(m.vision_tower_args, "hidden_size", 0) == 3584);
  CHECK(m.qkv_bias);
  bool noted_unknown = false;
  for (const auto& n : p.notes) noted_unknown |= n.find("is not known") != std::string::npos;
  CHECK_FALSE(noted_unknown);
}

TEST_CASE("Qwen2-VL's bad inputs are field errors", "[vision][qwen2_vl]") {
  Config c = qwen2_vl(1, 1024);
  CHECK(validate(c).empty());
  Config small = qwen2_vl(1, 1024, "image_height=20");  // smart_resize raises below the factor, 28, before 4.53
  CHECK(validate(small).empty());
  small.versions.transformers = "4.48";
  CHECK(has_error(small, "model.vision_tower_args"));
  Config wide = qwen2_vl(1, 1024, "hidden_size=4096");  // the merger must map to the language model's width
  CHECK(has_error(wide, "model.vision_tower_args"));
  Config many = qwen2_vl(1, 1024, "image_height=1080,image_width=1920");  // 2,691 tokens do not fit 1,024
  CHECK(has_error(many, "training.sequence_length"));
  for (const char* bad : {"image_height=0", "image_width=-5", "max_pixels=0", "image_height=448.5"}) {
    const Config c_bad = qwen2_vl(1, 1024, bad);  // one line naming the argument, not the dims it breaks
    const auto errors = validate(c_bad);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].field == "model.vision_tower_args");
    CHECK(errors[0].message.find("whole number of pixels") != std::string::npos);
  }
  Config thin = qwen2_vl(1, 1024, "image_height=30,image_width=7000");  // smart_resize: within 200:1
  CHECK(has_error(thin, "model.vision_tower_args"));
  Config sliver = qwen2_vl(1, 1024, "image_height=10,image_width=3000");  // under the factor (4.53 grows it), 300:1
  CHECK(has_error(sliver, "model.vision_tower_args"));
  Config old = qwen2_vl(1, 1024);
  old.versions.transformers = "4.44";  // Qwen2-VL arrived in 4.45
  CHECK(has_error(old, "versions.transformers"));
  // The merger maps to the language model's width: arguments that leave the tower's width out follow it (the 2B's
  // 1536 against the program's default 3584).
  Config two_b = qwen2_vl(1, 1024);
  two_b.model = find_model_preset("qwen2-vl-2b")->model;
  two_b.model.vision_tower_args = "image_height=480,image_width=640";
  CHECK(validate(two_b).empty());
  CHECK(model_shape_of(two_b.model).params_total == 2208985600);
  Config tower_only = qwen2_vl();
  tower_only.model.vision_tower.clear(), tower_only.model.vision_tower_args.clear();
  tower_only.model.architecture = "qwen2_vl_vision";  // a tower without a head or loss is not a model
  CHECK(has_error(tower_only, "model.architecture"));
}

TEST_CASE("program dims take sqrt, round (half to even) and if", "[architecture][qwen2_vl]") {
  const std::string program = R"J({"memsim_architecture": 1, "name": "t", "source": "test",
    "hyperparameters": {"a": 9, "c": 0},
    "dims": {"r": "sqrt(a)", "h": "round(2.5) + round(3.5)", "w": "if(c, 1, 2) * 8"},
    "repeat": 1, "inputs": {"x": {"shape": ["h", "w"]}},
    "embeddings": {"ops": [{"op": "linear", "name": "e", "in": "x", "out_features": "r", "out": "y"}], "output": "y"},
    "block": {"input": "x", "ops": [{"op": "linear", "name": "l", "in": "x", "out_features": "r", "out": "y"}], "output": "y"},
    "head": {"input": "x", "ops": [{"op": "mean_tokens", "in": "x", "out": "m"},
                                   {"op": "cross_entropy", "in": "m", "out": "loss"}]}})J";
  std::shared_ptr<const Architecture> a;
  for (const auto& e : decode_architecture(program, "", a)) FAIL(e.message);
  REQUIRE(a);
  CHECK(architecture_value(*a, "r") == 3);
  CHECK(architecture_value(*a, "h") == 6);  // 2 + 4
  CHECK(architecture_value(*a, "w") == 16);
  CHECK_FALSE(decode_architecture(program, "a=-4", a).empty());  // sqrt of a negative number
}

TEST_CASE("before transformers 4.54 the tower's attention spans every patch of the micro-batch", "[vision][qwen2_vl]") {
  // Two images of 1,564 patches: N = 3,128 rows attend as one sequence with a block-diagonal mask (cu_seqlens).
  const int64_t n = 2 * 1564;
  auto run = [&](const std::string& transformers, const std::string& attention) {
    Config c = qwen2_vl(2, 1024, "image_height=480,image_width=640");
    c.versions.transformers = transformers;
    c.training.attention = attention;
    const Result r = simulate(c);
    REQUIRE(r.ok);
    return r;
  };
  // 4.54 on ("latest"): one call per image, no mask and no scores.
  const Result latest = run("latest", "sdpa");
  CHECK(live(latest.devices[0].program, "backward", "attention scores", true) == 0);
  // 4.45-4.50: SDPA's math path (3-D q, k, v) over a bool mask made a bf16 bias: [16, N, N] scores twice at once.
  const Result math = run("4.48", "sdpa");
  CHECK(live(math.devices[0].program, "backward", "attention scores", true) == 2 * 16 * n * n * 2);
  CHECK(live(math.devices[0].program, "backward", "attention temporaries", true) >= 3 * n * n);
  CHECK(math.devices[0].peak.allocated_bytes > latest.devices[0].peak.allocated_bytes);
  bool noted = false;
  for (const auto& note : math.notes) noted |= note.find("math path") != std::string::npos;
  CHECK(noted);
  // 4.51-4.53: the memory-efficient kernel; no scores, the mask and its bf16 bias padded to 16 keys.
  const Result efficient = run("4.52", "sdpa");
  CHECK(live(efficient.devices[0].program, "backward", "attention scores", true) == 0);
  CHECK(live(efficient.devices[0].program, "backward", "attention temporaries", true) >= n * n + 2 * n * n);
  // flash_attention_2 takes cu_seqlens in every version.
  const Result flash = run("4.48", "flash_attention_2");
  CHECK(live(flash.devices[0].program, "backward", "attention scores", true) == 0);
}

// Qwen2.5-VL: RMSNorm blocks with a SwiGLU MLP, windows of 8 x 8 patches but in blocks 7, 15, 23 and 31.
TEST_CASE("Qwen2.5-VL-7B counts the published total, and imports with its windowed tower", "[vision][qwen2_vl]") {
  const Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/qwen2.5-vl-7b-instruct.json")));
  REQUIRE(p.ok);
  const ModelConfig& m = p.config.model;
  CHECK(m.vision_tower == "qwen2_5_vl_vision");
  CHECK(architecture_arg(m.vision_tower_args, "fullatt2", 0) == 15);
  CHECK(architecture_arg(m.vision_tower_args, "out_hidden_size", 0) == 3584);
  const ModelShape s = model_shape_of(m);
  CHECK(s.params_total == 8292166656);
  int64_t tower = 0, merger = 0;
  for (const auto& t : s.pre) {
    if (t.part == ParamTensor::Part::VisionTower) tower += t.numel;
    if (t.part == ParamTensor::Part::Projector) merger += t.numel;
  }
  // Derived from modeling_qwen2_5_vl.py: per block 2 RMSNorms (2 x 1280), qkv, proj, gate and up (1280 x 3420 + 3420
  // each) and down (3420 x 1280 + 1280): 19,702,200; the merger's ln_q has a weight only.
  CHECK(tower == 1505280 + 32 * int64_t{19702200});
  CHECK(merger == 1280 + 5120 * 5120 + 5120 + 3584 * 5120 + 3584);
  Config c = single_gpu_config("qwen2.5-vl-7b-instruct.json", 1, 1024);
  c.peft.method = "lora";
  CHECK(validate(c).empty());
  c.model.vision_tower_args += ",out_hidden_size=2048";  // the merger must map to the decoder's 3584
  CHECK(has_error(c, "model.vision_tower_args"));
}

TEST_CASE("Qwen2.5-VL's windows bound eager scores to 64 patches from transformers 4.54, before, the mask spans the batch", "[vision][qwen2_vl]") {
  auto run = [&](const std::string& transformers) {
    Config c = single_gpu_config("qwen2.5-vl-7b-instruct.json", 2, 1024);
    c.peft.method = "lora";
    c.training.attention = "eager";
    c.versions.transformers = transformers;
    const Result r = simulate(c);
    REQUIRE(r.ok);
    return live(r.devices[0].program, "backward", "attention scores", true);
  };
  // Two images of 448 x 448: 32 x 32 patches each, 16 windows of 64. 4.54 on: one eager call per window in 28 blocks
  // ([16, 64, 64] each) and per image in the 4 full-attention blocks ([16, 1024, 1024]), one call after another, so
  // the largest scores are one image's. 4.49-4.53: every block, windowed or not, scores all the micro-batch's 2,048
  // patches against each other: four times one image's. (Eager reaches the decoder too: its bf16 scores of
  // [2, 28, 1024, 1024] are larger than one image's tower scores of [16, 1024, 1024] and their scaled copy,
  // though smaller than two images' at once.)
  CHECK(run("latest") == 2 * 28 * 1024 * 1024 * 2);
  CHECK(run("4.50") == 2 * 16 * 2048 * 2048 * 2);
}

TEST_CASE("a trained Qwen2.5-VL tower keeps its RMSNorms' fp32 copies and frees them", "[vision][qwen2_vl]") {
  Config c = single_gpu_config("qwen2.5-vl-7b-instruct.json", 1, 1024);
  c.peft.method = "none";
  c.training.train_vision_tower = true;
  const Result r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.params_trainable == r.params_total);
  const StepProgram& p = r.devices[0].program;
  // Each block's two RMSNorms save an fp32 copy of their [1024, 1280] input (the decoder's norms save theirs too,
  // at its width; the tower's are at least these).
  CHECK(live(p, "backward", "norm input upcast to fp32") >= 32 * 2 * 1024 * 1280 * 4);
  for (const char* label : {"vision tower", "gradient of vision tower", "projector", "patch merger", "image", "pixel values"})
    CHECK(live(p, "optimizer", label) == 0);
}

TEST_CASE("ms-swift's vit_gradient_checkpointing makes a frozen tower keep its blocks' inputs and run backward", "[vision][qwen2_vl]") {
  Config c = qwen2_vl(1, 1024, "image_height=448,image_width=448");  // 1,024 patches
  c.training.activation_checkpointing = "full";
  const Result plain = simulate(c);
  REQUIRE(plain.ok);
  CHECK(live(plain.devices[0].program, "backward", "vision tower") == 0);
  // ms-swift 3.5+: enable_input_require_grads on the tower and its blocks checkpointed. Each block keeps its input
  // (the embeddings' output and blocks 0-30's), the frozen merger's LayerNorm its input (block 31's) and statistics.
  c.training.vit_gradient_checkpointing = "true";
  const Result swift = simulate(c);
  REQUIRE(swift.ok);
  const StepProgram& p = swift.devices[0].program;
  const int64_t hidden = 1024 * 1280 * 2;
  CHECK(live(p, "backward", "vision tower block y") == 31 * hidden + hidden);
  CHECK(live(p, "backward", "vision tower embeddings") == hidden);
  CHECK(live(p, "backward", "patch merger LayerNorm mean") == 8 * 1024);
  CHECK(has_label(p, "gradient of vision tower"));  // backward runs through the frozen blocks
  CHECK(swift.params_trainable == plain.params_trainable);
  for (const char* label : {"vision tower", "gradient of vision tower", "projector", "patch merger", "image", "pixel values"})
    CHECK(live(p, "optimizer", label) == 0);
  Config text = c;
  text.model.vision_tower.clear(), text.model.vision_tower_args.clear();
  CHECK(has_error(text, "training.vit_gradient_checkpointing"));
}

TEST_CASE("What helps offers a smaller max_pixels for a native-resolution tower", "[vision][qwen2_vl][advice]") {
  Config c = qwen2_vl(2, 4096, "image_height=1080,image_width=1920,max_pixels=1003520");  // 1,222 tokens an image
  c.data.images_per_sample = 2;
  const auto candidates = suggestion_candidates(c);
  const Suggestion* half = nullptr;
  for (const auto& s : candidates)
    if (s.id == "max_pixels_half") half = &s;
  REQUIRE(half);
  CHECK(half->group == SuggestionGroup::ChangesJob);
  // 728 x 1316 resized: half its area is the new budget, and the image shrinks to 504 x 952 (612 tokens).
  CHECK(architecture_arg(half->config.model.vision_tower_args, "max_pixels", 0) == 728 * 1316 / 2);
  const int64_t tokens = vision_image_tokens(half->config.model);
  CHECK(tokens < 1222 / 2 + 50);
  CHECK(half->config.training.sequence_length == 4096 - 2 * (1222 - tokens));  // one image a sample, its text unchanged
  const Result before = simulate(c), after = simulate(half->config);
  REQUIRE(before.ok);
  REQUIRE(after.ok);
  CHECK(after.devices[0].peak.allocated_bytes < before.devices[0].peak.allocated_bytes);
}
