// Inputs: the question first (panel_question.cpp), then under Details the model, training, data, versions,
// parallelism, hardware and fine-tuning. Every input has a tooltip saying what it
// does to memory, and a field with a problem shows the simulator's message right under it.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <cctype>
#include <string>

#include "core/catalog.h"
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
  if (details && section("Model")) {
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    changed |= ImGui::InputText("model_type", &m.model_type);
    const char* model_type_help = "Hugging Face model_type. Informational once the fields below are set; paste a config.json "
                                  "to fill everything from it.";
    announce_text_input("model_type", m.model_type, model_type_help);
    help_marker(model_type_help, item_has_keyboard_focus());
    changed |= int_input("hidden_size", "model.hidden_size", m.hidden_size, 128,
                         "Width of the residual stream. Weights grow with its square; activations linearly.");
    changed |= int_input("num_hidden_layers", "model.num_hidden_layers", m.num_hidden_layers, 1,
                         "Transformer layers. Weights, gradients, optimizer states and saved activations all scale with it.");
    changed |= int_input("num_attention_heads", "model.num_attention_heads", m.num_attention_heads, 1,
                         "Query heads. With head_dim 0, hidden_size / heads is the head size.");
    changed |= int_input("num_key_value_heads", "model.num_key_value_heads", m.num_key_value_heads, 1,
                         "Key/value heads: equal to the query heads for MHA, fewer for GQA, 1 for MQA. Fewer means "
                         "smaller k/v projections.");
    changed |= int_input("head_dim", "model.head_dim", m.head_dim, 8,
                         "Size of each head; 0 means hidden_size / num_attention_heads (HF's default).");
    changed |= int_input("intermediate_size", "model.intermediate_size", m.intermediate_size, 256,
                         "MLP width. A gated MLP has three matrices of hidden x intermediate, a plain one two.");
    changed |= int_input("vocab_size", "model.vocab_size", m.vocab_size, 1024,
                         "Vocabulary. The embedding (and an untied output head) hold vocab x hidden parameters.");
    changed |= check_input("tie_word_embeddings", "model.tie_word_embeddings", m.tie_word_embeddings,
                           "The output head reuses the input embedding: one vocab x hidden matrix instead of two.");
    if (subsection("Architecture details")) {
      int norm = m.norm_type == NormType::RMSNorm ? 0 : 1;
      ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
      if (index_combo("norm_type", norm, {"RMSNorm", "LayerNorm"})) {
        m.norm_type = norm == 0 ? NormType::RMSNorm : NormType::LayerNorm;
        changed = true;
      }
      const char* norm_help = "RMSNorm has a scale vector; LayerNorm a scale and a shift.";
      announce_focus(focus_words("norm_type", norm == 0 ? "RMSNorm, list" : "LayerNorm, list", "model.norm_type", norm_help));
      help_marker(norm_help, item_has_keyboard_focus());
      changed |= check_input("mlp_gated", "model.mlp_gated", m.mlp_gated,
                             "SwiGLU/GeGLU MLP with gate, up and down projections (Llama) instead of two (GPT-2).");
      changed |= check_input("attention_bias", "model.attention_bias", m.attention_bias, "Biases on q, k, v and o.");
      changed |= check_input("qkv_bias", "model.qkv_bias", m.qkv_bias, "Biases on q, k and v only (Qwen2).");
      changed |= check_input("mlp_bias", "model.mlp_bias", m.mlp_bias, "Biases on the MLP projections.");
      changed |= check_input("qk_norm", "model.qk_norm", m.qk_norm, "Per-head RMSNorm on queries and keys (Qwen3, Gemma 3).");
      changed |= int_input("norms_per_layer", "model.norms_per_layer", m.norms_per_layer, 1,
                           "Norms per layer: 2 in most models, 4 in Gemma 2/3.");
      if (!m.is_encoder_decoder) {  // T5's positions are its relative attention bias (below)
        int pos = m.position_embedding_type == PositionType::Rope ? 0 : 1;
        ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
        if (index_combo("positions", pos, {"RoPE (no parameters)", "Learned absolute"})) {
          m.position_embedding_type = pos == 0 ? PositionType::Rope : PositionType::Absolute;
          changed = true;
        }
        const char* pos_help = "Learned absolute positions (GPT-2, BERT) add max_position_embeddings x hidden parameters.";
        announce_focus(focus_words("positions", pos == 0 ? "RoPE, list" : "learned absolute, list",
                                   "model.position_embedding_type", pos_help));
        help_marker(pos_help, item_has_keyboard_focus());
      }
      changed |= double_input("attention_dropout", "model.attention_dropout", m.attention_dropout,
                              "Dropout on attention probabilities: with eager attention it saves a 1-byte mask of "
                              "heads x seq^2 per layer.");
      changed |= double_input("hidden_dropout", "model.hidden_dropout", m.hidden_dropout,
                              "Dropout after attention and MLP: a 1-byte mask per token and hidden unit, twice per layer.");
      changed |= check_input("post_layernorm (encoder)", "model.post_layernorm", m.post_layernorm,
                             "BERT-style layers: LayerNorm after each residual add, which saves the sum.");
      ImGui::TreePop();
    }
    if (subsection("Encoder-decoder (T5)")) {
      changed |= check_input("is_encoder_decoder", "model.is_encoder_decoder", m.is_encoder_decoder,
                             "T5's layout: num_hidden_layers encoder blocks on the source tokens, then decoder blocks "
                             "with cross-attention to the encoder output on the target tokens.");
      if (m.is_encoder_decoder) {
        changed |= int_input("num_decoder_layers", "model.num_decoder_layers", m.num_decoder_layers, 1,
                             "Decoder blocks; 0 = as many as the encoder (T5Config's default).");
        changed |= int_input("relative buckets", "model.relative_attention_num_buckets", m.relative_attention_num_buckets, 8,
                             "relative_attention_num_buckets: the position bias is an Embedding(buckets, heads) in the "
                             "first block of each stack.");
      }
      ImGui::TreePop();
    }
    if (subsection("Mixture of experts")) {
      changed |= int_input("num_experts", "model.num_experts", m.num_experts, 1,
                           "Routed experts per MoE layer; 0 = dense. Every expert's weights, gradients and optimizer "
                           "states are held unless expert parallelism splits them.");
      changed |= int_input("experts per token", "model.num_experts_per_tok", m.num_experts_per_tok, 1,
                           "Top-k: each token's activations pass through k experts, so expert activations are k x a "
                           "dense MLP's at moe_intermediate_size.");
      changed |= int_input("moe_intermediate_size", "model.moe_intermediate_size", m.moe_intermediate_size, 128,
                           "Width of one expert; 0 = intermediate_size (Mixtral).");
      changed |= int_input("shared experts width", "model.shared_expert_intermediate_size", m.shared_expert_intermediate_size,
                           128, "All shared experts together (DeepSeek: n_shared_experts x moe_intermediate_size).");
      changed |= int_input("first dense layers", "model.first_k_dense_replace", m.first_k_dense_replace, 1,
                           "Leading layers with a dense MLP (DeepSeek-V3: 3).");
      changed |= double_input("capacity factor", "model.moe_capacity_factor", m.moe_capacity_factor,
                              "0 = dropless (HF). Above 1, each expert buffers capacity x k x tokens / experts tokens.");
      ImGui::TreePop();
    }
    if (subsection("Latent attention (MLA)")) {
      changed |= int_input("kv_lora_rank", "model.kv_lora_rank", m.kv_lora_rank, 64,
                           "DeepSeek-V2/V3 compress keys and values to this rank; 0 = standard attention.");
      changed |= int_input("q_lora_rank", "model.q_lora_rank", m.q_lora_rank, 64, "Query compression rank; 0 = none.");
      changed |= int_input("qk_nope_head_dim", "model.qk_nope_head_dim", m.qk_nope_head_dim, 16, "Per-head q/k width without RoPE.");
      changed |= int_input("qk_rope_head_dim", "model.qk_rope_head_dim", m.qk_rope_head_dim, 16, "Per-head q/k width with RoPE.");
      changed |= int_input("v_head_dim", "model.v_head_dim", m.v_head_dim, 16, "Per-head value width.");
      if (m.position_embedding_type == PositionType::Absolute)
        changed |= int_input("max_position_embeddings", "model.max_position_embeddings", m.max_position_embeddings,
                             128, "Rows of the learned position table; also the longest sequence.");
      ImGui::TreePop();
    }
  }
  auto& t = c.training;
  if (details && section("Training")) {  // micro-batch and sequence length are the question's
    if (m.is_encoder_decoder)
      changed |= int_input("target length", "training.decoder_sequence_length", t.decoder_sequence_length, 64,
                           "Decoder (target) tokens per sequence; sequence_length is the encoder's (source). 0 = the "
                           "source length.");
    changed |= int_input("grad_accumulation", "training.gradient_accumulation_steps", t.gradient_accumulation_steps, 1,
                         "Micro-batches per optimizer step. Gradients stay allocated across them; activations do not "
                         "add up.");
    const std::string framework_before = t.framework;
    if (table_combo("framework", "training.framework", t.framework, frameworks(),
                    "Frameworks differ in what they save and allocate (attention kernel, norm, loss, optimizer "
                    "implementation). Each choice below set to auto follows the framework. Unsloth also sets no "
                    "ZeRO, no kbit preparation and its offloaded checkpointing.")) {
      choose_framework(c, framework_before);
      changed = true;
    }
    changed |= table_combo("precision", "training.precision", t.precision, precision_recipes(),
                           "How weights, gradients and optimizer states are stored (bytes per parameter), and the "
                           "dtype of saved activations.");
    changed |= table_combo("optimizer", "training.optimizer", t.optimizer, optimizers(),
                           "AdamW keeps two states per parameter, 8-bit AdamW about 2 bytes, Adafactor a factored "
                           "second moment, SGD without momentum none. Paged states live outside the GPU allocator.");
    // Each auto shows what it resolves to, and the stated versions that decided it (Library versions).
    const Resolved rs = resolve(c);
    changed |= switch_combo("optimizer impl", "training.optimizer_impl", t.optimizer_impl, rs, Switch::OptimizerImpl,
                            "foreach (torch's default on CUDA) builds a temporary as large as one param group's "
                            "states; fused has none; for_loop one tensor's worth.");
    changed |= choice_combo("checkpointing", "training.activation_checkpointing", t.activation_checkpointing, "",
                            "full: each layer keeps only its input and is recomputed in backward (about 33% more "
                            "compute). selective: recompute only the attention core (Megatron). selective_op: torchtitan's op-level policy, "
                            "keeping every other matmul output and the attention output. every_k: checkpoint every k-th layer.");
    if (t.activation_checkpointing == "every_k")
      changed |= int_input("every k layers", "training.checkpoint_every_k_layers", t.checkpoint_every_k_layers, 1,
                           "Layers 0, k, 2k, ... are checkpointed; the others keep all their activations.");
    if (t.activation_checkpointing != "none")
      changed |= switch_combo("use_reentrant", "training.checkpoint_reentrant", t.checkpoint_reentrant, rs,
                              Switch::CheckpointReentrant,
                              "torch.utils.checkpoint's use_reentrant. true keeps each recomputed layer's output "
                              "through its backward: HF's gradient checkpointing before transformers 5.0, unless "
                              "gradient_checkpointing_kwargs sets use_reentrant: False (TRL 0.27+ does). false keeps "
                              "only what the recomputed graph saved: transformers 5.0+, torchtune, torchtitan, litgpt.");
    changed |= switch_combo("attention", "training.attention", t.attention, rs, Switch::Attention,
                            "sdpa / flash_attention_2 save q, k, v, the output and a small logsumexp; eager saves the "
                            "heads x seq^2 softmax. repeat_kv materialises k and v for every query head (GQA). "
                            "sdpa_math: SDPA's math fallback (inputs no fused kernel takes), which keeps the bf16 "
                            "heads x seq^2 softmax and scaled copies of q and k.");
    changed |= choice_combo("norm", "training.norm_impl", t.norm_impl, std::string(rs.framework->norm_impl).c_str(),
                            "HF's and torchtune's eager RMSNorm keep an fp32 copy of their input; litgpt also keeps "
                            "the fp32 normalised input; a fused kernel keeps only its input.");
    changed |= switch_combo("loss", "training.loss", t.loss, rs, Switch::Loss,
                            "The logits are tokens x vocabulary: HF upcasts them to fp32 (before transformers 4.49 it "
                            "also shifted a copy: hf_shift_fp32 4.46-4.48, hf_fp32_logits 4.31-4.45 with fp32 logits in "
                            "the outputs, hf_shift before), chunked losses keep one chunk's fp32 copy at a time, fused "
                            "linear cross-entropy (Liger) never builds them. Unsloth's follow its version: "
                            "unsloth_logits keeps 16-bit logits and writes their gradient into them, cut_cross_entropy "
                            "and unsloth_fused_ce never build them.");
    changed |= check_input("torch.compile", "training.compile", t.compile,
                           "Inductor recomputes the cheap pointwise ops in backward: a compiled layer's norms keep "
                           "only their input and rstd, and SwiGLU does not keep silu(gate). torchtune's chunked loss "
                           "compiles too.");
    changed |= switch_combo("zero_grad(set_to_none)", "training.zero_grad_set_to_none", t.zero_grad_set_to_none, rs,
                            Switch::ZeroGradSetToNone,
                            "true, torch >= 2.0's default: the gradients are freed after each step. false: torch 1.x "
                            "zeroed them in place, so they stay allocated through the next forward.");
    changed |= switch_combo("softmax keeps its input", "training.softmax_saves_input", t.softmax_saves_input, rs,
                            Switch::SoftmaxSavesInput,
                            "Before torch 1.11 (PR #66018) softmax and log_softmax saved their input as well as their "
                            "output: eager attention kept one more heads x seq^2 tensor per layer, and the loss one more "
                            "tokens x vocabulary tensor.");
    changed |= check_input("CPU activation offload", "training.activation_offload", t.activation_offload,
                           "Saved activations move to host memory after the next layer's forward and come back for "
                           "backward: about one layer stays on the GPU. Under Unsloth, with full checkpointing, this is "
                           "use_gradient_checkpointing=\"unsloth\": each layer's input goes to the host (from 2025.3 "
                           "it comes back into one persistent GPU buffer and the last layer's stays).");
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
