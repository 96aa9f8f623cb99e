#include "data_shape.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "checked.h"
#include "fields.h"
#include "model.h"

namespace memsim {

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) out.push_back(trim(s.substr(start, i - start))), start = i + 1;
  return out;
}

// A finite number, the whole text of `s`.
bool parse_number(const std::string& s, double& out) {
  if (s.empty() || s.size() > 32) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

std::string shown(const std::string& s) {  // a piece of the user's text, short and printable, for an error
  std::string out;
  for (char ch : s.substr(0, 24)) out += std::isprint(static_cast<unsigned char>(ch)) ? ch : '?';
  return s.size() > 24 ? out + "..." : out;
}

constexpr size_t kMaxPoints = 1000;

// splitmix64 (Steele, Lea and Flood 2014): a small generator that is the same natively and in wasm, so a seed
// gives the same run everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
};

// HF LengthGroupedSampler (transformers trainer_pt_utils.py get_length_grouped_indices): mega-batches of
// mega_batch_mult x batch_size samples, each sorted longest first, split into batches in order; mega_batch_mult
// is min(len(lengths) // (4 batch_size), 50), at least 1. (The longest sample's move to the very first place is
// done by the caller for every way of putting it first.)
void group_by_length(std::vector<int64_t>& lengths, int64_t batch_size, int64_t dataset_samples) {
  const int64_t n = dataset_samples > 0 ? dataset_samples : static_cast<int64_t>(lengths.size());
  const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / std::max<int64_t>(1, 4 * batch_size), 50));
  const size_t mega = static_cast<size_t>(mult * batch_size);
  for (size_t i = 0; i < lengths.size(); i += mega)
    std::sort(lengths.begin() + static_cast<std::ptrdiff_t>(i),
              lengths.begin() + static_cast<std::ptrdiff_t>(std::min(lengths.size(), i + mega)), std::greater<>());
}


int64_t model_layers(const Config& c) { return c.model.num_hidden_layers + decoder_layers(c.model); }

// A micro-batch's pass through the model, in dense-layer passes (the unit of kMaxRunLayerPasses): the layers, the
// embedding and the head, and an MoE layer's experts weighed in. Each routed expert adds its own allocations to the
// replay (HF's loop over experts), so a 128-expert layer replays about three times the events of a dense one (the
// worst-case search of tests/bench/worst_case.cpp: 3.9 s against 1.3 s for the same passes).
int64_t layer_passes_per_micro_batch(const Config& c) {
  const int64_t expert_weight = 1 + c.model.num_experts / 64;
  return add(mul(model_layers(c), expert_weight), 2);
}

// Steps a run replays: data.steps, or the run's own length (dataset_samples x epochs over the samples each step
// takes on one device, as a DataLoader without drop_last counts them), at most kAutoRunSteps and within the work
// bound.
int64_t run_steps(const Config& c, int64_t listed_micro_batches) {
  const auto& d = c.data;
  if (d.steps > 0) return d.steps;
  const int64_t gas = c.training.gradient_accumulation_steps;
  int64_t steps = kAutoRunSteps;
  if (d.source() == LengthsSource::MicroBatches) steps = ceil_div(listed_micro_batches, gas);
  else if (d.dataset_samples > 0) {
    const int64_t per_step = mul(mul(c.training.micro_batch_size, gas), c.parallel.data_parallel_size);
    steps = std::min(steps, mul(ceil_div(d.dataset_samples, per_step), d.epochs));
  }
  const int64_t passes_per_step = mul(gas, layer_passes_per_micro_batch(c));
  steps = std::min(steps, std::max<int64_t>(1, kMaxRunLayerPasses / passes_per_step));
  if (d.source() == LengthsSource::Samples)
    steps = std::min(steps, std::max<int64_t>(1, kMaxRunSamples / mul(gas, c.training.micro_batch_size)));
  return std::max<int64_t>(1, steps);
}

}  // namespace

