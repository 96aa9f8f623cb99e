#include "validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "format.h"
#include "frameworks.h"
#include "serialize.h"
#include "simulate.h"

namespace memsim {

using json = nlohmann::json;

bool parse_validation_case(std::string_view text, ValidationCase& out, std::vector<FieldError>& errors) {
  if (std::string e = document_guard_error(text, "the case file"); !e.empty()) {
    errors.push_back({"case", std::move(e)});
    return false;
  }
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    errors.push_back({"case", "a validation case must be a JSON object"});
    return false;
  }
  auto str = [&](const char* key, std::string& dst, bool required) {
    if (j.contains(key) && j[key].is_string()) dst = j[key].get<std::string>();
    else if (required) errors.push_back({key, std::string(key) + " is required (a string)"});
  };
  str("id", out.id, true);
  str("confidence", out.confidence, true);
  str("statistic", out.statistic, true);
  str("source", out.source, true);
  str("notes", out.notes, false);
  str("excluded", out.excluded, false);
  if (j.contains("bound") && j["bound"] == "lower") out.lower_bound = true;
  if (j.contains("bound") && j["bound"] == "upper") out.upper_bound = true;
  if (j.contains("bound") && j["bound"] != "lower" && j["bound"] != "upper")
    errors.push_back({"bound", "bound must be lower (the source saw an OOM) or upper (the source says it fits)"});
  if (out.statistic != "allocated" && out.statistic != "reserved" && out.statistic != "active" && out.statistic != "device")
    errors.push_back({"statistic", "statistic must be allocated, reserved, active or device"});
  if (out.confidence != "high" && out.confidence != "medium" && out.confidence != "low")
    errors.push_back({"confidence", "confidence must be high, medium or low"});
  // A measured peak is a positive, finite number of GiB below 2^33 (8 Ei bytes, where int64 bytes end).
  const bool number = j.contains("measured_gib") && j["measured_gib"].is_number();
  const double gib = number ? j["measured_gib"].get<double>() : 0;
  if (number && std::isfinite(gib) && gib > 0 && gib < 8589934592.0)
    out.measured_bytes = std::max<int64_t>(1, static_cast<int64_t>(std::llround(gib * 1073741824.0)));
  else errors.push_back({"measured_gib", "measured_gib is required: a positive, finite number of GiB"});
  if (j.contains("first_score") && j["first_score"].is_object()) {
    const json& f = j["first_score"];
    if (f.contains("error") && f["error"].is_number()) {
      out.has_first_score = true;
      out.first_error = f["error"].get<double>();
    } else {
      errors.push_back({"first_score", "first_score.error is required (a number: (predicted - measured) / measured)"});
    }
    if (f.contains("memsim") && f["memsim"].is_string()) out.first_score_memsim = f["memsim"].get<std::string>();
  }
  if (j.contains("inferred") && j["inferred"].is_object())
    for (auto it = j["inferred"].begin(); it != j["inferred"].end(); ++it)
      out.inferred.emplace_back(it.key(), it->is_string() ? it->get<std::string>() : it->dump());
  if (!j.contains("config") || !j["config"].is_object()) {
    errors.push_back({"config", "config is required (a memsim config object)"});
    return false;
  }
  Parsed p = config_from_json(j["config"].dump());
  if (!p.ok) {
    errors.insert(errors.end(), p.errors.begin(), p.errors.end());
    return false;
  }
  out.config = p.config;
  return errors.empty();
}

bool is_multi_gpu(const Config& c) {
  const auto& p = c.parallel;
  return p.data_parallel_size * p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size > 1;
}

namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
// The nearest-rank 90th percentile.
double p90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.9 * static_cast<double>(v.size())));
  return v[std::max<size_t>(rank, 1) - 1];
}

// The statistic a case measured, on one device.
int64_t measured_statistic(const ValidationCase& c, const DeviceResult& d) {
  return c.statistic == "allocated" ? d.peak.allocated_bytes
         : c.statistic == "reserved" ? d.peak.reserved_bytes
         : c.statistic == "active"   ? d.peak.active_bytes
                                     : d.peak.device_bytes;
}

