// A dropped or pasted file of per-sample token lengths, read into data.sample_lengths and data.dataset_samples
// (data_shape.h sample_lengths_from_file); and the bound that keeps many variants of a run affordable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/data_shape.h"
#include "core/serialize.h"
#include "core/validate.h"
#include "test_util.h"

using namespace memsim;

namespace {

SampleLengthsFile read_ok(const std::string& text) {
  SampleLengthsFile f;
  FieldError e;
  INFO("file: " << text.substr(0, 60));
  const bool ok = sample_lengths_from_file(text, f, e);
  INFO("error: " << e.message);
  REQUIRE(ok);
  return f;
}

// The exact percentile of sorted lengths, as numpy.percentile computes it ("linear").
double exact_percentile(const std::vector<int64_t>& sorted, double p) {
  const double h = static_cast<double>(sorted.size() - 1) * p / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h)), hi = std::min(sorted.size() - 1, lo + 1);
  return static_cast<double>(sorted[lo]) + (h - static_cast<double>(lo)) * static_cast<double>(sorted[hi] - sorted[lo]);
}

}  // namespace

TEST_CASE("lengths file: one number per line or a JSON array, recognised apart from configs", "[run][lengths_file]") {
  SampleLengthsFile f = read_ok("12\n300\r\n\n  2048 \n");
  CHECK(f.samples == 3);
  CHECK(f.shortest == 12);
  CHECK(f.median == 300);
  CHECK(f.longest == 2048);
  CHECK(f.sample_lengths.rfind("p0=12,", 0) == 0);
  CHECK(f.sample_lengths.size() >= 9);
  CHECK(f.sample_lengths.substr(f.sample_lengths.size() - 10) == ",p100=2048");

  f = read_ok("[5, 10,\n 15 ,20]\n");
  CHECK(f.samples == 4);
  CHECK((f.shortest == 5 && f.longest == 20));
  // Evenly spaced lengths lie on one line: the two ends say it all.
  CHECK(f.sample_lengths == "p0=5,p100=20");
  CHECK(read_ok("\xEF\xBB\xBF[512, 512, 512]").sample_lengths == "p0=512,p100=512");
  CHECK(read_ok("7").samples == 1);
  CHECK(read_ok("1e3\n2000.0\n").longest == 2000);  // whole numbers written as floats are lengths too

  CHECK(looks_like_sample_lengths_file("[1, 2]"));
  CHECK(looks_like_sample_lengths_file("\n  12\n13\n"));
  CHECK(looks_like_sample_lengths_file("-4\n"));  // read as a lengths file, so its error names the bad line
  CHECK_FALSE(looks_like_sample_lengths_file("{\"hidden_size\": 4096}"));
  CHECK_FALSE(looks_like_sample_lengths_file("distributed_type: FSDP\nnum_processes: 8\n"));
  CHECK_FALSE(looks_like_sample_lengths_file("# accelerate\ndistributed_type: NO\n"));
  CHECK_FALSE(looks_like_sample_lengths_file("   "));
}

TEST_CASE("lengths file: the percentiles follow the data, ends exact, and the string stays short", "[run][lengths_file]") {
  // 200,000 lengths with a long tail, as chat data has: lognormal around 300 tokens, a few very long.
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(std::log(300.0), 0.8);
  std::vector<int64_t> lengths;
  std::string text;
  for (int i = 0; i < 200000; ++i) {
    // A few samples far out (whole books), past the range counted per length: kept one by one.
    lengths.push_back(i % 40000 == 7 ? 70000 + i : std::min<int64_t>(200000, 1 + static_cast<int64_t>(dist(rng))));
    text += std::to_string(lengths.back()) + "\n";
  }
  const SampleLengthsFile f = read_ok(text);
  std::sort(lengths.begin(), lengths.end());
  CHECK(f.samples == 200000);
  CHECK(f.shortest == lengths.front());
  CHECK(f.longest == lengths.back());
  CHECK(f.longest > 1 << 16);
  INFO(f.sample_lengths);
  CHECK(f.sample_lengths.size() < 2048);
  Config c = single_gpu_config("llama-3.2-1b.json", 4, 1 << 18);
  c.model.max_position_embeddings = 1 << 18;
  c.data.lengths = "samples";
  c.data.sample_lengths = f.sample_lengths;
  c.data.dataset_samples = f.samples;
  CHECK(validate(c).empty());
  LengthDistribution d;
  REQUIRE(parse_sample_lengths(f.sample_lengths, c.training.sequence_length, d).empty());
  CHECK(d.quantile(0) == lengths.front());
  CHECK(d.longest() == lengths.back());
  for (double p : {1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995}) {
    INFO("p" << p);
    CHECK(std::abs(d.quantile(p / 100) - exact_percentile(lengths, p)) <= 0.5);
  }
  // Between the listed percentiles the line stays within a token or 2% of the data.
  for (double p : {12.5, 37.5, 62.5, 87.5, 97.3, 99.25, 99.75, 99.925, 99.975}) {
    INFO("p" << p);
    const double exact = exact_percentile(lengths, p);
    CHECK(std::abs(d.quantile(p / 100) - exact) <= std::max(1.0, 0.02 * exact));
  }
  // It survives the link: the fragment carries it unchanged.
  Parsed back = config_from_fragment(config_to_fragment(c));
  REQUIRE(back.ok);
  CHECK(back.config.data.sample_lengths == f.sample_lengths);
}

