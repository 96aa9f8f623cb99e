// Fine-tuning inputs: LoRA/DoRA adapters on a frozen, optionally quantized base.
#include <imgui.h>
#include <imgui_stdlib.h>

#include "panels.h"

namespace memsim::ui {

bool draw_peft_inputs(Config& c) {
  auto& p = c.peft;
  bool changed = false;
  if (!ImGui::CollapsingHeader("Fine-tuning (PEFT)", ImGuiTreeNodeFlags_DefaultOpen)) return false;
  changed |= string_combo("method", "peft.method", p.method, {"none", "lora", "dora"},
                          "none: full fine-tuning. LoRA/DoRA freeze the base: only the adapters have gradients and "
                          "optimizer states, and frozen layers keep fewer activations.");
  if (!p.enabled()) {
    ImGui::TextDisabled("Full fine-tuning: every parameter is trained.");
    return changed;
  }
  changed |= int_input("rank", "peft.lora_rank", p.lora_rank, 8, "Adapter rank r: each adapted linear gains r x (in + out) "
                                                                  "trainable parameters.");
  changed |= double_input("alpha", "peft.lora_alpha", p.lora_alpha, "Scaling alpha / r; no memory effect.");
  changed |= double_input("dropout", "peft.lora_dropout", p.lora_dropout,
                          "Above 0, every adapted linear keeps its own dropout output and a 1-byte mask of its input.");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  changed |= ImGui::InputTextWithHint("targets", "q_proj,v_proj or all-linear", &p.target_modules);
  help_marker("Module names to adapt (PEFT target_modules), comma-separated, or all-linear.");
  field_error("peft.target_modules");
  for (const char* preset : {"q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj", "all-linear"}) {
    if (ImGui::SmallButton(preset)) p.target_modules = preset, changed = true;
    ImGui::SameLine();
  }
  ImGui::NewLine();
  changed |= string_combo("adapter dtype", "peft.adapter_dtype", p.adapter_dtype, {"fp32", "bf16", "fp16"},
                          "PEFT keeps adapters in fp32 by default (autocast_adapter_dtype); each adapted linear then "
                          "keeps an fp32 copy of its input.");
  changed |= string_combo("base storage", "peft.base_quantization", p.base_quantization, {"none", "int8", "nf4", "fp4"},
                          "How the frozen linears are stored: the precision's dtype, LLM.int8 (1 byte + row scales), "
                          "or 4-bit NF4/FP4 (4.5 bits per weight, 4.127 with double quantization).");
  if (p.base_quantization == "nf4" || p.base_quantization == "fp4")
    changed |= check_input("double quantization", "peft.double_quantization", p.double_quantization,
                           "Quantizes the 4-bit blocks' scales too: 0.127 instead of 0.5 bits per weight.");
  if (p.base_quantization != "none")
    changed |= check_input("prepare_model_for_kbit_training", "peft.prepare_kbit", p.prepare_kbit,
                           "PEFT's helper casts every parameter that is not quantized (embeddings, head, norms) to fp32.");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  changed |= ImGui::InputTextWithHint("modules_to_save", "e.g. lm_head", &p.modules_to_save);
  help_marker("Modules trained in full beside the adapters (PEFT modules_to_save).");
  field_error("peft.modules_to_save");
  return changed;
}

}  // namespace memsim::ui
