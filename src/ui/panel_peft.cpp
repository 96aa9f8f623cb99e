// Fine-tuning inputs: LoRA/DoRA adapters, IA3 vectors, LayerNorm tuning, prompt tuning or litgpt's LLaMA-Adapter on a
// frozen, optionally quantized base.
#include <imgui.h>
#include <imgui_stdlib.h>

#include "core/architecture.h"
#include "core/frameworks.h"
#include "panels.h"
#include "question.h"  // method_defaults

namespace memsim::ui {

bool draw_peft_inputs(Config& c) {
  auto& p = c.peft;
  bool changed = false;
  if (!section("Fine-tuning (PEFT)")) return false;
  const std::string previous = p.method;
  changed |= string_combo("peft.method", p.method, {"none", "lora", "dora", "ia3", "ln_tuning", "prompt_tuning", "prefix_tuning", "adapter", "adapter_v2", "adaption_prompt"});
  if (changed) method_defaults(p, previous);
  if (!p.enabled()) {
    ImGui::TextDisabled("Full fine-tuning: every parameter is trained.");
    return changed;
  }
  if (p.lora_like()) {
    changed |= int_input("peft.lora_rank", p.lora_rank, 8);
    changed |= double_input("peft.lora_alpha", p.lora_alpha);
    changed |= double_input("peft.lora_dropout", p.lora_dropout);
  }
  if (p.lora_like() || p.method == "ia3" || p.method == "ln_tuning") {
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    const bool norms = p.method == "ln_tuning";
    changed |= ImGui::InputTextWithHint("targets", norms ? "input_layernorm,post_attention_layernorm,norm"
                                                         : "q_proj,v_proj or all-linear", &p.target_modules);
    const char* targets_help = norms ? "The norms that get a trainable copy (LNTuningConfig target_modules), comma-separated."
                                     : "Module names to adapt (PEFT target_modules), comma-separated, or all-linear.";
    announce_text_input("targets", p.target_modules, targets_help);
    help_marker(targets_help, item_has_keyboard_focus());
    field_error("peft.target_modules");
    if (norms) {
      if (ImGui::SmallButton("every norm")) p.target_modules = "input_layernorm,post_attention_layernorm,norm", changed = true;
      announce_focus("every norm, button: targets every norm");
    } else {
      static const char* const kLora[] = {"q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj", "all-linear", nullptr};
      static const char* const kIa3[] = {"k_proj,v_proj,down_proj", "all-linear", nullptr};
      // A model program: its own default targets and all-linear.
      static std::string program_targets;
      static const char* kProgram[] = {nullptr, "all-linear", nullptr};
      const char* const* presets = p.method == "ia3" ? kIa3 : kLora;
      if (!c.model.architecture.empty()) {
        program_targets = default_lora_targets(c.model);
        kProgram[0] = program_targets.c_str();
        presets = program_targets == "all-linear" ? kProgram + 1 : kProgram;
      }
      for (const char* const* preset = presets; *preset; ++preset) {
        if (ImGui::SmallButton(*preset)) p.target_modules = *preset, changed = true;
        announce_focus(std::string(*preset) + ", button: sets the targets to it");
        ImGui::SameLine();
      }
      ImGui::NewLine();
    }
  }
  if (p.method == "ia3") {
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    changed |= ImGui::InputTextWithHint("feedforward", "down_proj", &p.feedforward_modules);
    const char* ff_help = field_spec("peft.feedforward_modules").help.data();
    announce_text_input("feedforward", p.feedforward_modules, ff_help);
    help_marker(ff_help, item_has_keyboard_focus());
    field_error("peft.feedforward_modules");
  }
  if (p.method == "prompt_tuning" || p.method == "prefix_tuning")
    changed |= int_input("peft.num_virtual_tokens", p.num_virtual_tokens, 10);
  if (p.prompt_adapter()) {  // field_error under peft.method names the frameworks each one runs under
    changed |= int_input("peft.adapter_prompt_length", p.adapter_prompt_length, 10);
    changed |= int_input("peft.adapter_start_layer", p.adapter_start_layer, 1);
  }
  const Resolved rs = resolve(c);  // the auto switches below show what they resolve to
  if (p.method != "ln_tuning")
    changed |= switch_combo("peft.adapter_dtype", p.adapter_dtype, rs, Switch::AdapterDtype);
  changed |= choice_combo("peft.base_quantization", p.base_quantization, "");  // the registry's choices (choices.h)
  if (p.base_quantization == "gptq" || p.base_quantization == "awq")
    changed |= int_input("peft.quant_group_size", p.quant_group_size, 32);
  if (p.base_quantization == "nf4" || p.base_quantization == "fp4")
    changed |= check_input("peft.double_quantization", p.double_quantization);
  if (p.base_quantization == "nf4" || p.base_quantization == "fp4")
    changed |= switch_combo("peft.bnb_saves_input", p.bnb_saves_input, rs, Switch::BnbSavesInput);
  if (p.base_quantization != "none")
    changed |= switch_combo("peft.prepare_kbit", p.prepare_kbit, rs, Switch::PrepareKbit);
  if (p.prompt_adapter()) return changed;  // the adaption prompts train alone: no modules_to_save
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  changed |= ImGui::InputTextWithHint("modules_to_save", "e.g. lm_head", &p.modules_to_save);
  const char* save_help = field_spec("peft.modules_to_save").help.data();
  announce_text_input("modules_to_save", p.modules_to_save, save_help);
  help_marker(save_help, item_has_keyboard_focus());
  field_error("peft.modules_to_save");
  return changed;
}

}  // namespace memsim::ui
