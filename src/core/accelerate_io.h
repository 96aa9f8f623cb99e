// An Accelerate config (`accelerate config` writes default_config.yaml) in: the flat YAML it writes, or the same content
// as JSON. Included by serialize.h, so callers see it with the other decoders.
#pragma once
#include <string_view>

#include "config.h"

namespace memsim {

struct Parsed;

// The flat YAML `accelerate config` writes (one level of sections, scalars, comments; no anchors, aliases, tags or
// several documents), or the same content as JSON. Reads distributed_type (FSDP, DEEPSPEED, MULTI_GPU, NO),
// num_processes, num_machines, mixed_precision, parallelism_config and fsdp_config (or deepspeed_config); notes list
// what was read, assumed and ignored.
Parsed config_from_accelerate(std::string_view text, const Config& base);
// Whether a dropped or pasted text is an Accelerate config: it has a distributed_type or fsdp_config key.
bool looks_like_accelerate_config(std::string_view text);

}  // namespace memsim
