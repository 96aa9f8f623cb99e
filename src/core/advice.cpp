// What helps (advice.h): scoring each changed setup against the current one, pairing the best changes that keep the
// job where none fits alone, and the ranking. The changes themselves are in advice_candidates.cpp.
#include "advice.h"

#include <algorithm>

#include "simulate.h"

namespace memsim {

namespace {

// The most loaded GPU's device peak, and the worst verdict over the GPUs (the verdicts are declared from best to
// worst). A change that leaves a GPU borderline does not make the setup fit. A GPU whose memory is an engine's fixed
// share (the vLLM server's) counts for the verdict only: no training change moves it.
int64_t worst_peak(const Result& r, Verdict& verdict) {
  int64_t peak = 0;
  verdict = Verdict::Fits;
  for (const auto& d : r.devices) {
    verdict = std::max(verdict, d.verdict);
    if (!d.fixed_share) peak = std::max(peak, d.peak.device_bytes);
  }
  return peak;
}

bool keeps_job(const Suggestion& s) { return s.group == SuggestionGroup::SameJob || s.group == SuggestionGroup::SameJobNumerics; }

// Worth a row: at least 1% of the peak before the change (a smaller saving is noise next to the band, core/band.h),
// and at least 16 MiB, which would read as 0.00 GiB.
// A pair is worth a row only where it saves that much more than its better change alone.
bool worth_a_row(const Suggestion& s) {
  if (s.unblocks) return true;
  const int64_t before = s.peak_bytes + s.saved_bytes;
  const int64_t more = s.saved_bytes - (s.group == SuggestionGroup::Pair ? s.parts_saved_bytes : 0);
  return more >= (int64_t{16} << 20) && more * 100 >= before;
}

// The order within a group: what fits first, the cheapest first; then the rest by the memory saved.
bool ranks_before(const Suggestion& a, const Suggestion& b) {
  if (a.group != b.group) return a.group < b.group;
  if (a.fits != b.fits) return a.fits;
  if (a.fits && a.slowdown != b.slowdown) return a.slowdown < b.slowdown;
  return a.saved_bytes > b.saved_bytes;
}

}  // namespace

int64_t worst_device_peak(const Result& r) {
  if (!r.ok) return -1;
  Verdict verdict;
  return worst_peak(r, verdict);
}

int64_t worst_device_peak(const Config& config) { return worst_device_peak(simulate(config)); }

int refusal_count(const Result& r) {
  int n = 0;
  for (const auto& d : r.devices) n += !d.refusal.empty();
  return n;
}

bool score_suggestion(Suggestion& s, int64_t peak_now, const Result& r, int refusals_now) {
  if (!r.ok) return false;
  s.peak_bytes = worst_peak(r, s.verdict);
  s.fits = s.verdict == Verdict::Fits;
  s.saved_bytes = peak_now - s.peak_bytes;
  s.unblocks = refusal_count(r) < refusals_now;
  return true;
}

bool evaluate_suggestion(Suggestion& s, int64_t peak_now, int refusals_now) {
  return score_suggestion(s, peak_now, simulate(s.config), refusals_now);
}

std::vector<Suggestion> pair_candidates(const Config& base, const std::vector<Suggestion>& scored) {
  std::vector<const Suggestion*> pool;
  for (const auto& s : scored) {
    if (!keeps_job(s)) continue;
    if (s.fits) return {};  // one change that keeps the job is enough
    if (worth_a_row(s)) pool.push_back(&s);
  }
  // A change that lets a vLLM engine start comes first: no pair without it can fit.
  std::stable_sort(pool.begin(), pool.end(), [](const Suggestion* a, const Suggestion* b) {
    return a->unblocks != b->unblocks ? a->unblocks : a->saved_bytes > b->saved_bytes;
  });
  if (pool.size() > kMaxPairedChanges) pool.resize(kMaxPairedChanges);
  std::vector<Suggestion> pairs;
  for (size_t i = 0; i < pool.size(); ++i) {
    // The second change as it applies to the setup the first makes: micro-batch 2 after tensor parallel doubles
    // the accumulation that tensor parallel doubled already, and an offload after ZeRO-2 takes the stage it needs.
    const std::vector<Suggestion> after_first = suggestion_candidates(pool[i]->config, true);
    for (size_t j = i + 1; j < pool.size(); ++j) {
      auto second = std::find_if(after_first.begin(), after_first.end(), [&](const Suggestion& s) { return s.id == pool[j]->id; });
      if (second == after_first.end() || second->config == pool[i]->config || second->config == pool[j]->config ||
          second->config == base)
        continue;
      Suggestion p;
      p.id = pool[i]->id + "+" + pool[j]->id;
      p.part_changes = {pool[i]->change, second->change};
      p.part_costs = {pool[i]->cost, second->cost};
      p.change = pool[i]->change + " + " + second->change;
      p.cost = pool[i]->change + ": " + pool[i]->cost + ". " + second->change + ": " + second->cost;
      p.group = SuggestionGroup::Pair;
      p.slowdown = pool[i]->slowdown + second->slowdown;
      p.config = second->config;
      p.parts_saved_bytes = std::max(pool[i]->saved_bytes, pool[j]->saved_bytes);
      pairs.push_back(std::move(p));
    }
  }
  return pairs;
}

std::vector<Suggestion> rank_suggestions(std::vector<Suggestion> evaluated) {
  std::vector<Suggestion> out, pairs;
  for (auto& s : evaluated)
    if (worth_a_row(s)) (s.group == SuggestionGroup::Pair ? pairs : out).push_back(std::move(s));
  // The pairs that fit, or where none does the borderline ones: a pair that still does not fit is no answer.
  const bool any_fit = std::any_of(pairs.begin(), pairs.end(), [](const Suggestion& s) { return s.fits; });
  std::stable_sort(pairs.begin(), pairs.end(), ranks_before);
  int shown = 0;
  for (auto& p : pairs)
    if (shown < kMaxPairsShown && (any_fit ? p.fits : p.verdict == Verdict::Borderline)) out.push_back(std::move(p)), ++shown;
  std::stable_sort(out.begin(), out.end(), ranks_before);
  return out;
}

std::vector<Suggestion> suggest(const Config& base) {
  const Result now = simulate(base);
  const int64_t peak_now = worst_device_peak(now);
  if (peak_now < 0) return {};
  const int refusals_now = refusal_count(now);
  std::vector<Suggestion> out;
  for (auto& s : suggestion_candidates(base))
    if (evaluate_suggestion(s, peak_now, refusals_now)) out.push_back(std::move(s));
  for (auto& s : pair_candidates(base, out))
    if (evaluate_suggestion(s, peak_now, refusals_now)) out.push_back(std::move(s));
  return rank_suggestions(std::move(out));
}

}  // namespace memsim
