// The uncertainty band (core/band.h): the residual table, nearness, the band around each prediction, the verdict
// that uses it, and the unstated data shape's run. Its leave-one-out coverage over the published cases is held in
// test_validation.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/advice.h"
#include "core/band.h"
#include "core/validation.h"
#include "random_config.h"
#include "test_util.h"

using namespace memsim;

namespace {

ResidualRow row(std::string id, BandStatistic s, double error, const BandFeatures& f, bool excluded = false) {
  return {std::move(id), s, "high", excluded, error, f};
}

// A table of `n` cases that share `f` and measured `s`, with these errors in turn.
std::vector<ResidualRow> table_of(const BandFeatures& f, BandStatistic s, const std::vector<double>& errors) {
  std::vector<ResidualRow> t;
  for (size_t i = 0; i < errors.size(); ++i) t.push_back(row("case-" + std::to_string(i), s, errors[i], f));
  return t;
}

Config hf_qlora() {
  Config c = single_gpu_config("llama-3.2-1b.json", 4, 1024);
  c.peft.method = "lora";
  c.peft.base_quantization = "nf4";
  return c;
}

}  // namespace

TEST_CASE("the noise floor is the two machines' ratio of torchtune PR #961", "[band]") {
  const double ratio = std::sqrt(22.3 / 20.2);
  CHECK(kNoiseFloorRatio >= ratio);
  CHECK(kNoiseFloorRatio - ratio < 1e-5);
}

TEST_CASE("the embedded residual table parses, and text and rows round-trip", "[band]") {
  std::string error;
  const auto rows = parse_residual_table(residual_table_file(), &error);
  CHECK(error.empty());
  REQUIRE(rows.size() >= 80);
  CHECK(rows.size() == residual_table().size());
  std::string again;
  const auto round = parse_residual_table(residual_table_text(rows), &again);
  CHECK(again.empty());
  REQUIRE(round.size() == rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(round[i].id == rows[i].id);
    CHECK(round[i].relative_error == Approx(rows[i].relative_error).margin(1e-6));
    CHECK(round[i].features.sharding == rows[i].features.sharding);
  }
}

TEST_CASE("a malformed residual table is an error naming the line, never a crash", "[band]") {
  const std::string header =
      "id\tstatistic\tconfidence\texcluded\trelative_error\tframework\tpeft\tquantization\tgpus\tsharding\tdata\tprecision\n";
  const std::string good = "a\treserved\thigh\tno\t0.05\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n";
  for (const std::string& bad : std::vector<std::string>{"a\treserved\thigh\tno\tnan\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n",
                                "a\treserved\thigh\tno\t-1\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n",
                                "a\treserved\thigh\tno\t0.1x\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n",
                                "a\tpeak\thigh\tno\t0.1\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n",
                                "a\treserved\thigh\tmaybe\t0.1\thf_trainer\tlora\tnf4\tsingle\tnone\tfixed\tbf16_pure\n",
                                "a\treserved\thigh\n", std::string("\0\t\t\n", 4)}) {
    std::string error;
    const auto rows = parse_residual_table(header + good + bad, &error);
    INFO(bad);
    CHECK(rows.size() == 1);  // the good row before it is kept, the bad one is not
    CHECK(error.rfind("residual table line 3", 0) == 0);
  }
  std::string error;
  CHECK(parse_residual_table("not a table\n", &error).empty());
  CHECK(!error.empty());
  CHECK(parse_residual_table("", &error).empty());
  // No table, no band claimed; the verdict falls back to the prediction's.
  Result r = simulate(Config{});
  REQUIRE(r.ok);
  apply_bands(r, Config{}, {});
  CHECK(!r.devices[0].band.valid);
  CHECK(r.devices[0].verdict == (r.devices[0].fits ? Verdict::Fits : Verdict::DoesNotFit));
}

TEST_CASE("nearness: the statistic's kind first, then framework, PEFT, quantization, layout", "[band]") {
  const BandFeatures f{"hf_trainer", "lora", "nf4", "single", "none", "fixed", "bf16_pure"};
  BandFeatures other_fw = f;
  other_fw.framework = "litgpt";
  // An allocated case with every feature the same is farther from a reserved prediction than a reserved case with
  // none of them.
  const BandFeatures nothing{"torchtitan", "none", "none", "multi", "fsdp2", "varying", "fp8_torchao"};
  CHECK(band_points(f, BandStatistic::Reserved, row("r", BandStatistic::Reserved, 0, nothing)) >
        band_points(f, BandStatistic::Reserved, row("a", BandStatistic::Allocated, 0, f)));
  // device is reserved's kind, active allocated's.
  CHECK(band_points(f, BandStatistic::Device, row("r", BandStatistic::Reserved, 0, nothing)) >
        band_points(f, BandStatistic::Device, row("a", BandStatistic::Active, 0, f)));
  CHECK(band_points(f, BandStatistic::Reserved, row("same", BandStatistic::Reserved, 0, f)) >
        band_points(f, BandStatistic::Reserved, row("fw", BandStatistic::Reserved, 0, other_fw)));
  // The nearest list keeps every case tied with the 9th, nearest first.
  std::vector<ResidualRow> t = table_of(f, BandStatistic::Reserved, std::vector<double>(12, 0.01));
  t.push_back(row("far", BandStatistic::Reserved, 0.5, other_fw));
  const auto near = nearest_cases(f, BandStatistic::Reserved, t);
  CHECK(near.size() == 12);
  for (const auto& n : near) CHECK(n.id != "far");
  // Leave-one-out leaves the case out.
  for (const auto& n : nearest_cases(f, BandStatistic::Reserved, t, "case-3")) CHECK(n.id != "case-3");
}

