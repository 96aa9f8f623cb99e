// Accelerate config import (accelerate_io.h): the flat YAML that `accelerate config` writes, or the same content as
// JSON.
//
// Key names and values as huggingface/accelerate writes and reads them:
// - commands/config/cluster.py (the questionnaire) writes fsdp_config: fsdp_sharding_strategy, fsdp_offload_params,
//   fsdp_auto_wrap_policy, fsdp_backward_prefetch, fsdp_state_dict_type, fsdp_forward_prefetch, fsdp_use_orig_params,
//   fsdp_cpu_ram_efficient_loading, fsdp_sync_module_states, fsdp_activation_checkpointing; utils/constants.py lists
//   the strategies FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 and the prefetch policies
//   BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH; utils/dataclasses.py FullyShardedDataParallelPlugin reads a numeric
//   strategy as torch's ShardingStrategy(int) (1-5 in that order) and defaults the prefetch to NO_PREFETCH.
// - commands/to_fsdp2.py: FSDP2 replaces fsdp_sharding_strategy by fsdp_reshard_after_forward (FULL_SHARD and
//   HYBRID_SHARD -> true, SHARD_GRAD_OP, HYBRID_SHARD_ZERO2 and NO_SHARD -> false), drops fsdp_backward_prefetch,
//   and treats a config without fsdp_version as version 1 (as utils/launch.py does).
// - utils/launch.py: num_processes is the world size over all machines (nproc_per_node = num_processes //
//   num_machines); parallelism_config holds parallelism_config_{dp_replicate,dp_shard,tp,cp}_size; a DeepSpeed
//   config's deepspeed_config holds zero_stage, offload_optimizer_device, offload_param_device,
//   gradient_accumulation_steps.
// The YAML is read by yaml_subset.h, which takes exactly the flat subset `accelerate config` writes.

#include "accelerate_io.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "json_read.h"
#include "yaml_subset.h"
#include "serialize.h"

namespace memsim {

using json = nlohmann::json;
using json_read::describe;
using json_read::parse_document;
using json_read::valid_utf8;

namespace {

constexpr size_t kMaxAccelerateBytes = 1024 * 1024;  // `accelerate config` writes about 1 KB
// The JSON form is held to the YAML reader's limits (yaml_subset.h).
constexpr size_t kMaxAccelerateEntries = yaml_subset::kMaxEntries;
constexpr size_t kMaxAccelerateScalar = yaml_subset::kMaxScalarBytes;
constexpr int64_t kMaxExactInteger = yaml_subset::kMaxExactInteger;

const char* const kAccelerateWhat = "the Accelerate config";

// The JSON form must have the YAML form's shape: scalars, lists of scalars and one level of sections.
bool accelerate_json_shape(const json& v, const std::string& path, int depth, size_t& entries, FieldError& err) {
  auto fail = [&](const std::string& what) {
    err = {path.empty() ? kAccelerateWhat : path, std::string(kAccelerateWhat) + (path.empty() ? "" : " (" + path.substr(0, 80) + ")") + ": " + what};
    return false;
  };
  if (++entries > kMaxAccelerateEntries) return fail("more than " + std::to_string(kMaxAccelerateEntries) + " entries");
  if (v.is_object()) {
    if (depth > 2) return fail("nested more than one level deep; an Accelerate config has sections of key: value pairs");
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key().empty() || it.key().size() > 128) return fail("keys must have 1 to 128 bytes");
      if (!accelerate_json_shape(*it, path.empty() ? it.key() : path + "." + it.key(), depth + 1, entries, err)) return false;
    }
    return true;
  }
  if (v.is_array()) {
    if (depth == 1) return fail("an Accelerate config is a JSON object");
    for (const auto& item : v)
      if (item.is_structured()) return fail("lists of lists or of objects are not accepted");
      else if (!accelerate_json_shape(item, path, depth + 1, entries, err)) return false;
    return true;
  }
  if (depth == 1) return fail("an Accelerate config is a JSON object");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMaxExactInteger))
    return fail("the number " + describe(v) + " is beyond 2^53; no field of a config is that large");
  if (v.is_number_integer() && !v.is_number_unsigned() && (v.get<int64_t>() > kMaxExactInteger || v.get<int64_t>() < -kMaxExactInteger))
    return fail("the number " + describe(v) + " is beyond 2^53; no field of a config is that large");
  if (v.is_number_float() && !std::isfinite(v.get<double>())) return fail("the number is not finite");
  if (v.is_string() && v.get_ref<const std::string&>().size() > kMaxAccelerateScalar)
    return fail("a value longer than " + std::to_string(kMaxAccelerateScalar) + " bytes");
  return true;
}

