// The question users come with, at the top of the inputs: the model, the method, the GPUs (how many, which card,
// on how many nodes), the micro-batch and the sequence length. Everything else is under Details.
//
// A model or a method picked here sets what it implies (question.h) and keeps every field the user set by hand; the
// micro-batch and sequence length, until the user sets them, are the largest that fit (fit_shape).
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "core/gpu_count.h"
#include "core/tables.h"
#include "model_picker.h"
#include "panels.h"
#include "question.h"

namespace memsim::ui {

namespace {

std::string lowercase(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Every word of `needle` appears in `hay` (both lowercase).
bool matches(const std::string& hay, const std::string& needle) {
  size_t pos = 0;
  while (pos < needle.size()) {
    size_t end = needle.find(' ', pos);
    if (end == std::string::npos) end = needle.size();
    if (end > pos && hay.find(needle.substr(pos, end - pos)) == std::string::npos) return false;
    pos = end + 1;
  }
  return true;
}

// The method: Full, LoRA and QLoRA a click each; the other PEFT methods in a list beside Other.
bool method_choice(Config& c) {
  static const Method kOthers[] = {Method::Dora, Method::Ia3, Method::LnTuning, Method::PromptTuning};
  const char* help = "Full fine-tuning trains every parameter. LoRA trains low-rank adapters on a frozen base; QLoRA does "
                     "so on a base stored in 4 bits (NF4 with double quantization, adapters on every linear layer). "
                     "Other: DoRA, IA3, LayerNorm or prompt tuning; their settings are under Details > Fine-tuning.";
  const Method now = method_of(c.peft);
  const bool other = now != Method::Full && now != Method::Lora && now != Method::Qlora;
  bool changed = false;
  auto radio = [&](const char* label, const char* words, bool active, Method m) {
    if (ImGui::RadioButton(label, active) && !active) set_method(c, m), changed = true;
    const bool focused = item_has_keyboard_focus();
    announce_focus(focus_words("method", std::string(words) + (active ? ", chosen" : ", option"), "peft.method", help),
                   focused);
    ImGui::SameLine();
  };
  radio("Full", "Full fine-tuning", now == Method::Full, Method::Full);
  radio("LoRA", "LoRA", now == Method::Lora, Method::Lora);
  radio("QLoRA", "QLoRA, LoRA on a 4-bit NF4 base", now == Method::Qlora, Method::Qlora);
  radio("Other", "another PEFT method", other, Method::Dora);
  ImGui::TextUnformatted("method");
  help_marker(help, false);
  if (other) {
    std::string preview = method_label(now);
    if (now == Method::Other)
      preview = c.peft.method + (c.peft.base_quantization != "none" ? ", " + c.peft.base_quantization + " base" : "");
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    if (ImGui::BeginCombo("PEFT method", preview.c_str())) {
      for (Method m : kOthers) {
        const bool selected = m == now;
        if (ImGui::Selectable(method_label(m), selected) && !selected) set_method(c, m), changed = true;
        if (selected && ImGui::IsWindowAppearing()) ImGui::SetItemDefaultFocus();
        announce_focus(std::string(method_label(m)) + (selected ? ", chosen" : ""));
      }
      ImGui::EndCombo();
    }
    announce_focus(focus_words("PEFT method", preview + ", list", "peft.method", help));
  }
  field_error("peft.method");
  field_error("peft.base_quantization");
  return changed;
}

// The GPU card, with a search box. Opened with the keyboard, the list starts on the current card (the arrows move
// from there, or up to the search box); opened with the mouse, the search box has the focus.
bool gpu_picker(HardwareConfig& hw) {
  static std::string filter;
  static bool was_focused = false;  // the combo had the keyboard focus in the frame before it opened
  std::string preview = hw.gpu == "custom" ? "Custom capacity" : hw.gpu;
  for (const auto& g : gpus())
    if (g.id == hw.gpu) preview = std::string(g.label);
  const std::string help_text = std::string(field_spec("hardware.gpu").help) +
                                " Type to search by name or vendor; Custom capacity takes any size (Details > Hardware).";
  const char* help = help_text.c_str();
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  bool changed = false;
  const bool open = ImGui::BeginCombo("GPU", preview.c_str(), ImGuiComboFlags_HeightLarge);
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words("GPU", preview + ", list with a search box", "hardware.gpu", help), focused);
  if (open) {
    const bool appearing = ImGui::IsWindowAppearing();
    if (appearing) filter.clear();
    if (appearing && !was_focused) ImGui::SetKeyboardFocusHere();
    ImGui::SetNextItemWidth(-1);
    const bool enter = ImGui::InputTextWithHint("##gpu filter", "search, e.g. a100 or h100", &filter,
                                                ImGuiInputTextFlags_EnterReturnsTrue);
    announce_focus("Search the GPUs: " + (filter.empty() ? std::string("empty") : filter) + ". Enter picks the first match");
    const std::string needle = lowercase(filter);
    int shown = 0;
    for (const auto& g : gpus()) {
      if (!matches(lowercase(std::string(g.id) + " " + std::string(g.label) + " " + std::string(g.vendor)), needle)) continue;
      ++shown;
      const bool selected = g.id == hw.gpu;
      if (ImGui::Selectable(std::string(g.label).c_str(), selected) || (enter && shown == 1)) {
        changed = hw.gpu != g.id;
        hw.gpu = std::string(g.id);
        if (enter) ImGui::CloseCurrentPopup();
      }
      if (selected && appearing && was_focused) ImGui::SetItemDefaultFocus();
      announce_focus(std::string(g.label) + (selected ? ", chosen" : ""));
    }
    if (shown == 0) ImGui::TextDisabled("No GPU matches \"%s\"", filter.c_str());
    if (ImGui::Selectable("Custom capacity", hw.gpu == "custom")) changed = hw.gpu != "custom", hw.gpu = "custom";
    announce_focus("Custom capacity: set its bytes under Details > Hardware");
    ImGui::EndCombo();
  }
  was_focused = !open && focused;
  help_marker(help, focused);
  field_error("hardware.gpu");
  return changed;
}

// The question's state beside the setup: what the user set by hand, and the setup as the panel last left it (a
// change between frames came from elsewhere: a link, a file, What helps).
struct QuestionState {
  const Config* owner = nullptr;
  Config seen;
  HandSet hand;
};

QuestionState& state() {
  static QuestionState s;
  return s;
}

HandSet& hand_set() { return state().hand; }

}  // namespace

void question_frame_start(const Config& c) {
  QuestionState& s = state();
  if (s.owner != &c) {
    // A new setup to answer (a new app): what it holds apart from the defaults was chosen by someone, a link's
    // author or a file's; the model is replaced whole when another is picked.
    s = QuestionState{&c, c, {}};
    Config defaults;
    defaults.model = c.model;
    note_hand_set(s.hand, defaults, c);
    return;
  }
  if (!(s.seen == c)) note_hand_set(s.hand, s.seen, c);  // changed since the last frame, from outside the inputs
}

void question_frame_end(const Config& c) { state().seen = c; }

bool draw_question_inputs(Config& c) {
  HandSet& hand = hand_set();
  bool changed = false;
  // The model: the catalogue's picker (model_picker.cpp), on a copy, so that picking goes through choose_model.
  ModelConfig m = c.model;
  if (model_picker(m)) {
    for (auto it = hand.begin(); it != hand.end();) it = it->rfind("model.", 0) == 0 ? hand.erase(it) : std::next(it);
    choose_model(c, m, hand);
    changed = true;
  }
  if (method_choice(c)) {
    hand.insert("peft.method");
    fit_shape(c, hand);
    changed = true;
  }
  int64_t gpus = gpu_count(c.parallel);
  if (int_input("GPUs", "parallel.gpus", gpus, 1,
                "How many GPUs train together. Data parallel follows: GPUs / (tensor x pipeline x context parallel, "
                "under Details > Parallelism), so those must divide it.")) {
    set_gpu_count(c.parallel, gpus);
    hand.insert("parallel.gpus");
    if (!c.parallel.gpus) fit_shape(c, hand);
    changed = true;
  }
  if (gpu_picker(c.hardware)) {
    hand.insert("hardware.gpu");
    fit_shape(c, hand);
    changed = true;
  }
  int64_t nodes = node_count(c);
  if (int_input("nodes", "hardware.gpus_per_node", nodes, 1,
                "Machines the GPUs are spread over: GPUs per node (Details > Hardware) becomes GPUs / nodes, rounded "
                "up. With offload, the GPUs of a node share its host RAM.") && nodes >= 1) {
    const int64_t g = std::max<int64_t>(gpu_count(c.parallel), 1);
    c.hardware.gpus_per_node = std::clamp<int64_t>((g + nodes - 1) / nodes, 1, 1024);
    hand.insert("hardware.gpus_per_node");
    changed = true;
  }
  const int64_t per_node = std::min(c.hardware.gpus_per_node, std::max<int64_t>(gpu_count(c.parallel), 1));
  ImGui::TextDisabled("%lld GPU%s per node", static_cast<long long>(per_node), per_node == 1 ? "" : "s");
  auto& t = c.training;
  if (int_input("training.micro_batch_size", t.micro_batch_size, 1))
    hand.insert("training.micro_batch_size"), changed = true;
  // A model program's inputs have the shapes it declares (an image size): the sequence length does not apply.
  const bool program = !c.model.architecture.empty();
  if (program) ImGui::TextDisabled("sequence: the model program's own (its inputs' shapes, under Details > Model)");
  else if (int_input("training.sequence_length", t.sequence_length, 512))
    hand.insert("training.sequence_length"), changed = true;
  if (!hand.count("training.micro_batch_size") || (!program && !hand.count("training.sequence_length"))) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("Not set by hand: the largest that fit the model, method and GPUs.");
    ImGui::PopStyleColor();
  }
  // The objective: supervised, or a preference objective over pairs (its reference under Details > Training). Last,
  // so that the rows above keep their places.
  if (!program && choice_combo("training.objective", t.objective, "")) {
    hand.insert("training.objective");
    choose_objective(c);
    fit_shape(c, hand);
    changed = true;
  }
  return changed;
}

}  // namespace memsim::ui
