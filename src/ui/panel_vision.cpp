// The Model section's vision tower: a vision-language model in LLaVA's (1.5 or NeXT's anyres), Qwen2-VL's or Qwen2.5-VL's layout (core/config.h
// ModelConfig::vision_tower; core/vision_step.cpp). The tower is a built-in program, run frozen on each sample's
// images; its arguments (Qwen2-VL: the image's size and max_pixels), LLaVA's projector depth and the images per
// sample follow. A summary line says what one image
// costs in the sequence and what the tower and the projector weigh.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <map>
#include <memory>
#include <string>

#include "core/architecture.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// LLaVA-1.5's tower, openai/clip-vit-large-patch14-336 (the llava-1.5 presets' vision_config): what choosing CLIP
// sets, where the arguments were empty, rather than the program's own defaults (ViT-B/32 at 224).
constexpr const char* kLlavaTowerArgs =
    "hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096,image_size=336,patch_size=14";

}  // namespace

bool draw_vision_tower(Config& c) {
  if (!subsection("Vision tower (LLaVA, Qwen2-VL, Qwen2.5-VL)")) return false;
  ModelConfig& m = c.model;
  bool changed = false;
  const FieldSpec& tower = field_spec("model.vision_tower");
  static const char* const kTowers[] = {"", "clip_vision", "qwen2_vl_vision", "qwen2_5_vl_vision"};
  int on = 0;
  for (int i = 1; i < 4; ++i)
    if (m.vision_tower == kTowers[i]) on = i;
  if (on == 0 && !m.vision_tower.empty()) on = 1;  // a program given as text: shown under CLIP, its field says more
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  if (index_combo(tower.label.data(), on,
                  {"none (text only)", "CLIP (clip_vision)", "Qwen2-VL (qwen2_vl_vision)", "Qwen2.5-VL (qwen2_5_vl_vision)"})) {
    const bool same = m.vision_tower == kTowers[on];
    m.vision_tower = kTowers[on];
    if (on == 0 || !same) m.vision_tower_args.clear();
    // LLaVA-1.5's CLIP; Qwen2-VL's merger maps to the language model's width, the tower's hidden_size.
    if (on == 1 && m.vision_tower_args.empty()) m.vision_tower_args = kLlavaTowerArgs;
    if (on == 2 && m.vision_tower_args.empty()) m.vision_tower_args = "hidden_size=" + std::to_string(m.hidden_size);
    if (on == 3 && m.vision_tower_args.empty()) m.vision_tower_args = "out_hidden_size=" + std::to_string(m.hidden_size);
    changed = true;
  }
  const char* const kSpoken[] = {"none, list", "CLIP, list", "Qwen2-VL, list", "Qwen2.5-VL, list"};
  announce_focus(focus_words(tower.label.data(), kSpoken[on], "model.vision_tower", tower.help.data()));
  help_marker(tower.help.data(), item_has_keyboard_focus());
  field_error("model.vision_tower");
  if (!m.vision_tower.empty()) {
    // Decoded once per change of the tower or its arguments: the page redraws many frames of one setup.
    static std::string decoded_spec, decoded_args, summary;
    static bool merger = false;  // Qwen2-VL's patch merger has a fixed depth
    static bool image_sized = false;  // the program takes image_height, image_width and max_pixels
    static bool anyres_capable = false;  // the CLIP program's LLaVA-NeXT tiles (anyres, image_height, image_width)
    static std::map<std::string, double> image_defaults;
    if (decoded_spec != m.vision_tower || decoded_args != m.vision_tower_args) {
      decoded_spec = m.vision_tower, decoded_args = m.vision_tower_args;
      std::shared_ptr<const Architecture> a;
      decode_architecture(m.vision_tower, m.vision_tower_args, a);
      summary.clear(), merger = false, image_sized = false, anyres_capable = false;
      image_defaults.clear();
      std::shared_ptr<const Architecture> plain;
      decode_architecture(m.vision_tower, "", plain);
      if (plain) {
        for (const auto& [name, value] : plain->defaults) image_defaults[name] = value;
        image_sized = image_defaults.count("image_height") && image_defaults.count("image_width") && image_defaults.count("max_pixels");
        anyres_capable = image_defaults.count("anyres") && image_defaults.count("image_height") && image_defaults.count("image_width");
      }
      if (a) {
        summary = "Each image is " + std::to_string(vision_image_tokens(m)) + " tokens of the sequence (" +
                  std::to_string(a->repeat) + " blocks of width " + std::to_string(tower_spec(*a).width) + ", ";
        merger = tower_spec(*a).projector == TowerSpec::Projector::PatchMerger;
      }
    }
    // Whether the tower trains is the training section's, not the cached program's: said apart from the cache.
    if (!summary.empty())
      ImGui::TextWrapped("%s%s", summary.c_str(), c.training.train_vision_tower ? "trained in full)." : "frozen, under no_grad).");
    // A native-resolution tower (Qwen2-VL's) sizes each image by its arguments: inputs of their own, written into
    // the arguments (left out where they equal the program's default, as the model program panel does).
    if (image_sized) {
      static const std::pair<const char*, const char*> kImage[] = {
          {"image_height", "The image's height in pixels before the processor resizes it (smart_resize: to multiples of 28, its area within min_pixels and max_pixels)."},
          {"image_width", "The image's width in pixels before the processor resizes it."},
          {"max_pixels", "The processor's largest image area after resizing: the hub's preprocessor_config.json sets 12845056; ms-swift's MAX_PIXELS and LLaMA-Factory's image_max_pixels set their own."}};
      for (const auto& [name, help] : kImage) {
        const double fallback = image_defaults[name];
        const double current = architecture_arg(m.vision_tower_args, name, fallback);
        int64_t v = static_cast<int64_t>(current);
        const std::string field = std::string("model.vision_tower_args.") + name;
        if (int_input(name, field.c_str(), v, std::string(name) == "max_pixels" ? 28 * 28 * 64 : 28, help) && v != current) {
          m.vision_tower_args = set_architecture_arg(m.vision_tower_args, name, static_cast<double>(v), fallback);
          changed = true;
        }
      }
    }
    // LLaVA-NeXT (llava_next): the CLIP tower on the image's base view and the tiles of its best grid pinpoint, which
    // the image's size chooses (0: the tower's image_size).
    if (anyres_capable) {
      bool anyres = architecture_arg(m.vision_tower_args, "anyres", 0) != 0;
      if (ImGui::Checkbox("anyres tiles (LLaVA-NeXT)", &anyres)) {
        m.vision_tower_args = set_architecture_arg(m.vision_tower_args, "anyres", anyres ? 1 : 0, 0);
        changed = true;
      }
      const char* anyres_help = "LLaVA-NeXT (LLaVA-1.6): each image also runs the tower on the tiles of the best of llava-v1.6's grid pinpoints for its size, and brings their unpadded features and a newline row per row of patches into the sequence.";
      announce_focus(std::string("anyres tiles, checkbox, ") + (anyres ? "checked. " : "not checked. ") + anyres_help);
      help_marker(anyres_help, item_has_keyboard_focus());
      if (anyres) {
        static const std::pair<const char*, const char*> kSize[] = {
            {"image_height", "The image's height in pixels before processing; it and the width choose the tiles (0: the tower's image_size)."},
            {"image_width", "The image's width in pixels before processing (0: the tower's image_size)."}};
        for (const auto& [name, help] : kSize) {
          const double current = architecture_arg(m.vision_tower_args, name, 0);
          int64_t v = static_cast<int64_t>(current);
          const std::string field = std::string("model.vision_tower_args.") + name;
          if (int_input(name, field.c_str(), v, 14, help) && v != current) {
            m.vision_tower_args = set_architecture_arg(m.vision_tower_args, name, static_cast<double>(v), 0);
            changed = true;
          }
        }
      }
    }
    const FieldSpec& args = field_spec("model.vision_tower_args");
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    changed |= ImGui::InputText(args.label.data(), &m.vision_tower_args);
    announce_text_input(args.label.data(), m.vision_tower_args, args.help.data());
    help_marker(args.help.data(), item_has_keyboard_focus());
    field_error("model.vision_tower_args");
    if (!merger) changed |= int_input("model.projector_depth", m.projector_depth, 1);
    changed |= choice_combo("training.train_projector", c.training.train_projector,
                            c.peft.enabled() ? "frozen: PEFT freezes the base" : "trained: no PEFT");
    changed |= check_input("training.train_vision_tower", c.training.train_vision_tower);
    changed |= choice_combo("training.vit_gradient_checkpointing", c.training.vit_gradient_checkpointing,
                            c.training.train_vision_tower ? "with the decoder's checkpointing" : "frozen: no graph");
    changed |= int_input("data.images_per_sample", c.data.images_per_sample, 1);
  }
  ImGui::TreePop();
  return changed;
}

}  // namespace memsim::ui
