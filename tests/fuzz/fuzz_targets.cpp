// libFuzzer targets for every decoder of outside input (built by scripts/fuzz.sh with clang,
// -fsanitize=fuzzer,address,undefined). One binary per target, chosen by MEMSIM_FUZZ_TARGET at compile time.
// Each input must decode or fail with a message, never crash; whatever decodes must round-trip exactly and
// simulate without an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/architecture.h"
#include "core/data_shape.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"

using namespace memsim;

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // a broken invariant is a finding, like a crash
}

// Decoded configs are simulated only while small enough to keep each input fast; the size limits of the
// validator already bound the rest (tests/core cover extremes).
void exercise(const Parsed& p) {
  if (!p.ok) {
    check(!p.errors.empty() && !p.errors[0].message.empty());
    return;
  }
  Parsed again = config_from_json(config_to_json(p.config));
  check(again.ok && again.config == p.config);
  Parsed frag = config_from_fragment(config_to_fragment(p.config));
  check(frag.ok && frag.config == p.config);
  Parsed full = config_from_fragment(config_to_full_fragment(p.config));
  check(full.ok && full.config == p.config);
  const auto& m = p.config.model;
  if (m.num_hidden_layers <= 64 && p.config.training.gradient_accumulation_steps <= 4) {
    Result r = simulate(p.config);
    if (r.ok)
      for (const auto& d : r.devices) check(d.breakdown.total() == d.peak.device_bytes && d.peak.allocated_bytes >= 0);
    else
      check(!r.errors.empty());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
#if defined(MEMSIM_FUZZ_FRAGMENT)
  exercise(config_from_fragment(text));
#elif defined(MEMSIM_FUZZ_CONFIG_JSON)
  exercise(config_from_json(text));
#elif defined(MEMSIM_FUZZ_HF_CONFIG)
  exercise(model_from_hf_json(text));
#elif defined(MEMSIM_FUZZ_DEEPSPEED)
  exercise(config_from_deepspeed_json(text, Config{}));
#elif defined(MEMSIM_FUZZ_ACCELERATE)
  // An Accelerate config (YAML subset or JSON): decodes or fails with a message that keeps the base untouched.
  Config base;
  Parsed p = config_from_accelerate(text, base);
  if (!p.ok) check(p.config == base);
  exercise(p);
  if (p.ok) {  // the same text decodes the same way onto the same base
    Parsed again = config_from_accelerate(text, base);
    check(again.ok && again.config == p.config && again.notes == p.notes);
  }
  (void)looks_like_accelerate_config(text);
#elif defined(MEMSIM_FUZZ_SET)
  Config c;
  auto errors = apply_setting(c, text);
  check(errors.empty() || !errors[0].message.empty());
  if (errors.empty()) exercise(Parsed{true, c, {}, {}});
#elif defined(MEMSIM_FUZZ_LENGTHS_FILE)
  // A dropped file of sample lengths: read, or refused with a message naming data.sample_lengths. What is read is a
  // distribution the config's own parser takes, from the file's shortest to its longest sample, and it survives a
  // link. (Not simulated: a run of the default setup is far too slow for a fuzzer's input under the sanitizers.)
  (void)looks_like_sample_lengths_file(text);
  SampleLengthsFile f;
  FieldError e;
  if (sample_lengths_from_file(text, f, e)) {
    check(f.samples >= 1 && f.shortest <= f.median && f.median <= f.longest && f.longest >= 1);
    LengthDistribution d;
    check(parse_sample_lengths(f.sample_lengths, f.longest, d).empty());
    check(d.quantile(0) == static_cast<double>(f.shortest) && d.longest() == static_cast<double>(f.longest));
    Config c;
    c.data.lengths = "samples";
    c.data.sample_lengths = f.sample_lengths;
    c.data.dataset_samples = f.samples;
    Parsed frag = config_from_fragment(config_to_fragment(c));
    check(frag.ok && frag.config == c);
  } else {
    check(e.field == "data.sample_lengths" && e.message.rfind("data.sample_lengths: ", 0) == 0);
  }
#elif defined(MEMSIM_FUZZ_ARCHITECTURE)
  // A model program (--architecture FILE, model.architecture): decodes, or fails with errors that name
  // model.architecture or model.architecture_args. What decodes has a parameter count, survives a link, and (when
  // small, to keep each input fast under the sanitizers) validates and simulates on one GPU.
  std::shared_ptr<const Architecture> a;
  const auto errors = decode_architecture(text, "", a);
  if (!errors.empty()) {
    check(!a);
    for (const auto& e : errors) check(e.field == "model.architecture" && e.message.rfind("model.architecture", 0) == 0);
  } else {
    check(a && a->repeat >= 1 && a->tokens >= 1);
    const ModelShape s = build_program_shape(a);
    check(s.params_total >= 0 && s.num_layers == a->repeat);
    Config c;
    c.model.architecture = text;
    c.training.framework = "hf_trainer";
    c.training.micro_batch_size = 1;
    c.parallel.zero_stage = 0;
    c.parallel.data_parallel_size = 1;
    Parsed frag = config_from_fragment(config_to_fragment(c));
    check(frag.ok && frag.config == c);
    int64_t elements = 0;
    for (const ArchStage* st : a->stages())
      for (const auto& t : st->tensors) elements += t.numel() > (int64_t{1} << 20) ? (int64_t{1} << 40) : t.numel();
    if (a->repeat <= 4 && elements <= (int64_t{1} << 20) && s.params_total <= (int64_t{1} << 24) && validate(c).empty()) {
      Result r = simulate(c);
      check(r.ok);
      for (const auto& d : r.devices) check(d.breakdown.total() == d.peak.device_bytes && d.peak.allocated_bytes > 0);
    }
  }
#else
#error "define one MEMSIM_FUZZ_* target"
#endif
  return 0;
}