TEST_CASE("the band contains the prediction and is never narrower than the noise floor", "[band]") {
  std::mt19937_64 rng(20261201);
  int checked = 0;
  for (int i = 0; i < 60; ++i) {
    const Config c = memsim_test::random_config(rng);
    const Result r = simulate(c);
    if (!r.ok) continue;
    for (const auto& d : r.devices) {
      REQUIRE(d.band.valid);
      const std::pair<BandStatistic, int64_t> stats[] = {{BandStatistic::Allocated, d.peak.allocated_bytes},
                                                         {BandStatistic::Reserved, d.peak.reserved_bytes},
                                                         {BandStatistic::Active, d.peak.active_bytes},
                                                         {BandStatistic::Device, d.peak.device_bytes}};
      for (const auto& [s, p] : stats) {
        const StatisticBand& b = d.band.of(s);
        INFO(band_statistic_id(s) << " " << p << " in [" << b.low_bytes << ", " << b.high_bytes << "]");
        CHECK(b.low_bytes <= p);
        CHECK(p <= b.high_bytes);
        CHECK(static_cast<double>(b.high_bytes) >= static_cast<double>(p) * kNoiseFloorRatio - 1);
        CHECK(static_cast<double>(b.low_bytes) <= static_cast<double>(p) / kNoiseFloorRatio + 1);
        CHECK(b.neighbours.size() >= static_cast<size_t>(kBandNeighbours));
      }
      ++checked;
    }
  }
  CHECK(checked > 20);
}

TEST_CASE("the band is wider where the nearest cases disagree", "[band]") {
  Result r = simulate(Config{});
  REQUIRE(r.ok);
  const DeviceResult& d = r.devices[0];
  const BandFeatures f = band_features(Config{});
  const auto agree = table_of(f, BandStatistic::Reserved, {0.01, -0.01, 0.0, 0.02, -0.02, 0.01, 0.0, -0.01, 0.01});
  const auto disagree = table_of(f, BandStatistic::Reserved, {0.2, -0.25, 0.0, 0.02, -0.02, 0.01, 0.0, -0.01, 0.15});
  const Band a = device_band(f, d, agree);
  const Band b = device_band(f, d, disagree);
  REQUIRE(a.valid);
  REQUIRE(b.valid);
  for (auto s : {BandStatistic::Allocated, BandStatistic::Reserved, BandStatistic::Active, BandStatistic::Device}) {
    CHECK(b.of(s).high_bytes > a.of(s).high_bytes);
    CHECK(b.of(s).low_bytes < a.of(s).low_bytes);
  }
  // Errors within the floor give the floor: measured = predicted / (1 + e).
  const int64_t p = d.peak.reserved_bytes;
  CHECK(a.of(BandStatistic::Reserved).high_bytes == Approx(static_cast<double>(p) * kNoiseFloorRatio).epsilon(1e-9));
  // The widest errors set the edges: -25% under means a measurement up to p / 0.75.
  CHECK(b.of(BandStatistic::Reserved).high_bytes == Approx(static_cast<double>(p) / 0.75).epsilon(1e-9));
  CHECK(b.of(BandStatistic::Reserved).low_bytes == Approx(static_cast<double>(p) / 1.2).epsilon(1e-9));
  // allocated borrows from the reserved cases here: every neighbour counts as borrowed.
  CHECK(b.of(BandStatistic::Allocated).borrowed == 9);
  CHECK(b.of(BandStatistic::Reserved).borrowed == 0);
}

TEST_CASE("the verdict at the band's edges", "[band]") {
  DeviceResult d;
  d.usable_bytes = 1000;
  d.capacity_bytes = 1100;
  d.peak.device_bytes = 900;
  d.band.valid = true;
  auto& dev = d.band.of(BandStatistic::Device);
  dev.low_bytes = 850;
  dev.high_bytes = 1000;  // the top exactly on the usable line: fits
  CHECK(device_verdict(d) == Verdict::Fits);
  dev.high_bytes = 1001;  // the line inside the band
  CHECK(device_verdict(d) == Verdict::Borderline);
  dev.low_bytes = 1000;  // the bottom exactly on the line: still inside
  CHECK(device_verdict(d) == Verdict::Borderline);
  dev.low_bytes = 1001;  // the whole band above it
  CHECK(device_verdict(d) == Verdict::DoesNotFit);
  d.oom = true;
  CHECK(device_verdict(d) == Verdict::OutOfMemory);
  CHECK(std::string(verdict_id(Verdict::DoesNotFit)) == "does_not_fit");
  // The headroom the band asks for: the GPU's share between the prediction and the band's top.
  d.oom = false;
  dev.high_bytes = 1010;
  CHECK(keep_free_fraction(d) == Approx(110.0 / 1100));
}

