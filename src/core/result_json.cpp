// The CLI's JSON result (serialize.h result_to_json; README "CLI contract").
#include <nlohmann/json.hpp>

#include "serialize.h"

namespace memsim {

using json = nlohmann::json;

std::string result_to_json(const Result& r, bool with_timeline, int indent, const std::vector<Suggestion>* suggestions,
                           const Config* base) {
  json out;
  out["schema"] = kResultSchema;
  out["ok"] = r.ok;
  if (!r.ok) {
    json errs = json::array();
    for (const auto& e : r.errors) errs.push_back({{"field", e.field}, {"message", e.message}});
    out["errors"] = errs;
    return out.dump(indent, ' ', false, json::error_handler_t::replace);
  }
  out["params_total"] = r.params_total;
  out["params_trainable"] = r.params_trainable;
  out["model_states"] = {{"weights_bytes", r.model_states.weights_bytes},
                         {"gradients_bytes", r.model_states.gradients_bytes},
                         {"optimizer_bytes", r.model_states.optimizer_bytes},
                         {"other_models_bytes", r.model_states.other_models_bytes}};
  json devices = json::array();
  for (const auto& d : r.devices) {
    json dev;
    dev["role"] = d.role;
    dev["device_count"] = d.device_count;
    if (d.fixed_share) dev["fixed_share"] = true;  // an engine's claimed share: its band is that share
    if (!d.refusal.empty()) dev["refusal"] = d.refusal;
    dev["peak"] = {{"allocated_bytes", d.peak.allocated_bytes}, {"reserved_bytes", d.peak.reserved_bytes},
                   {"active_bytes", d.peak.active_bytes},       {"requested_bytes", d.peak.requested_bytes},
                   {"device_bytes", d.peak.device_bytes}};
    json bd;
    for (int i = 0; i < kComponentCount; ++i) bd[component_id(static_cast<Component>(i))] = d.breakdown.allocator[i];
    bd["fragmentation"] = d.breakdown.fragmentation_bytes;
    bd["cuda_context"] = d.breakdown.cuda_context_bytes;
    bd["nccl"] = d.breakdown.nccl_bytes;
    dev["breakdown"] = bd;
    dev["fits"] = d.fits;
    dev["verdict"] = verdict_id(d.verdict);
    if (d.band.valid) {  // the uncertainty band of each statistic (core/band.h)
      json band;
      for (int i = 0; i < kBandStatistics; ++i) {
        const auto s = static_cast<BandStatistic>(i);
        band[band_statistic_id(s)] = {{"low_bytes", d.band.of(s).low_bytes}, {"high_bytes", d.band.of(s).high_bytes}};
      }
      dev["band"] = band;
    }
    dev["oom"] = d.oom;
    if (d.oom) dev["oom_at"] = {{"event", d.oom_event}};
    dev["capacity_bytes"] = d.capacity_bytes;
    dev["usable_bytes"] = d.usable_bytes;
    dev["peak_at"] = {{"event", d.peak_event}, {"phase", d.peak_phase}, {"tensor", d.peak_label}};
    if (d.run.steps == 0)  // a fixed shape's two steps, not a run's peak step
      if (const int64_t kept = forward_retained_bytes(d.program); kept >= 0) dev["forward_retained_bytes"] = kept;
    if (d.host_bytes > 0 || d.nvme_bytes > 0) dev["offloaded"] = {{"host_bytes", d.host_bytes}, {"nvme_bytes", d.nvme_bytes}};
    if (d.run.steps > 0) {  // a run of varying shapes: where in the run the peaks fell, and how reserved grew
      const auto& run = d.run;
      dev["run"] = {{"steps", run.steps},
                    {"allocated_peak_step", run.allocated_peak_step},
                    {"reserved_peak_step", run.reserved_peak_step},
                    {"longest_step", run.longest_step},
                    {"longest_tokens", run.longest_tokens},
                    {"first_step_reserved_bytes", run.first_step_reserved_bytes},
                    {"empty_cache_calls", run.empty_cache_calls},
                    {"shuffles", run.shuffles},
                    {"shuffle_reserved_low_bytes", run.shuffle_reserved_low_bytes},
                    {"shuffle_reserved_high_bytes", run.shuffle_reserved_high_bytes},
                    {"shuffle_allocated_high_bytes", run.shuffle_allocated_high_bytes}};
      if (with_timeline) {
        json tokens = json::array(), alloc = json::array(), res = json::array();
        for (const auto& pt : run.per_step)
          tokens.push_back(pt.tokens), alloc.push_back(pt.allocated_bytes), res.push_back(pt.reserved_bytes);
        dev["run"]["per_step"] = {{"tokens", tokens}, {"allocated_bytes", alloc}, {"reserved_bytes", res}};
      }
    }
    if (with_timeline) {
      json phases = json::array();
      for (const auto& ph : d.program.phases) phases.push_back({{"name", ph.name}, {"first_event", ph.first_event}});
      json alloc = json::array(), res = json::array();
      for (const auto& pt : d.timeline) alloc.push_back(pt.allocated_bytes), res.push_back(pt.reserved_bytes);
      dev["timeline"] = {{"phases", phases}, {"allocated_bytes", alloc}, {"reserved_bytes", res}};
    }
    devices.push_back(dev);
  }
  out["devices"] = devices;
  if (r.host.per_node_bytes > 0 || r.host.nvme_per_node_bytes > 0) {
    out["host"] = {{"per_node_bytes", r.host.per_node_bytes}, {"nvme_per_node_bytes", r.host.nvme_per_node_bytes},
                   {"gpus_per_node", r.host.gpus_per_node}, {"nodes", r.host.nodes}};
    if (r.host.capacity_bytes > 0) out["host"]["capacity_bytes"] = r.host.capacity_bytes, out["host"]["fits"] = r.host.fits;
  }
  out["notes"] = r.notes;
  if (suggestions) {
    json list = json::array();
    // The group's id, in advice.h's order: the JSON edge's words for SuggestionGroup.
    static const char* const kGroupIds[kSuggestionGroups] = {"same_job", "same_job_numerics", "pair", "more_hardware",
                                                             "changes_job"};
    for (const auto& sg : *suggestions) {
      json item = {{"id", sg.id}, {"group", kGroupIds[static_cast<int>(sg.group)]}, {"change", sg.change}, {"cost", sg.cost},
                   {"set", base ? config_changes(*base, sg.config) : std::vector<std::string>{}},
                   {"device_bytes_after", sg.peak_bytes}, {"saved_bytes", sg.saved_bytes}, {"fits", sg.fits},
                   {"verdict", verdict_id(sg.verdict)}};
      if (!sg.part_changes.empty()) item["parts"] = sg.part_changes;
      list.push_back(item);
    }
    out["suggestions"] = list;
  }
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

}  // namespace memsim
