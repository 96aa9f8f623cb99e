// The model picker. Several hundred presets (src/core/catalog) are searched as the user types
// (core/catalog.h search_model_presets: words of a name or an HF id such as meta-llama/Llama-3.1-8B); a search
// that finds nothing says so in the list, so that an empty list is never mistaken for a catalogue that is loading.
#include "model_picker.h"

#include <imgui.h>
#include <imgui_internal.h>  // GetActiveID and NavActivateId: when the search field can take typed characters
#include <imgui_stdlib.h>

#include <cfloat>
#include <string>
#include <vector>

#include "core/catalog.h"
#include "core/format.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// The search of the last frame, kept while the text is unchanged: a search scans every preset's strings.
struct Search {
  std::string text;
  std::vector<const ModelPreset*> found;
  bool done = false;
};

const std::vector<const ModelPreset*>& found_for(const std::string& text) {
  static Search last;
  if (!last.done || last.text != text) {
    last.text = text;
    last.found = search_model_presets(text);
    last.done = true;
  }
  return last.found;
}

// A preset whose fields were changed afterwards keeps its name in the config; the picker says it was edited, so that
// "Llama 3.1 8B" is not shown for a model that no longer is one.
std::string shown_name(const ModelConfig& m) {
  std::string shown = m.name;
  static const ModelConfig default_model;
  // A model program opened from a link carries no name of its own: the program names it.
  if (!m.architecture.empty() && m.name == default_model.name)
    return m.architecture.front() == '{' ? "Model program (Details > Model)" : "Model program \"" + m.architecture + "\"";
  if (m.name == default_model.name) {
    if (!(m == default_model)) shown += " (edited)";
    return shown;
  }
  for (const auto& p : model_presets())
    if (p.name == m.name) {
      if (!(p.model == m)) shown += " (edited)";
      break;
    }
  return shown;
}

void preset_tooltip(const ModelPreset& p) {
  ImGui::BeginTooltip();
  ImGui::Text("%s (%s)", p.hf_id.c_str(), p.id.c_str());
  if (!p.supported) {
    ImGui::TextColored(ImVec4(1, 0.6f, 0.4f, 1), "%s", p.unsupported_reason.c_str());
  } else {
    ImGui::Text("%s layers, hidden %s%s", format_count(p.model.num_hidden_layers).c_str(),
                format_count(p.model.hidden_size).c_str(),
                p.model.num_experts > 0 ? (", " + format_count(p.model.num_experts) + " experts").c_str() : "");
    if (p.params_published > 0) ImGui::Text("published: %s parameters", format_count(p.params_published).c_str());
  }
  if (!p.generated_from.empty()) ImGui::TextDisabled("shape from litgpt's config.py (tools/catalog/import_litgpt.py)");
  ImGui::EndTooltip();
}

// ImGui 1.86 gives the search field the keyboard two frames after the list opens: SetKeyboardFocusHere() resolves at
// the end of the frame, and the frame that activates the field drops the characters it receives. A user who clicks
// the picker and types at once ("llama") would lose the first letters. The characters typed in those frames are held
// back here and handed to the field in the first frame it takes them. Not those of the frame the keyboard opened the
// list in: that is the Space that opened it.
class HeldKeys {
 public:
  // Before the search field, every frame the list is open.
  void before_field(bool appearing, bool opened_by_keyboard, ImGuiID field) {
    ImVector<ImWchar>& queue = ImGui::GetIO().InputQueueCharacters;
    if (appearing) {
      held_.clear();
      frames_left_ = 4;  // a frame to resolve the focus, one to activate, and some slack for a slow frame
      if (!opened_by_keyboard) take(queue);
      queue.resize(0);
      return;
    }
    if (frames_left_ == 0) return;
    if (ImGui::GetActiveID() == field) {  // the field takes characters this frame: the held ones first
      ImVector<ImWchar> all = held_;
      for (ImWchar c : queue) all.push_back(c);
      queue.swap(all);
      held_.clear();
      frames_left_ = 0;
      return;
    }
    --frames_left_;
    take(queue);  // still not taking them (the frame that activates it would drop them)
    queue.resize(0);
    if (frames_left_ == 0) held_.clear();  // the focus went elsewhere: typing is not for the field
  }

 private:
  void take(const ImVector<ImWchar>& queue) {
    for (ImWchar c : queue) held_.push_back(c);
  }
  ImVector<ImWchar> held_;
  int frames_left_ = 0;
};

}  // namespace