double LengthDistribution::quantile(double u) const {
  if (points.empty()) return 0;
  if (u <= points.front().first || points.size() == 1) return points.front().second;
  // The first point above u (a binary search: a run draws up to kMaxRunSamples lengths, a file's distribution has
  // a hundred points), or the last one; the length is on the line from the point before it.
  const auto above = std::upper_bound(points.begin() + 1, points.end(), u,
                                      [](double v, const std::pair<double, double>& p) { return v < p.first; });
  const size_t i = std::min<size_t>(static_cast<size_t>(above - points.begin()), points.size() - 1);
  const auto [q0, l0] = points[i - 1];
  const auto [q1, l1] = points[i];
  return q1 > q0 ? l0 + (l1 - l0) * (std::min(u, q1) - q0) / (q1 - q0) : l1;
}

std::string parse_sample_lengths(const std::string& text, int64_t max_length, LengthDistribution& out,
                                 std::vector<std::string>* notes) {
  const std::string field = "data.sample_lengths";
  out.points.clear();
  const auto items = split(text, ',');
  if (trim(text).empty())
    return field + " must give percentiles (\"p50=310,p90=720,p100=2048\") or a histogram (\"0-256:40,256-512:35\")";
  if (items.size() > kMaxPoints) return field + " must have at most 1000 entries; got " + std::to_string(items.size());
  const bool histogram = items.front().find(':') != std::string::npos;
  if (histogram) {
    struct Bin {
      double lo, hi, weight;
    };
    std::vector<Bin> bins;
    for (const auto& item : items) {
      const size_t colon = item.find(':'), dash = item.find('-', 1);
      Bin b{};
      if (colon == std::string::npos || dash == std::string::npos || dash > colon ||
          !parse_number(trim(item.substr(0, dash)), b.lo) || !parse_number(trim(item.substr(dash + 1, colon - dash - 1)), b.hi) ||
          !parse_number(trim(item.substr(colon + 1)), b.weight))
        return field + ": a histogram bin must read LOW-HIGH:WEIGHT, e.g. 256-512:35; got \"" + shown(item) + "\"";
      if (!(b.lo >= 0 && b.hi > b.lo && b.hi <= 1e9))
        return field + ": a bin's lengths must satisfy 0 <= LOW < HIGH <= 1e9; got \"" + shown(item) + "\"";
      if (!(b.weight >= 0 && b.weight <= 1e15)) return field + ": a bin's weight must be from 0 to 1e15; got \"" + shown(item) + "\"";
      bins.push_back(b);
    }
    std::sort(bins.begin(), bins.end(), [](const Bin& a, const Bin& b) { return a.lo < b.lo; });
    double total = 0;
    for (size_t i = 0; i < bins.size(); ++i) {
      if (i > 0 && bins[i].lo < bins[i - 1].hi) return field + ": histogram bins must not overlap";
      total += bins[i].weight;
    }
    if (!(total > 0)) return field + ": the histogram's weights must add up to more than 0";
    double cum = 0;
    for (const auto& b : bins) {
      if (b.weight == 0) continue;
      out.points.push_back({cum / total, b.lo});
      cum += b.weight;
      out.points.push_back({cum / total, b.hi});
    }
    out.points.back().first = 1.0;
  } else {
    for (const auto& item : items) {
      const size_t eq = item.find('=');
      double p = -1, len = 0;
      const std::string key = eq == std::string::npos ? "" : trim(item.substr(0, eq));
      if (key == "min") p = 0;
      else if (key == "median") p = 50;
      else if (key == "max") p = 100;
      else if (key.size() > 1 && (key[0] == 'p' || key[0] == 'P') && !parse_number(key.substr(1), p)) p = -1;
      if (eq == std::string::npos || !parse_number(trim(item.substr(eq + 1)), len) || key.empty())
        return field + ": each entry must read pNN=LENGTH (or min=, median=, max=), e.g. p90=720, or be a histogram "
                       "bin LOW-HIGH:WEIGHT; got \"" + shown(item) + "\"";
      if (!(p >= 0 && p <= 100)) return field + ": a percentile must be from p0 to p100; got \"" + shown(item) + "\"";
      if (!(len >= 0 && len <= 1e9)) return field + ": a length must be from 0 to 1e9 tokens; got \"" + shown(item) + "\"";
      out.points.push_back({p / 100.0, len});
    }
    std::sort(out.points.begin(), out.points.end());
    for (size_t i = 1; i < out.points.size(); ++i) {
      if (out.points[i].first == out.points[i - 1].first) return field + ": a percentile is given twice";
      if (out.points[i].second < out.points[i - 1].second)
        return field + ": lengths must not fall as the percentile rises (p" +
               std::to_string(static_cast<int>(out.points[i].first * 100)) + " is below an earlier one)";
    }
    if (out.points.front().first > 0) {
      out.points.insert(out.points.begin(), {0.0, std::min(1.0, out.points.front().second)});
      if (notes) notes->push_back(field + ": no p0 (min) given; the shortest sample is taken as 1 token");
    }
    if (out.points.back().first < 1) {
      const double top = std::max<double>(static_cast<double>(max_length), out.points.back().second);
      out.points.push_back({1.0, top});
      if (notes)
        notes->push_back(field + ": no p100 (max) given; the longest sample is taken as training.sequence_length (" +
                         std::to_string(max_length) + "), the truncation length, since the data can be no longer");
    }
  }
  if (!(out.longest() >= 1)) return field + ": the longest sample must be at least 1 token";
  return "";
}

