// DeepSpeed config import and export (deepspeed_io.h). Sources, microsoft/DeepSpeed:
//   config.py        deepspeed/runtime/config.py @ 38327e07f6cd39b63418f60cedd1651b0be3e7c3 (0.16.5 dev, 2025-02)
//   precision_config deepspeed/runtime/precision_config.py @ 7d5be07867fa4c4bf2f1abfc08e6df474d5d0ab1
//   config_utils.py  deepspeed/runtime/config_utils.py @ 0bb3516d154d27c1c5730742ca73a9b00680c184
//   zero/config.py   deepspeed/runtime/zero/config.py @ 38327e07 (offload: zero/offload_config.py)
// - config.py _initialize_params reads the keys it knows by name and nothing else, so a key it does not know (the
//   "memsim" section) is not an error there.
// - Booleans: precision_config.py DeepSpeedBF16Config/DeepSpeedFP16Config and zero/config.py (overlap_comm) are
//   pydantic models (config_utils.py DeepSpeedConfigModel), whose bool takes true/false, 0/1 and the strings
//   true/false/1/0/yes/no/on/off/t/f/y/n in any case (pydantic's conversion table). Released DeepSpeed validates
//   bf16 that way (microsoft/superbenchmark#796, 2026-03: "ValidationError ... for DeepSpeedBF16Config"); 0.16's
//   config.py get_bfloat16_enabled read the value raw, where the string "false" was truthy. memsim reads it as now.
// - "auto": config_utils.py DeepSpeedConfigModel.__init__ drops keys whose value is "auto" (their default applies);
//   HF Trainer's integration (transformers integrations/deepspeed.py) fills them from TrainingArguments first.
//   memsim keeps its own value for them and says so.
// - bf16: precision_config.py get_bfloat16_config reads "bf16", or the older "bfloat16". {"bf16": true} is not a
//   form DeepSpeed takes (DeepSpeedBF16Config(**True) raises); memsim reads it as meant and notes that.
// - bf16 and fp16 both enabled: config.py _initialize_params asserts 'bfloat16 and fp16 modes cannot be
//   simultaneously enabled' (line 835 at 38327e07). Neither: DeepSpeed trains in fp32.
// - Optimizer: config.py get_optimizer_name reads optimizer["type"]; a name in DEEPSPEED_OPTIMIZERS (adam, adamw,
//   lion, lamb, ...) in any case, any other as torch.optim's class (engine.py _configure_basic_optimizer:
//   getattr(torch.optim, name)), so "SGD" and torch >= 2.5's "Adafactor". A bare string ("optimizer": "AdamW") is
//   not a form DeepSpeed takes (it calls .keys() on it); memsim reads it as meant and notes that.
// - Batch: config.py _set_batch_related_parameters/_batch_assertion: train_batch_size = micro x accumulation x the
//   data-parallel world size; with one of the three left out DeepSpeed derives it from the other two.
// - "zero_optimization": true|false is zero/config.py read_zero_config_deprecated: stage 1 or 0.
#include "deepspeed_io.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "frameworks.h"
#include "json_read.h"
#include "serialize.h"
#include "tables.h"

namespace memsim {

using json = nlohmann::json;

namespace {

using json_read::describe;

bool is_auto(const json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

// An integer as memsim's JSON reader takes it (4096, 4096.0, 1e3), refusing anything else by name.
bool read_int(const json& v, const std::string& key, int64_t& out, std::vector<FieldError>& errors) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return out = v.get<int64_t>(), true;
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX))
    return out = static_cast<int64_t>(v.get<uint64_t>()), true;
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= 9007199254740992.0) return out = static_cast<int64_t>(d), true;
  }
  errors.push_back({key, key + " must be an integer (or \"auto\"); got " + describe(v)});
  return false;
}

// A boolean as pydantic reads one (see the top). nullopt: not a boolean.
std::optional<bool> as_bool(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer() || v.is_number_float()) {
    const double d = v.get<double>();
    if (d == 0) return false;
    if (d == 1) return true;
    return std::nullopt;
  }
  if (!v.is_string()) return std::nullopt;
  std::string s = v.get<std::string>();
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* t : {"true", "1", "yes", "on", "t", "y"})
    if (s == t) return true;
  for (const char* f : {"false", "0", "no", "off", "f", "n"})
    if (s == f) return false;
  return std::nullopt;
}