// The config with every switch it sets by hand back at auto (empty_cache_steps' auto is -1); `changed` counts them.
// peft.prepare_kbit stays: whether the script calls prepare_model_for_kbit_training is in the user's own code, a fact
// they know like the framework (its auto only follows the framework and TRL's SFT and DPO trainers). So do
// training.loss fused_linear, Liger's kernel the user turns on (use_liger_kernel, axolotl's
// liger_fused_linear_cross_entropy), and vocab_chunked, prime-rl's RL trainer's head: no version implies either.
Config switches_at_auto(const Config& c, int& changed) {
  Config out = c;
  const Resolved r = resolve(c);
  changed = 0;
  for (size_t i = 0; i < kSwitchCount; ++i) {
    if (r.origin[i].kind != Origin::Kind::Explicit || static_cast<Switch>(i) == Switch::PrepareKbit) continue;
    if (static_cast<Switch>(i) == Switch::Loss && (c.training.loss == "fused_linear" || c.training.loss == "vocab_chunked"))
      continue;
    const std::string field(switch_field(static_cast<Switch>(i)));
    if (apply_setting(out, field + (field == "training.empty_cache_steps" ? "=-1" : "=auto")).empty()) ++changed;
  }
  return out;
}

double within_10pct(const std::vector<double>& errors) {
  if (errors.empty()) return 0;
  return static_cast<double>(std::count_if(errors.begin(), errors.end(), [](double e) { return e <= 0.10; })) /
         static_cast<double>(errors.size());
}
}  // namespace

