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
  const char* help = "What the data-parallel GPUs shard: 1 the optimizer states (ZeRO-1, Megatron's distributed optimizer), "
                     "2 also the gradients (ZeRO-2, FSDP SHARD_GRAD_OP), 3 also the weights (ZeRO-3, FSDP FULL_SHARD). "
                     "Rajbhandari et al. 2020.";
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
    changed |= int_input("data_parallel", "parallel.data_parallel_size", p.data_parallel_size, 1,
                         "GPUs that each train on their own data. With sharding they share the model states. It follows "
                         "from the question's GPUs / (tensor x pipeline x context parallel); set here, it sets the GPUs.");
    const std::string engine(rs.framework->sharding);
    changed |= choice_combo("sharding engine", "parallel.sharding", p.sharding, engine.c_str(),
                            "Whose code shards the states: DeepSpeed ZeRO (flat partitions, reduce buckets), FSDP1 "
                            "(flat parameters per unit), FSDP2 (per-parameter shards, fp32 shards under mixed precision) "
                            "or Megatron (main-grad buffer, distributed optimizer).");
    changed |= stage_combo(p, rs.sharding);
    if (fsdp) {
      changed |= int_input("shard group (HSDP)", "parallel.shard_group_size", p.shard_group_size, 1,
                           "Hybrid sharding: shard within groups of this many GPUs (often one node) and replicate across "
                           "groups. 0 shards over all data-parallel GPUs.");
      if (rs.sharding == Sharding::Fsdp1) {
        changed |= choice_combo("backward prefetch", "parallel.fsdp_backward_prefetch", p.fsdp_backward_prefetch, "",
                                "backward_pre holds the current and the next unit's parameters with the current "
                                "gradients; backward_post and none hold one unit's parameters.");
        changed |= string_combo("use_orig_params", "parallel.fsdp_use_orig_params", p.fsdp_use_orig_params,
                                {"auto", "true", "false"},
                                "true: a unit that trains any tensor (a LoRA Block) keeps gradients for its frozen "
                                "weights too, as if they were not frozen. auto follows the framework (Lightning "
                                "Fabric sets it; FSDP1's own default is false).");
      } else {
        changed |= int_input("backward prefetch", "parallel.fsdp2_backward_prefetch", p.fsdp2_backward_prefetch, 1,
                             "Blocks all-gathered ahead in backward: 1 is FSDP2's own prefetch of the next block, k "
                             "what set_modules_to_backward_prefetch(k blocks) asks for, 0 none.");
        if (p.zero_stage == 3)
          changed |= check_input("embeddings as own units", "parallel.fsdp_shard_embeddings", p.fsdp_shard_embeddings,
                                 "The token embedding and the output layer are FSDP2 units of their own (torchtune's "
                                 "custom_sharded_layers ['tok_embeddings', 'output']): each is resharded after its "
                                 "forward and all-gathered again in backward, instead of staying unsharded in the root.");
      }
      changed |= string_combo("accumulate under no_sync", "parallel.fsdp_no_sync", p.fsdp_no_sync, {"auto", "true", "false"},
                              "true: micro-batches before the last keep unsharded gradients of the whole model (FSDP's "
                              "no_sync(), as HF Trainer and Lightning Fabric accumulate); false: every micro-batch "
                              "reduce-scatters (Accelerate's sync_each_batch=True). auto follows the framework.");
      changed |= int_input("forward prefetch", "parallel.fsdp_forward_prefetch", p.fsdp_forward_prefetch, 1,
                           "Units all-gathered ahead in forward, their parameters held with the current one's: "
                           "FSDP1 forward_prefetch=True is 1; FSDP2 set_modules_to_forward_prefetch(k blocks) is k.");
    }
    if (rs.sharding == Sharding::DeepSpeed && p.zero_stage >= 1 && subsection("DeepSpeed buffers")) {
      changed |= int_input("reduce_bucket_size", "parallel.zero_reduce_bucket_size", p.zero_reduce_bucket_size,
                           50000000, "Elements per gradient bucket (0 = DeepSpeed's 5e8; HF's auto = hidden^2). One "
                                     "bucket, two with overlap_comm, in the model dtype.");
      changed |= string_combo("overlap_comm", "parallel.zero_overlap_comm", p.zero_overlap_comm,
                              {"auto", "true", "false"}, "auto: on for stage 3 only, as DeepSpeed's config validator does.");
      if (p.zero_stage == 3) {
        changed |= int_input("prefetch_bucket", "parallel.zero_prefetch_bucket_size", p.zero_prefetch_bucket_size,
                             10000000, "Elements of the next layer all-gathered ahead (0 = DeepSpeed's 5e7).");
        changed |= int_input("persistence_threshold", "parallel.zero_param_persistence_threshold",
                             p.zero_param_persistence_threshold, 10000,
                             "Parameters smaller than this stay whole on every GPU (0 = DeepSpeed's 1e5).");
        changed |= int_input("max_live_parameters", "parallel.zero_max_live_parameters", p.zero_max_live_parameters,
                             100000000, "At most this many elements are gathered at once, the prefetch included "
                                        "(0 = DeepSpeed's 1e9).");
      }
      ImGui::TreePop();
    }
    changed |= choice_combo("offload optimizer", "parallel.offload_optimizer", p.offload_optimizer, "",
                            "ZeRO-Offload / FSDP CPUOffload: the fp32 master, the optimizer states and the gradient "
                            "shards live in host RAM (or NVMe, DeepSpeed) and the step runs on the CPU.");
    changed |= choice_combo("offload params", "parallel.offload_params", p.offload_params, "",
                            "ZeRO-Infinity / FSDP CPUOffload: parameter shards live in host RAM and are copied in per "
                            "layer. Needs stage 3.");
    if (p.zero_stage == 0 && p.data_parallel_size > 1 && !fsdp && rs.sharding != Sharding::Megatron)
      changed |= check_input("gradient_as_bucket_view", "parallel.ddp_gradient_as_bucket_view", p.ddp_gradient_as_bucket_view,
                             "PyTorch DDP: gradients become views into the all-reduce buckets from the second "
                             "iteration, saving one copy of the gradients.");
    changed |= int_input("tensor_parallel", "parallel.tensor_parallel_size", p.tensor_parallel_size, 1,
                         "Megatron tensor parallelism: attention heads, the MLP and the vocabulary are split over t GPUs; "
                         "norms and the residual stream are not (unless sequence parallel).");
    if (p.tensor_parallel_size > 1)
      changed |= check_input("sequence parallel", "parallel.sequence_parallel", p.sequence_parallel,
                             "Also splits the tokens that norms, dropout and the residual stream hold, by t.");
    changed |= int_input("context_parallel", "parallel.context_parallel_size", p.context_parallel_size, 1,
                         "Ring attention: every GPU holds sequence / cp tokens of each sequence, so activations shrink by "
                         "cp; key/value chunks circulate in small buffers.");
    if (c.model.num_experts > 0)
      changed |= int_input("expert_parallel", "parallel.expert_parallel_size", p.expert_parallel_size, 1,
                           "Each GPU of an expert-parallel group holds num_experts / ep routed experts; tokens travel "
                           "to their experts through all-to-all buffers.");
    changed |= int_input("pipeline_parallel", "parallel.pipeline_parallel_size", p.pipeline_parallel_size, 1,
                         "Layers split into stages on different GPUs. Each stage is its own device below: the first holds "
                         "the embeddings and the most micro-batches in flight, the last the head and the loss.");
    if (p.pipeline_parallel_size > 1) {
      changed |= choice_combo("schedule", "parallel.pipeline_schedule", p.pipeline_schedule, "",
                              "1F1B keeps at most (stages - stage) micro-batches in flight; GPipe all of them; "
                              "interleaved 1F1B runs v model chunks per GPU, holding 1 + (p-1)/(p v) times 1F1B's "
                              "activations on the first stage. Gradient accumulation sets the number of micro-batches.");
      if (p.pipeline_schedule == "interleaved_1f1b")
        changed |= int_input("virtual stages", "parallel.virtual_pipeline_stages", p.virtual_pipeline_stages, 1,
                             "Model chunks per GPU (Megatron's virtual pipeline size).");
      else {
        changed |= int_input("first stage layers", "parallel.pipeline_first_stage_layers", p.pipeline_first_stage_layers, 1,
                             "Uneven split: layers on the first stage, which also holds the embeddings (0 = even).");
        changed |= int_input("last stage layers", "parallel.pipeline_last_stage_layers", p.pipeline_last_stage_layers, 1,
                             "Uneven split: layers on the last stage, which also holds the head and loss (0 = even).");
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
      changed |= int_input("capacity (bytes)", "hardware.gpu_memory_bytes", hw.gpu_memory_bytes, int64_t(1) << 30,
                           "Total memory of the custom GPU, in bytes.");
    }
    ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x * 0.55f);
    float headroom = static_cast<float>(hw.headroom_fraction * 100.0);
    if (ImGui::SliderFloat("headroom %", &headroom, 0.0f, 50.0f, "%.0f%%")) {
      hw.headroom_fraction = headroom / 100.0;
      changed = true;
    }
    const char* headroom_help = "Memory kept free for what no model predicts (other processes, allocator spikes). "
                                "Practitioners budget 10-15%; memsim's own uncertainty is the band under each verdict, "
                                "which says how much to keep free for this setup, and the verdict fits only when the "
                                "band's top is under this line. Space, then the left and right arrows, changes it; Enter "
                                "types it.";
    announce_focus(focus_words("headroom", std::to_string(static_cast<int>(headroom + 0.5f)) + " percent, slider",
                               "hardware.headroom_fraction", headroom_help));
    help_marker(headroom_help, item_has_keyboard_focus());
    changed |= int_input("GPUs per node (at most)", "hardware.gpus_per_node", hw.gpus_per_node, 1,
                         "The most GPUs one host holds: a setup on fewer GPUs takes one node of that many; more take "
                         "GPUs / this nodes, rounded up (the question's nodes field sets it). The offloaded states of "
                         "a node's GPUs share its RAM.");
    changed |= int_input("host RAM per node (bytes)", "hardware.host_memory_bytes", hw.host_memory_bytes, int64_t(1) << 30,
                         "With offload, the node's RAM the offloaded states must fit in; 0 shows the need without a "
                         "verdict.");
    changed |= int_input("NCCL channels", "hardware.nccl_channels", hw.nccl_channels, 1,
                         "NCCL's buffers (outside PyTorch's allocator) grow with channels x communicators: about 18 MiB "
                         "per channel per communicator. NCCL's log says \"N coll channels\".");
    const Resolved switches = resolve(c);
    changed |= switch_combo("CUDA module loading", "hardware.cuda_module_loading", hw.cuda_module_loading, switches,
                            Switch::CudaModuleLoading,
                            "lazy (CUDA 11.7+ with PyTorch 1.13+, the default) loads kernels on first use: a context of "
                            "254 MiB (PyTorch PR #86509), 767 MiB on Hopper after real training steps (memsim's own "
                            "H200 calibration); eager (older CUDA or PyTorch) loads them all: 616 MiB.");
    changed |= int_input("CUDA context (bytes)", "hardware.cuda_context_bytes", hw.cuda_context_bytes, 64 << 20,
                         "Memory the CUDA context and its loaded kernels take outside PyTorch's allocator; 0 uses the "
                         "measured default for the GPU and module loading (254 MiB lazy; 767 MiB lazy on Hopper). Old "
                         "CUDA loads eagerly: 0.7-1.4 GiB.");
    changed |= switch_combo("expandable segments", "hardware.expandable_segments", hw.expandable_segments, switches,
                            Switch::ExpandableSegments,
                            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (auto: on where the launcher sets it, "
                            "torchtitan's run_train.sh): one segment per stream that grows by mapping 20 MiB pages "
                            "(2 MiB for requests up to 1 MiB), instead of one cudaMalloc per segment. No segment "
                            "rounding, but a freed block between live ones stays mapped, so reserved can come out lower "
                            "or higher than the default.");
  }
  return changed;
}

}  // namespace memsim::ui