// DeepSpeed's precision for memsim's recipes: the bf16 or fp16 flag, or neither (fp32). Exact for bf16_mixed,
// fp16_mixed and fp32; the others are the nearest DeepSpeed run, and the "memsim" section keeps the recipe.
const char* ds_precision(const std::string& p) {
  if (p == "fp32") return "fp32";
  if (p == "fp16_mixed" || p == "amp_fp16") return "fp16";
  return "bf16";
}
bool ds_precision_exact(const std::string& p) { return p == "fp32" || p == "bf16_mixed" || p == "fp16_mixed"; }

// DeepSpeed's optimizer name for memsim's, "" where it has none (bitsandbytes and torchao optimizers: HF Trainer
// builds those from --optim when the DeepSpeed config has no optimizer section).
std::string ds_optimizer(const std::string& o) {
  if (o == "adamw") return "AdamW";
  if (o == "adam") return "Adam";
  if (o == "lion") return "Lion";
  if (o == "sgd" || o == "sgd_momentum") return "SGD";
  if (o == "adafactor") return "Adafactor";
  return "";
}

// The memsim settings deepspeed_json puts in its "memsim" section, in the order they are applied.
constexpr const char* kMemsimKeys[] = {"training.precision", "training.optimizer", "training.activation_checkpointing",
                                       "training.checkpoint_every_k_layers"};

bool is_choice(const std::string& field, const std::string& value) {
  for (std::string_view ch : choices(field))
    if (ch == value) return true;
  return false;
}

std::string list(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 24; ++i) s += (i ? ", " : "") + v[i].substr(0, 60);
  if (v.size() > 24) s += " and " + std::to_string(v.size() - 24) + " more";
  return s;
}

}  // namespace

