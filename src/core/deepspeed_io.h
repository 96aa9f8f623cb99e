// A DeepSpeed config JSON (the "ds_config" of deepspeed.initialize or HF TrainingArguments(deepspeed=...)) in and out.
// Included by serialize.h, so callers see it with the other decoders.
#pragma once
#include <string>
#include <string_view>

#include "config.h"

namespace memsim {

struct Parsed;

// Reads what memsim models: the batch (train_micro_batch_size_per_gpu, gradient_accumulation_steps and, with both,
// train_batch_size for the data-parallel size), bf16/fp16 (neither: fp32; both: refused), the optimizer, ZeRO stage,
// offload and buffers, and the "memsim" section deepspeed_json writes for what DeepSpeed's keys cannot say. Every
// form DeepSpeed takes: enabled as a boolean, a string or 0/1; "auto" (HF Trainer fills it; memsim keeps its value);
// {"bf16": true}; the optimizer as an object or a bare name; the deprecated "zero_optimization": true and cpu_offload.
// Sets training.framework and parallel.sharding to deepspeed. Notes list what was read, what was kept for "auto",
// and every key that was not read.
Parsed config_from_deepspeed_json(std::string_view text, const Config& base);
// The training part of a config as a DeepSpeed config a user can start from. What DeepSpeed's keys cannot say
// (activation checkpointing, an optimizer or precision it has no name for) goes to a "memsim" section, which
// DeepSpeed does not read and config_from_deepspeed_json reads back, so the round trip is lossless for the batch,
// data-parallel size, precision, optimizer, checkpointing, ZeRO stage and offload.
std::string deepspeed_json(const Config& c, int indent = 2);

}  // namespace memsim