TEST_CASE("lengths file: what is not a list of lengths is refused, naming the field and the line", "[run][lengths_file]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "no lengths"},
      {" \n\n ", "no lengths"},
      {"[]", "no lengths"},
      {"12\n-4\n", "line 2"},
      {"12\n300\nNaN\n", "line 3"},
      {"12\ninf\n", "line 2"},
      {"12\n1.5\n", "whole number"},
      {"12 13\n", "line 1"},
      {"[1, 2", "not closed"},
      {"[1, 2] 3", "after the JSON array"},
      {"[1,,2]", "entry 2"},
      {"[1, \"2\"]", "entry 2"},
      {"[1, [2]]", "entry 2"},
      {"[1, null]", "entry 2"},
      {"5\n1e10\n", "above"},
      {"0\n0\n", "0 tokens"},
      {"12\nhello\n", "line 2"},
      {std::string("12\n\0\n", 5), "line 2"},
  };
  for (const auto& [text, says] : bad) {
    SampleLengthsFile f;
    FieldError e;
    INFO("file \"" << text << "\": " << e.message);
    CHECK_FALSE(sample_lengths_from_file(text, f, e));
    CHECK(e.field == "data.sample_lengths");
    CHECK(e.message.rfind("data.sample_lengths: ", 0) == 0);
    CHECK(e.message.find(says) != std::string::npos);
    CHECK(e.message.find('\n') == std::string::npos);  // one line
  }
}

TEST_CASE("lengths file: more than the most read stops early with a message", "[run][lengths_file]") {
  std::string text;
  text.reserve(static_cast<size_t>(2 * (kMaxLengthsFileSamples + 1)));
  for (int64_t i = 0; i <= kMaxLengthsFileSamples; ++i) text += "7\n";
  SampleLengthsFile f;
  FieldError e;
  CHECK_FALSE(sample_lengths_from_file(text, f, e));
  CHECK(e.message.find(std::to_string(kMaxLengthsFileSamples)) != std::string::npos);
}

TEST_CASE("a run's steps, and the fewer steps that bound a variant's replay", "[run]") {
  Config c = single_gpu_config("llama-3.2-1b.json", 4, 2048);
  CHECK(planned_run_steps(c) == 0);  // a fixed shape
  CHECK(run_steps_within(c, 10) == 0);
  c.data.lengths = "samples";
  c.data.sample_lengths = "p0=20,p50=300,p100=1500";
  CHECK(planned_run_steps(c) == kAutoRunSteps);
  // A layer pass per layer, the embedding and the head, in every order of the data (kRunShuffles replays).
  const int64_t passes_per_step = (c.model.num_hidden_layers + 2) * kRunShuffles;
  CHECK(run_steps_within(c, kAutoRunSteps * passes_per_step) == 0);  // the whole run is within the bound
  CHECK(run_steps_within(c, 100 * passes_per_step + 5) == 100);
  c.training.gradient_accumulation_steps = 4;
  CHECK(run_steps_within(c, 100 * passes_per_step) == 25);
  c.data.steps = 10;
  CHECK(planned_run_steps(c) == 10);
  CHECK(run_steps_within(c, 100 * passes_per_step) == 0);
  c.data.sample_lengths = "p50=abc";  // does not validate
  CHECK(planned_run_steps(c) == 0);
  CHECK(run_steps_within(c, 1) == 0);
}
