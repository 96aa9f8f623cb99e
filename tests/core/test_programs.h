// Helpers of the model-program tests (test_architecture.cpp, test_cnn_programs.cpp).
#pragma once
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/architecture.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_util.h"

// Every validation error of a config, one "field: message" line each (empty where it validates).
inline std::string errors_of(const memsim::Config& c) {
  std::string e;
  for (const auto& x : memsim::validate(c)) e += x.field + ": " + x.message + "\n";
  return e;
}

// The first error decoding a program (a built-in's name or JSON text) with its arguments; empty where it holds.
inline std::string first_error(const std::string& program, const std::string& args = "") {
  std::shared_ptr<const memsim::Architecture> a;
  const auto errors = memsim::decode_architecture(program, args, a);
  return errors.empty() ? std::string() : errors.front().message;
}

// A language-model program (a hybrid's, an MoE's) on one H100 under the HF Trainer: pure bf16, AdamW, no
// checkpointing, micro-batches of 2.
inline memsim::Config language_program_config(const std::string& architecture, const std::string& args) {
  memsim::Config c;
  c.model.architecture = architecture;
  c.model.architecture_args = args;
  c.training.framework = "hf_trainer";
  c.training.precision = "bf16_pure";
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = "none";
  c.training.micro_batch_size = 2;
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  c.hardware.gpu = "h100-sxm";
  return c;
}

// A built-in program's JSON with one edit applied.
template <typename F>
std::string program_edited(const char* name, F&& edit) {
  auto j = nlohmann::ordered_json::parse(memsim::builtin_architecture(name));
  edit(j);
  return j.dump();
}

// Activation bytes alive when the first backward starts: what the forward saved (per-block differences of it are the
// closed forms the tests check).
inline int64_t activations_before_backward(const memsim::Config& c) {
  const memsim::Result r = memsim::simulate(c);
  REQUIRE(r.ok);
  return live_bytes_before_phase(r.devices[0].program, "backward", memsim::Component::Activations);
}

// Each tensor allocated once and freed at most once, after its allocation; what is left at the end is weights,
// gradients the optimizer keeps, optimizer states and workspaces, never an activation or a temporary.
inline std::string ledger_problem(const memsim::StepProgram& p) {
  std::vector<int> state(p.tensors.size(), 0);  // 0 never, 1 live, 2 freed
  for (const auto& e : p.events) {
    int& s = state[e.tensor];
    if (e.op == memsim::Event::Op::Alloc) {
      if (s != 0) return "tensor " + std::to_string(e.tensor) + " (" + p.labels[p.tensors[e.tensor].label] + ") allocated twice";
      s = 1;
    } else {
      if (s != 1) return "tensor " + std::to_string(e.tensor) + " (" + p.labels[p.tensors[e.tensor].label] + ") freed while not live";
      s = 2;
    }
  }
  for (size_t t = 0; t < p.tensors.size(); ++t)
    if (state[t] == 1 && (p.tensors[t].component == memsim::Component::Activations || p.tensors[t].component == memsim::Component::Temporaries))
      return "tensor " + std::to_string(t) + " (" + p.labels[p.tensors[t].label] + ") is still live at the end";
  return "";
}
