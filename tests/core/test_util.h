#pragma once
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "core/config.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/step.h"
#include "core/validate.h"

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
inline std::string source_path(const std::string& rel) { return std::string(MEMSIM_SOURCE_DIR) + "/" + rel; }

// The first device's result of a config that must validate (the first field error is shown when it does not).
inline memsim::DeviceResult simulate_valid(const memsim::Config& c) {
  const auto errors = memsim::validate(c);
  INFO((errors.empty() ? std::string() : errors[0].field + ": " + errors[0].message));
  REQUIRE(errors.empty());
  memsim::Result r = memsim::simulate(c);
  REQUIRE(r.ok);
  return r.devices[0];
}

// Bytes requested by the live tensors of one component just before the first phase whose name starts with
// `prefix` (e.g. what a forward leaves saved for backward).
inline int64_t live_bytes_before_phase(const memsim::StepProgram& p, const std::string& prefix, memsim::Component c) {
  uint32_t end = 0;
  for (const auto& ph : p.phases)
    if (ph.name.rfind(prefix, 0) == 0) {
      end = ph.first_event;
      break;
    }
  int64_t live = 0;
  for (uint32_t i = 0; i < end; ++i)
    if (p.events[i].component == c)
      live += (p.events[i].op == memsim::Event::Op::Alloc ? 1 : -1) * p.tensors[p.events[i].tensor].bytes;
  return live;
}

// The most bytes of one component alive at once during the phase named `phase` (the whole program if none is).
inline int64_t peak_live_in_phase(const memsim::StepProgram& p, const std::string& phase, memsim::Component c) {
  uint32_t begin = 0, end = static_cast<uint32_t>(p.events.size());
  for (size_t i = 0; i < p.phases.size(); ++i)
    if (p.phases[i].name == phase) {
      begin = p.phases[i].first_event;
      if (i + 1 < p.phases.size()) end = p.phases[i + 1].first_event;
    }
  int64_t live = 0, peak = 0;
  for (uint32_t i = 0; i < end; ++i) {
    const memsim::Event& e = p.events[i];
    if (e.component != c) continue;
    live += (e.op == memsim::Event::Op::Alloc ? 1 : -1) * p.tensors[e.tensor].bytes;
    if (i >= begin) peak = std::max(peak, live);
  }
  return peak;
}

// One layer's saved set: the activations live at the start of backward with two layers minus with one.
inline int64_t per_layer_activations(memsim::Config c) {
  auto at_backward = [&](int64_t layers) {
    c.model.num_hidden_layers = layers;
    memsim::Result r = memsim::simulate(c);
    REQUIRE(r.ok);
    return live_bytes_before_phase(r.devices[0].program, "backward", memsim::Component::Activations);
  };
  const int64_t one = at_backward(1);
  return at_backward(2) - one;
}

// A model from tests/data/hf/<file> on one GPU with the HF Trainer, pure bf16, SDPA and no checkpointing: the
// common starting point of the activation and fine-tuning tests, which then change what they measure.
inline memsim::Config single_gpu_config(const std::string& file, int64_t micro_batch = 4, int64_t sequence = 4096) {
  memsim::Parsed p = memsim::model_from_hf_json(read_file(source_path("tests/data/hf/" + file)));
  REQUIRE(p.ok);
  memsim::Config c = p.config;
  c.training.micro_batch_size = micro_batch;
  c.training.sequence_length = sequence;
  c.training.framework = "hf_trainer";
  c.training.precision = "bf16_pure";
  c.training.activation_checkpointing = "none";
  c.training.attention = "sdpa";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

// Bytes of the live tensors whose label starts with `label`, just before the first phase named `phase...`; or, with
// `most`, the most that were ever live at once before it.
inline int64_t live(const memsim::StepProgram& p, const std::string& phase, const std::string& label, bool most = false) {
  uint32_t end = static_cast<uint32_t>(p.events.size());
  for (const auto& ph : p.phases)
    if (ph.name.rfind(phase, 0) == 0) {
      end = ph.first_event;
      break;
    }
  int64_t now = 0, top = 0;
  for (uint32_t i = 0; i < end; ++i) {
    const memsim::Tensor& t = p.tensors[p.events[i].tensor];
    if (p.labels[t.label].rfind(label, 0) != 0) continue;
    now += (p.events[i].op == memsim::Event::Op::Alloc ? 1 : -1) * t.bytes;
    top = std::max(top, now);
  }
  return most ? top : now;
}

inline bool has_label(const memsim::StepProgram& p, const std::string& prefix) {
  for (const auto& l : p.labels)
    if (l.rfind(prefix, 0) == 0) return true;
  return false;
}
