// The shapes of a run's micro-batches: how long each one is, made the way the run's data loader makes them
// (DataConfig). A fixed shape needs none of this; a run of varying lengths is replayed micro-batch by micro-batch.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "validate.h"

namespace memsim {

struct MicroBatchShape {
  int64_t sequences = 1;  // rows of the micro-batch (training.micro_batch_size; 1 when padding-free flattens them)
  int64_t tokens = 1;     // tokens per row after padding (the row length every activation has)
  // Some row holds pad tokens, so the collator's attention_mask has zeros: transformers then builds a 4-D mask
  // where it skips one otherwise (docs/versions.md 6b). A fixed shape says nothing of padding and counts as none.
  bool padded = false;
};

// Per-sample token lengths as a piecewise-linear distribution: points (cumulative fraction, length) with both
// non-decreasing, from fraction 0 to fraction 1. Percentiles are such points already; a histogram's bin edges
// become points, a bin's weight spread evenly over its lengths.
struct LengthDistribution {
  std::vector<std::pair<double, double>> points;
  double quantile(double u) const;  // the length at cumulative fraction u in [0, 1]
  double longest() const { return points.empty() ? 0 : points.back().second; }
};

// data.sample_lengths: "p0=12,p50=310,p90=720,p100=2048" (also min=, median=, max=) or "0-256:40,256-512:35".
// A missing p0 is 1 token; a missing p100 is max_length, the truncation length, since the data can be no longer;
// each assumption goes to `notes`. Returns an empty string, or the error (a sentence naming the field).
std::string parse_sample_lengths(const std::string& text, int64_t max_length, LengthDistribution& out,
                                 std::vector<std::string>* notes = nullptr);
// data.micro_batch_lengths: "512,380,1024".
std::string parse_micro_batch_lengths(const std::string& text, std::vector<int64_t>& out);

// The bound on a run's work, in micro-batch passes through one layer: each pass is about 70 allocator events,
// so the bound keeps a native replay within about a second and its memory bounded (a simulation replays the run
// once per order of the data, kRunShuffles, on the machine's cores where it has them). Validation refuses more.
constexpr int64_t kMaxRunLayerPasses = 150'000;
// Optimizer steps replayed when neither data.steps nor a shorter run says otherwise. Reserved memory grows as new
// lengths arrive and then levels off: a 7B LoRA run over a long-tailed distribution (p50 150, p100 1,100 tokens,
// micro-batch 4) reached 51-65 GiB by step 1,000 over eight shuffles, and 61-66 GiB by step 2,000-5,000.
constexpr int64_t kAutoRunSteps = 2000;
// Samples a run may draw (steps x accumulation x micro-batch): the draws are kept for group_by_length's sort.
constexpr int64_t kMaxRunSamples = int64_t{1} << 24;

struct RunPlan {
  int64_t steps = 0;
  int64_t gas = 1;
  std::vector<MicroBatchShape> micro_batches;  // steps x gas, in the order one device runs them
  int64_t longest_step = 0;                    // the step (from 1) that holds the dataset's longest sample; 0: none
  int64_t longest_tokens = 0;
  std::vector<std::string> notes;              // what the plan assumed, for the result's notes
};

// A file of per-sample token lengths, as a tokenized dataset's lengths are saved: one number per line, or a JSON
// array of numbers (`json.dump([len(ids) for ids in ds["input_ids"]])`). It becomes data.sample_lengths as
// percentiles (the exact shortest and longest, every percent, and the tail that sets the longest batches ever
// finer: p99.1..p99.9, p99.91..p99.99, p99.991..p99.999 where the file has the samples to tell them apart), with
// the points a straight line through their neighbours already gives left out, so that the string stays short in a
// link (2 KB at most for lengths below ten million tokens); and data.dataset_samples as the number of samples.
struct SampleLengthsFile {
  std::string sample_lengths;  // for data.sample_lengths: "p0=12,p1=20,...,p100=2048"
  int64_t samples = 0;         // for data.dataset_samples
  int64_t shortest = 0, median = 0, longest = 0;  // tokens, for the message that says what was read
};
// Samples a lengths file may hold: reading stops after them, so time and memory stay bounded (4 bytes a sample
// at most, and one pass over the text).
constexpr int64_t kMaxLengthsFileSamples = 10'000'000;
// True when `text` is meant as a lengths file rather than a config: its first character after blanks is '[' or
// one that starts a number. The configs memsim reads never start so (JSON objects, Accelerate's YAML keys).
bool looks_like_sample_lengths_file(const std::string& text);
// Reads such a file. False, with `error` naming data.sample_lengths and the line or entry, when the text is not a
// list of whole, non-negative token counts (negative, NaN, a fraction, empty, more than kMaxLengthsFileSamples).
bool sample_lengths_from_file(const std::string& text, SampleLengthsFile& out, FieldError& error);

// The data section's checks (validate() calls it): ranges, parse errors, lengths above the model's positions, and
// the bound on the run's work.
void validate_data(const Config& c, std::vector<FieldError>& errors);

// The orders of the data a run of drawn samples is replayed in (data.seed's own, and more drawn from it). Its
// reserved peak depends on the order: a longer batch cannot reuse the blocks cached for shorter ones, so the peak
// grows with each new longest batch, and where those come in the run decides how much is cached by then. One 7B
// QLoRA run over a log-normal length distribution (fms-acceleration's OrcaMath rows) reserved 23-36 GiB over six
// seeds with the same allocated peak. A measured run is one such order: the median of three is the closer
// estimate of it, and their spread is part of the band. Listed micro-batch lengths have one order.
constexpr int64_t kRunShuffles = 3;
int64_t run_shuffles(const Config& c);  // kRunShuffles for drawn samples, 1 for listed lengths

// Requires a validated config whose data.varies(). `shuffle` (0 .. run_shuffles - 1): 0 draws with data.seed, the
// others from streams derived from it that no other seed's orders share.
RunPlan plan_run(const Config& c, int64_t shuffle = 0);

// Whether some micro-batch of the run can be padded (MicroBatchShape::padded): a run of varying lengths that pads,
// drawn samples, or listed lengths that vary with more than one row a micro-batch. False for a fixed shape.
bool run_may_pad(const Config& c);

// Optimizer steps the run of `c` replays: data.steps, or the run's own length within the bounds above. 0 for a fixed
// shape or a config that does not validate.
int64_t planned_run_steps(const Config& c);
// For callers that simulate many variants of one run (What helps, the fit explorer): the optimizer steps that keep
// one simulation of `c` (its replays in every order of the data) within `max_layer_passes`, or 0 when the whole run
// already is (or `c` is a fixed shape, or does not validate). A config with data.steps set to them replays the same draws' first steps, the dataset's longest
// sample placed among them.
int64_t run_steps_within(const Config& c, int64_t max_layer_passes);

}  // namespace memsim