std::string parse_micro_batch_lengths(const std::string& text, std::vector<int64_t>& out) {
  const std::string field = "data.micro_batch_lengths";
  out.clear();
  if (trim(text).empty()) return field + " must list each micro-batch's length, e.g. \"512,380,1024\"";
  const auto items = split(text, ',');
  if (items.size() > 2000) return field + " must list at most 2000 lengths; got " + std::to_string(items.size());
  for (const auto& item : items) {
    double v = 0;
    if (!parse_number(item, v) || v != std::floor(v) || v < 1 || v > (1 << 26))
      return field + ": each length must be an integer from 1 to 67108864; got \"" + shown(item) + "\"";
    out.push_back(static_cast<int64_t>(v));
  }
  return "";
}

bool looks_like_sample_lengths_file(const std::string& text) {
  size_t i = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte order mark
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i == text.size()) return false;
  const char ch = text[i];
  return ch == '[' || ch == '-' || ch == '+' || ch == '.' || std::isdigit(static_cast<unsigned char>(ch));
}

namespace {

// The file's lengths, counted rather than kept one by one where they are short (nearly all are): a count per
// length below kShort, the rare longer ones in a list. Percentiles then take one pass over the counts.
struct LengthCounts {
  static constexpr uint32_t kShort = 1 << 16;
  std::vector<uint32_t> counts = std::vector<uint32_t>(kShort, 0);
  std::vector<uint32_t> long_lengths;
  int64_t n = 0;

  void add(uint32_t length) {
    if (length < kShort) ++counts[length];
    else long_lengths.push_back(length);
    ++n;
  }
  // The length of rank r (from 0) in sorted order; call finish() first, ranks in any order.
  std::vector<int64_t> below;  // below[v]: samples shorter than v, for v < kShort
  void finish() {
    std::sort(long_lengths.begin(), long_lengths.end());
    below.assign(kShort + 1, 0);
    for (uint32_t v = 0; v < kShort; ++v) below[v + 1] = below[v] + counts[v];
  }
  int64_t at(int64_t r) const {
    if (r >= below[kShort]) return long_lengths[static_cast<size_t>(r - below[kShort])];
    return std::upper_bound(below.begin(), below.end(), r) - below.begin() - 1;
  }
  // numpy.percentile's default ("linear"): between the ranks around (n - 1) p / 100.
  double percentile(double p) const {
    const double h = static_cast<double>(n - 1) * p / 100.0;
    const int64_t lo = static_cast<int64_t>(std::floor(h));
    const int64_t hi = std::min(n - 1, lo + 1);
    const double a = static_cast<double>(at(lo)), b = static_cast<double>(at(hi));
    return a + (h - static_cast<double>(lo)) * (b - a);
  }
};

}  // namespace

