// The simulation of several distinct devices runs on threads natively (simulate.cpp for_each_index: one pipeline
// stage per worker). scripts/sanitize.sh builds this file with the core under ThreadSanitizer: each layout below simulates its devices concurrently, and the result must equal a second run
// byte for byte (the threads share the catalogue, the tables and the config, and write only their own device).
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/serialize.h"
#include "core/simulate.h"

using namespace memsim;

namespace {

Config layout(const std::vector<std::string>& settings) {
  Config c;  // the defaults: a Llama-2-13B shape, bf16, ZeRO-3 on 8 GPUs
  for (const auto& s : settings) REQUIRE(apply_setting(c, s).empty());
  return c;
}

std::string fingerprint(const Result& r) {
  std::string s;
  for (const auto& d : r.devices)
    s += d.role + ":" + std::to_string(d.peak.allocated_bytes) + "/" + std::to_string(d.peak.reserved_bytes) + "/" +
         std::to_string(d.peak.device_bytes) + "/" + std::to_string(d.program.events.size()) + ";";
  return s;
}

}  // namespace

TEST_CASE("layouts of several distinct devices simulate on threads, deterministically", "[threads]") {
  const std::vector<std::vector<std::string>> layouts = {
      {"training.framework=megatron", "parallel.sharding=megatron", "parallel.zero_stage=1",
       "parallel.pipeline_parallel_size=4", "parallel.data_parallel_size=2"},
      {"training.framework=megatron", "parallel.sharding=megatron", "parallel.zero_stage=0",
       "parallel.pipeline_parallel_size=8", "parallel.pipeline_schedule=interleaved_1f1b",
       "parallel.tensor_parallel_size=2", "parallel.data_parallel_size=1"},
      {"training.framework=torchtitan", "parallel.zero_stage=3", "parallel.pipeline_parallel_size=2",
       "parallel.data_parallel_size=4"},
      {"parallel.pipeline_parallel_size=4", "parallel.zero_stage=1", "parallel.data_parallel_size=2",
       "parallel.pipeline_first_stage_layers=7", "parallel.pipeline_last_stage_layers=13"},
  };
  for (const auto& settings : layouts) {
    const Config c = layout(settings);
    INFO(config_to_fragment(c));
    const Result first = simulate(c);
    REQUIRE(first.ok);
    CHECK(first.devices.size() > 1);
    const Result second = simulate(c);
    REQUIRE(second.ok);
    CHECK(fingerprint(first) == fingerprint(second));
  }
}