Parsed config_from_deepspeed_json(std::string_view text, const Config& base) {
  Parsed p;
  p.config = base;
  json doc;
  if (!json_read::parse_document(text, "the DeepSpeed config", doc, p.errors)) return p;
  Config c = base;
  std::vector<std::string> used, kept_auto, ignored, notes;
  std::set<std::string> read_top;
  auto& errors = p.errors;

  // ---- the batch ----
  auto integer = [&](const json& obj, const std::string& prefix, const char* key, int64_t& out) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return false;
    if (is_auto(*it)) return kept_auto.push_back(prefix + key), false;
    int64_t v;
    if (!read_int(*it, prefix + key, v, errors)) return false;
    out = v, used.push_back(prefix + key);
    return true;
  };
  for (const char* k : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"}) read_top.insert(k);
  int64_t micro = c.training.micro_batch_size, accum = c.training.gradient_accumulation_steps, global = 0;
  const bool has_micro = integer(doc, "", "train_micro_batch_size_per_gpu", micro);
  const bool has_accum = integer(doc, "", "gradient_accumulation_steps", accum);
  const bool has_global = integer(doc, "", "train_batch_size", global);
  if (has_micro && micro < 1) errors.push_back({"train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu must be at least 1"});
  if (has_accum && accum < 1) errors.push_back({"gradient_accumulation_steps", "gradient_accumulation_steps must be at least 1"});
  if (has_global && global < 1) errors.push_back({"train_batch_size", "train_batch_size must be at least 1"});
  if (errors.empty()) {
    c.training.micro_batch_size = micro;
    c.training.gradient_accumulation_steps = accum;
    if (has_global) {
      const int64_t dp = c.parallel.data_parallel_size;
      int64_t per_rank = 0;
      if (__builtin_mul_overflow(micro, accum, &per_rank)) per_rank = 0;
      if (has_micro && has_accum) {
        // All three: train_batch_size = micro x accumulation x data-parallel GPUs (config.py _batch_assertion).
        if (per_rank <= 0 || global % per_rank != 0)
          errors.push_back({"train_batch_size", "train_batch_size (" + std::to_string(global) +
                                                    ") must be train_micro_batch_size_per_gpu x gradient_accumulation_steps (" +
                                                    std::to_string(micro) + " x " + std::to_string(accum) +
                                                    ") x the data-parallel GPUs, as DeepSpeed asserts"});
        else c.parallel.data_parallel_size = global / per_rank, c.parallel.gpus.reset();
      } else if (has_micro) {  // DeepSpeed derives the accumulation from the world size: memsim's data parallel
        if (micro > 0 && dp > 0 && global % micro == 0 && (global / micro) % dp == 0 && global / micro / dp >= 1)
          c.training.gradient_accumulation_steps = global / micro / dp;
        else errors.push_back({"train_batch_size", "train_batch_size (" + std::to_string(global) + ") is not a multiple of " +
                                                       "train_micro_batch_size_per_gpu x the " + std::to_string(dp) + " data-parallel GPUs"});
      } else {  // the micro-batch from the world size (and accumulation 1 when that is left out too)
        if (!has_accum) c.training.gradient_accumulation_steps = accum = 1;
        if (accum > 0 && dp > 0 && global % accum == 0 && (global / accum) % dp == 0 && global / accum / dp >= 1)
          c.training.micro_batch_size = global / accum / dp;
        else errors.push_back({"train_batch_size", "train_batch_size (" + std::to_string(global) + ") is not a multiple of " +
                                                       "gradient_accumulation_steps x the " + std::to_string(dp) + " data-parallel GPUs"});
      }
    }
  }

  // ---- precision ----
  // Each flag: 1 on, 0 off, -1 absent, 2 "auto".
  auto flag = [&](const char* section, const char* alias) -> int {
    auto it = doc.find(section);
    std::string name = section;
    if ((it == doc.end() || it->is_null()) && alias) it = doc.find(alias), name = alias;
    if (it == doc.end() || it->is_null()) return -1;
    read_top.insert(name);
    const json* v = &*it;
    if (it->is_object()) {
      for (auto s = it->begin(); s != it->end(); ++s)
        if (s.key() != "enabled") ignored.push_back(name + "." + s.key());
      auto e = it->find("enabled");
      if (e == it->end() || e->is_null()) return 0;  // DeepSpeedBF16Config/FP16Config: enabled defaults to false
      v = &*e;
      name += ".enabled";
    } else if (!is_auto(*it)) {
      notes.push_back(name + " is read as {\"enabled\": " + describe(*it) + "}, the form DeepSpeed takes");
    }
    if (is_auto(*v)) return kept_auto.push_back(name), 2;
    auto b = as_bool(*v);
    if (!b) {
      errors.push_back({name, name + " must be true or false (or \"true\"/\"false\", 1/0, \"auto\"); got " + describe(*v)});
      return 0;
    }
    used.push_back(name);
    return *b ? 1 : 0;
  };
  const int bf16 = flag("bf16", "bfloat16"), fp16 = flag("fp16", nullptr);
  std::string precision = c.training.precision;
  if (bf16 == 1 && fp16 == 1)
    errors.push_back({"bf16.enabled", "bf16.enabled and fp16.enabled are both true; DeepSpeed refuses that "
                                      "(bfloat16 and fp16 modes cannot be simultaneously enabled): enable one"});
  else if (bf16 == 1) precision = "bf16_mixed";
  else if (fp16 == 1) precision = "fp16_mixed";
  else if (bf16 == 2 || fp16 == 2) ;  // HF Trainer decides (--bf16/--fp16): memsim keeps its precision
  else {
    precision = "fp32";
    if (bf16 == -1 && fp16 == -1) notes.push_back("no bf16 or fp16 section: DeepSpeed trains in fp32");
  }

  // ---- ZeRO ----
  read_top.insert("zero_optimization");
  auto zero_defaults = [&](int64_t stage) {  // zero/config.py DeepSpeedZeroConfig's defaults
    c.parallel.zero_stage = stage;
    c.parallel.offload_optimizer = c.parallel.offload_params = "none";
    c.parallel.zero_reduce_bucket_size = c.parallel.zero_prefetch_bucket_size = 0;
    c.parallel.zero_param_persistence_threshold = c.parallel.zero_max_live_parameters = 0;
    c.parallel.zero_overlap_comm = "auto";
  };
  if (auto z = doc.find("zero_optimization"); z == doc.end() || z->is_null()) {
    zero_defaults(0);
    notes.push_back("no zero_optimization section: DeepSpeed's default, ZeRO stage 0 (nothing sharded)");
  } else {
    c.training.framework = "deepspeed";
    if (z->is_boolean()) {  // the deprecated form: true is stage 1
      zero_defaults(z->get<bool>() ? 1 : 0);
      used.push_back("zero_optimization (deprecated boolean: stage " + std::to_string(c.parallel.zero_stage) + ")");
    } else if (!z->is_object()) {
      errors.push_back({"zero_optimization", "zero_optimization must be a JSON object such as {\"stage\": 3}; got " + describe(*z)});
    } else {
      const std::string zo = "zero_optimization.";
      int64_t stage = c.parallel.zero_stage;
      if (integer(*z, zo, "stage", stage)) {
        if (stage < 0 || stage > 3) errors.push_back({zo + "stage", zo + "stage must be 0, 1, 2 or 3; got " + std::to_string(stage)});
        else c.parallel.zero_stage = stage;
      }
      // A buffer or overlap_comm the section leaves out is DeepSpeed's default (memsim's 0 and "auto"), whatever the
      // current setup had; "auto" keeps memsim's value.
      auto buffer = [&](const char* key, int64_t& out) {
        if (!z->contains(key)) out = 0;
        else integer(*z, zo, key, out);
      };
      buffer("reduce_bucket_size", c.parallel.zero_reduce_bucket_size);
      buffer("stage3_prefetch_bucket_size", c.parallel.zero_prefetch_bucket_size);
      buffer("stage3_param_persistence_threshold", c.parallel.zero_param_persistence_threshold);
      buffer("stage3_max_live_parameters", c.parallel.zero_max_live_parameters);
      if (!z->contains("overlap_comm")) c.parallel.zero_overlap_comm = "auto";
      if (auto o = z->find("overlap_comm"); o != z->end()) {
        // null and "auto" are DeepSpeed's default (true for stage 3 only), which memsim's "auto" is.
        if (o->is_null() || is_auto(*o)) c.parallel.zero_overlap_comm = "auto", used.push_back(zo + "overlap_comm");
        else if (auto b = as_bool(*o)) c.parallel.zero_overlap_comm = *b ? "true" : "false", used.push_back(zo + "overlap_comm");
        else errors.push_back({zo + "overlap_comm", zo + "overlap_comm must be true or false; got " + describe(*o)});
      }
      // Offload (zero/offload_config.py: OffloadDeviceEnum none|cpu|nvme, default none; zero/config.py: the deprecated
      // cpu_offload -> offload_optimizer cpu, cpu_offload_param -> offload_param cpu). A ZeRO section without them
      // means no offload, whatever the current setup had.
      auto offload = [&](const char* section, const char* legacy, std::string& out) {
        std::string device = "none";
        bool legacy_given = false;
        if (auto l = z->find(legacy); l != z->end() && !l->is_null()) {
          auto b = as_bool(*l);
          if (!b) return errors.push_back({zo + legacy, zo + legacy + " must be true or false; got " + describe(*l)});
          if (*b) device = "cpu";
          legacy_given = true;
          used.push_back(zo + legacy);
        }
        if (auto o = z->find(section); o != z->end() && !o->is_null()) {
          const std::string name = zo + section + ".device";
          if (!o->is_object())
            return errors.push_back({name, zo + section + " must be a JSON object such as {\"device\": \"cpu\"}; got " + describe(*o)});
          for (auto it = o->begin(); it != o->end(); ++it)  // pin_memory, nvme_path, buffer_count: speed, not GPU bytes
            if (it.key() != "device") ignored.push_back(zo + section + "." + it.key());
          auto d = o->find("device");
          if (d != o->end() && !d->is_string() && !d->is_null())
            return errors.push_back({name, name + " must be one of: none, cpu, nvme; got " + describe(*d)});
          const std::string v = d == o->end() || d->is_null() ? "none" : d->get<std::string>();
          if (v != "none" && v != "cpu" && v != "nvme")
            return errors.push_back({name, name + " must be one of: none, cpu, nvme; got \"" + v.substr(0, 40) + "\""});
          if (legacy_given && v != device) notes.push_back(zo + section + " (" + v + ") is read, not the deprecated " + zo + legacy);
          device = v;
          used.push_back(name);
        }
        out = device;
      };
      offload("offload_optimizer", "cpu_offload", c.parallel.offload_optimizer);
      offload("offload_param", "cpu_offload_param", c.parallel.offload_params);
      static const std::set<std::string> read_keys = {"stage", "reduce_bucket_size", "stage3_prefetch_bucket_size",
                                                      "stage3_param_persistence_threshold", "overlap_comm",
                                                      "stage3_max_live_parameters", "offload_optimizer", "offload_param",
                                                      "cpu_offload", "cpu_offload_param"};
      for (auto it = z->begin(); it != z->end(); ++it)
        if (!read_keys.count(it.key())) ignored.push_back(zo + it.key());
    }
  }
  c.parallel.sharding = "deepspeed";

  // ---- optimizer ----
  read_top.insert("optimizer");
  std::string optimizer = c.training.optimizer, optimizer_type;
  if (auto o = doc.find("optimizer"); o != doc.end() && !o->is_null()) {
    const json* t = nullptr;
    const json* params = nullptr;
    if (o->is_string()) {
      t = &*o;
      notes.push_back("optimizer is read as {\"type\": " + describe(*o) + "}, the form DeepSpeed takes");
    } else if (!o->is_object()) {
      errors.push_back({"optimizer", "optimizer must be a JSON object such as {\"type\": \"AdamW\"}; got " + describe(*o)});
    } else {
      if (auto it = o->find("type"); it != o->end() && !it->is_null()) t = &*it;
      if (auto it = o->find("params"); it != o->end() && it->is_object()) params = &*it;
      for (auto it = o->begin(); it != o->end(); ++it)
        if (it.key() != "type" && it.key() != "params") ignored.push_back("optimizer." + it.key());
    }
    if (t && !t->is_string()) errors.push_back({"optimizer.type", "optimizer.type must be a string such as \"AdamW\"; got " + describe(*t)});
    else if (t && is_auto(*t)) kept_auto.push_back("optimizer.type");
    else if (t) {
      optimizer_type = t->get<std::string>();
      std::string lower = optimizer_type;
      for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      // DeepSpeed's own names in any case; torch.optim's class names as torch spells them.
      bool momentum = false;
      if (params)
        if (auto m = params->find("momentum"); m != params->end() && m->is_number()) momentum = m->get<double>() != 0;
      const std::string found = lower == "adam" ? "adam" : lower == "adamw" ? "adamw" : lower == "lion" ? "lion"
                                : optimizer_type == "SGD" ? (momentum ? "sgd_momentum" : "sgd")
                                : optimizer_type == "Adafactor" ? "adafactor" : "";
      if (!found.empty()) optimizer = found, used.push_back("optimizer.type");
      else ignored.push_back("optimizer.type " + optimizer_type.substr(0, 40) + " (not modelled; kept " + optimizer + ")");
      if (params)
        for (auto it = params->begin(); it != params->end(); ++it)
          if (!(found.rfind("sgd", 0) == 0 && it.key() == "momentum")) ignored.push_back("optimizer.params." + it.key());
    }
  }

  // Without an optimizer section DeepSpeed steps the client optimizer the script passes to deepspeed.initialize: the
  // HF Trainer's adamw_torch, whose foreach step makes a full-size temporary of each flat partition (optimizer_step.cpp).
  if ((doc.find("optimizer") == doc.end() || doc["optimizer"].is_null()) && c.training.framework == "deepspeed")
    notes.push_back("no optimizer section: DeepSpeed steps the optimizer the training script passes it; under the HF "
                    "Trainer that is its adamw_torch (set training.framework hf_trainer, whose step memsim models then), "
                    "where framework deepspeed assumes DeepSpeed's FusedAdam");

  // ---- memsim's own section (what deepspeed_json writes beyond DeepSpeed's keys) ----
  read_top.insert("memsim");
  std::string checkpointing = c.training.activation_checkpointing;
  const bool ds_checkpointing = doc.contains("activation_checkpointing");
  if (ds_checkpointing) {
    read_top.insert("activation_checkpointing");
    // The section configures deepspeed.checkpointing; the model (or HF's gradient_checkpointing) decides which layers.
    if (checkpointing == "none") checkpointing = "full", notes.push_back("activation_checkpointing: assumed full checkpointing");
    else used.push_back("activation_checkpointing");
    if (doc["activation_checkpointing"].is_object())
      for (auto it = doc["activation_checkpointing"].begin(); it != doc["activation_checkpointing"].end(); ++it)
        ignored.push_back("activation_checkpointing." + it.key());
  }
  Config mine = c;
  mine.training.precision = precision, mine.training.optimizer = optimizer, mine.training.activation_checkpointing = checkpointing;
  if (auto m = doc.find("memsim"); m != doc.end() && !m->is_null()) {
    if (!m->is_object()) errors.push_back({"memsim", "memsim must be a JSON object of memsim settings; got " + describe(*m)});
    else {
      Config tmp = mine;
      for (const char* key : kMemsimKeys) {
        auto it = m->find(key);
        if (it == m->end()) continue;
        if (!it->is_string() && !it->is_number_integer()) {
          errors.push_back({std::string("memsim.") + key, std::string("memsim.") + key + " must be a string or an integer; got " + describe(*it)});
          continue;
        }
        const std::string value = it->is_string() ? it->get<std::string>() : it->dump();
        const std::string field = std::string("memsim.") + key;
        const std::string k = key;
        if (k == "training.precision" && !find_precision(value))
          errors.push_back({field, field + " must be one of memsim's precision recipes; got " + describe(*it)});
        else if (k == "training.optimizer" && !find_optimizer(value))
          errors.push_back({field, field + " must be one of memsim's optimizers; got " + describe(*it)});
        else if (k == "training.activation_checkpointing" && !is_choice(k, value))
          errors.push_back({field, field + " must be one of memsim's checkpointing choices (none, full, ...); got " + describe(*it)});
        else
          for (auto& e : apply_setting(tmp, k + "=" + value)) errors.push_back({"memsim." + e.field, e.message});
      }
      for (auto it = m->begin(); it != m->end(); ++it)
        if (it.key() != "note" && std::find(std::begin(kMemsimKeys), std::end(kMemsimKeys), it.key()) == std::end(kMemsimKeys))
          ignored.push_back("memsim." + it.key());
      // Taken where it agrees with DeepSpeed's keys; where someone edited those, they win.
      if (ds_precision(tmp.training.precision) == std::string(ds_precision(precision)) && (bf16 == 1 || fp16 == 1 || precision == "fp32"))
        mine.training.precision = tmp.training.precision;
      else if (tmp.training.precision != precision) notes.push_back("memsim.training.precision (" + tmp.training.precision + ") disagrees with bf16/fp16: read " + precision);
      if (ds_optimizer(tmp.training.optimizer) == optimizer_type || (optimizer_type.empty() && ds_optimizer(tmp.training.optimizer).empty()))
        mine.training.optimizer = tmp.training.optimizer;
      else if (tmp.training.optimizer != optimizer) notes.push_back("memsim.training.optimizer (" + tmp.training.optimizer + ") disagrees with optimizer: read " + optimizer);
      if ((tmp.training.activation_checkpointing != "none") == ds_checkpointing || !m->contains("training.activation_checkpointing"))
        mine.training.activation_checkpointing = tmp.training.activation_checkpointing;
      else notes.push_back("memsim.training.activation_checkpointing (" + tmp.training.activation_checkpointing +
                           ") disagrees with the activation_checkpointing section: read " + checkpointing);
      mine.training.checkpoint_every_k_layers = tmp.training.checkpoint_every_k_layers;
      used.push_back("memsim");
    }
  }
  c.training = mine.training;

  for (auto it = doc.begin(); it != doc.end(); ++it)
    if (!read_top.count(it.key())) ignored.push_back(it.key());
  if (!errors.empty()) return p;
  if (!used.empty()) p.notes.push_back("DeepSpeed config: read " + list(used));
  if (!kept_auto.empty()) p.notes.push_back("kept memsim's current values for \"auto\" (HF Trainer fills them): " + list(kept_auto));
  for (const auto& n : notes) p.notes.push_back(n);
  if (!ignored.empty()) p.notes.push_back("not modelled, ignored: " + list(ignored));
  p.config = c;
  p.ok = true;
  return p;
}