bool sample_lengths_from_file(const std::string& text, SampleLengthsFile& out, FieldError& error) {
  const std::string field = "data.sample_lengths";
  const char* kExpect = "a lengths file holds one token count (a whole number from 0 to 1000000000) per line, or a "
                        "JSON array of them";
  out = SampleLengthsFile{};
  auto fail = [&](const std::string& what) {
    error = {field, field + ": " + what + "; " + kExpect};
    return false;
  };
  LengthCounts lengths;
  size_t i = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  const size_t size = text.size();
  auto skip_blanks = [&] {
    while (i < size && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  skip_blanks();
  const bool array = i < size && text[i] == '[';
  if (array) ++i;
  int64_t line = 1;  // of the entry being read, for the error
  for (size_t p = 0; p < i; ++p) line += text[p] == '\n';
  bool closed = false;
  while (true) {
    // Blanks between entries (a line file's empty lines too); a JSON array's separators.
    while (i < size && std::isspace(static_cast<unsigned char>(text[i]))) line += text[i++] == '\n';
    if (i == size) break;
    if (array && text[i] == ']' && lengths.n == 0) {
      ++i, closed = true;
      break;
    }
    // One entry: up to the next separator (a line's end, or a comma or bracket in an array).
    const size_t start = i;
    while (i < size && text[i] != '\n' && !(array && (text[i] == ',' || text[i] == ']'))) ++i;
    const std::string entry = trim(text.substr(start, std::min<size_t>(i - start, 64)));
    auto where = [&] {  // made only for an error: a file may hold millions of entries
      return array ? "entry " + std::to_string(lengths.n + 1) + " of the array (line " + std::to_string(line) + ")"
                   : "line " + std::to_string(line);
    };
    double v = 0;
    if (entry.empty()) return fail(where() + " is empty");
    if (i - start > 64 || !parse_number(entry, v)) return fail(where() + ", \"" + shown(entry) + "\", is not a number");
    if (v < 0) return fail(where() + ", \"" + shown(entry) + "\", is negative");
    if (v != std::floor(v)) return fail(where() + ", \"" + shown(entry) + "\", is not a whole number of tokens");
    if (v > 1e9) return fail(where() + ", \"" + shown(entry) + "\", is above 1000000000 tokens");
    if (lengths.n == kMaxLengthsFileSamples)
      return fail("the file holds more than " + std::to_string(kMaxLengthsFileSamples) + " samples, the most read");
    lengths.add(static_cast<uint32_t>(v));
    if (array) {
      while (i < size && std::isspace(static_cast<unsigned char>(text[i]))) line += text[i++] == '\n';
      if (i < size && text[i] == ',') ++i;
      else if (i < size && text[i] == ']') {
        ++i, closed = true;
        break;
      } else {
        return fail("the JSON array is not closed after entry " + std::to_string(lengths.n));
      }
    }
  }
  if (array && !closed) return fail("the JSON array is not closed");
  skip_blanks();
  if (i != size) return fail("there is text after the JSON array's closing bracket");
  if (lengths.n == 0) return fail("the file holds no lengths");
  lengths.finish();
  if (lengths.at(lengths.n - 1) == 0) return fail("every sample in the file is 0 tokens long");

  // Percentiles every percent, then the tail ever finer (p99.1..p99.9, p99.91..p99.99, p99.991..p99.999, as far as
  // the file has samples to tell them apart): the longest samples set the longest batches, and a long tail bends
  // too much for a line between p99 and p100. Then the points a straight line through their neighbours gives within
  // half a token are left out (the exact p0 and p100 always stay).
  std::vector<double> ps;
  for (int p = 0; p <= 99; ++p) ps.push_back(p);
  for (double step : {0.1, 0.01, 0.001})
    if (static_cast<double>(lengths.n) * step / 100.0 >= 1.0)
      for (int k = 1; k <= 9; ++k) ps.push_back(100.0 - (10 - k) * step);
  ps.push_back(100.0);
  struct Point {
    double p, exact, tokens;  // the percentile, its value, and that rounded to whole tokens (what the string holds)
  };
  std::vector<Point> points;
  for (double p : ps) {
    const double v = lengths.percentile(p);
    points.push_back({p, v, std::round(v)});
  }
  // Greedy: from each kept point, the farthest point whose line (through the rounded values) passes every point in
  // between within half a token of its exact value.
  std::vector<size_t> kept = {0};
  while (kept.back() + 1 < points.size()) {
    const Point& a = points[kept.back()];
    size_t reach = kept.back() + 1;
    for (size_t j = reach + 1; j < points.size(); ++j) {
      const Point& b = points[j];
      bool straight = true;
      for (size_t k = kept.back() + 1; k < j && straight; ++k)
        straight = std::abs(a.tokens + (b.tokens - a.tokens) * (points[k].p - a.p) / (b.p - a.p) - points[k].exact) <= 0.5;
      if (straight) reach = j;
    }
    kept.push_back(reach);
  }
  for (size_t k : kept) {
    char key[16];
    std::snprintf(key, sizeof key, "%g", points[k].p);
    out.sample_lengths += (out.sample_lengths.empty() ? "p" : ",p") + std::string(key) + "=" +
                          std::to_string(static_cast<int64_t>(points[k].tokens));
  }
  out.samples = lengths.n;
  out.shortest = lengths.at(0);
  out.longest = lengths.at(lengths.n - 1);
  out.median = static_cast<int64_t>(std::round(lengths.percentile(50)));
  return true;
}

void validate_data(const Config& c, std::vector<FieldError>& e) {
  const auto& d = c.data;
  auto err = [&](const char* field, const std::string& msg) { e.push_back({field, msg}); };
  // The fields' ranges and lists (data.*, training.empty_cache_steps) are the field registry's, checked by validate()
  // before this runs.
  if (!d.varies() || !e.empty()) return;
  const auto& m = c.model;
  if (m.is_encoder_decoder)
    return err("data.lengths", "data.lengths must be fixed for encoder-decoder models: a run of varying source and "
                               "target lengths is not modelled for T5 yet");
  const int64_t positions = m.max_position_embeddings;
  int64_t longest = 0;
  if (d.source() == LengthsSource::MicroBatches) {
    std::vector<int64_t> lengths;
    const std::string msg = parse_micro_batch_lengths(d.micro_batch_lengths, lengths);
    if (!msg.empty()) return err("data.micro_batch_lengths", msg);
    longest = *std::max_element(lengths.begin(), lengths.end());
    if (longest > positions)
      return err("data.micro_batch_lengths", "data.micro_batch_lengths: a micro-batch of " + std::to_string(longest) +
                                                 " tokens is longer than model.max_position_embeddings (" +
                                                 std::to_string(positions) + ")");
  } else {
    LengthDistribution dist;
    const std::string msg = parse_sample_lengths(d.sample_lengths, c.training.sequence_length, dist);
    if (!msg.empty()) return err("data.sample_lengths", msg);
    longest = std::min<int64_t>(c.training.sequence_length, static_cast<int64_t>(std::ceil(dist.longest())));
    if (longest > positions)
      return err("data.sample_lengths", "data.sample_lengths: samples reach " + std::to_string(longest) +
                                            " tokens (after truncation to training.sequence_length), more than "
                                            "model.max_position_embeddings (" + std::to_string(positions) +
                                            "); lower training.sequence_length, the truncation length");
  }
  // What the longest micro-batch needs must stay as checkable as a fixed shape: padding-free packs a micro-batch's
  // samples into one row of up to micro_batch_size x longest tokens.
  if (static_cast<long double>(longest) * static_cast<long double>(c.training.micro_batch_size) > (int64_t{1} << 40))
    return err("data.padding", "the longest micro-batch (" + std::to_string(longest) + " tokens x training.micro_batch_size) "
                               "is above 2^40 tokens");
  if (c.parallel.pipeline_parallel_size > 1 || c.parallel.context_parallel_size > 1)
    return err("data.lengths", "data.lengths must be fixed with pipeline or context parallelism: their schedules are "
                               "modelled for one shape (Megatron's variable_seq_lengths is not modelled)");
  if (c.parallel.sequence_parallel)
    return err("data.lengths", "data.lengths must be fixed with sequence parallelism (each length must divide by the "
                               "tensor-parallel size)");
  // The work bound (kMaxRunLayerPasses): refuse a request above it, naming the limit.
  const long double passes = static_cast<long double>(d.steps) * c.training.gradient_accumulation_steps *
                             static_cast<long double>(layer_passes_per_micro_batch(c));
  if (d.steps > 0 && passes > kMaxRunLayerPasses)
    err("data.steps", "data.steps: the run replays data.steps x training.gradient_accumulation_steps micro-batches "
                      "through " + std::to_string(model_layers(c)) + " layers, " + std::to_string(static_cast<int64_t>(passes)) +
                      " layer passes; at most " + std::to_string(kMaxRunLayerPasses) + " are replayed (use at most " +
                      std::to_string(std::max<int64_t>(1, kMaxRunLayerPasses / static_cast<int64_t>(passes / d.steps))) +
                      " steps)");
  // One step is replayed even where the run's length is left to memsim (run_steps takes at least one): its own
  // micro-batches must be within the bound too.
  else if (d.steps == 0 && static_cast<long double>(c.training.gradient_accumulation_steps) * layer_passes_per_micro_batch(c) > kMaxRunLayerPasses)
    err("training.gradient_accumulation_steps",
        "training.gradient_accumulation_steps: a run of varying lengths replays every micro-batch of a step through " +
            std::to_string(model_layers(c)) + " layers; at most " + std::to_string(kMaxRunLayerPasses) +
            " layer passes are replayed (use at most " +
            std::to_string(std::max<int64_t>(1, kMaxRunLayerPasses / layer_passes_per_micro_batch(c))) +
            " micro-batches of accumulation, or data.lengths fixed)");
  else if (d.steps == 0 && d.source() == LengthsSource::Samples &&
           static_cast<long double>(c.training.gradient_accumulation_steps) * c.training.micro_batch_size > kMaxRunSamples)
    err("training.gradient_accumulation_steps",
        "training.gradient_accumulation_steps x training.micro_batch_size: one step of the run would draw more than " +
            std::to_string(kMaxRunSamples) + " samples");
  else if (d.steps > 0 && d.source() == LengthsSource::Samples &&
           static_cast<long double>(d.steps) * c.training.gradient_accumulation_steps * c.training.micro_batch_size > kMaxRunSamples)
    err("data.steps", "data.steps: the run would draw data.steps x training.gradient_accumulation_steps x "
                      "training.micro_batch_size samples, more than " + std::to_string(kMaxRunSamples));
}

int64_t run_shuffles(const Config& c) {
  return c.data.varies() && c.data.source() == LengthsSource::Samples ? kRunShuffles : 1;
}

RunPlan plan_run(const Config& c, int64_t shuffle) {
  const auto& d = c.data;
  const auto& t = c.training;
  RunPlan plan;
  plan.gas = t.gradient_accumulation_steps;
  const int64_t max_length = t.sequence_length;
  const int64_t multiple = d.pad_to_multiple_of;
  if (d.source() == LengthsSource::MicroBatches) {
    std::vector<int64_t> lengths;
    parse_micro_batch_lengths(d.micro_batch_lengths, lengths);
    plan.steps = run_steps(c, static_cast<int64_t>(lengths.size()));
    const int64_t n = mul(plan.steps, plan.gas);
    plan.micro_batches.reserve(static_cast<size_t>(n));
    // A listed length is the micro-batch's padded length; its samples are not given. Where the listed lengths vary,
    // the rows of one micro-batch (samples of varying length padded to the longest) are taken to differ, so a
    // micro-batch of more than one row is padded; one row is its own length. One length throughout stands for
    // fixed-length rows (packed or truncated), as data.lengths fixed does: no padding.
    const bool varied = std::adjacent_find(lengths.begin(), lengths.end(), std::not_equal_to<>()) != lengths.end();
    const bool padded = varied && t.micro_batch_size > 1 && d.pad() != Padding::None;
    for (int64_t k = 0; k < n; ++k)
      plan.micro_batches.push_back({t.micro_batch_size, lengths[static_cast<size_t>(k) % lengths.size()], padded});
    const auto top = std::max_element(lengths.begin(), lengths.end());
    plan.longest_tokens = *top;
    plan.longest_step = (top - lengths.begin()) / plan.gas + 1;
    if (static_cast<int64_t>(lengths.size()) != n)
      plan.notes.push_back("data.micro_batch_lengths: " + std::to_string(lengths.size()) + " lengths for " +
                           std::to_string(n) + " micro-batches; the list repeats");
    return plan;
  }
  LengthDistribution dist;
  parse_sample_lengths(d.sample_lengths, max_length, dist, &plan.notes);
  plan.steps = run_steps(c, 0);
  const int64_t b = t.micro_batch_size;
  const int64_t per_step = mul(plan.gas, b);
  const int64_t n = mul(plan.steps, per_step);
  // Order 0 is data.seed's own draw; order k draws from data.seed + k * (2^62 + 1), which no other seed's orders
  // reach (seeds are at most 2^62), so neighbouring seeds do not share orders.
  Rng rng{static_cast<uint64_t>(d.seed) + static_cast<uint64_t>(shuffle) * ((uint64_t{1} << 62) + 1)};
  auto length_of = [&](double len) { return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(len)), 1, max_length); };
  std::vector<int64_t> samples(static_cast<size_t>(n));
  for (auto& s : samples) s = length_of(dist.quantile(rng.uniform()));
  if (d.group_by_length) group_by_length(samples, per_step, d.dataset_samples);
  // Every epoch holds the dataset's longest sample. Draws from the distribution come near it without reaching it,
  // so it is placed in the run: first where the sampler or the loop puts it first (LengthGroupedSampler swaps it
  // into the very first batch; lit-gpt's 2023 loops put it into iteration 1), else at a shuffled place.
  plan.longest_tokens = length_of(dist.longest());
  const bool first = d.group_by_length || d.longest_first;
  const size_t at = first ? 0 : static_cast<size_t>(rng.below(static_cast<uint64_t>(n)));
  samples[at] = plan.longest_tokens;
  plan.longest_step = static_cast<int64_t>(at) / per_step + 1;
  plan.micro_batches.reserve(static_cast<size_t>(mul(plan.steps, plan.gas)));
  for (int64_t k = 0; k < n; k += b) {
    const auto begin = samples.begin() + k, end = begin + b;
    if (d.pad() == Padding::None) {  // padding-free: the micro-batch's samples concatenated into one row, no pad token
      int64_t sum = 0;
      for (auto it = begin; it != end; ++it) sum += *it;
      plan.micro_batches.push_back({1, sum, false});
    } else {
      const int64_t longest = d.pad() == Padding::MaxLength ? max_length : *std::max_element(begin, end);
      const int64_t row = round_up(longest, multiple);
      // Padded when any sample is shorter than the row: shorter than the batch's longest (or than max_length), or
      // the longest itself rounded up to pad_to_multiple_of.
      const bool padded = std::any_of(begin, end, [&](int64_t len) { return len < row; });
      plan.micro_batches.push_back({b, row, padded});
    }
  }
  const char* where = first ? "in the first micro-batch" : "where the shuffle put it";
  plan.notes.push_back("data: the run's longest sample (" + std::to_string(plan.longest_tokens) + " tokens) is in step " +
                       std::to_string(plan.longest_step) + " of " + std::to_string(plan.steps) + " replayed, " + where);
  return plan;
}

