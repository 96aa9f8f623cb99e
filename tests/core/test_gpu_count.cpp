// The number of GPUs as a field of its own (core/gpu_count.h): data parallel follows from GPUs / (tensor x pipeline
// x context parallel), a count they do not divide is an error on its own field with the other settings kept, and
// links, which carry data_parallel_size, mean what they meant.
#include <catch2/catch.hpp>

#include "core/catalog.h"
#include "core/gpu_count.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"

using namespace memsim;

namespace {

const FieldError* error_on(const std::vector<FieldError>& errors, const std::string& field) {
  for (const auto& e : errors)
    if (e.field == field) return &e;
  return nullptr;
}

}  // namespace

TEST_CASE("gpu count: data parallel follows from GPUs / (tensor x pipeline x context)", "[gpus]") {
  Config c;
  CHECK(gpu_count(c.parallel) == 8);  // the page's default: data parallel 8
  set_gpu_count(c.parallel, 1);
  CHECK(c.parallel.data_parallel_size == 1);
  CHECK_FALSE(c.parallel.gpus);
  c.parallel.tensor_parallel_size = 2;
  c.parallel.pipeline_parallel_size = 2;
  c.parallel.context_parallel_size = 2;
  c.parallel.zero_stage = 1;  // DeepSpeed's pipeline engine takes ZeRO-1 at most
  set_gpu_count(c.parallel, 32);
  CHECK(c.parallel.data_parallel_size == 4);
  CHECK(gpu_count(c.parallel) == 32);
  CHECK(replica_gpus(c.parallel) == 8);
  CHECK_FALSE(gpu_count_error(c.parallel));
  CHECK(validate(c).empty());
}

TEST_CASE("gpu count: a count the layout does not divide is an error on its field, the rest is kept", "[gpus]") {
  Config c;
  c.parallel.tensor_parallel_size = 4;
  set_gpu_count(c.parallel, 8);
  REQUIRE(c.parallel.data_parallel_size == 2);
  const Config before = c;
  set_gpu_count(c.parallel, 6);
  CHECK(c.parallel.gpus == 6);
  CHECK(gpu_count(c.parallel) == 6);
  CHECK(c.parallel.data_parallel_size == 2);  // kept until the count divides
  Config rest = c;
  rest.parallel.gpus.reset();
  CHECK(rest == before);  // nothing else changed
  const auto errors = validate(c);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].field == "parallel.gpus");
  CHECK(errors[0].message.find("multiple of 4 (4 or 8)") != std::string::npos);
  CHECK(errors[0].message.find('\n') == std::string::npos);  // one line
  const Result r = simulate(c);
  CHECK_FALSE(r.ok);
  REQUIRE(error_on(r.errors, "parallel.gpus"));
  // Below the replica's size, the only allowed counts are its multiples from it up.
  set_gpu_count(c.parallel, 3);
  REQUIRE(gpu_count_error(c.parallel));
  CHECK(gpu_count_error(c.parallel)->message.find("multiple of 4 (4)") != std::string::npos);
  set_gpu_count(c.parallel, 0);
  REQUIRE(gpu_count_error(c.parallel));
  CHECK(gpu_count_error(c.parallel)->message.find("from 1 to") != std::string::npos);
  set_gpu_count(c.parallel, 12);  // a count that divides clears it
  CHECK_FALSE(c.parallel.gpus);
  CHECK(c.parallel.data_parallel_size == 3);
  CHECK(validate(c).empty());
}

TEST_CASE("gpu count: changing tensor, pipeline or context parallel keeps the GPU count", "[gpus]") {
  Config c;  // 8 GPUs
  ParallelConfig before = c.parallel;
  c.parallel.tensor_parallel_size = 2;
  keep_gpu_count(before, c.parallel);
  CHECK(c.parallel.data_parallel_size == 4);
  CHECK(gpu_count(c.parallel) == 8);
  // 3 does not divide 8: the count waits, and the next step to 4 resolves it.
  before = c.parallel;
  c.parallel.tensor_parallel_size = 3;
  keep_gpu_count(before, c.parallel);
  CHECK(c.parallel.gpus == 8);
  CHECK(c.parallel.data_parallel_size == 4);
  REQUIRE(error_on(validate(c), "parallel.gpus"));
  before = c.parallel;
  c.parallel.tensor_parallel_size = 4;
  keep_gpu_count(before, c.parallel);
  CHECK_FALSE(c.parallel.gpus);
  CHECK(c.parallel.data_parallel_size == 2);
  // Data parallel set directly is a new GPU count, and drops a pending one.
  c.parallel.gpus = 5;
  before = c.parallel;
  c.parallel.data_parallel_size = 3;
  keep_gpu_count(before, c.parallel);
  CHECK_FALSE(c.parallel.gpus);
  CHECK(gpu_count(c.parallel) == 12);
  // Other edits leave the layout alone.
  before = c.parallel;
  c.parallel.zero_stage = 2;
  keep_gpu_count(before, c.parallel);
  CHECK(c.parallel.data_parallel_size == 3);
}

TEST_CASE("gpu count: nodes are the GPUs over the GPUs per node, rounded up", "[gpus]") {
  Config c;
  CHECK(node_count(c) == 1);  // 8 GPUs, 8 per node
  set_gpu_count(c.parallel, 1);
  CHECK(node_count(c) == 1);
  set_gpu_count(c.parallel, 20);
  CHECK(node_count(c) == 3);
  c.hardware.gpus_per_node = 4;
  CHECK(node_count(c) == 5);
}

TEST_CASE("gpu count: links and JSON carry the layout, so a setup on any count opens the same", "[gpus][links]") {
  Config c;
  c.model = find_model_preset("llama-3.1-70b")->model;
  set_gpu_count(c.parallel, 1);
  const Parsed link = config_from_fragment(config_to_fragment(c));
  REQUIRE(link.ok);
  CHECK(link.config == c);
  CHECK(gpu_count(link.config.parallel) == 1);
  const Parsed json = config_from_json(config_to_json(c));
  REQUIRE(json.ok);
  CHECK(json.config == c);
  // The default setup's link is unchanged by the GPU count: it is data_parallel_size, as before.
  CHECK(config_to_fragment(Config{}).find("data_parallel") == std::string::npos);
}
