// LLaVA-NeXT (LLaVA-1.6): the CLIP tower on each image's base view and anyres tiles, the image tokens the processor
// counts, the image_newline row, the import of llava_next config.json and the field errors.
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

Config llava_next(int64_t height, int64_t width, int64_t sequence = 4096) {
  Parsed p = model_from_hf_json(read_file(source_path("tests/data/hf/llava-v1.6-mistral-7b-hf.json")));
  REQUIRE(p.ok);
  Config c = p.config;
  c.model.vision_tower_args = set_architecture_arg(c.model.vision_tower_args, "image_height", double(height), 0);
  c.model.vision_tower_args = set_architecture_arg(c.model.vision_tower_args, "image_width", double(width), 0);
  c.training.micro_batch_size = 1;
  c.training.sequence_length = sequence;
  c.training.precision = "bf16_pure";
  c.training.activation_checkpointing = "none";
  c.peft.method = "lora";
  return c;
}

}  // namespace

TEST_CASE("LLaVA-NeXT: the image tokens and crops LlavaNextProcessor counts", "[vision][llava_next]") {
  // Reference values from processing_llava_next.py's _get_number_of_features and select_best_resolution over
  // llava-v1.6's pinpoints (computed in Python): base 576 + the tiles' unpadded rows x columns + a newline per row.
  const struct { int64_t h, w, crops, tokens; } kCases[] = {
      {480, 640, 5, 2340}, {336, 336, 3, 1176}, {1080, 1920, 5, 1948}, {1920, 1080, 5, 1968}, {224, 2000, 4, 1160}};
  for (const auto& k : kCases) {
    const Config c = llava_next(k.h, k.w);
    INFO(k.h << " x " << k.w);
    CHECK(vision_image_tokens(c.model) == k.tokens);
    const ModelShape s = model_shape_of(c.model);
    CHECK(s.image_crops == k.crops);
    CHECK(s.projector_rows == k.crops * 576);
  }
  // Without anyres the same tower is LLaVA-1.5's: one view, 576 tokens, no newline parameter.
  Config one = llava_next(480, 640);
  one.model.vision_tower_args = set_architecture_arg(one.model.vision_tower_args, "anyres", 0, 0);
  CHECK(vision_image_tokens(one.model) == 576);
  CHECK(model_shape_of(one.model).params_total == model_shape_of(llava_next(480, 640).model).params_total - 4096);
}

TEST_CASE("LLaVA-NeXT: the tower runs on every crop and the pixel batch holds them", "[vision][llava_next]") {
  // 640 x 480: 5 crops of 3 x 336 x 336 fp32 pixels, kept by the batch until the micro-batch's backward.
  Config c = llava_next(480, 640);
  Result r = simulate(c);
  INFO((r.errors.empty() ? "" : r.errors[0].message));
  REQUIRE(r.ok);
  CHECK(live(r.devices[0].program, "backward", "pixel values") == 5 * 3 * 336 * 336 * 4);
  // The frozen tower keeps every hidden state while it runs (output_hidden_states): five crops' worth, where one view
  // holds one.
  Config plain = c;
  plain.model.vision_tower_args = set_architecture_arg(plain.model.vision_tower_args, "anyres", 0, 0);
  Result r1 = simulate(plain);
  REQUIRE(r1.ok);
  const int64_t tower5 = peak_live_in_phase(r.devices[0].program, "forward (step 1)", Component::Activations);
  const int64_t tower1 = peak_live_in_phase(r1.devices[0].program, "forward (step 1)", Component::Activations);
  CHECK(tower5 > tower1);
}

TEST_CASE("LLaVA-NeXT: imports, refusals and field errors", "[vision][llava_next][bad-input]") {
  const Config c = llava_next(0, 0);
  CHECK(c.model.vision_tower == "clip_vision");
  CHECK(architecture_arg(c.model.vision_tower_args, "anyres", 0) == 1);
  // Other grid pinpoints than llava-v1.6's are refused at import, naming the tower.
  std::string text = read_file(source_path("tests/data/hf/llava-v1.6-mistral-7b-hf.json"));
  const std::string pins = "[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]";
  REQUIRE(text.find(pins) != std::string::npos);
  text.replace(text.find(pins), pins.size(), "[[384, 768], [768, 384]]");
  Parsed p = model_from_hf_json(text);
  CHECK(!p.ok);
  // The sequence must hold the image's tokens: 2,340 for 640 x 480.
  Config shortseq = llava_next(480, 640, 2048);
  auto errors = validate(shortseq);
  REQUIRE(!errors.empty());
  CHECK(errors[0].message.find("2340") != std::string::npos);
  Config bad = llava_next(480, 640);
  bad.model.vision_tower_args = set_architecture_arg(bad.model.vision_tower_args, "anyres", 2, 0);
  errors = validate(bad);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "model.vision_tower_args");
  bad = llava_next(480, 640);
  bad.model.vision_tower_args = set_architecture_arg(bad.model.vision_tower_args, "image_width", -3, 0);
  errors = validate(bad);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].message.find("image_width") != std::string::npos);
}
