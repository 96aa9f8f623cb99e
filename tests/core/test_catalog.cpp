// Every model preset of the catalogue loads and counts exactly what its publisher states (or, where the
// published scope differs, what the preset says memsim must count and why).
#include <catch2/catch.hpp>

#include "core/catalog.h"
#include "core/model.h"
#include "core/simulate.h"

using namespace memsim;

TEST_CASE("the catalogue has the models people use", "[catalog]") {
  const auto& presets = model_presets();
  CHECK(presets.size() >= 40);
  for (const char* id : {"gpt2", "llama-2-7b", "llama-3.1-405b", "llama-3.2-1b", "mistral-7b-v0.1", "mixtral-8x22b",
                         "qwen2.5-72b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gemma-2-27b", "phi-4", "deepseek-v3",
                         "olmo-2-13b", "falcon-7b", "bert-large-uncased"}) {
    INFO(id);
    CHECK(find_model_preset(id) != nullptr);
  }
}

TEST_CASE("every supported preset counts its published total", "[catalog]") {
  int checked = 0;
  for (const auto& p : model_presets()) {
    INFO(p.id << ": " << p.unsupported_reason);
    if (!p.supported) {
      CHECK(!p.unsupported_reason.empty());  // the interface shows why the preset cannot be picked
      continue;
    }
    const ModelShape s = build_model_shape(p.model);
    if (p.params_expected > 0) {
      INFO("published " << p.params_published << " (" << p.params_source << "); " << p.params_expected_why);
      CHECK(s.params_total == p.params_expected);
      ++checked;
    }
    Config c;
    c.model = p.model;
    c.training.sequence_length = 512;
    c.training.micro_batch_size = 1;
    Result r = simulate(c);
    CHECK(r.ok);
  }
  CHECK(checked >= 35);
}
