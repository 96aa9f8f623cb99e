// Fine-tuning inputs: LoRA/DoRA adapters, IA3 vectors, LayerNorm tuning or prompt tuning on a frozen, optionally
// quantized base.
#include <imgui.h>
#include <imgui_stdlib.h>

#include "core/frameworks.h"
#include "panels.h"
#include "question.h"  // method_defaults

namespace memsim::ui {

bool draw_peft_inputs(Config& c) {
  auto& p = c.peft;
  bool changed = false;
  if (!section("Fine-tuning (PEFT)")) return false;
  const std::string previous = p.method;
  changed |= string_combo("method", "peft.method", p.method,
                          {"none", "lora", "dora", "ia3", "ln_tuning", "prompt_tuning", "prefix_tuning"},
                          "none: full fine-tuning. Every other method freezes the base: only what it adds has "
                          "gradients and optimizer states, and frozen layers keep fewer activations. LoRA/DoRA: "
                          "low-rank adapters; IA3: one learned vector per targeted linear; ln_tuning: trainable copies "
                          "of the norms; prompt_tuning: learned virtual tokens before every sequence. prefix_tuning is "
                          "not modelled (its keys and values go through transformers' cache).");
  if (changed) method_defaults(p, previous);
  if (!p.enabled()) {
    ImGui::TextDisabled("Full fine-tuning: every parameter is trained.");
    return changed;
  }
  if (p.lora_like()) {
    changed |= int_input("rank", "peft.lora_rank", p.lora_rank, 8, "Adapter rank r: each adapted linear gains r x (in + out) "
                                                                    "trainable parameters.");
    changed |= double_input("alpha", "peft.lora_alpha", p.lora_alpha, "Scaling alpha / r; no memory effect.");
    changed |= double_input("dropout", "peft.lora_dropout", p.lora_dropout,
                            "Above 0, every adapted linear keeps its own dropout output and a 1-byte mask of its input.");
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
      for (const char* const* preset = p.method == "ia3" ? kIa3 : kLora; *preset; ++preset) {
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
    const char* ff_help = "IA3Config feedforward_modules: targeted linears whose input the vector scales (one value per "
                          "input feature, and an fp32 copy of the input kept); the others scale their output (the fp32 "
                          "pre-scale output kept).";
    announce_text_input("feedforward", p.feedforward_modules, ff_help);
    help_marker(ff_help, item_has_keyboard_focus());
    field_error("peft.feedforward_modules");
  }
  if (p.method == "prompt_tuning")
    changed |= int_input("virtual tokens", "peft.num_virtual_tokens", p.num_virtual_tokens, 10,
                         "PromptTuningConfig num_virtual_tokens: learned embeddings put before every sequence, so the "
                         "layers and the loss see sequence_length + this many positions.");
  const Resolved rs = resolve(c);  // the auto switches below show what they resolve to
  if (p.method != "ln_tuning")
    changed |= switch_combo("adapter dtype", "peft.adapter_dtype", p.adapter_dtype, rs, Switch::AdapterDtype,
                            "PEFT keeps adapters in fp32 by default (autocast_adapter_dtype, peft 0.12+; 0.6-0.11 cast "
                            "them to a bf16/fp16 base's dtype); IA3 vectors and prompt embeddings are created in fp32. "
                            "An adapter dtype other than the activations' makes each adapted linear keep a cast copy.");
  changed |= string_combo("base storage", "peft.base_quantization", p.base_quantization, {"none", "int8", "nf4", "fp4"},
                          "How the frozen linears are stored: the precision's dtype, LLM.int8 (1 byte + row scales), "
                          "or 4-bit NF4/FP4 (4.5 bits per weight, 4.127 with double quantization).");
  if (p.base_quantization == "nf4" || p.base_quantization == "fp4")
    changed |= check_input("double quantization", "peft.double_quantization", p.double_quantization,
                           "Quantizes the 4-bit blocks' scales too: 0.127 instead of 0.5 bits per weight.");
  if (p.base_quantization == "nf4" || p.base_quantization == "fp4")
    changed |= switch_combo("4-bit keeps its input", "peft.bnb_saves_input", p.bnb_saves_input, rs,
                            Switch::BnbSavesInput,
                            "bitsandbytes before 0.43.2 keeps every 4-bit linear's input for backward although the "
                            "frozen weight needs no gradient (PR #1270): about 2 bytes x tokens x (3h + f) per layer.");
  if (p.base_quantization != "none")
    changed |= check_input("prepare_model_for_kbit_training", "peft.prepare_kbit", p.prepare_kbit,
                           "PEFT's helper casts every parameter that is not quantized (embeddings, head, norms) to fp32.");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  changed |= ImGui::InputTextWithHint("modules_to_save", "e.g. lm_head", &p.modules_to_save);
  const char* save_help = "Modules trained in full beside the adapters (PEFT modules_to_save).";
  announce_text_input("modules_to_save", p.modules_to_save, save_help);
  help_marker(save_help, item_has_keyboard_focus());
  field_error("peft.modules_to_save");
  return changed;
}

}  // namespace memsim::ui
