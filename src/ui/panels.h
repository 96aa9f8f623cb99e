// One function per panel; each lives in its own file.
#pragma once
#include <imgui.h>

#include <chrono>
#include <initializer_list>
#include <string>

#include "core/config.h"
#include "core/fields.h"
#include "core/frameworks.h"
#include "core/format.h"
#include "core/result.h"
#include "core/simulate.h"
#include "keyboard.h"

namespace memsim::ui {

// Inputs: the question (the model, method, GPUs, card, nodes, micro-batch and sequence length), then under Details
// the model, training, data, versions, parallelism, hardware and fine-tuning sections. Returns true when the config
// changed. reveal_data scrolls the Data section into view (a link or a file just changed it).
bool draw_inputs_panel(Config& config, const Result& result, bool reveal_data = false);

// The question section (panel_question.cpp). question_frame_start notes what changed since question_frame_end of the
// last frame as set by hand (Details' edits, a link, What helps; question.h HandSet); the question's own choices are
// not. Returns true when the config changed.
void question_frame_start(const Config& config);
bool draw_question_inputs(Config& config);
void question_frame_end(const Config& config);
// Fit verdict per device, stacked bar by component and the exact table. `version` names the result's content, as for
// the timeline (0: unknown).
void draw_results_panel(const Config& config, const Result& result, Unit unit, uint64_t version = 0);
// One line that stays above the results tabs, whichever is open: the worst GPU's verdict, its nvidia-smi peak
// against the usable memory and the headroom (core/format.h describe_usable). `current`: false greys it (the result
// of the previous setup while this one simulates). verdict_line_text is its words, "" without a result.
void draw_verdict_line(const Result& result, Unit unit, bool current = true);
std::string verdict_line_text(const Result& result, Unit unit);
// Allocated and reserved memory over the events of the step, phases and peak marked; hover shows the event.
// `version` names the result's content (0: unknown): the chart's columns are rebuilt, and uploaded by a renderer,
// only when it, the chart's size or the theme change. every_event draws one column per event even where several
// share a pixel: the renderer benchmark's worst case.
void draw_timeline_panel(const Result& result, Unit unit, uint64_t version = 0, bool every_event = false);
// A run of varying shapes (the first device's RunTrace), a column per step: its allocated and reserved peak above,
// the tokens of its longest micro-batch below; the allocated peak's, the reserved peak's and the longest sample's
// steps marked; hover shows the step. `version` as for the timeline.
void draw_run_panel(const Result& result, Unit unit, uint64_t version = 0);

// Single changes that lower the peak, ranked; returns true when one was applied to `config`. `current` is the
// setup's own result once `ready` (its simulation complete); until then the panel simulates nothing, so that the
// setup's own run gets the frames first.
bool draw_advice_panel(Config& config, Unit unit, const Result& current, bool ready);

// A heatmap of the peak over two axes of the setup; returns true when a clicked cell changed `config`. Cells are
// simulated only while `ready`, as for the advice panel.
bool draw_explorer_panel(Config& config, Unit unit, bool ready);

// For the panels that simulate many variants of the setup (What helps, the fit explorer): the layer passes one
// variant of a run may replay (data_shape.h run_steps_within). A Llama-7B-shaped run (32 layers) replays about 150
// steps within it, some 40 ms natively and twice that in wasm, so that a list of 25 changes or a grid of 42 cells
// fills in within seconds.
constexpr int64_t kVariantRunLayerPasses = 5000;
// Advances `sim` until it is done (true) or `deadline` has passed (false): the panels' and the app's share of a frame.
bool advance_until(Simulation& sim, std::chrono::steady_clock::time_point deadline);
// A panel that has work left for later frames (changes or cells still to simulate) says so in each frame it draws: the
// platform draws only on input otherwise, and keeps frames coming while this is said (App::wants_frames).
void note_work_left();
// Whether a panel said so since the last call, which clears it: App::frame() asks once per frame.
bool take_work_left();

// The Model section of a model program (model.architecture): the program, its arguments, the way back to the
// built-in families. Returns true when the config changed.
bool draw_program_model(ModelConfig& m);
// The Model section's vision tower (a vision-language model in LLaVA's layout), its arguments, the projector's depth
// and the images per sample. Returns true when the config changed.
bool draw_vision_tower(Config& config);

// Parallelism and hardware inputs. Returns true when the config changed.
bool draw_parallel_inputs(Config& config);

// Parameter-efficient fine-tuning inputs (LoRA/DoRA, quantized base). Returns true when the config changed.
bool draw_peft_inputs(Config& config);

// The data a run reads (sequence lengths, padding, the sampler's order, the dataset) and how much of the run is
// replayed; training.empty_cache_steps. Returns true when the config changed.
bool draw_data_inputs(Config& config, bool reveal = false);
// The library versions (latest by default) and a date, with the switches they set. Returns true when the config
// changed.
bool draw_versions_inputs(Config& config);

// Shared widgets. Inputs show the simulator's message for their field under them (set_field_errors).
// A "(?)" that shows `text` when hovered, or when `focused` (the keyboard focus is on the input it explains).
void help_marker(const char* text, bool focused = false);
// The words that announce a focused input: "label: value. help", and the field's problem if it has one.
std::string focus_words(const char* label, const std::string& value, const char* field, const char* help);
void set_field_errors(const Result* result);
void field_error(const char* field);
// The field registry's row of `field` (core/fields.h), whose label and help the short forms below show.
const FieldSpec& field_spec(const char* field);
bool int_input(const char* label, const char* field, int64_t& v, int64_t step, const char* help);
bool check_input(const char* label, const char* field, bool& v, const char* help);
bool double_input(const char* label, const char* field, double& v, const char* help);
bool choice_combo(const char* label, const char* field, std::string& value, const char* auto_means, const char* help);
// A switch that the library versions derive (core/frameworks.h Switch): choice_combo whose auto shows the resolved
// value, and, where a stated version decided it, a line under it naming the versions (announced with the input).
bool switch_combo(const char* label, const char* field, std::string& value, const Resolved& resolved, Switch s,
                  const char* help);
// The same inputs labelled and explained by the field registry: what almost every input uses; the forms above are for
// the few whose words depend on the rest of the config.
bool int_input(const char* field, int64_t& v, int64_t step);
bool check_input(const char* field, bool& v);
bool double_input(const char* field, double& v);
bool choice_combo(const char* field, std::string& value, const char* auto_means);
bool switch_combo(const char* field, std::string& value, const Resolved& resolved, Switch s);

// A combo over a table of the core (precision recipes, optimizers, GPUs, frameworks), shown by label.
template <typename Table>
bool table_combo(const char* label, const char* field, std::string& id, Table table, const char* help,
                 bool allow_custom = false) {
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  std::string preview = id;
  for (const auto& e : table)
    if (e.id == id) preview = std::string(e.label);
  bool changed = false;
  const bool open = ImGui::BeginCombo(label, preview.c_str());
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words(label, preview + ", list", field, help), focused);
  if (open) {
    for (const auto& e : table) {
      bool selected = e.id == id;
      if (ImGui::Selectable(std::string(e.label).c_str(), selected)) id = std::string(e.id), changed = true;
      if (selected) ImGui::SetItemDefaultFocus();
      announce_focus(std::string(e.label) + (selected ? ", chosen" : ""));
    }
    if (allow_custom && ImGui::Selectable("Custom capacity", id == "custom")) id = "custom", changed = true;
    announce_focus("Custom capacity");
    ImGui::EndCombo();
  }
  help_marker(help, focused);
  field_error(field);
  return changed;
}

bool string_combo(const char* label, const char* field, std::string& value, std::initializer_list<const char*> values,
                  const char* help);
bool string_combo(const char* field, std::string& value, std::initializer_list<const char*> values);
template <typename Table>
bool table_combo(const char* field, std::string& id, Table table, bool allow_custom = false) {
  const FieldSpec& f = field_spec(field);
  return table_combo(f.label.data(), field, id, table, f.help.data(), allow_custom);
}
std::string bytes_text(int64_t bytes, Unit unit);
// ImGui::Combo over `items`, whose open list announces the focused item: the caller announces the combo itself
// (right after this call, the combo is the last item). True when another item was picked.
bool index_combo(const char* label, int& index, std::initializer_list<const char*> items);
bool index_combo(const char* label, int& index, const char* const* items, int count);
// A section of the inputs (a collapsing header, open at first) and a subsection (a tree node: TreePop() it when open),
// each announced with its state when focused.
bool section(const char* label);
bool subsection(const char* label);
// Announces the last item, a text field, when it has the keyboard focus.
void announce_text_input(const char* label, const std::string& value, const char* help);

}  // namespace memsim::ui
