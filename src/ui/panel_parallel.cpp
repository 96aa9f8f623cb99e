// Parallelism and hardware inputs: the layout (data, tensor, context, expert and pipeline parallel), who shards
// the model states and how much, offload, and the node the GPUs sit in.
#include <imgui.h>

#include <string>

#include "core/frameworks.h"
#include "core/tables.h"
#include "panels.h"

namespace memsim::ui {

namespace {

// The stage combo says what each level means in the chosen engine's own words.
bool stage_combo(ParallelConfig& p, Sharding s) {
  static const char* const kMegatron[] = {"0 (no distributed optimizer)", "1 (distributed optimizer)"};
  static const char* const kFsdp[] = {"0 (NO_SHARD)", "1 (not in FSDP)", "2 (SHARD_GRAD_OP / no reshard after forward)",
                                      "3 (FULL_SHARD)"};
  static const char* const kZero[] = {"0 (DDP, no sharding)", "1 (optimizer states)", "2 (+ gradients)", "3 (+ weights)"};
  const bool megatron = s == Sharding::Megatron, fsdp = s == Sharding::Fsdp1 || s == Sharding::Fsdp2;
  const char* const* items = megatron ? kMegatron : fsdp ? kFsdp : kZero;
  const int count = megatron ? 2 : 4;
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
  int stage = static_cast<int>(p.zero_stage);
  bool changed = false;
  if (index_combo("sharding stage", stage, items, count)) p.zero_stage = stage, changed = true;
  const char* help = field_spec("parallel.zero_stage").help.data();
  const bool focused = item_has_keyboard_focus();
  announce_focus(focus_words("sharding stage", std::to_string(p.zero_stage) + ", list", "parallel.zero_stage", help), focused);
  help_marker(help, focused);
  field_error("parallel.zero_stage");
  return changed;
}

}  // namespace

bool draw_parallel_inputs(Config& c) {
  bool changed = false;
  auto& p = c.parallel;
  const Resolved rs = resolve(c);
  const bool fsdp = rs.sharding == Sharding::Fsdp1 || rs.sharding == Sharding::Fsdp2;
  if (section("Parallelism")) {
    changed |= int_input("parallel.data_parallel_size", p.data_parallel_size, 1);
    const std::string engine(rs.framework->sharding);
    changed |= choice_combo("parallel.sharding", p.sharding, engine.c_str());
    changed |= stage_combo(p, rs.sharding);
    if (fsdp) {
      changed |= int_input("parallel.shard_group_size", p.shard_group_size, 1);
      if (rs.sharding == Sharding::Fsdp1) {
        changed |= choice_combo("parallel.fsdp_backward_prefetch", p.fsdp_backward_prefetch, "");
        changed |= string_combo("parallel.fsdp_use_orig_params", p.fsdp_use_orig_params, {"auto", "true", "false"});
        if (c.training.activation_checkpointing != "none")
          changed |= check_input("parallel.fsdp_checkpoint_in_units", p.fsdp_checkpoint_in_units);
      } else {
        changed |= int_input("parallel.fsdp2_backward_prefetch", p.fsdp2_backward_prefetch, 1);
        if (p.zero_stage == 3)
          changed |= check_input("parallel.fsdp_shard_embeddings", p.fsdp_shard_embeddings);
      }
      changed |= string_combo("parallel.fsdp_no_sync", p.fsdp_no_sync, {"auto", "true", "false"});
      changed |= int_input("parallel.fsdp_forward_prefetch", p.fsdp_forward_prefetch, 1);
    }
    if (rs.sharding == Sharding::DeepSpeed && p.zero_stage >= 1 && subsection("DeepSpeed buffers")) {
      changed |= int_input("parallel.zero_reduce_bucket_size", p.zero_reduce_bucket_size, 50000000);
      changed |= string_combo("parallel.zero_overlap_comm", p.zero_overlap_comm, {"auto", "true", "false"});
      if (p.zero_stage == 3) {
        changed |= int_input("parallel.zero_prefetch_bucket_size", p.zero_prefetch_bucket_size, 10000000);
        changed |= int_input("parallel.zero_param_persistence_threshold", p.zero_param_persistence_threshold, 10000);
        changed |= int_input("parallel.zero_max_live_parameters", p.zero_max_live_parameters, 100000000);
      }
      ImGui::TreePop();
    }
    changed |= choice_combo("parallel.offload_optimizer", p.offload_optimizer, "");
    changed |= choice_combo("parallel.offload_params", p.offload_params, "");
    if (p.zero_stage == 0 && p.data_parallel_size > 1 && !fsdp && rs.sharding != Sharding::Megatron)
      changed |= check_input("parallel.ddp_gradient_as_bucket_view", p.ddp_gradient_as_bucket_view);
    changed |= int_input("parallel.tensor_parallel_size", p.tensor_parallel_size, 1);
    if (p.tensor_parallel_size > 1)
      changed |= check_input("parallel.sequence_parallel", p.sequence_parallel);
    changed |= int_input("parallel.context_parallel_size", p.context_parallel_size, 1);
    if (c.model.num_experts > 0)
      changed |= int_input("parallel.expert_parallel_size", p.expert_parallel_size, 1);
    changed |= int_input("parallel.pipeline_parallel_size", p.pipeline_parallel_size, 1);
    if (p.pipeline_parallel_size > 1) {
      changed |= choice_combo("parallel.pipeline_schedule", p.pipeline_schedule, "");
      if (p.pipeline_schedule == "interleaved_1f1b")
        changed |= int_input("parallel.virtual_pipeline_stages", p.virtual_pipeline_stages, 1);
      else {
        changed |= int_input("parallel.pipeline_first_stage_layers", p.pipeline_first_stage_layers, 1);
        changed |= int_input("parallel.pipeline_last_stage_layers", p.pipeline_last_stage_layers, 1);
      }
    }
    const long long world = static_cast<long long>(p.data_parallel_size) * p.tensor_parallel_size *
                            p.pipeline_parallel_size * p.context_parallel_size;
    ImGui::TextDisabled("world: %lld GPUs (data x context x tensor x pipeline)", world);
    if (p.gpus) ImGui::TextDisabled("asked for: %lld GPUs (the question's GPUs field)", static_cast<long long>(*p.gpus));
  }
  auto& hw = c.hardware;
  if (section("Hardware")) {
    // The card itself is the question's (panel_question.cpp, with a search box).
    if (hw.gpu == "custom") {
      changed |= int_input("hardware.gpu_memory_bytes", hw.gpu_memory_bytes, int64_t(1) << 30);
    }
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    float headroom = static_cast<float>(hw.headroom_fraction * 100.0);
    if (ImGui::SliderFloat("headroom %", &headroom, 0.0f, 50.0f, "%.0f%%")) {
      hw.headroom_fraction = headroom / 100.0;
      changed = true;
    }
    const std::string headroom_help =
        std::string(field_spec("hardware.headroom_fraction").help) + " Space, then the left and right arrows, changes it; Enter types it.";
    announce_focus(focus_words("headroom", std::to_string(static_cast<int>(headroom + 0.5f)) + " percent, slider",
                               "hardware.headroom_fraction", headroom_help.c_str()));
    help_marker(headroom_help.c_str(), item_has_keyboard_focus());
    changed |= int_input("hardware.gpus_per_node", hw.gpus_per_node, 1);
    changed |= int_input("hardware.host_memory_bytes", hw.host_memory_bytes, int64_t(1) << 30);
    changed |= int_input("hardware.nccl_channels", hw.nccl_channels, 1);
    const Resolved switches = resolve(c);
    changed |= switch_combo("hardware.cuda_module_loading", hw.cuda_module_loading, switches, Switch::CudaModuleLoading);
    changed |= int_input("hardware.cuda_context_bytes", hw.cuda_context_bytes, 64 << 20);
    changed |= switch_combo("hardware.expandable_segments", hw.expandable_segments, switches, Switch::ExpandableSegments);
  }
  return changed;
}

}  // namespace memsim::ui
