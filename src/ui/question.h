// What the question section of the inputs (panel_question.cpp) does to a setup, apart from drawing it, so that it
// can be tested without ImGui: the method as users name it (Full, LoRA, QLoRA or another PEFT method), a model
// picked from the catalogue, and a micro-batch and sequence length that fit when the user has not set them.
//
// "Set by hand" belongs to the interface, not to the setup: a set of flattened field ids ("training.micro_batch_size")
// that the user changed, which a model or a method picked later keeps.
#pragma once
#include <set>
#include <string>

#include "core/config.h"

namespace memsim::ui {

using HandSet = std::set<std::string>;

// Adds the id of every field that differs between `before` and `after` (serialize.h config_changes' keys).
void note_hand_set(HandSet& hand, const Config& before, const Config& after);

// The methods of the question. QLoRA is LoRA on a 4-bit NF4 base with double quantization on every linear
// (Dettmers et al. 2023); Other is any other PEFT method or mix (DoRA, IA3, an int8 base, ...), set under Details.
enum class Method { Full, Lora, Qlora, Dora, Ia3, LnTuning, PromptTuning, Other };
Method method_of(const PeftConfig& p);
const char* method_label(Method m);
// Sets what the method implies: the PEFT method, the base's storage, double quantization and the targets PEFT or
// the QLoRA paper use for it. Other leaves the PEFT section as it is.
void set_method(Config& c, Method m);
// PEFT's default targets for a Llama-style model when the method changes from `previous` (peft/utils/constants.py).
void method_defaults(PeftConfig& p, const std::string& previous);

// The framework picked under Details, from `previous`. Unsloth implies what its notebooks run and what memsim models
// of it: no ZeRO (one GPU or DDP), no prepare_model_for_kbit_training (its loader keeps the weights it does not quantize
// in 16 bits), bf16 autocast over bf16 weights where pure bf16 or a bf16 recipe with fp32 weights or master copies was
// set, double quantization on an NF4 base, and use_gradient_checkpointing="unsloth" (full checkpointing with
// activation offload). Leaving Unsloth turns that offload off again. Other frameworks change nothing else.
void choose_framework(Config& c, const std::string& previous);
// training.objective was changed by the user: the fields only some objectives take follow it (ppo scores with a
// reward model of the policy's shape; the others take none unless grpo's user picked one), and TRL's objectives run
// on the HF Trainer (torchtune's DPO recipes stay torchtune's).
void choose_objective(Config& c);

// The model picked from the catalogue: the model section, and what the model implies unless set by hand: the sequence
// length within its max positions. Then fit_shape.
void choose_model(Config& c, const ModelConfig& model, const HandSet& hand);

// The micro-batch and sequence length the question starts from when the user set neither: the page's defaults (4 x
// 4096), the sequence within the model's max positions.
int64_t default_micro_batch();
int64_t default_sequence_length(const ModelConfig& m);

// For the question's micro-batch and sequence length not set by hand: the largest that fit, trying the longest
// sequence first (from the default, halving down to 512) and at each the largest micro-batch (from the default,
// halving down to 1); when none fits, the defaults (the verdict then says so, and What helps what to change). A
// sequence is kept longer over a larger micro-batch because it is a property of the data, while a smaller
// micro-batch with gradient accumulation trains on the same batch. Nothing changes while a run of varying lengths
// is set (Data), whose replay is too long to try several shapes. Returns true when the setup changed.
bool fit_shape(Config& c, const HandSet& hand);

}  // namespace memsim::ui
