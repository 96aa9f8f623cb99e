// The data a run reads: every micro-batch of one length (the fixed shape), a list of micro-batch lengths, or a
// distribution of sample lengths batched as the run's collator and sampler batch them; and how much of the run
// memsim replays. Only the fields that matter for the choice are shown.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <string>

#include "panels.h"

namespace memsim::ui {

namespace {

// The list or the distribution, in one text field as wide as the row (the text is long) with its syntax and the
// field's problem under it. `name` is what the focus announces; the field shows no label.
bool lengths_text(const char* name, const char* field, std::string& value, const char* hint, const char* syntax,
                  const char* help) {
  ImGui::SetNextItemWidth(-ImGui::GetFontSize() * 1.6f);  // the whole row but the help mark
  const bool changed = ImGui::InputTextWithHint((std::string("##") + field).c_str(), hint, &value);
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words(name, (value.empty() ? std::string("empty") : value) + ", text", field,
                             (std::string(syntax) + " " + help).c_str()),
                 focused);
  help_marker(help, focused);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextUnformatted(syntax);
  ImGui::PopTextWrapPos();
  ImGui::PopStyleColor();
  field_error(field);
  return changed;
}

}  // namespace

bool draw_data_inputs(Config& c, bool reveal) {
  auto& d = c.data;
  bool changed = false;
  if (reveal) {  // the section's header at the top of the inputs, opened
    ImGui::SetScrollHereY(0.0f);
    ImGui::SetNextItemOpen(true);
  }
  if (!section("Data")) return false;

  static const char* const kLengths[] = {"fixed (packed, or padded to max length)", "listed per micro-batch",
                                         "a distribution of sample lengths"};
  static const char* const kLengthIds[] = {"fixed", "micro_batches", "samples"};
  int kind = d.lengths == "micro_batches" ? 1 : d.lengths == "samples" ? 2 : d.lengths == "fixed" ? 0 : -1;
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  if (index_combo("sequence lengths", kind, kLengths, 3)) {
    d.lengths = kLengthIds[kind];
    changed = true;
  }
  const char* lengths_help = field_spec("data.lengths").help.data();
  announce_focus(focus_words("sequence lengths", std::string(kind >= 0 ? kLengths[kind] : d.lengths.c_str()) + ", list",
                             "data.lengths", lengths_help));
  help_marker(lengths_help, item_has_keyboard_focus());
  field_error("data.lengths");

  if (!d.varies()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("Pick a list or a distribution to replay a whole run of varying lengths, or drop a file of "
                       "sample lengths (one per line, or a JSON array) onto the window.");
    ImGui::PopStyleColor();
    return changed;
  }
  const bool samples = d.lengths == "samples";
  if (samples) {
    changed |= lengths_text("sample lengths", "data.sample_lengths", d.sample_lengths, "p0=12,p50=310,p90=720,p100=2048",
                            "Percentiles p0=12,p50=310,p100=2048 or a histogram 0-256:40,256-512:35 (bins of lengths: "
                            "weight); or drop a file of lengths.",
                            "Tokens per sample, before padding. Samples longer than sequence_length are truncated to "
                            "it; without p100 the longest sample is taken as sequence_length, without p0 the shortest "
                            "as 1 token.");
    static const char* const kPadding[] = {"longest in the batch", "to max length", "none (padding-free)"};
    static const char* const kPaddingIds[] = {"longest", "max_length", "none"};
    int padding = d.padding == "max_length" ? 1 : d.padding == "none" ? 2 : d.padding == "longest" ? 0 : -1;
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    if (index_combo("padding", padding, kPadding, 3)) {
      d.padding = kPaddingIds[padding];
      changed = true;
    }
    const char* padding_help = field_spec("data.padding").help.data();
    announce_focus(focus_words("padding", std::string(padding >= 0 ? kPadding[padding] : d.padding.c_str()) + ", list",
                               "data.padding", padding_help));
    help_marker(padding_help, item_has_keyboard_focus());
    field_error("data.padding");
    if (d.padding != "none")
      changed |= int_input("data.pad_to_multiple_of", d.pad_to_multiple_of, 8);
    changed |= check_input("data.group_by_length", d.group_by_length);
    changed |= check_input("data.longest_first", d.longest_first);
    changed |= int_input("data.dataset_samples", d.dataset_samples, 1000);
    changed |= int_input("data.epochs", d.epochs, 1);
  } else {
    changed |= lengths_text("micro-batch lengths", "data.micro_batch_lengths", d.micro_batch_lengths, "512,380,1024",
                            "Each micro-batch's length after padding, in order: 512,380,1024. The list repeats for "
                            "a longer run.",
                            "Tokens per sequence of each micro-batch as the run feeds them, e.g. from your data "
                            "loader's log.");
  }
  changed |= int_input("steps to replay", "data.steps", d.steps, 100,
                       samples ? "Optimizer steps memsim replays; 0 = auto: the run's own length from the dataset's "
                                 "size, at most 2,000 steps."
                               : "Optimizer steps memsim replays; 0 = auto: the list once.");
  if (samples)
    changed |= int_input("data.seed", d.seed, 1);
  changed |= int_input("training.empty_cache_steps", c.training.empty_cache_steps, 1);
  if (c.training.empty_cache_steps == kEmptyCacheAuto) {  // what auto resolves to, and the version that decided it
    const Resolved rs = resolve(c);
    const std::string from = switch_versions(rs, Switch::EmptyCacheSteps);
    ImGui::Indent();
    ImGui::TextDisabled("auto: %s%s", rs.empty_cache_steps == 0 ? "never" : "every step",
                        from.empty() ? "" : (", from " + from).c_str());
    ImGui::Unindent();
  }
  return changed;
}

}  // namespace memsim::ui