// Typed reads of Accelerate keys. Accelerate's launcher passes every value through the environment as text, so
// "true" and "2" are accepted where a boolean or an integer is meant.
struct AccelerateValues {
  std::vector<FieldError>& errors;
  std::vector<std::string>& used;
  bool boolean(const json& obj, const std::string& section, const char* key, std::optional<bool>& out) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return true;
    const std::string name = section.empty() ? key : section + "." + key;
    if (it->is_boolean()) out = it->get<bool>();
    else if (it->is_string() && (it->get_ref<const std::string&>() == "true" || it->get_ref<const std::string&>() == "True")) out = true;
    else if (it->is_string() && (it->get_ref<const std::string&>() == "false" || it->get_ref<const std::string&>() == "False")) out = false;
    else return errors.push_back({name, name + " must be true or false; got " + describe(*it)}), false;
    used.push_back(name);
    return true;
  }
  bool integer(const json& obj, const std::string& section, const char* key, int64_t min, int64_t max, std::optional<int64_t>& out) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return true;
    const std::string name = section.empty() ? key : section + "." + key;
    int64_t v = 0;
    bool ok = false;
    if (it->is_number_integer() && !it->is_number_unsigned()) v = it->get<int64_t>(), ok = true;
    else if (it->is_number_unsigned() && it->get<uint64_t>() <= static_cast<uint64_t>(kMaxExactInteger)) v = static_cast<int64_t>(it->get<uint64_t>()), ok = true;
    else if (it->is_number_float()) {
      const double d = it->get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= static_cast<double>(kMaxExactInteger)) v = static_cast<int64_t>(d), ok = true;
    } else if (it->is_string()) {
      const std::string& s = it->get_ref<const std::string&>();
      if (!s.empty() && s.size() <= 15 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        v = std::stoll(s), ok = true;
    }
    if (!ok || v < min || v > max)
      return errors.push_back({name, name + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                                         "; got " + describe(*it)}),
             false;
    out = v;
    used.push_back(name);
    return true;
  }
  // A string (or, for `allow_int`, an integer) matched case-insensitively against `names`; returns its index.
  bool choice(const json& obj, const std::string& section, const char* key, const std::vector<std::string>& names,
              std::optional<size_t>& out, bool allow_int = false) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return true;
    const std::string name = section.empty() ? key : section + "." + key;
    std::string s;
    if (it->is_string()) s = it->get<std::string>();
    else if (allow_int && it->is_number_integer()) s = it->dump();
    std::string upper = s;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    for (size_t k = 0; k < names.size(); ++k) {
      std::string n = names[k];
      for (char& ch : n) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      if (upper == n || (allow_int && s == std::to_string(k + 1))) {
        out = k;
        used.push_back(name);
        return true;
      }
    }
    std::string allowed;
    for (size_t k = 0; k < names.size(); ++k)
      allowed += (k ? ", " : "") + names[k] + (allow_int ? " (" + std::to_string(k + 1) + ")" : "");
    errors.push_back({name, name + " must be one of: " + allowed + "; got " + describe(*it)});
    return false;
  }
};

std::string list_keys(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 24; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > 24) s += " and " + std::to_string(v.size() - 24) + " more";
  return s;
}

}  // namespace

bool looks_like_accelerate_config(std::string_view text) {
  for (std::string_view key : {std::string_view("distributed_type"), std::string_view("fsdp_config")}) {
    for (size_t at = text.find(key); at != std::string_view::npos; at = text.find(key, at + 1)) {
      size_t j = at + key.size();
      if (j < text.size() && text[j] == '"') ++j;  // JSON: "distributed_type": ...
      while (j < text.size() && text[j] == ' ') ++j;
      if (j < text.size() && text[j] == ':') return true;
    }
  }
  return false;
}