bool model_picker(ModelConfig& m) {
  static std::string filter;
  bool changed = false;
  const std::string shown = shown_name(m);
  // The list is as wide as the inputs column, not the combo, so that names and HF ids fit beside each other; as
  // tall as ImGui's large combo (20 rows).
  const float column = ImGui::GetContentRegionAvail().x;
  const ImGuiStyle& style = ImGui::GetStyle();
  ImGui::SetNextWindowSizeConstraints(
      ImVec2(column, 0.0f), ImVec2(FLT_MAX, 20 * (ImGui::GetFontSize() + style.ItemSpacing.y) + 2 * style.WindowPadding.y));
  ImGui::SetNextItemWidth(column * 0.55f);
  const ImGuiID combo = ImGui::GetID("preset");
  const bool open = ImGui::BeginCombo("preset", shown.c_str(), ImGuiComboFlags_HeightLarge);
  const bool opened_by_keyboard = GImGui->NavActivateId == combo;  // Space or Enter on the picker, not a click
  const bool focused = item_has_keyboard_focus();
  announce_focus("preset: " + shown + ", list with a search box: Space or Enter opens it, type a name or a Hugging "
                 "Face id, Enter picks the first match", focused);
  if (open) {
    static HeldKeys held;
    const bool appearing = ImGui::IsWindowAppearing();
    held.before_field(appearing, opened_by_keyboard, ImGui::GetID("##filter"));
    if (appearing) ImGui::SetKeyboardFocusHere();
    ImGui::SetNextItemWidth(-1);
    // Enter picks the first match, so the keyboard alone can choose a model. The last search is kept and selected,
    // so that typing replaces it.
    const bool enter = ImGui::InputTextWithHint("##filter", "name or HF id, e.g. llama 8b or meta-llama/Llama-3.1-8B",
                                                &filter, ImGuiInputTextFlags_EnterReturnsTrue |
                                                             ImGuiInputTextFlags_AutoSelectAll);
    const auto& found = found_for(filter);
    announce_focus("Search the models: " + (filter.empty() ? std::string("empty") : filter) + ". " +
                   (found.empty() ? std::string("No match") : format_count(static_cast<int64_t>(found.size())) + " found") +
                   ". Enter picks the first match");
    const size_t total = model_presets().size();
    if (found.empty()) {
      // Visible in the list itself: the search ran and found nothing (and why an Enter does nothing).
      ImGui::TextColored(ImVec4(1.0f, 0.62f, 0.35f, 1.0f), "No match for \"%s\"", filter.c_str());
      // Short lines: the list is no wider than a phone's inputs column.
      ImGui::TextDisabled("Search a name: llama 3.1 8b");
      ImGui::TextDisabled("or an HF id: meta-llama/Llama-3.1-8B");
      ImGui::TextDisabled("(%s models), or paste or drop", format_count(static_cast<int64_t>(total)).c_str());
      ImGui::TextDisabled("the model's config.json.");
    } else {
      ImGui::TextDisabled("%s of %s models", format_count(static_cast<int64_t>(found.size())).c_str(),
                          format_count(static_cast<int64_t>(total)).c_str());
    }
    if (enter && !found.empty()) {
      for (const ModelPreset* p : found)
        if (p->supported) {
          m = p->model;
          changed = true;
          break;
        }
      ImGui::CloseCurrentPopup();
    }
    // Only the rows in view are drawn: the catalogue is several hundred long.
    ImGuiListClipper clipper;
    clipper.Begin(static_cast<int>(found.size()));
    while (clipper.Step()) {
      for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
        const ModelPreset& p = *found[static_cast<size_t>(i)];
        ImGui::PushID(i);
        ImGui::BeginDisabled(!p.supported);
        if (ImGui::Selectable(p.name.c_str(), m.name == p.name) && !changed) {
          m = p.model;
          changed = true;
        }
        ImGui::EndDisabled();
        announce_focus(p.name + " (" + p.hf_id + ")" + (p.supported ? "" : ", not simulated: " + p.unsupported_reason));
        const bool hovered = ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled) || item_has_keyboard_focus();
        if (!p.hf_id.empty() && p.hf_id.substr(p.hf_id.find('/') + 1) != p.name) {
          ImGui::SameLine();
          ImGui::TextDisabled("%s", p.hf_id.c_str());
        } else if (!p.hf_id.empty()) {
          ImGui::SameLine();
          ImGui::TextDisabled("%s", p.hf_id.substr(0, p.hf_id.find('/')).c_str());
        }
        if (hovered) preset_tooltip(p);
        ImGui::PopID();
      }
    }
    ImGui::EndCombo();
  }
  help_marker("Models from the catalogue (src/core/catalog): search by name or Hugging Face id; each fills the fields "
              "below. Paste or drop any other config.json.", focused);
  return changed;
}

}  // namespace memsim::ui