bool run_may_pad(const Config& c) {
  const auto& d = c.data;
  if (!d.varies() || d.pad() == Padding::None) return false;
  if (d.source() == LengthsSource::Samples) return true;
  std::vector<int64_t> lengths;
  if (!parse_micro_batch_lengths(d.micro_batch_lengths, lengths).empty()) return false;
  return c.training.micro_batch_size > 1 &&
         std::adjacent_find(lengths.begin(), lengths.end(), std::not_equal_to<>()) != lengths.end();
}

int64_t planned_run_steps(const Config& c) {
  if (!c.data.varies() || !validate(c).empty()) return 0;
  std::vector<int64_t> listed;
  if (c.data.source() == LengthsSource::MicroBatches) parse_micro_batch_lengths(c.data.micro_batch_lengths, listed);
  return run_steps(c, static_cast<int64_t>(listed.size()));
}

int64_t run_steps_within(const Config& c, int64_t max_layer_passes) {
  const int64_t steps = planned_run_steps(c);
  // Every order of the data is a replay of its own (run_shuffles).
  const int64_t passes_per_step =
      mul(mul(c.training.gradient_accumulation_steps, layer_passes_per_micro_batch(c)), run_shuffles(c));
  if (steps == 0 || static_cast<long double>(steps) * static_cast<long double>(passes_per_step) <= max_layer_passes) return 0;
  return std::max<int64_t>(1, max_layer_passes / passes_per_step);
}

}  // namespace memsim