Parsed config_from_accelerate(std::string_view text, const Config& base) {
  Parsed p;
  p.config = base;
  if (text.size() > kMaxAccelerateBytes) {
    p.errors.push_back({kAccelerateWhat, std::string(kAccelerateWhat) + " is " + std::to_string(text.size() / 1024) +
                                             " KiB; at most 1 MiB is accepted (`accelerate config` writes about 1 KB)"});
    return p;
  }
  const std::string s(text);
  if (!valid_utf8(s)) {
    p.errors.push_back({kAccelerateWhat, std::string(kAccelerateWhat) + " is not UTF-8 text"});
    return p;
  }
  std::string_view body = text;
  if (body.substr(0, 3) == "\xEF\xBB\xBF") body.remove_prefix(3);  // a byte-order mark, as editors write
  size_t first = 0;
  while (first < body.size() && (body[first] == ' ' || body[first] == '\n' || body[first] == '\r' || body[first] == '\t')) ++first;
  json doc;
  if (first < body.size() && body[first] == '{') {  // the JSON form
    if (!parse_document(body, kAccelerateWhat, doc, p.errors)) return p;
    size_t entries = 0;
    FieldError err;
    if (!accelerate_json_shape(doc, "", 1, entries, err)) return p.errors.push_back(err), p;
  } else {
    FieldError error;
    if (!yaml_subset::parse(body, kAccelerateWhat, doc, error)) return p.errors.push_back(error), p;
  }

  Config c = base;
  std::vector<std::string> used, assumed, ignored;
  AccelerateValues rd{p.errors, used};
  auto section = [&](const char* name) -> const json& {
    static const json empty = json::object();
    auto it = doc.find(name);
    if (it == doc.end() || it->is_null()) return empty;
    if (!it->is_object()) {
      p.errors.push_back({name, std::string(name) + " must be a mapping of key: value lines; got " + describe(*it)});
      return empty;
    }
    return *it;
  };

  // The layout: distributed_type, world size, machines, and the device mesh of parallelism_config.
  static const std::vector<std::string> kTypes = {"FSDP", "DEEPSPEED", "MULTI_GPU", "NO"};
  std::optional<size_t> type;
  if (!doc.contains("distributed_type") || doc["distributed_type"].is_null()) {
    p.errors.push_back({"distributed_type", "distributed_type is missing; an Accelerate config names it (FSDP, DEEPSPEED, "
                                            "MULTI_GPU or NO are read)"});
    return p;
  }
  if (!rd.choice(doc, "", "distributed_type", kTypes, type)) {
    p.errors.back().message += " (memsim reads these; other distributed types are not modelled)";
    return p;
  }
  const bool fsdp = *type == 0, deepspeed = *type == 1, ddp = *type == 2, single = *type == 3;
  std::optional<int64_t> processes, machines;
  rd.integer(doc, "", "num_processes", 1, 1 << 24, processes);
  rd.integer(doc, "", "num_machines", 1, 1 << 20, machines);
  std::optional<int64_t> dp_replicate, dp_shard, tp, cp, sp;
  const json& mesh = section("parallelism_config");
  rd.integer(mesh, "parallelism_config", "parallelism_config_dp_replicate_size", 1, 1 << 24, dp_replicate);
  rd.integer(mesh, "parallelism_config", "parallelism_config_dp_shard_size", 1, 1 << 24, dp_shard);
  rd.integer(mesh, "parallelism_config", "parallelism_config_tp_size", 1, 1 << 24, tp);
  rd.integer(mesh, "parallelism_config", "parallelism_config_cp_size", 1, 1 << 24, cp);
  rd.integer(mesh, "parallelism_config", "parallelism_config_sp_size", 1, 1 << 24, sp);
  if (!p.errors.empty()) return p;
  if (sp.value_or(1) > 1) {
    p.errors.push_back({"parallelism_config.parallelism_config_sp_size",
                        "parallelism_config.parallelism_config_sp_size (Ulysses sequence parallelism) is not modelled yet; "
                        "memsim models ring-attention context parallelism (parallelism_config_cp_size)"});
    return p;
  }
  const bool has_mesh = dp_replicate || dp_shard || tp || cp;
  // Each factor is at most 2^24, so the product is checked: four of them wrapped to 0, and memsim fell back to 8 GPUs.
  int64_t mesh_dp = 0, mesh_world = 0;
  if (__builtin_mul_overflow(dp_replicate.value_or(1), dp_shard.value_or(1), &mesh_dp) ||
      __builtin_mul_overflow(mesh_dp, tp.value_or(1), &mesh_world) ||
      __builtin_mul_overflow(mesh_world, cp.value_or(1), &mesh_world) || mesh_world > (int64_t{1} << 24)) {
    p.errors.push_back({"parallelism_config", "parallelism_config: dp_replicate x dp_shard x tp x cp must be at most "
                                              "16,777,216 GPUs"});
    return p;
  }
  if (has_mesh && processes && mesh_world != *processes) {
    p.errors.push_back({"parallelism_config", "parallelism_config: dp_replicate x dp_shard x tp x cp = " + std::to_string(mesh_world) +
                                                  " must equal num_processes (" + std::to_string(*processes) + ")"});
    return p;
  }
  int64_t world = processes ? *processes : has_mesh ? mesh_world : 0;
  if (single) {
    if (world > 1) assumed.push_back("distributed_type NO runs one process; num_processes " + std::to_string(world) + " is not used");
    world = 1;
  }
  if (world > 0) {
    const int64_t nodes = single ? 1 : machines.value_or(1);
    if (world % nodes != 0) {
      p.errors.push_back({"num_processes", "num_processes (" + std::to_string(world) + ", all machines together) must be a "
                                           "multiple of num_machines (" + std::to_string(nodes) + ")"});
      return p;
    }
    c.hardware.gpus_per_node = world / nodes;
    c.parallel.tensor_parallel_size = has_mesh ? tp.value_or(1) : 1;
    c.parallel.context_parallel_size = has_mesh ? cp.value_or(1) : 1;
    c.parallel.pipeline_parallel_size = 1;
    c.parallel.data_parallel_size = has_mesh ? mesh_dp : world;
    if (c.parallel.tensor_parallel_size == 1) c.parallel.sequence_parallel = false;
    if (base.parallel.pipeline_parallel_size != 1 || (!has_mesh && (base.parallel.tensor_parallel_size != 1 ||
                                                                    base.parallel.context_parallel_size != 1)))
      assumed.push_back("the Accelerate config has no pipeline" + std::string(has_mesh ? "" : ", tensor or context") +
                        " parallelism, so those sizes are 1");
  } else {
    assumed.push_back("num_processes not given: kept the current " + std::to_string(c.parallel.data_parallel_size) +
                      " data-parallel GPUs");
  }

  // Mixed precision: FSDP shards fp32 parameters and computes in bf16/fp16 (the fp32-master recipes); DDP and a
  // single process use torch autocast over fp32 weights.
  static const std::vector<std::string> kPrecisions = {"no", "fp16", "bf16", "fp8"};
  std::optional<size_t> precision;
  if (auto it = doc.find("mixed_precision"); it != doc.end() && it->is_boolean() && !it->get<bool>()) {
    precision = 0;  // an unquoted `no` is the boolean false in YAML 1.1
    used.push_back("mixed_precision");
  } else {
    rd.choice(doc, "", "mixed_precision", kPrecisions, precision);
  }
  if (precision) {
    if (*precision == 0) c.training.precision = "fp32";
    else if (*precision == 3) assumed.push_back("mixed_precision fp8 is not modelled: kept training.precision " + c.training.precision);
    else if (fsdp || deepspeed) c.training.precision = *precision == 2 ? "bf16_mixed" : "fp16_mixed";
    else c.training.precision = *precision == 2 ? "amp_bf16" : "amp_fp16";
  }

  static const std::set<std::string> kLayoutKeys = {"distributed_type", "num_processes", "num_machines", "mixed_precision",
                                                    "parallelism_config"};
  std::set<std::string> read_sections;
  if (fsdp) {
    const json& f = section("fsdp_config");
    read_sections.insert("fsdp_config");
    const std::string fs = "fsdp_config";
    std::optional<int64_t> version;
    rd.integer(f, fs, "fsdp_version", 1, 2, version);
    static const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
    std::optional<size_t> strategy;
    std::optional<bool> reshard, offload, checkpointing;
    rd.choice(f, fs, "fsdp_sharding_strategy", kStrategies, strategy, true);
    // fsdp_reshard_after_forward: a boolean (FSDP2), or a strategy name (newer configs of either version).
    if (auto it = f.find("fsdp_reshard_after_forward"); it != f.end() && !it->is_null()) {
      if (it->is_string() && it->get_ref<const std::string&>() != "true" && it->get_ref<const std::string&>() != "false" &&
          it->get_ref<const std::string&>() != "True" && it->get_ref<const std::string&>() != "False") {
        std::optional<size_t> named;
        if (rd.choice(f, fs, "fsdp_reshard_after_forward", kStrategies, named, false)) {
          if (!strategy) strategy = named;
          else if (*strategy != *named) assumed.push_back("fsdp_sharding_strategy is read, not fsdp_reshard_after_forward");
        }
      } else {
        rd.boolean(f, fs, "fsdp_reshard_after_forward", reshard);
      }
    }
    rd.boolean(f, fs, "fsdp_offload_params", offload);
    rd.boolean(f, fs, "fsdp_activation_checkpointing", checkpointing);
    static const std::vector<std::string> kPrefetch = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
    std::optional<size_t> prefetch;
    const char* prefetch_key = f.contains("fsdp_backward_prefetch") ? "fsdp_backward_prefetch" : "fsdp_backward_prefetch_policy";
    rd.choice(f, fs, prefetch_key, kPrefetch, prefetch);
    std::optional<bool> forward_prefetch, orig_params;
    rd.boolean(f, fs, "fsdp_forward_prefetch", forward_prefetch);
    rd.boolean(f, fs, "fsdp_use_orig_params", orig_params);
    static const std::vector<std::string> kWrap = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};
    std::optional<size_t> wrap;
    rd.choice(f, fs, "fsdp_auto_wrap_policy", kWrap, wrap);
    if (!p.errors.empty()) return p;

    const int v = static_cast<int>(version.value_or(1));
    if (!version) assumed.push_back("no fsdp_version: FSDP1, as Accelerate's launcher assumes");
    c.parallel.sharding = v == 2 ? "fsdp2" : "fsdp1";
    // The sharding strategy. FSDP2 expresses it as reshard_after_forward (to_fsdp2.py's mapping).
    size_t st = 0;
    if (v == 2) {
      if (reshard) st = *reshard ? 0 : 1;
      else if (strategy) {
        st = *strategy;
        assumed.push_back("FSDP2 reads " + kStrategies[st] + " as reshard_after_forward " +
                          ((st == 0 || st == 3) ? "true" : "false") + " (accelerate to-fsdp2)");
        st = (st == 0 || st == 3) ? 0 : 1;
      } else {
        assumed.push_back("no fsdp_reshard_after_forward: true (FSDP2's default, FULL_SHARD)");
      }
    } else {
      if (strategy) st = *strategy;
      else if (reshard) {
        st = *reshard ? 0 : 1;
        assumed.push_back("FSDP1 reads fsdp_reshard_after_forward " + std::string(*reshard ? "true as FULL_SHARD" : "false as SHARD_GRAD_OP"));
      } else {
        assumed.push_back("no fsdp_sharding_strategy: FULL_SHARD, Accelerate's default");
      }
    }
    c.parallel.zero_stage = st == 0 || st == 3 ? 3 : st == 1 || st == 4 ? 2 : 0;
    c.parallel.shard_group_size = 0;
    if (v == 2 && has_mesh && dp_replicate.value_or(1) > 1) {
      c.parallel.shard_group_size = dp_shard.value_or(1);  // HSDP: replicate over dp_replicate, shard over dp_shard
    } else if (st == 3 || st == 4) {
      const int64_t nodes = machines.value_or(1);
      if (v == 2) {
        assumed.push_back("FSDP2 shards hybrid only through parallelism_config (dp_replicate_size); " + kStrategies[st] +
                          " is read as " + (st == 3 ? "FULL_SHARD" : "SHARD_GRAD_OP"));
      } else if (world > 0 && nodes > 1 && c.parallel.data_parallel_size % (world / nodes) == 0) {
        c.parallel.shard_group_size = world / nodes;  // FSDP1 HYBRID_SHARD: shard within a machine, replicate across
        assumed.push_back(kStrategies[st] + ": each shard spans the " + std::to_string(world / nodes) + " GPUs of one machine");
      } else {
        assumed.push_back(kStrategies[st] + " on one machine shards over all its GPUs, as " + (st == 3 ? "FULL_SHARD" : "SHARD_GRAD_OP"));
      }
    }
    if (cp.value_or(1) > 1)
      assumed.push_back("Accelerate shards FSDP2 over dp_shard x cp ranks; memsim shards over the data-parallel ranks only");
    const std::string device = offload.value_or(false) ? "cpu" : "none";
    c.parallel.offload_params = c.parallel.offload_optimizer = device;
    if (v == 1) {
      if (prefetch) c.parallel.fsdp_backward_prefetch = *prefetch == 0 ? "backward_pre" : *prefetch == 1 ? "backward_post" : "none";
      else {
        c.parallel.fsdp_backward_prefetch = "none";
        assumed.push_back("no fsdp_backward_prefetch: none (Accelerate's default NO_PREFETCH)");
      }
    } else if (prefetch) {
      assumed.push_back(std::string(prefetch_key) + " does not apply to FSDP2, which prefetches as BACKWARD_PRE");
    }
    if (orig_params && v == 1) c.parallel.fsdp_use_orig_params = *orig_params ? "true" : "false";
    else if (orig_params) assumed.push_back("fsdp_use_orig_params does not apply to FSDP2 (per-parameter sharding)");
    if (forward_prefetch.value_or(false)) {
      if (v == 1) c.parallel.fsdp_forward_prefetch = 1;  // FullyShardedDataParallel(forward_prefetch=True)
      else assumed.push_back("fsdp_forward_prefetch does not apply to FSDP2 (Accelerate passes it to FSDP1 only)");
    }
    if (checkpointing && *checkpointing) c.training.activation_checkpointing = "full";
    else if (checkpointing)
      assumed.push_back("fsdp_activation_checkpointing false: kept training.activation_checkpointing " +
                        c.training.activation_checkpointing + " (the script may still enable gradient checkpointing)");
    if (wrap && *wrap != 0)
      assumed.push_back("fsdp_auto_wrap_policy " + kWrap[*wrap] + ": memsim models one FSDP unit per transformer layer");
  } else if (deepspeed) {
    const json& d = section("deepspeed_config");
    read_sections.insert("deepspeed_config");
    const std::string ds = "deepspeed_config";
    std::optional<int64_t> stage, accumulation;
    rd.integer(d, ds, "zero_stage", 0, 3, stage);
    rd.integer(d, ds, "gradient_accumulation_steps", 1, 1 << 20, accumulation);
    static const std::vector<std::string> kDevices = {"none", "cpu", "nvme"};
    std::optional<size_t> opt_dev, param_dev;
    rd.choice(d, ds, "offload_optimizer_device", kDevices, opt_dev);
    rd.choice(d, ds, "offload_param_device", kDevices, param_dev);
    if (!p.errors.empty()) return p;
    c.parallel.sharding = "deepspeed";
    c.parallel.shard_group_size = 0;
    if (stage) c.parallel.zero_stage = *stage;
    if (accumulation) c.training.gradient_accumulation_steps = *accumulation;
    c.parallel.offload_optimizer = kDevices[opt_dev.value_or(0)];
    c.parallel.offload_params = kDevices[param_dev.value_or(0)];
    if (auto it = d.find("deepspeed_config_file"); it != d.end() && it->is_string() && !it->get_ref<const std::string&>().empty())
      assumed.push_back("the DeepSpeed settings are in " + it->get<std::string>().substr(0, 80) +
                        ": load that file too (memsim-cli --deepspeed-config, or drop it)");
  } else {
    // DDP (MULTI_GPU) or one process: nothing is sharded or offloaded.
    c.parallel.zero_stage = 0;
    c.parallel.shard_group_size = 0;
    c.parallel.offload_optimizer = c.parallel.offload_params = "none";
    c.parallel.sharding = "auto";
    if (ddp) assumed.push_back("MULTI_GPU: DistributedDataParallel, nothing sharded");
  }

  // What was not read: every other key, with the sections' keys by name.
  std::set<std::string> read(used.begin(), used.end());
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& k = it.key();
    if (it->is_object() && !it->empty()) {
      for (auto jt = it->begin(); jt != it->end(); ++jt)
        if (!read.count(k + "." + jt.key())) ignored.push_back(k + "." + jt.key());
    } else if (!kLayoutKeys.count(k) && !read_sections.count(k) && !it->is_null() && !(it->is_array() && it->empty()) &&
               !(it->is_object() && it->empty())) {
      ignored.push_back(k);
    }
  }
  if (!p.errors.empty()) return p;
  std::vector<std::string> read_list;
  for (const auto& k : used) read_list.push_back(k);
  if (!read_list.empty()) p.notes.push_back("Accelerate config: read " + list_keys(read_list));
  for (const auto& a : assumed) p.notes.push_back(a);
  if (!ignored.empty()) p.notes.push_back("not modelled, ignored: " + list_keys(ignored));
  p.config = c;
  p.ok = true;
  return p;
}

}  // namespace memsim