ValidationSummary run_validation(const std::vector<ValidationCase>& cases) {
  ValidationSummary s;
  std::vector<double> counted, multi, peft, programs, preference, all, with_auto;
  // Per row, the device whose peak was compared (its peaks and its unstated-data run), for the band afterwards.
  std::vector<DeviceResult> compared(cases.size());
  for (const auto& c : cases) {
    ValidationRow row;
    row.vcase = c;
    Result r = simulate(c.config);
    if (!r.ok) {
      row.error = r.errors.empty() ? "failed" : r.errors[0].message;
    } else {
      // Sources report one rank or the maximum over ranks; the devices differ only across pipeline stages,
      // where every source quoted here gives the maximum. A vLLM server's GPUs (fixed_share) are not the trainer's.
      row.ok = true;
      for (const DeviceResult& d : r.devices) {
        if (d.fixed_share) continue;
        const int64_t v = measured_statistic(c, d);
        if (v > row.predicted_bytes) {
          row.predicted_bytes = v, row.peak_phase = d.peak_phase;
          DeviceResult& kept = compared[s.rows.size()];
          kept.peak = d.peak;
          kept.band = d.band;
        }
      }
      row.relative_error = static_cast<double>(row.predicted_bytes - c.measured_bytes) / static_cast<double>(c.measured_bytes);
      row.bound_met = c.lower_bound ? row.predicted_bytes > c.measured_bytes : !c.upper_bound || row.predicted_bytes <= c.measured_bytes;
      if (!c.bound() && (c.confidence == "high" || c.confidence == "medium")) {
        all.push_back(std::fabs(row.relative_error));
        int changed = 0;
        const Config automatic = switches_at_auto(c.config, changed);
        double error = row.relative_error;
        if (changed > 0) {
          ++s.auto_cases_changed;
          const StackVersions v = stack_versions(c.config.versions);
          bool dated = v.has_date;
          for (size_t l = 0; l < kLibraryCount; ++l) dated = dated || v.stated(static_cast<Library>(l));
          s.auto_cases_dated += dated;
          const Result ra = simulate(automatic);
          int64_t predicted = 0;
          for (const DeviceResult& d : ra.devices)
            if (!d.fixed_share) predicted = std::max(predicted, measured_statistic(c, d));
          // A config that no longer validates with its switches at auto counts as a total miss.
          error = ra.ok ? static_cast<double>(predicted - c.measured_bytes) / static_cast<double>(c.measured_bytes) : 1.0;
        }
        with_auto.push_back(std::fabs(error));
      }
      if (c.excluded.empty() && !c.bound() && (c.confidence == "high" || c.confidence == "medium")) {
        const bool m = is_multi_gpu(c.config);
        (m ? multi : counted).push_back(std::fabs(row.relative_error));
        double& worst = m ? s.multi_worst_high_abs_error : s.worst_high_abs_error;
        if (c.confidence == "high") worst = std::max(worst, std::fabs(row.relative_error));
        if (!c.config.model.architecture.empty() || !c.config.model.vision_tower.empty()) programs.push_back(std::fabs(row.relative_error));
        if (c.config.training.preference() || c.config.training.rollout()) preference.push_back(std::fabs(row.relative_error));
        if (!m && c.config.peft.enabled()) {
          peft.push_back(std::fabs(row.relative_error));
          if (c.confidence == "high") s.peft_worst_high_abs_error = std::max(s.peft_worst_high_abs_error, std::fabs(row.relative_error));
        }
      }
    }
    s.rows.push_back(std::move(row));
  }
  // Leave-one-out: each case's band from the other cases' errors, on the statistic its source measured.
  const std::vector<ResidualRow> table = residual_rows(s);
  std::vector<double> widths;
  for (size_t i = 0; i < s.rows.size(); ++i) {
    ValidationRow& row = s.rows[i];
    const ValidationCase& c = row.vcase;
    BandStatistic stat;
    if (!row.ok || c.bound() || !parse_band_statistic(c.statistic, stat)) continue;
    const Band b = device_band(band_features(c.config), compared[i], table, c.id);
    if (!b.valid) continue;
    row.band_ok = true;
    row.band_low_bytes = b.of(stat).low_bytes;
    row.band_high_bytes = b.of(stat).high_bytes;
    row.inside_band = row.band_low_bytes <= c.measured_bytes && c.measured_bytes <= row.band_high_bytes;
    ++s.band_cases;
    s.band_inside += row.inside_band;
    if (c.excluded.empty() && (c.confidence == "high" || c.confidence == "medium")) {
      ++s.band_counted_cases;
      s.band_counted_inside += row.inside_band;
    }
    widths.push_back(static_cast<double>(row.band_high_bytes) / static_cast<double>(std::max<int64_t>(1, row.band_low_bytes)) - 1);
  }
  s.band_median_width = median(widths);
  s.counted = static_cast<int>(counted.size());
  s.median_abs_error = median(counted);
  s.peft_counted = static_cast<int>(peft.size());
  s.peft_median_abs_error = median(peft);
  s.program_counted = static_cast<int>(programs.size());
  s.program_median_abs_error = median(programs);
  s.preference_counted = static_cast<int>(preference.size());
  s.preference_median_abs_error = median(preference);
  s.multi_counted = static_cast<int>(multi.size());
  s.multi_median_abs_error = median(multi);
  s.all_counted = static_cast<int>(all.size());
  s.all_median_abs_error = median(all);
  s.all_p90_abs_error = p90(all);
  s.all_within_10pct = within_10pct(all);
  s.auto_median_abs_error = median(with_auto);
  s.auto_p90_abs_error = p90(with_auto);
  s.auto_within_10pct = within_10pct(with_auto);
  return s;
}

std::vector<ResidualRow> residual_rows(const ValidationSummary& s) {
  std::vector<ResidualRow> rows;
  for (const auto& r : s.rows) {
    BandStatistic stat;
    if (!r.ok || r.vcase.bound() || !parse_band_statistic(r.vcase.statistic, stat)) continue;
    rows.push_back({r.vcase.id, stat, r.vcase.confidence, !r.vcase.excluded.empty(), r.relative_error,
                    band_features(r.vcase.config)});
  }
  return rows;
}