std::string deepspeed_json(const Config& c, int indent) {
  json ds, own;
  own["note"] = "memsim's settings that DeepSpeed's keys cannot say; DeepSpeed does not read this section";
  ds["train_micro_batch_size_per_gpu"] = c.training.micro_batch_size;
  ds["gradient_accumulation_steps"] = c.training.gradient_accumulation_steps;
  // Checked (an unvalidated config's product came out as -9.2e18). When it overflows the key is left out: DeepSpeed
  // derives train_batch_size from the other two and the world size (config.py _set_batch_related_parameters).
  int64_t train_batch = 0;
  if (!__builtin_mul_overflow(c.training.micro_batch_size, c.training.gradient_accumulation_steps, &train_batch) &&
      !__builtin_mul_overflow(train_batch, c.parallel.data_parallel_size, &train_batch) && train_batch > 0)
    ds["train_batch_size"] = train_batch;
  const std::string precision = ds_precision(c.training.precision);
  ds["bf16"] = {{"enabled", precision == "bf16"}};
  ds["fp16"] = {{"enabled", precision == "fp16"}};
  if (!ds_precision_exact(c.training.precision)) own["training.precision"] = c.training.precision;
  ds["zero_optimization"] = {{"stage", c.parallel.zero_stage}};
  if (c.parallel.zero_reduce_bucket_size > 0) ds["zero_optimization"]["reduce_bucket_size"] = c.parallel.zero_reduce_bucket_size;
  if (c.parallel.zero_overlap_comm != "auto") ds["zero_optimization"]["overlap_comm"] = c.parallel.zero_overlap_comm == "true";
  if (c.parallel.zero_prefetch_bucket_size > 0)
    ds["zero_optimization"]["stage3_prefetch_bucket_size"] = c.parallel.zero_prefetch_bucket_size;
  if (c.parallel.zero_param_persistence_threshold > 0)
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = c.parallel.zero_param_persistence_threshold;
  if (c.parallel.zero_max_live_parameters > 0)
    ds["zero_optimization"]["stage3_max_live_parameters"] = c.parallel.zero_max_live_parameters;
  // Offload blocks as zero/offload_config.py names them; NVMe needs a path, so the export writes DeepSpeed's
  // documentation example for the user to replace.
  auto offload = [&](const char* section, const std::string& device) {
    if (device == "none") return;
    ds["zero_optimization"][section] = {{"device", device}};
    if (device == "nvme") ds["zero_optimization"][section]["nvme_path"] = "/local_nvme";
  };
  offload("offload_optimizer", c.parallel.offload_optimizer);
  offload("offload_param", c.parallel.offload_params);
  if (const std::string type = ds_optimizer(c.training.optimizer); !type.empty()) {
    ds["optimizer"] = {{"type", type}, {"params", {{"lr", "auto"}}}};
    if (c.training.optimizer == "sgd_momentum") ds["optimizer"]["params"]["momentum"] = 0.9;
    if (c.training.optimizer == "adafactor") own["training.optimizer"] = c.training.optimizer;  // torch >= 2.5's class
  } else {
    // No DeepSpeed name: without an optimizer section HF Trainer builds it from TrainingArguments.optim.
    own["training.optimizer"] = c.training.optimizer;
  }
  // DeepSpeed's section configures deepspeed.checkpointing; which layers are checkpointed the model decides, so
  // memsim's choice (none, full, selective, every k) goes to its own section too.
  if (c.training.activation_checkpointing != "none")
    ds["activation_checkpointing"] = {{"partition_activations", false}, {"contiguous_memory_optimization", false}};
  own["training.activation_checkpointing"] = c.training.activation_checkpointing;
  if (c.training.activation_checkpointing == "every_k") own["training.checkpoint_every_k_layers"] = c.training.checkpoint_every_k_layers;
  ds["memsim"] = own;
  return ds.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace memsim
