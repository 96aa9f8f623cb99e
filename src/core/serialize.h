// Reading and writing configs and results: versioned JSON (serialize.cpp), the URL fragment and `--set KEY=VALUE`
// overrides (links.cpp), the Hugging Face config.json model section (hf_config.cpp) and the result JSON
// (result_json.cpp). They share serialize_internal.h.
//
// The field registry (fields.h, walked by visit_fields) drives every encoding, so the JSON keys, the fragment's
// flattened keys and the CLI's --set keys are the same names ("model.hidden_size").
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "advice.h"
#include "config.h"
#include "accelerate_io.h"
#include "deepspeed_io.h"
#include "result.h"
#include "validate.h"

namespace memsim {

// Schema of the config JSON and the fragment. Bump it when a field changes meaning, and add a step to
// migrate() in serialize.cpp; tests/golden keeps one file per version that has ever shipped.
constexpr int kConfigSchema = 3;
// Schema of `memsim-cli estimate --format json` output.
constexpr int kResultSchema = 1;

struct Parsed {
  bool ok = false;
  Config config;
  std::vector<FieldError> errors;
  std::vector<std::string> notes;  // keys ignored and values assumed while reading
};

// Whole memsim config JSON: {"schema": 3, "model": {...}, "training": {...}, ..., "versions": {...}}. Missing sections keep
// `base`. A present "model" section is read like a Hugging Face config.json (absent keys take HF's meaning).
Parsed config_from_json(std::string_view text, const Config& base = Config{});
std::string config_to_json(const Config& c, int indent = 2);

// The guards every JSON decoder applies before parsing: at most 8 MiB and 64 levels of nesting. Empty when the
// text passes; otherwise one line naming `what` ("the case file is nested more than 64 levels deep").
std::string document_guard_error(std::string_view text, const std::string& what);

// Links (the URL fragment; README "Links"). config_to_fragment writes the short link:
//   "memsim=3&model=llama-3.1-70b&method=lora&gpu=h200&c=7kq2m9"
// memsim=N (the schema), then only the fields that differ from schema N's frozen defaults (tests/golden/vN.defaults.json)
// by their bare names, the model as a frozen catalogue id (tests/golden/vN.presets.json) where that is shorter, and a
// checksum of it all. config_to_full_fragment writes the form every link had before: "schema=3&model.name=...&..."
// with every field and no checksum.
std::string config_to_fragment(const Config& c);
std::string config_to_full_fragment(const Config& c);
// Reads either form, from a whole URL ("https://host/#memsim=3&...") or a bare fragment, ignoring what chat clients
// append to a link (.,;:!?)]>'" and whitespace at the end). A field the link leaves out takes the frozen default of
// the link's schema, so a link keeps its meaning when the code's defaults change; on success the link alone decides
// the config. A short link that is cut (its c= is missing) or altered (its checksum does not match) is refused with
// a message that says so; the full form has no checksum. On failure `config` is `base`.
Parsed config_from_fragment(std::string_view link, const Config& base = Config{});
// The fragment of a link as config_from_fragment reads it: after the first '#', without the appended characters.
std::string_view link_fragment(std::string_view text);

// One override, "training.micro_batch_size=8" (or a link's bare name, "micro_batch_size=8"). Returns the errors
// (empty on success); `c` is changed only on success.
std::vector<FieldError> apply_setting(Config& c, std::string_view key_equals_value);

// A Hugging Face config.json (or memsim's model section) into a ModelConfig.
Parsed model_from_hf_json(std::string_view text, const Config& base = Config{});

// A DeepSpeed config in and out: config_from_deepspeed_json, deepspeed_json (deepspeed_io.h, included above).

// An Accelerate config in: config_from_accelerate, looks_like_accelerate_config (accelerate_io.h, included above).

// The CLI's JSON result; see README "CLI contract". With suggestions (core/advice.h), a "suggestions" array.
std::string result_to_json(const Result& r, bool with_timeline, int indent = 2,
                           const std::vector<Suggestion>* suggestions = nullptr, const Config* base = nullptr);

// The fields that differ between two configs, as the KEY=VALUE settings that turn `from` into `to` (--set's form).
std::vector<std::string> config_changes(const Config& from, const Config& to);

// Every flattened key, in order (for docs, completion and tests).
std::vector<std::string> field_keys();

}  // namespace memsim