std::string validation_markdown(const ValidationSummary& s) {
  char buf[1024];
  std::string md =
      "# Validation: predicted against measured peaks\n\n"
      "Generated by `scripts/validation_report.sh` (`memsim-cli validate tests/validation/cases`); do not edit.\n"
      "Each row is a published measurement from `../shared/validation/cases.jsonl`, expressed as a memsim config\n"
      "in `tests/validation/cases/<id>.json` with every inferred field explained there. The prediction uses the\n"
      "statistic the source measured: `allocated` = max_memory_allocated, `reserved` = max_memory_reserved,\n"
      "`active` = peak active bytes, `device` = nvidia-smi (reserved + CUDA context).\n\n";
  std::snprintf(buf, sizeof buf,
                "**Summary, single GPU:** %d high- and medium-confidence cases counted; median absolute error %.1f%%; "
                "worst high-confidence case %.1f%%.\n\n"
                "**Summary, fine-tuning (single GPU, a PEFT method):** %d of those cases; median absolute error "
                "%.1f%%; worst high-confidence case %.1f%%.\n\n"
                "**Summary, several GPUs:** %d cases counted; median absolute error %.1f%%; worst high-confidence "
                "case %.1f%%. For a pipeline the prediction is the largest stage's.\n\n",
                s.counted, 100 * s.median_abs_error, 100 * s.worst_high_abs_error, s.peft_counted,
                100 * s.peft_median_abs_error, 100 * s.peft_worst_high_abs_error, s.multi_counted,
                100 * s.multi_median_abs_error, 100 * s.multi_worst_high_abs_error);
  md += buf;
  // (The families' list is longer than buf: only the figures go through snprintf.)
  md += "**Summary, families beyond decoder LLMs** (model programs, model.architecture, and vision-language models, "
        "model.vision_tower; published cases for ViT/DeiT (six torchvision ViT-L/16 fine-tunes, fp32, 16-mixed and "
        "bf16-true), ResNets, Swin (two torch-AMP runs of the official code; three apex O1 runs, low confidence, 22% "
        "under: a finding), Qwen2-VL and LLaVA-1.5 (three runs of one ScienceQA study) so far, none yet for DINOv2, "
        "ConvNeXt, SigLIP or LLaVA-NeXT; the Stable "
        "Diffusion UNets (1.x, XL) have three low-confidence fits claims, bounds outside the statistics; FLUX.1's "
        "transformer a reserved bound (a finding) and a low-confidence reading of its bf16 LoRA, and SD3-medium's a fits "
        "claim and two OOMs (one a finding); Whisper four fits claims and an OOM, bounds outside the statistics, and "
        "three low-confidence readings; none yet for Mamba-2 or the dense Nemotron-H; Nemotron-3-Nano (the Mamba-2, "
        "attention and MoE hybrid) one medium-confidence reserved peak under TRL, whose training delta is mostly "
        "unexplained (a finding); single and several GPUs): ";
  std::snprintf(buf, sizeof buf, "%d high- and medium-confidence cases counted; median absolute error %.1f%%.\n\n",
                s.program_counted, 100 * s.program_median_abs_error);
  md += buf;
  std::snprintf(buf, sizeof buf,
                "**Summary, preference and RL objectives** (training.objective dpo, orpo, simpo, kto, grpo, ppo; single and several GPUs): "
                "%d high- and medium-confidence cases counted; median absolute error %.1f%%.\n\n",
                s.preference_counted, 100 * s.preference_median_abs_error);
  md += buf;
  std::snprintf(buf, sizeof buf,
                "**Every high- and medium-confidence case, the excluded findings included** (single and several "
                "GPUs; OOM bounds have no error): %d cases; median absolute error %.1f%%; 90th percentile %.1f%%; "
                "%.0f%% within 10%%.\n\n",
                s.all_counted, 100 * s.all_median_abs_error, 100 * s.all_p90_abs_error, 100 * s.all_within_10pct);
  md += buf;
  std::snprintf(buf, sizeof buf,
                "**The same cases with every version-derived switch at auto** (the %d case files that set one by hand "
                "— attention, loss, optimizer implementation, adapter dtype, ... — put back to auto, so that the "
                "versions decide, as for a user who knows only the versions; %d of them state versions or a date, "
                "the others take the latest releases): median absolute error %.1f%%; 90th percentile %.1f%%; %.0f%% "
                "within 10%%.\n\n",
                s.auto_cases_changed, s.auto_cases_dated, 100 * s.auto_median_abs_error, 100 * s.auto_p90_abs_error,
                100 * s.auto_within_10pct);
  md += buf;
  std::snprintf(buf, sizeof buf,
                "**Uncertainty band, leave-one-out:** the measured value falls inside the band that the %d nearest "
                "other cases give it (src/core/band.h) for %d of %d cases (%.0f%%), excluded and low-confidence ones "
                "included; for %d of the %d counted cases (%.0f%%). The band aims at 80%%; its median width (top over "
                "bottom) is %.0f%%.\n\n",
                kBandNeighbours, s.band_inside, s.band_cases,
                s.band_cases ? 100.0 * s.band_inside / s.band_cases : 0.0, s.band_counted_inside, s.band_counted_cases,
                s.band_counted_cases ? 100.0 * s.band_counted_inside / s.band_counted_cases : 0.0,
                100 * s.band_median_width);
  md += buf;
  md += "The column *first score* is memsim's error when the case was added, before any model change it motivated.\n\n";
  md += "| case | confidence | statistic | measured | predicted | error | first score | band, leave-one-out | peak during | source |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : s.rows) {
    const auto& c = r.vcase;
    std::string err = r.ok ? "" : "not simulated: " + r.error;
    if (r.ok) {
      std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * r.relative_error);
      err = buf;
      if (!c.excluded.empty()) err += " (excluded)";
      if (c.lower_bound) err = r.bound_met ? "above the OOM bound: ok" : "below the OOM bound: wrong";
      if (c.upper_bound) err = r.bound_met ? "within the fits bound: ok" : "above the fits bound: wrong";
    }
    std::string first = "-";
    if (c.has_first_score) std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * c.first_error), first = buf;
    const std::string band = !r.band_ok ? "-"
                             : format_bytes(r.band_low_bytes) + " - " + format_bytes(r.band_high_bytes) +
                                   (r.inside_band ? ", in" : ", **out**");
    md += "| " + c.id + " | " + c.confidence + " | " + c.statistic + " | " + format_bytes(c.measured_bytes) + " | " +
          (r.ok ? format_bytes(r.predicted_bytes) : "-") + " | " + err + " | " + first + " | " + band + " | " + r.peak_phase + " | " +
          c.source + " |\n";
  }
  md += "\n## Findings and inferred fields\n\n";
  for (const auto& r : s.rows) {
    const auto& c = r.vcase;
    if (c.excluded.empty() && c.inferred.empty() && c.notes.empty()) continue;
    md += "### " + c.id + "\n\n";
    if (!c.excluded.empty()) md += "**Excluded from the statistics:** " + c.excluded + "\n\n";
    if (!c.notes.empty()) md += c.notes + "\n\n";
    for (const auto& [field, why] : c.inferred) md += "- `" + field + "`: " + why + "\n";
    md += "\n";
  }
  return md;
}

std::string calibration_markdown(const ValidationSummary& s, std::string_view folder) {
  char buf[512];
  const std::string stat = s.rows.empty() ? "" : s.rows.front().vcase.statistic;
  std::string md = "### `" + std::string(folder) + "` (" + stat + ")\n\n";
  if (!s.rows.empty()) md += "Source: " + s.rows.front().vcase.source + ".\n\n";
  std::snprintf(buf, sizeof buf, "%d cases; median absolute error %.1f%%; worst %.1f%%.\n\n", s.counted,
                100 * s.median_abs_error, 100 * s.worst_high_abs_error);
  md += buf;
  md += "| case | measured | predicted | error | peak during |\n|---|---|---|---|---|\n";
  for (const auto& r : s.rows) {
    std::string err = r.ok ? "" : "not simulated: " + r.error;
    if (r.ok) std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * r.relative_error), err = buf;
    md += "| " + r.vcase.id + " | " + format_bytes(r.vcase.measured_bytes) + " | " +
          (r.ok ? format_bytes(r.predicted_bytes) : "-") + " | " + err + " | " + r.peak_phase + " |\n";
  }
  return md + "\n";
}

}  // namespace memsim