TEST_CASE("the verdict of a real setup follows its band, and fits agrees with it", "[band]") {
  Config c;
  Result r = simulate(c);
  REQUIRE(r.ok);
  const DeviceResult& d = r.devices[0];
  // Usable memory set between the prediction and the band's top: the prediction fits, the verdict is borderline.
  const auto& dev = d.band.of(BandStatistic::Device);
  REQUIRE(dev.high_bytes > d.peak.device_bytes);
  c.hardware.gpu = "custom";
  c.hardware.headroom_fraction = 0;
  c.hardware.gpu_memory_bytes = (d.peak.device_bytes + dev.high_bytes) / 2;
  Result mid = simulate(c);
  REQUIRE(mid.ok);
  CHECK(mid.devices[0].fits);
  CHECK(mid.devices[0].verdict == Verdict::Borderline);
  c.hardware.gpu_memory_bytes = dev.high_bytes + (int64_t{1} << 30);
  Result roomy = simulate(c);
  REQUIRE(roomy.ok);
  CHECK(roomy.devices[0].verdict == Verdict::Fits);
}

TEST_CASE("What helps calls a change fit only when its verdict fits", "[band][advice]") {
  Config c;
  c.training.micro_batch_size = 8;
  // A GPU whose memory lies between the lowest suggestion's peak and its band's top: that change fits by its
  // prediction alone, and is borderline with the band.
  const auto roomy = suggest(c);
  REQUIRE(!roomy.empty());
  const Suggestion& lowest = *std::min_element(roomy.begin(), roomy.end(), [](const auto& a, const auto& b) {
    return a.peak_bytes < b.peak_bytes;
  });
  const Result at_80 = simulate(lowest.config);
  REQUIRE(at_80.ok);
  c.hardware.gpu = "custom";
  c.hardware.headroom_fraction = 0;
  c.hardware.gpu_memory_bytes = (lowest.peak_bytes + at_80.devices[0].band.of(BandStatistic::Device).high_bytes) / 2;
  const auto suggestions = suggest(c);
  bool seen = false;
  for (const auto& s : suggestions)
    if (s.change == lowest.change) {
      seen = true;
      CHECK(s.peak_bytes <= c.hardware.gpu_memory_bytes);
      CHECK(s.verdict == Verdict::Borderline);
      CHECK(!s.fits);
    }
  CHECK(seen);
  for (const auto& s : suggestions) {
    const Result r = simulate(s.config);
    REQUIRE(r.ok);
    Verdict worst = Verdict::Fits;
    for (const auto& d : r.devices) worst = std::max(worst, d.verdict);
    INFO(s.change);
    CHECK(s.verdict == worst);
    CHECK(s.fits == (worst == Verdict::Fits));
  }
}

TEST_CASE("an unstated data shape widens the reserved top by a short run of varying lengths", "[band][run]") {
  const Config c = hf_qlora();
  REQUIRE(data_shape_unstated(c));
  const Result r = simulate(c);
  REQUIRE(r.ok);
  const DeviceResult& d = r.devices[0];
  REQUIRE(d.band.data_run_reserved_bytes > 0);
  CHECK(d.band.of(BandStatistic::Reserved).high_bytes >= d.band.data_run_reserved_bytes);
  CHECK(d.band.of(BandStatistic::Device).high_bytes >= d.band.data_run_device_bytes);
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.rfind("band: the data's lengths are not stated", 0) == 0;
  CHECK(noted);
  // The run is the config as a run of varying lengths in one order of its data, and its reserved peak is that
  // run's own.
  const Config run = unstated_data_run(c);
  CHECK(run.data.lengths == "samples");
  CHECK(run.data.steps * c.training.gradient_accumulation_steps >= kUnsetDataMicroBatches);
  const Result rr = simulate(run, 1);
  REQUIRE(rr.ok);
  CHECK(rr.devices[0].peak.reserved_bytes == d.band.data_run_reserved_bytes);
  // The peaks of the fixed shape are untouched by it.
  Config stated = c;
  stated.data.padding = "max_length";  // every batch padded or packed to the length: the shape is stated
  CHECK(!data_shape_unstated(stated));
  const Result s = simulate(stated);
  REQUIRE(s.ok);
  CHECK(s.devices[0].peak.reserved_bytes == d.peak.reserved_bytes);
  CHECK(s.devices[0].peak.allocated_bytes == d.peak.allocated_bytes);
  CHECK(s.devices[0].band.data_run_reserved_bytes == 0);
  // Frameworks that pack or pad to a fixed length by default are not asked.
  Config titan = c;
  titan.training.framework = "torchtitan";
  CHECK(!data_shape_unstated(titan));
}
