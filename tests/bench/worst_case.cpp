// The worst in-range case (robustness issue: every config that validation accepts simulates in at most 2 s and 1 GiB
// natively). A search over the ranges, not a proof: from five bases (the default, a 3D layout, a run of varying
// lengths, an MoE, an MoE's run), each ranged integer field (and data.steps) is pushed to the largest value validation accepts,
// each such config is timed once, and the slowest are combined in pairs (the second field pushed again). It prints the slowest cases as
// `memsim-cli estimate` arguments, their time and the process's peak memory; like the rest of this binary it reports
// and never fails on speed.
//   build/native/memsim_bench "[worst]"      (on demand, about a minute; README Robustness has its last result)
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#if !defined(__EMSCRIPTEN__)
#include <sys/resource.h>
#endif

#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"

using namespace memsim;

namespace {

using Settings = std::vector<std::string>;

struct Base {
  const char* name;
  Settings settings;
};

const std::vector<Base>& bases() {
  static const std::vector<Base> b = {
      {"default", {}},
      {"3D layout", {"model.hidden_size=16384", "model.num_hidden_layers=128", "model.num_attention_heads=128",
                     "model.num_key_value_heads=8", "model.intermediate_size=53248", "model.vocab_size=128256",
                     "training.framework=megatron", "training.sequence_length=8192",
                     "training.gradient_accumulation_steps=32", "training.activation_checkpointing=selective",
                     "parallel.data_parallel_size=4", "parallel.zero_stage=1", "parallel.tensor_parallel_size=8",
                     "parallel.sequence_parallel=true", "parallel.pipeline_parallel_size=16",
                     "parallel.pipeline_schedule=interleaved_1f1b", "parallel.virtual_pipeline_stages=2",
                     "hardware.gpu=h100-sxm"}},
      {"run of lengths", {"model.hidden_size=4096", "model.num_hidden_layers=32", "model.num_attention_heads=32",
                          "model.num_key_value_heads=32", "model.intermediate_size=11008", "training.framework=hf_trainer",
                          "training.sequence_length=2048", "training.activation_checkpointing=none", "peft.method=lora",
                          "parallel.data_parallel_size=1", "parallel.zero_stage=0", "data.lengths=samples",
                          "data.sample_lengths=p0=20,p50=150,p90=350,p99=600,p100=1100", "data.steps=1000"}},
      {"MoE", {"model.hidden_size=4096", "model.num_hidden_layers=32", "model.num_attention_heads=32",
               "model.num_key_value_heads=8", "model.intermediate_size=14336", "model.num_experts=8",
               "model.num_experts_per_tok=2", "parallel.expert_parallel_size=8"}},
      // A run's replay costs per layer pass, and an MoE layer holds more events than a dense one.
      {"MoE run of lengths", {"model.hidden_size=2048", "model.num_hidden_layers=48", "model.num_attention_heads=32",
                              "model.num_key_value_heads=4", "model.intermediate_size=6144", "model.num_experts=128",
                              "model.num_experts_per_tok=8", "model.moe_intermediate_size=768",
                              "training.framework=hf_trainer", "training.sequence_length=2048", "peft.method=lora",
                              "parallel.data_parallel_size=1", "parallel.zero_stage=0", "data.lengths=samples",
                              "data.sample_lengths=p0=20,p50=150,p90=350,p99=600,p100=1100"}},
  };
  return b;
}

struct Case {
  Settings settings;
  double seconds = 0;
};
Case g_memory_worst;  // the case that raised the process's peak memory last: the largest footprint seen
double g_memory_worst_mib = 0;

bool build(const Settings& settings, Config& out) {
  Config c;
  for (const auto& s : settings)
    if (!apply_setting(c, s).empty()) return false;
  if (!validate(c).empty()) return false;
  out = c;
  return true;
}

double peak_rss_mib();

double time_once(const Config& c) {
  if (std::getenv("MEMSIM_WORST_VERBOSE")) std::fprintf(stderr, "timing: %s\n", config_to_fragment(c).c_str());
  const auto start = std::chrono::steady_clock::now();
  const Result r = simulate(c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (void)r;
  return s;
}

double peak_rss_mib() {
#if defined(__EMSCRIPTEN__)
  return 0;
#else
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: kilobytes
#endif
}

std::string command(const Settings& settings) {
  std::string out = "memsim-cli estimate";
  for (const auto& s : settings) out += " --set " + s;
  return out;
}

// Extra values for fields that are not integers with a range, but that set how much work a run is.
const std::vector<std::string> kExtra = {"data.steps=100000", "data.steps=1000000", "training.activation_checkpointing=full",
                                         "parallel.pipeline_schedule=interleaved_1f1b", "peft.method=lora",
                                         "parallel.zero_stage=3", "training.framework=fsdp2"};

// The largest value of `field` that validation accepts on `base` (bisection between the range's ends; the limits
// that tie fields together, such as stages x micro-batches or a run's layer passes, are monotone in each field).
bool largest_accepted(const Settings& base, const std::string& field, IntRange r, Settings& out) {
  auto with = [&](int64_t v) {
    Settings s = base;
    s.push_back(field + "=" + std::to_string(v));
    return s;
  };
  Config c;
  if (build(with(r.max), c)) return out = with(r.max), true;
  int64_t lo = r.min, hi = r.max;  // hi refused
  if (!build(with(lo), c)) return false;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (build(with(mid), c) ? lo : hi) = mid;
  }
  out = with(lo);
  return true;
}

// Settings with each key once, the last value of a key kept (as --set applies them).
Settings last_of_each_key(const Settings& settings) {
  Settings out;
  for (const auto& s : settings) {
    const std::string key = s.substr(0, s.find('='));
    out.erase(std::remove_if(out.begin(), out.end(), [&](const std::string& x) { return x.substr(0, x.find('=')) == key; }),
              out.end());
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("worst in-range case", "[.][worst]") {
  std::vector<Case> cases;
  int tried = 0, accepted = 0;
  auto time_case = [&](const Settings& settings) {
    ++tried;
    Config c;
    if (!build(settings, c)) return;
    ++accepted;
    const double before = peak_rss_mib();
    cases.push_back({last_of_each_key(settings), time_once(c)});
    if (peak_rss_mib() > before) g_memory_worst = cases.back(), g_memory_worst_mib = peak_rss_mib();
  };
  for (const Base& base : bases()) {
    std::vector<std::pair<std::string, IntRange>> fields;
    for (const std::string& field : ranged_fields())
      if (field.rfind("hardware.", 0) != 0) fields.push_back({field, int_range(field)});  // memory sizes: no work
    fields.push_back({"data.steps", {1, 1'000'000'000}});  // a run's length: its own bound (data_shape.h)
    for (const auto& [field, range] : fields) {
      Settings s;
      if (largest_accepted(base.settings, field, range, s)) time_case(s);
    }
    for (const std::string& extra : kExtra) {
      Settings s = base.settings;
      s.push_back(extra);
      time_case(s);
    }
  }
  std::sort(cases.begin(), cases.end(), [](const Case& a, const Case& b) { return a.seconds > b.seconds; });
  // Pairs of the slowest singles, the second pushed to its largest accepted value beside the first.
  const size_t singles = std::min<size_t>(cases.size(), 6);
  std::vector<Case> pairs;
  for (size_t i = 0; i < singles; ++i)
    for (size_t j = 0; j < singles; ++j) {
      if (i == j) continue;
      const std::string& last = cases[j].settings.back();
      const std::string field = last.substr(0, last.find('='));
      const IntRange range = field == "data.steps" ? IntRange{1, 1'000'000'000} : int_range(field);
      if (range.min == INT64_MIN) continue;  // a choice, not a number
      Settings s;
      ++tried;
      Config c;
      if (!largest_accepted(cases[i].settings, field, range, s) || !build(s, c)) continue;
      ++accepted;
      const double before = peak_rss_mib();
      pairs.push_back({last_of_each_key(s), time_once(c)});
      if (peak_rss_mib() > before) g_memory_worst = pairs.back(), g_memory_worst_mib = peak_rss_mib();
    }
  cases.insert(cases.end(), pairs.begin(), pairs.end());
  std::sort(cases.begin(), cases.end(), [](const Case& a, const Case& b) { return a.seconds > b.seconds; });
  std::printf("worst in-range case: %d configs timed of %d tried (each field at the largest value validation accepts, "
              "then pairs); the slowest, one run each:\n", accepted, tried);
  for (size_t i = 0; i < std::min<size_t>(cases.size(), 5); ++i)
    std::printf("  %8.3f s  %s\n", cases[i].seconds, command(cases[i].settings).c_str());
  std::printf("peak memory of the whole search (the process's max RSS): %.0f MiB, reached by\n  %s\n", g_memory_worst_mib,
              command(g_memory_worst.settings).c_str());
  CHECK(accepted > 0);
}
