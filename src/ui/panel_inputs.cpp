// Inputs: the question first (panel_question.cpp), then under Details the model, training, data, versions,
// parallelism, hardware and fine-tuning. Every input has a tooltip saying what it
// does to memory, and a field with a problem shows the simulator's message right under it.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <cctype>
#include <string>

#include "core/catalog.h"
#include "core/choices.h"
#include "core/frameworks.h"
#include "core/gpu_count.h"
#include "core/tables.h"
#include "panels.h"
#include "question.h"

namespace memsim::ui {


bool draw_inputs_panel(Config& c, const Result& result, bool reveal_data) {
  set_field_errors(&result);
  bool changed = false;
  // The question first (panel_question.cpp); everything else under Details, in the sections it always had.
  question_frame_start(c);
  if (section("Your question")) changed |= draw_question_inputs(c);
  question_frame_end(c);  // what Details changes below counts as set by hand (seen on the next frame)
  const ParallelConfig layout_before = c.parallel;
  if (reveal_data) ImGui::SetNextItemOpen(true);  // the Data section below is to be shown
  const bool details = section("Details");
  if (details) ImGui::Indent(ImGui::GetStyle().IndentSpacing * 0.5f);
  auto& m = c.model;
  const bool model_open = details && section("Model");
  if (model_open && !m.architecture.empty()) changed |= draw_program_model(m);  // panel_program.cpp
  if (model_open && m.architecture.empty()) {
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    changed |= ImGui::InputText("model_type", &m.model_type);
    const char* model_type_help = field_spec("model.model_type").help.data();
    announce_text_input("model_type", m.model_type, model_type_help);
    help_marker(model_type_help, item_has_keyboard_focus());
    changed |= int_input("model.hidden_size", m.hidden_size, 128);
    changed |= int_input("model.num_hidden_layers", m.num_hidden_layers, 1);
    changed |= int_input("model.num_attention_heads", m.num_attention_heads, 1);
    changed |= int_input("model.num_key_value_heads", m.num_key_value_heads, 1);
    changed |= int_input("model.head_dim", m.head_dim, 8);
    changed |= int_input("model.intermediate_size", m.intermediate_size, 256);
    changed |= int_input("model.vocab_size", m.vocab_size, 1024);
    changed |= check_input("model.tie_word_embeddings", m.tie_word_embeddings);
    if (subsection("Architecture details")) {
      int norm = m.norm_type == NormType::RMSNorm ? 0 : 1;
      ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
      if (index_combo("norm_type", norm, {"RMSNorm", "LayerNorm"})) {
        m.norm_type = norm == 0 ? NormType::RMSNorm : NormType::LayerNorm;
        changed = true;
      }
      const char* norm_help = field_spec("model.norm_type").help.data();
      announce_focus(focus_words("norm_type", norm == 0 ? "RMSNorm, list" : "LayerNorm, list", "model.norm_type", norm_help));
      help_marker(norm_help, item_has_keyboard_focus());
      changed |= check_input("model.mlp_gated", m.mlp_gated);
      changed |= check_input("model.attention_bias", m.attention_bias);
      changed |= check_input("model.qkv_bias", m.qkv_bias);
      changed |= check_input("model.mlp_bias", m.mlp_bias);
      changed |= check_input("model.qk_norm", m.qk_norm);
      changed |= int_input("model.norms_per_layer", m.norms_per_layer, 1);
      if (!m.is_encoder_decoder) {  // T5's positions are its relative attention bias (below)
        int pos = m.position_embedding_type == PositionType::Rope ? 0 : 1;
        ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
        if (index_combo("positions", pos, {"RoPE (no parameters)", "Learned absolute"})) {
          m.position_embedding_type = pos == 0 ? PositionType::Rope : PositionType::Absolute;
          changed = true;
        }
        const char* pos_help = field_spec("model.position_embedding_type").help.data();
        announce_focus(focus_words("positions", pos == 0 ? "RoPE, list" : "learned absolute, list",
                                   "model.position_embedding_type", pos_help));
        help_marker(pos_help, item_has_keyboard_focus());
      }
      changed |= double_input("model.attention_dropout", m.attention_dropout);
      changed |= double_input("model.hidden_dropout", m.hidden_dropout);
      changed |= check_input("model.post_layernorm", m.post_layernorm);
      ImGui::TreePop();
    }
    if (subsection("Encoder-decoder (T5)")) {
      changed |= check_input("model.is_encoder_decoder", m.is_encoder_decoder);
      if (m.is_encoder_decoder) {
        changed |= int_input("model.num_decoder_layers", m.num_decoder_layers, 1);
        changed |= int_input("model.relative_attention_num_buckets", m.relative_attention_num_buckets, 8);
      }
      ImGui::TreePop();
    }
    if (subsection("Mixture of experts")) {
      changed |= int_input("model.num_experts", m.num_experts, 1);
      changed |= int_input("model.num_experts_per_tok", m.num_experts_per_tok, 1);
      changed |= int_input("model.moe_intermediate_size", m.moe_intermediate_size, 128);
      changed |= int_input("model.shared_expert_intermediate_size", m.shared_expert_intermediate_size, 128);
      changed |= int_input("model.first_k_dense_replace", m.first_k_dense_replace, 1);
      changed |= double_input("model.moe_capacity_factor", m.moe_capacity_factor);
      ImGui::TreePop();
    }
    if (subsection("Latent attention (MLA)")) {
      changed |= int_input("model.kv_lora_rank", m.kv_lora_rank, 64);
      changed |= int_input("model.q_lora_rank", m.q_lora_rank, 64);
      changed |= int_input("model.qk_nope_head_dim", m.qk_nope_head_dim, 16);
      changed |= int_input("model.qk_rope_head_dim", m.qk_rope_head_dim, 16);
      changed |= int_input("model.v_head_dim", m.v_head_dim, 16);
      if (m.position_embedding_type == PositionType::Absolute)
        changed |= int_input("model.max_position_embeddings", m.max_position_embeddings, 128);
      ImGui::TreePop();
    }
    changed |= draw_vision_tower(c);  // panel_vision.cpp
  }
  auto& t = c.training;
  if (details && section("Training")) {  // micro-batch and sequence length are the question's
    if (m.is_encoder_decoder)
      changed |= int_input("training.decoder_sequence_length", t.decoder_sequence_length, 64);
    changed |= int_input("training.gradient_accumulation_steps", t.gradient_accumulation_steps, 1);
    const std::string framework_before = t.framework;
    if (table_combo("training.framework", t.framework, frameworks())) {
      choose_framework(c, framework_before);
      changed = true;
    }
    // A preference objective (chosen in the question): where its reference comes from (auto shows what it means).
    if (t.preference() || t.rollout()) {
      // ReferenceModel's order is choices.h kReferenceModel's.
      const std::string auto_ref(memsim::choice::kReferenceModel[static_cast<size_t>(auto_reference(c, stack_versions(c.versions)))]);
      if (t.goal() == Objective::Dpo || t.goal() == Objective::Kto || t.rollout())
        changed |= choice_combo("training.reference_model", t.reference_model, auto_ref.c_str());
      if (t.preference() && t.goal() != Objective::Kto) changed |= double_input("training.nll_alpha", t.nll_alpha);
    }
    // GRPO's and PPO's rollouts: what generates them, how many and how long; PPO's value model.
    if (t.rollout()) {
      const bool ppo = t.ppo();
      if (!ppo) changed |= int_input("training.num_generations", t.num_generations, 1);
      changed |= int_input("training.completion_length", t.completion_length, 64);
      if (!ppo) changed |= choice_combo("training.generation_engine", t.generation_engine, "");
      changed |= choice_combo("training.reward_model", t.reward_model, "");
      if (ppo) changed |= choice_combo("training.value_model", t.value_model, "");
      if (ppo) changed |= check_input("training.use_cache", t.use_cache);
      if (!ppo) changed |= int_input("training.steps_per_generation", t.steps_per_generation, 1);
      changed |= int_input("training.num_iterations", t.num_iterations, 1);
      if (t.engine() == GenerationEngine::VllmColocate) {
        changed |= double_input("training.gpu_memory_utilization", t.gpu_memory_utilization);
        changed |= check_input("training.vllm_sleep", t.vllm_sleep);
      }
      if (t.engine() == GenerationEngine::VllmServer) {  // the server's own GPUs, a device of their own
        changed |= int_input("training.vllm_server_tensor_parallel_size", t.vllm_server_tensor_parallel_size, 1);
        changed |= int_input("training.vllm_server_data_parallel_size", t.vllm_server_data_parallel_size, 1);
        changed |= double_input("training.vllm_server_gpu_memory_utilization", t.vllm_server_gpu_memory_utilization);
      }
      if (t.engine() == GenerationEngine::VllmColocate || t.engine() == GenerationEngine::VllmServer)
        changed |= int_input("training.vllm_max_model_len", t.vllm_max_model_len, 1024);
    }
    changed |= table_combo("training.precision", t.precision, precision_recipes());
    changed |= table_combo("training.optimizer", t.optimizer, optimizers());
    // Each auto shows what it resolves to, and the stated versions that decided it (Library versions).
    const Resolved rs = resolve(c);
    changed |= switch_combo("training.optimizer_impl", t.optimizer_impl, rs, Switch::OptimizerImpl);
    changed |= choice_combo("training.ema", t.ema, "");
    changed |= choice_combo("training.activation_checkpointing", t.activation_checkpointing, "");
    if (t.activation_checkpointing == "every_k")
      changed |= int_input("training.checkpoint_every_k_layers", t.checkpoint_every_k_layers, 1);
    if (t.activation_checkpointing != "none")
      changed |= switch_combo("training.checkpoint_reentrant", t.checkpoint_reentrant, rs, Switch::CheckpointReentrant);
    changed |= switch_combo("training.attention", t.attention, rs, Switch::Attention);
    changed |= choice_combo("training.norm_impl", t.norm_impl, std::string(rs.framework->norm_impl).c_str());
    changed |= switch_combo("training.loss", t.loss, rs, Switch::Loss);
    changed |= check_input("training.compile", t.compile);
    changed |= switch_combo("training.zero_grad_set_to_none", t.zero_grad_set_to_none, rs, Switch::ZeroGradSetToNone);
    changed |= choice_combo("training.zero_grad_at", t.zero_grad_at, "");
    changed |= switch_combo("training.softmax_saves_input", t.softmax_saves_input, rs, Switch::SoftmaxSavesInput);
    changed |= check_input("training.activation_offload", t.activation_offload);
    // Evaluation between steps: its batch, and the HF Trainer's logits kept for compute_metrics.
    changed |= int_input("training.eval_batch_size", t.eval_batch_size, 1);
    if (t.eval_batch_size > 0 || t.eval_logits_batches > 0)
      changed |= int_input("training.eval_logits_batches", t.eval_logits_batches, 1);
  }
  if (details) {
    changed |= draw_data_inputs(c, reveal_data);
    changed |= draw_versions_inputs(c);
    changed |= draw_parallel_inputs(c);
    changed |= draw_peft_inputs(c);
    ImGui::Unindent(ImGui::GetStyle().IndentSpacing * 0.5f);
  }
  // A changed tensor, pipeline or context parallel keeps the GPU count: data parallel follows (core/gpu_count.h).
  keep_gpu_count(layout_before, c.parallel);
  changed |= !(layout_before == c.parallel);
  set_field_errors(nullptr);
  return changed;
}

}  // namespace memsim::ui
