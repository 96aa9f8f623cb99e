#include "simulate.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#if MEMSIM_THREADS
#include <thread>
#endif

#include "allocator.h"
#include "architecture.h"
#include "band.h"
#include "checked.h"
#include "format.h"
#include "model.h"
#include "run_replay.h"
#include "tables.h"
#include "train_step.h"
#include "vllm_server.h"

namespace memsim {

int64_t Breakdown::total() const {
  int64_t t = add(add(fragmentation_bytes, cuda_context_bytes), nccl_bytes);
  for (int64_t b : allocator) t = add(t, b);
  return t;
}

namespace {

// NCCL allocates its own device buffers per communicator (outside PyTorch's allocator, so they show in nvidia-smi
// but not in memory_reserved): for every channel, one receive connection for the ring and one for the tree,
// each holding the three protocols' buffers (nccl src/init.cc computeBuffSizes: DEFAULT_LL_BUFFSIZE =
// 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, DEFAULT_LL128_BUFFSIZE = 120 x 640 x 8 x 8 B = 4,800 KiB,
// DEFAULT_BUFFSIZE = 4 MiB). Point-to-point (pipeline) sends use the SIMPLE buffer on "2 p2p channels per peer"
// towards each of 2 peers. The collective channel count is hardware.nccl_channels; 8-GPU nodes' NCCL INFO lines
// quoted in public issues commonly read "16 coll channels, ... 16 p2p channels, 2 p2p channels per peer" (NVLink
// and NVLS H100 nodes, EFA and InfiniBand clusters).
constexpr int64_t kNcclConnectionBytes = 524288 + 4915200 + 4194304;
constexpr int64_t kNcclP2pChannelsPerPeer = 2;
int64_t nccl_bytes(const Config& c) {
  const auto& p = c.parallel;
  const int64_t ch = c.hardware.nccl_channels;
  int64_t comms = 0;
  const int64_t shard = p.shard_group_size > 0 ? p.shard_group_size : p.data_parallel_size;
  for (int64_t size : {shard * p.context_parallel_size, p.tensor_parallel_size, p.context_parallel_size,
                       p.expert_parallel_size, p.shard_group_size > 0 ? p.data_parallel_size / p.shard_group_size : 1})
    if (size > 1) ++comms;
  int64_t bytes = mul(mul(comms, ch), mul(2, kNcclConnectionBytes));
  if (p.pipeline_parallel_size > 1) bytes = add(bytes, mul(mul(2, kNcclP2pChannelsPerPeer), 4194304));
  return bytes;
}

int32_t request(CachingAllocator& a, int64_t bytes, int stream) { return a.malloc(bytes, -1, stream); }
int32_t request(ExpandableSegmentsAllocator& a, int64_t bytes, int stream) { return a.malloc(bytes, stream); }

// Replays the program through the allocator model. The peak, the breakdown at the peak and the timeline all
// come from this one pass. `d` is fresh; its peak and timeline are kept in locals during the loop, which the
// compiler can hold in registers across the allocator's calls. A template over the allocator, so that the default
// one's replay is the same code it was before expandable segments were modelled.
template <class Allocator>
void replay_with(Allocator& alloc, const StepProgram& prog, DeviceResult& d) {
  std::vector<int32_t> handle(prog.tensors.size(), -1);
  std::array<int64_t, kComponentCount> live{};
  std::array<int64_t, kComponentCount> at_peak{};
  int64_t peak_allocated = 0, peak_reserved = 0, peak_requested = 0;
  uint32_t peak_event = 0;
  std::vector<TimelinePoint> timeline;
  timeline.reserve(prog.events.size());
  const uint32_t n = static_cast<uint32_t>(prog.events.size());
  for (uint32_t i = 0; i < n; ++i) {
    const Event& e = prog.events[i];
    const int comp = static_cast<int>(e.component);
    if (e.op == Event::Op::Alloc) {
      const Tensor& t = prog.tensors[e.tensor];
      int32_t h = request(alloc, t.bytes, static_cast<int>(t.stream));
      if (h < 0) {
        // An OOM: the real step would stop here. Report the peak so far and flag it.
        d.oom = true;
        peak_event = i;
        d.peak_label = prog.labels[prog.tensors[e.tensor].label];
        break;
      }
      handle[e.tensor] = h;
      live[comp] += alloc.block_bytes(h);
    } else if (e.op == Event::Op::EmptyCache) [[unlikely]] {
      alloc.empty_cache();
    } else if (handle[e.tensor] >= 0) {
      live[comp] -= alloc.block_bytes(handle[e.tensor]);
      alloc.free(handle[e.tensor]);
      handle[e.tensor] = -1;
    }
    timeline.push_back({alloc.allocated_bytes(), alloc.reserved_bytes()});
    if (alloc.allocated_bytes() > peak_allocated) {  // the label is looked up once, after the loop
      peak_allocated = alloc.allocated_bytes();
      at_peak = live;
      peak_event = i;
    }
    peak_reserved = std::max(peak_reserved, alloc.reserved_bytes());
    peak_requested = std::max(peak_requested, alloc.requested_bytes());
  }
  d.timeline = std::move(timeline);
  d.peak.allocated_bytes = peak_allocated;
  d.peak.reserved_bytes = peak_reserved;
  d.peak.requested_bytes = peak_requested;
  d.breakdown.allocator = at_peak;
  d.peak_event = peak_event;
  if (!d.oom && d.peak_event < prog.events.size())
    d.peak_label = prog.labels[prog.tensors[prog.events[d.peak_event].tensor].label];
  d.peak.active_bytes = d.peak.allocated_bytes;  // one stream, no record_stream: active == allocated
  for (auto p = prog.phases.rbegin(); p != prog.phases.rend(); ++p)  // the last phase that began by the peak
    if (p->first_event <= d.peak_event) {
      d.peak_phase = p->name;
      break;
    }
}

// hardware.expandable_segments picks the allocator model. gpu_total_bytes sizes an expandable segment's address
// space (9/8 of the GPU's memory).
void replay(const StepProgram& prog, DeviceResult& d, int64_t allocator_capacity, bool expandable, int64_t gpu_total_bytes) {
  if (expandable) {
    ExpandableSegmentsAllocator alloc(allocator_capacity, gpu_total_bytes);
    replay_with(alloc, prog, d);
  } else {
    CachingAllocator alloc(allocator_capacity);
    replay_with(alloc, prog, d);
  }
}

// Runs f(0), ..., f(n - 1), spread over the machine's cores where the build has threads (MEMSIM_THREADS: the
// native builds; the web page's wasm is built without them). The exception of the lowest index that throws is
// rethrown once the others have stopped, and indices above it are skipped, as a plain loop would: the outcome does
// not depend on the threads' timing.
template <class F>
void for_each_index(size_t n, F&& f) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> first_error{n};
  auto run = [&](size_t i) {
    if (i > first_error.load(std::memory_order_relaxed)) return;
    try {
      f(i);
    } catch (...) {
      errors[i] = std::current_exception();
      for (size_t seen = first_error.load(); i < seen && !first_error.compare_exchange_weak(seen, i);) {
      }
    }
  };
  size_t workers = 1;
#if MEMSIM_THREADS
  workers = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (workers > 1) {
    std::atomic<size_t> next{0};
    auto loop = [&] {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) run(i);
    };
    std::vector<std::thread> threads;
    try {
      threads.reserve(workers - 1);
      for (size_t w = 1; w < workers; ++w) threads.emplace_back(loop);
    } catch (...) {  // no more threads to be had: the ones started and this one do the rest
    }
    loop();
    for (auto& t : threads) t.join();
  }
#endif
  if (workers <= 1)
    for (size_t i = 0; i < n; ++i) run(i);
  if (first_error.load() < n) std::rethrow_exception(errors[first_error.load()]);
}

// What a device's result holds before any replay: its role, model states, capacity and what sits outside the
// allocator.
DeviceResult device_shell(const StepContext& ctx, std::string role) {
  const Config& config = ctx.config;
  const GpuSpec* gpu = ctx.gpu;
  const auto& par = config.parallel;
  DeviceResult d;
  d.role = std::move(role);
  d.device_count = mul(mul(par.data_parallel_size, par.tensor_parallel_size), par.context_parallel_size);
  d.model_states = model_state_bytes(ctx);
  const HostStates hs = host_state_bytes(ctx);
  d.host_bytes = hs.host_bytes;
  d.nvme_bytes = hs.nvme_bytes;
  d.capacity_bytes = gpu_total_bytes(config, gpu);
  d.usable_bytes = static_cast<int64_t>(static_cast<double>(d.capacity_bytes) * (1.0 - config.hardware.headroom_fraction));
  d.breakdown.cuda_context_bytes = context_bytes(config, gpu, resolve(config).lazy_module_loading);
  d.breakdown.nccl_bytes = nccl_bytes(config);
  return d;
}

// What cudaMalloc can hand out: the GPU less what sits outside the caching allocator.
int64_t allocator_capacity(const DeviceResult& d) {
  return std::max<int64_t>(0, d.capacity_bytes - d.breakdown.cuda_context_bytes - d.breakdown.nccl_bytes);
}

void device_finish(DeviceResult& d) {
  d.breakdown.fragmentation_bytes = d.peak.reserved_bytes - d.peak.allocated_bytes;
  d.peak.device_bytes = add(add(d.peak.reserved_bytes, d.breakdown.cuda_context_bytes), d.breakdown.nccl_bytes);
  d.fits = !d.oom && d.peak.device_bytes <= d.usable_bytes;
}

// The replay's outcome, where the peak fell, from `from` into `d`.
void take_peak(DeviceResult& d, DeviceResult& from) {
  d.timeline = std::move(from.timeline);
  d.program = std::move(from.program);
  d.peak_event = from.peak_event;
  d.peak_label = from.peak_label;
  d.peak_phase = from.peak_phase;
}

// One pipeline stage's device with a fixed shape: its two steps, built at once and replayed. Stages share nothing
// but the (read-only) config and model shape, so they can run on different threads.
DeviceResult simulate_device(const StepContext& ctx, std::string role) {
  DeviceResult d = device_shell(ctx, std::move(role));
  const int64_t capacity = allocator_capacity(d);
  const bool expandable = resolve(ctx.config).expandable_segments;
  d.program = build_train_step(ctx);
  // Replay without a capacity limit first: that is what the step needs. Only when its reserved peak exceeds
  // the GPU but its allocated peak does not can the allocator's cache release decide between fitting and an
  // OOM, so only then is the step replayed again against the real capacity. Where even the allocated peak
  // exceeds the GPU, the step runs out of memory at the first event past the capacity.
  // (The unlimited replay gives expandable segments an address space as unlimited as its memory, so that a
  // tensor larger than the GPU still shows the step's whole allocated peak; the limited one uses the GPU's.)
  replay(d.program, d, int64_t{1} << 62, expandable, int64_t{1} << 58);
  if (d.peak.allocated_bytes > capacity) {
    d.oom = true;
    for (uint32_t i = 0; i < d.timeline.size(); ++i)
      if (d.timeline[i].allocated_bytes > capacity) {
        d.oom_event = i;
        break;
      }
  } else if (d.peak.reserved_bytes > capacity) {
    DeviceResult limited;
    replay(d.program, limited, capacity, expandable, d.capacity_bytes);
    if (limited.oom) {
      d.oom = true;
      d.oom_event = limited.peak_event;
    } else {  // the cache release kept it within the GPU: the limited replay is what happens
      d.timeline = std::move(limited.timeline);
      d.peak = limited.peak;
      d.breakdown.allocator = limited.breakdown.allocator;
      d.peak_event = limited.peak_event;
      d.peak_label = limited.peak_label;
      d.peak_phase = limited.peak_phase;
    }
  }
  device_finish(d);
  return d;
}

}  // namespace

int64_t gpu_total_bytes(const Config& c, const GpuSpec* gpu) {
  return c.hardware.gpu_memory_bytes > 0 ? c.hardware.gpu_memory_bytes : gpu ? gpu->memory_bytes : 0;
}
int64_t context_bytes(const Config& c, const GpuSpec* gpu, bool lazy_module_loading) {
  return c.hardware.cuda_context_bytes > 0 ? c.hardware.cuda_context_bytes
                                           : cuda_context_bytes(gpu ? gpu->compute_capability : 0, !lazy_module_loading);
}

int64_t cuda_context_bytes(int compute_capability, bool eager) {
  if (eager) return kCudaContextEagerBytes;  // only measured on pre-Hopper GPUs; no generation data for eager
  return compute_capability == 90 ? kCudaContextHopperLazyBytes : kCudaContextLazyBytes;
}

// Everything a simulation holds while it runs: contexts refer to config and shape, so the state stays in one place.
struct Simulation::State {
  Config config;
  std::shared_ptr<const ModelShape> shape;  // shared with layout_shape's cache
  Result r;
  std::vector<StepContext> contexts;
  std::vector<std::string> roles;
  bool done = false;
  // A run of varying shapes (one device: runs have no pipeline): one plan per order of the data (run_shuffles),
  // each replayed without a capacity limit (what the run needs); then the median order's, where only its cache
  // exceeds the GPU, against the real capacity.
  std::vector<RunPlan> plans;
  std::vector<DeviceResult> unlimited;  // the finished unlimited passes, one per plan so far
  size_t chosen = 0;                    // the plan whose pass the result shows: the median reserved peak
  int64_t run_orders = 0;               // the orders asked for (Simulation's argument; 0: run_shuffles)
  size_t allocated_high_at = 0;         // the order with the highest allocated peak
  RunTrace orders;                      // the orders' range (shuffles and shuffle_*), once every order is replayed
  std::unique_ptr<RunReplay> pass;
  bool limited = false;
  DeviceResult device;
  std::string colocated_refusal;  // a colocated vLLM engine that would not start (vllm_server.h): why
};

namespace {

// The fields that decide a layout's model shape.
struct ShapeKey {
  ModelConfig model;
  PeftConfig peft;
  bool quantize_head = false, projector = false, vision_tower = false, unit_gradients = false, experts_parameters = false;
  int64_t tensor_parallel = 1, expert_parallel = 1;
  bool operator==(const ShapeKey&) const = default;
};
// The model shape on one rank, and the whole model's parameter counts.
struct LayoutShape {
  std::shared_ptr<const ModelShape> shape;
  int64_t params_total = 0, params_trainable = 0;
};

// The last few layouts' shapes, kept: the page, What helps and the Fit explorer simulate one model again and again
// with other training fields, and the shape of a program with many block kinds (FLUX.1's: a thousand named
// parameters) took a twentieth of its step's simulation to build. Shapes are immutable once built.
LayoutShape layout_shape(const Config& config, const Resolved& rs) {
  ShapeKey key{config.model, config.peft, rs.framework->bnb_via_lightning, projector_trains(config.training, config.peft),
               config.training.train_vision_tower, fsdp1_unit_gradients(config), rs.moe_experts_parameters,
               config.parallel.tensor_parallel_size, config.parallel.expert_parallel_size};
  static std::mutex recent_mutex;
  static std::array<std::pair<ShapeKey, LayoutShape>, 4> recent;  // most recently used first
  {
    const std::lock_guard<std::mutex> lock(recent_mutex);
    for (size_t i = 0; i < recent.size(); ++i)
      if (recent[i].second.shape && recent[i].first == key) {
        std::rotate(recent.begin(), recent.begin() + static_cast<std::ptrdiff_t>(i), recent.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        return recent.front().second;
      }
  }
  auto shape = std::make_shared<ModelShape>(model_shape_of(config.model));  // a model program is decoded again: validation found no error in it
  if (key.experts_parameters) mark_expert_parameters(*shape);
  apply_peft(*shape, config.peft, key.quantize_head);
  apply_vision_training(*shape, key.projector, key.vision_tower);
  if (key.unit_gradients) mark_unit_gradients(*shape);
  LayoutShape out;
  out.params_total = shape->params_total;
  out.params_trainable = trainable_numel(*shape);
  apply_tensor_parallel(*shape, config.model, key.tensor_parallel);  // per rank from here
  apply_expert_parallel(*shape, key.expert_parallel);
  out.shape = std::move(shape);
  const std::lock_guard<std::mutex> lock(recent_mutex);
  std::rotate(recent.begin(), recent.end() - 1, recent.end());
  recent.front() = {std::move(key), out};
  return out;
}

// The devices of a layout: the model shape on one rank and a context per pipeline stage.
void set_up(Simulation::State& st) {
  const Config& config = st.config;
  Result& r = st.r;
  const Resolved rs = resolve(config);
  const LayoutShape layout = layout_shape(config, rs);
  st.shape = layout.shape;
  const ModelShape& shape = *st.shape;
  r.params_total = layout.params_total;
  r.params_trainable = layout.params_trainable;
  const GpuSpec* gpu = find_gpu(config.hardware.gpu);
  const auto& par = config.parallel;
  const int64_t stages = par.pipeline_parallel_size;
  const bool interleaved = stages > 1 && par.schedule() == PipelineSchedule::Interleaved1F1B;
  // Layers per stage: Megatron's even split (the remainder to the first stages here), or the uneven split of
  // decoder_first/last_pipeline_num_layers with the rest shared evenly (validated to divide).
  std::vector<int64_t> counts(static_cast<size_t>(stages), shape.num_layers / stages);
  for (int64_t i = 0; i < shape.num_layers % stages; ++i) ++counts[static_cast<size_t>(i)];
  if (!interleaved && (par.pipeline_first_stage_layers > 0 || par.pipeline_last_stage_layers > 0)) {
    const int64_t first = par.pipeline_first_stage_layers, last = par.pipeline_last_stage_layers;
    const int64_t middle = stages - (first > 0) - (last > 0);
    const int64_t each = middle > 0 ? (shape.num_layers - first - last) / middle : 0;
    for (auto& c : counts) c = each;
    if (first > 0) counts.front() = first;
    if (last > 0) counts.back() = last;
  }
  const int64_t chunks = stages * par.virtual_pipeline_stages;
  if (interleaved) {  // stage st holds model chunks j p + st
    for (int64_t st = 0; st < stages; ++st) {
      int64_t n = 0;
      for (int64_t j = 0; j < par.virtual_pipeline_stages; ++j) {
        const auto [f, end] = interleaved_chunk(shape.num_layers, chunks, j * stages + st);
        n += end - f;
      }
      counts[static_cast<size_t>(st)] = n;
    }
  }
  int64_t next_layer = 0;
  for (int64_t stage = 0; stage < stages; ++stage) {
    const int64_t count = counts[static_cast<size_t>(stage)];
    StepContext ctx{config, shape, *find_precision(config.training.precision), *find_optimizer(config.training.optimizer),
                    gpu};
    ctx.stage = stage;
    ctx.first_layer = next_layer;
    ctx.end_layer = next_layer + count;
    ctx.has_pre = stage == 0;
    ctx.has_post = stage == stages - 1;
    next_layer += count;
    std::string layers = std::to_string(ctx.first_layer) + "-" + std::to_string(ctx.end_layer - 1);
    if (interleaved) {
      layers.clear();
      for (int64_t j = 0; j < par.virtual_pipeline_stages; ++j) {
        const auto [f, end] = interleaved_chunk(shape.num_layers, chunks, j * stages + stage);
        layers += (j ? ", " : "") + std::to_string(f) + "-" + std::to_string(end - 1);
      }
    }
    st.roles.push_back(stages == 1 ? "every GPU"
                                   : "pipeline stage " + std::to_string(stage + 1) + " of " + std::to_string(stages) +
                                         " (layers " + layers + (ctx.has_pre ? ", embeddings" : "") +
                                         (ctx.has_post ? ", head and loss" : "") + ")");
    st.contexts.push_back(ctx);
  }
  // Which stated version set which switch (frameworks.cpp resolve()); none while every version is latest.
  const std::vector<std::string> from_versions = version_notes(config);
  r.notes.insert(r.notes.end(), from_versions.begin(), from_versions.end());
  if (config.training.zero_grad_before_backward() && !rs.zero_grad_before_backward)
    r.notes.push_back("training.zero_grad_at before_backward: no effect here, DeepSpeed's ZeRO engine and Megatron clear "
                      "their gradient buffers inside their own step whatever the loop calls");
  // FSDP2 over one GPU (one_rank_fsdp2): communication buffers and gradient shards on a single GPU need saying.
  if (!st.contexts.empty())
    if (const ShardPlan sp = shard_plan(st.contexts.front()); sp.fsdp && sp.n == 1)
      r.notes.push_back(std::string("parallel.sharding fsdp2 on one GPU: ") + std::string(rs.framework->label) +
                        " applies fully_shard whatever the world size, so its fp32 parameters are shards of a one-rank "
                        "mesh; each unit is " +
                        (rs.fsdp2_one_rank_skips_all_gather ? "cast into a 16-bit copy while it runs (torch 2.9 skips the one-rank all-gather)"
                                                            : "all-gathered into a 16-bit copy while it runs, as on several ranks (before torch 2.9)") +
                        ", and the fp32 gradients come out of a reduce-scatter, in that stream's own pool");
  // A frozen reference copy has a breakdown row of its own: say how it is placed.
  if (!st.contexts.empty())
    if (const int64_t ref = reference_copy_bytes(st.contexts.front()); ref > 0) {
      const ShardPlan sp = shard_plan(st.contexts.front());
      const bool sharded = resolve(config).preference.reference_sharded && sp.shard_weights && sp.n > 1;
      r.notes.push_back("training.reference_model copy: the frozen reference model holds " + format_bytes(ref) +
                        " per GPU (" + (sharded ? "sharded like the policy's weights" : "a whole copy on every GPU") + ")");
    }
  if (!st.contexts.empty())
    if (const int64_t reward = reward_model_bytes(st.contexts.front()); reward > 0)
      r.notes.push_back("training.reward_model same_as_policy: the frozen reward model holds " + format_bytes(reward) +
                        " per GPU (" + (resolve(config).rollout.reward_sharded && config.parallel.zero_stage == 3
                                            ? "ZeRO-3 sharded, prepare_deepspeed" : "whole on every GPU") +
                        ") and scores " + (config.training.ppo() ? "each chunk of responses" : "the whole generation batch") +
                        " in one forward");
  // PPO's value model trains beside the policy (ppo_step.cpp): its parameters are not in params_trainable, which counts
  // the policy's.
  if (config.training.ppo()) {
    const ModelShape value = value_model_shape(value_model_config(config));
    int64_t trainable = trainable_numel(value);  // its trunk: a score head of hidden x 1 instead of lm_head
    for (const auto& t : value.post)
      if (!t.frozen && t.name.rfind("lm_head", 0) == 0) trainable -= t.numel;
    r.notes.push_back("training.objective ppo: the value model trains " +
                      std::string(config.training.value_model_peft() ? "its adapters (training.value_model peft)" : "in full") +
                      " beside the policy, " + format_params(trainable) +
                      " more trainable parameters, never checkpointed; its weights, gradients and optimizer states count with the "
                      "policy's in the breakdown, and its tensors and phases are named \"value model\" on the timeline");
  }
  // A colocated vLLM engine that vLLM would not start (no memory for the cache blocks, or a KV cache too small for one
  // request of its max_model_len): the training GPUs do not fit, whatever their peak (finish()).
  if (!st.contexts.empty())
    if (const EngineBytes e = engine_bytes(st.contexts.front()); e.active) {
      if (e.trainer_at_start > 0)
        r.notes.push_back(describe_version(stack_versions(config.versions), Library::Vllm) +
                          ": gpu_memory_utilization caps the whole process (vLLM's V1 engine before 0.9.1), and the "
                          "trainer's weights on the GPU when the engine starts (" + format_bytes(e.trainer_at_start) +
                          ": the policy, and its reference copy if any) come out of its share, which leaves the "
                          "engine " + format_bytes(e.total));
      const VllmRefusal refused = colocated_vllm_refusal(config, e.total, e.weights);
      if (!refused.note.empty()) r.notes.push_back(refused.note);
      st.colocated_refusal = refused.refusal;
    }
  if (config.data.varies())
    for (int64_t k = 0, n = st.run_orders > 0 ? std::min(st.run_orders, run_shuffles(config)) : run_shuffles(config);
         k < n; ++k)
      st.plans.push_back(plan_run(config, k));
}

// The data shape the config leaves unstated (band.h data_shape_unstated): an HF-style fine-tune pads each batch to
// its longest sample, so batches of many lengths leave cached blocks that later, longer batches cannot reuse, and
// reserved memory grows over the run. The same config replayed as a short run of varying lengths (the run replay
// models exactly that cache) gives the band's top for reserved and nvidia-smi memory; the peaks of the fixed shape
// stay what they are. The run is bounded (kUnsetDataMicroBatches), so that the page can still simulate on every edit.
void replay_unstated_data(const Config& config, Result& r) {
  const Config run_config = unstated_data_run(config);
  const std::string assumed = "band: the data's lengths are not stated (training.framework " + config.training.framework +
                              " pads each batch to its longest sample unless the data is packed)";
  const auto errors = validate(run_config);
  if (!errors.empty()) {
    r.notes.push_back(assumed + ", and a run of varying lengths cannot be replayed here (" + errors.front().message +
                      "): the band does not include the growth of reserved memory such a run shows");
    return;
  }
  // One order of the data: the lengths are a guess (uniform over the whole range), and the page runs this on every edit.
  const Result run = simulate(run_config, 1);
  if (!run.ok || run.devices.size() != 1) return;
  const DeviceResult& rd = run.devices.front();
  for (auto& d : r.devices) {
    d.band.data_run_reserved_bytes = rd.peak.reserved_bytes;
    d.band.data_run_device_bytes = rd.peak.device_bytes;
    d.band.data_run_oom = rd.oom;
  }
  const int64_t fixed_reserved = r.devices.empty() ? 0 : r.devices.front().peak.reserved_bytes;
  r.notes.push_back(assumed + ": memsim replayed " + std::to_string(kUnsetDataMicroBatches) +
                    " micro-batches of samples whose lengths are uniform from " +
                    std::to_string(unstated_shortest_sample(config)) + " to " +
                    std::to_string(config.training.sequence_length) + " tokens, and that run " +
                    (rd.oom ? "runs out of memory" : "reserves " + format_bytes(rd.peak.reserved_bytes)) +
                    " (the fixed shape reserves " + format_bytes(fixed_reserved) +
                    "); the band's top for reserved and nvidia-smi memory includes it, and a longer run can reserve "
                    "more, up to the GPU's memory, where the allocator releases its cache. Set data.padding=max_length "
                    "if every batch is padded or packed to " +
                    std::to_string(config.training.sequence_length) +
                    " tokens, or describe the lengths in the data section for the run's own answer.");
}

// The vLLM server's GPUs (vllm_server.h), a device of their own after the training GPUs: the engine's weights and KV
// cache replayed through the allocator. vLLM claims its share by design, so no headroom is kept there: they fit when
// vLLM starts (VllmServerPlan::failure), and their band is the share itself, not the published cases' errors.
void add_vllm_server(Simulation::State& st) {
  const Config& config = st.config;
  if (st.contexts.empty() || !config.training.rollout() || config.training.engine() != GenerationEngine::VllmServer) return;
  DeviceResult d = device_shell(st.contexts.front(), "");
  const VllmServerPlan plan = plan_vllm_server(config, d.capacity_bytes, d.breakdown.cuda_context_bytes);
  d.role = plan.role;
  d.device_count = mul(plan.tensor_parallel, plan.data_parallel);
  d.fixed_share = true;
  d.model_states = {};
  d.model_states.weights_bytes = plan.weights_bytes;
  d.host_bytes = d.nvme_bytes = 0;
  d.breakdown.nccl_bytes = 0;
  d.usable_bytes = d.capacity_bytes;
  d.program = vllm_server_program(plan);
  replay(d.program, d, int64_t{1} << 62, false, int64_t{1} << 58);
  device_finish(d);
  d.refusal = plan.refusal;
  d.fits = d.fits && plan.failure.empty();
  d.verdict = d.fits ? Verdict::Fits : Verdict::DoesNotFit;
  const int64_t stats[kBandStatistics] = {d.peak.allocated_bytes, d.peak.reserved_bytes, d.peak.active_bytes,
                                          d.peak.device_bytes};
  d.band.valid = true;
  for (int i = 0; i < kBandStatistics; ++i) d.band.stats[static_cast<size_t>(i)].low_bytes = d.band.stats[static_cast<size_t>(i)].high_bytes = stats[i];
  st.r.notes.push_back(plan.note);
  if (!plan.failure.empty()) st.r.notes.push_back("training.generation_engine vllm_server: " + plan.failure);
  st.r.devices.push_back(std::move(d));
}

// Host RAM per node under offload, once every device is simulated: every GPU of a node keeps its offloaded states
// there. Nodes hold consecutive ranks; with pipeline stages on different nodes the largest stage sets the need.
void finish(Simulation::State& st) {
  Result& r = st.r;
  const auto& par = st.config.parallel;
  const auto& hw = st.config.hardware;
  r.model_states = r.devices.front().model_states;
  const int64_t world = mul(mul(mul(par.data_parallel_size, par.tensor_parallel_size), par.pipeline_parallel_size),
                            par.context_parallel_size);
  r.host.gpus_per_node = std::min(hw.gpus_per_node, world);
  r.host.nodes = ceil_div(world, hw.gpus_per_node);
  int64_t host = 0, nvme = 0;
  for (const auto& d : r.devices) host = std::max(host, d.host_bytes), nvme = std::max(nvme, d.nvme_bytes);
  r.host.per_node_bytes = mul(host, r.host.gpus_per_node);
  r.host.nvme_per_node_bytes = mul(nvme, r.host.gpus_per_node);
  r.host.capacity_bytes = hw.host_memory_bytes;
  r.host.fits = hw.host_memory_bytes == 0 || r.host.per_node_bytes <= hw.host_memory_bytes;
  r.ok = true;
  st.done = true;
  if (data_shape_unstated(st.config)) replay_unstated_data(st.config, r);
  apply_bands(r, st.config, residual_table());
  if (!st.colocated_refusal.empty())
    for (auto& d : r.devices) d.refusal = st.colocated_refusal, d.fits = false, d.verdict = Verdict::DoesNotFit;
  add_vllm_server(st);
}

// The index of the pass with the median reserved peak (the lower middle of an even count; ties: the earlier).
size_t median_reserved(const std::vector<DeviceResult>& passes) {
  std::vector<size_t> order(passes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return passes[a].peak.reserved_bytes < passes[b].peak.reserved_bytes;
  });
  return order[(order.size() - 1) / 2];
}

// A finished pass's peaks, run trace and peak step into d, with the range of the orders of the data replayed.
void take_pass(DeviceResult& d, DeviceResult& p, const RunTrace& orders) {
  d.peak = p.peak;
  d.breakdown.allocator = p.breakdown.allocator;
  d.run = std::move(p.run);
  d.run.shuffles = orders.shuffles;
  d.run.shuffle_reserved_low_bytes = orders.shuffle_reserved_low_bytes;
  d.run.shuffle_reserved_high_bytes = orders.shuffle_reserved_high_bytes;
  d.run.shuffle_allocated_high_bytes = orders.shuffle_allocated_high_bytes;
  take_peak(d, p);
}

// The band and the note of a run replayed in several orders of the data (st.unlimited's passes, d the one shown).
// The orders' reserved peaks widen the reserved and nvidia-smi band. Where the shown order was replayed against the
// GPU (its cache outgrew it and was released), no order can reserve more than the GPU: the orders' peaks without
// that limit are capped there. An order whose allocated peak exceeds the GPU runs out of memory whatever its cache
// does: the band's top is then above the GPU, so that the verdict cannot be "fits".
void order_band(Simulation::State& st, DeviceResult& d) {
  const int64_t capacity = allocator_capacity(d);
  const int64_t above_reserved = d.peak.device_bytes - d.peak.reserved_bytes;  // the CUDA context and the rest
  const int64_t low = std::min(d.peak.reserved_bytes, d.run.shuffle_reserved_low_bytes);
  int64_t high = d.run.shuffle_reserved_high_bytes;
  if (st.limited) high = std::max(d.peak.reserved_bytes, std::min(high, capacity));
  high = std::max(high, d.run.shuffle_allocated_high_bytes);
  d.band.data_run_reserved_bytes = high;
  d.band.data_run_device_bytes = high + above_reserved;
  d.band.data_run_reserved_low_bytes = low;
  d.band.data_run_device_low_bytes = low + above_reserved;
  d.band.data_run_oom = d.run.shuffle_allocated_high_bytes > capacity;
  const std::string seeds = "data.seed " + std::to_string(st.config.data.seed) + "'s own order and " +
                            std::to_string(d.run.shuffles - 1) + " more drawn from it";
  std::string note = "data: the run was replayed in " + std::to_string(d.run.shuffles) + " orders of the data (" + seeds +
                     "); the result is order " + std::to_string(st.chosen + 1) + ", the median reserved peak, and the orders reserve " +
                     format_bytes(d.run.shuffle_reserved_low_bytes) + " to " + format_bytes(d.run.shuffle_reserved_high_bytes);
  if (st.limited)
    note += " without the GPU's limit (replayed against it, order " + std::to_string(st.chosen + 1) + " reserves " +
            format_bytes(d.peak.reserved_bytes) + ")";
  note += ": which batch comes when decides what the cache holds by the longest ones; the band includes them";
  if (d.band.data_run_oom && !d.oom)
    note += ". Order " + std::to_string(st.allocated_high_at + 1) + " allocates " + format_bytes(d.run.shuffle_allocated_high_bytes) +
            ", more than the GPU holds: in that order of the data the run runs out of memory";
  st.r.notes.push_back(note);
}

// A run's next steps. The same decisions as a fixed shape's replay (simulate_device), each made over the whole
// run: an allocated peak above the GPU runs out of memory; a reserved peak above it is replayed again against the
// real capacity, where the cache releases decide between fitting and running out of memory. The run is replayed
// once per order of the data (run_shuffles); the result shows the order with the median reserved peak, and the
// others' reserved peaks widen the band (d.band.data_run_*).
bool advance_run(Simulation::State& st, int64_t steps) {
  const StepContext& ctx = st.contexts.front();
  DeviceResult& d = st.device;
  const bool expandable = resolve(st.config).expandable_segments;
  if (!st.limited) {
    if (steps == INT64_MAX && !st.pass && st.unlimited.empty()) {
      // The whole run at once (simulate(), not the page's frames): the orders are independent passes that share
      // only the read-only context, so they run on the machine's cores.
      st.unlimited.resize(st.plans.size());
      for_each_index(st.plans.size(), [&](size_t k) {
        RunReplay pass(ctx, st.plans[k], int64_t{1} << 62, expandable, int64_t{1} << 58);
        pass.advance(INT64_MAX);
        st.unlimited[k] = std::move(pass.result());
      });
    } else {
      if (!st.pass)
        st.pass = std::make_unique<RunReplay>(ctx, st.plans[st.unlimited.size()], int64_t{1} << 62, expandable,
                                              int64_t{1} << 58);
      if (!st.pass->advance(steps)) return false;
      st.unlimited.push_back(std::move(st.pass->result()));
      st.pass.reset();
      if (st.unlimited.size() < st.plans.size()) return false;
    }
    st.chosen = median_reserved(st.unlimited);
    RunTrace& o = st.orders;
    o.shuffles = static_cast<int64_t>(st.unlimited.size());
    for (size_t k = 0; k < st.unlimited.size(); ++k) {
      const auto& peak = st.unlimited[k].peak;
      o.shuffle_reserved_low_bytes = k == 0 ? peak.reserved_bytes : std::min(o.shuffle_reserved_low_bytes, peak.reserved_bytes);
      o.shuffle_reserved_high_bytes = std::max(o.shuffle_reserved_high_bytes, peak.reserved_bytes);
      if (peak.allocated_bytes > o.shuffle_allocated_high_bytes) o.shuffle_allocated_high_bytes = peak.allocated_bytes, st.allocated_high_at = k;
    }
    d = device_shell(ctx, st.roles.front());
    take_pass(d, st.unlimited[st.chosen], st.orders);
    st.unlimited.clear();
    const int64_t capacity = allocator_capacity(d);
    if (d.peak.allocated_bytes > capacity) {
      d.oom = true;
      for (uint32_t i = 0; i < d.timeline.size(); ++i)
        if (d.timeline[i].allocated_bytes > capacity) {
          d.oom_event = i;
          break;
        }
    } else if (d.peak.reserved_bytes > capacity) {
      st.pass = std::make_unique<RunReplay>(ctx, st.plans[st.chosen], capacity, expandable, d.capacity_bytes);
      st.limited = true;
      return false;
    }
  } else {
    if (!st.pass->advance(steps)) return false;
    DeviceResult& p = st.pass->result();
    if (p.oom) {  // the run stops in that step: show it, with the whole run's demand beside it
      d.oom = true;
      take_peak(d, p);
      d.oom_event = d.peak_event;
    } else {  // the cache releases kept the run within the GPU: the limited replay is what happens, the orders'
              // range (without the GPU's limit) beside it
      take_pass(d, p, st.orders);
    }
  }
  st.pass.reset();
  device_finish(d);
  const auto& notes = st.plans[st.chosen].notes;
  st.r.notes.insert(st.r.notes.end(), notes.begin(), notes.end());
  if (d.run.shuffles > 1) order_band(st, d);
  st.r.devices = {std::move(d)};
  finish(st);
  return true;
}

}  // namespace

Simulation::Simulation(const Config& config, int64_t run_orders) : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.config = config;
  st.run_orders = run_orders;
  st.r.errors = validate(config);
  if (!st.r.errors.empty()) {
    st.done = true;
    return;
  }
  try {
    set_up(st);
  } catch (const RangeError& e) {
    st.r.errors.push_back({"config", std::string("the configuration is out of range: ") + e.what() +
                                         "; reduce the model size, micro_batch_size or sequence_length"});
    st.done = true;
  }
}

Simulation::~Simulation() = default;
Simulation::Simulation(Simulation&&) noexcept = default;
Simulation& Simulation::operator=(Simulation&&) noexcept = default;

bool Simulation::advance(int64_t steps) {
  State& st = *state_;
  if (st.done) return true;
  try {
    if (st.config.data.varies()) return advance_run(st, std::max<int64_t>(1, steps));
    st.r.devices.resize(st.contexts.size());
    for_each_index(st.contexts.size(), [&](size_t i) { st.r.devices[i] = simulate_device(st.contexts[i], st.roles[i]); });
    finish(st);
  } catch (const RangeError& e) {
    st.r = Result{};
    st.r.errors.push_back({"config", std::string("the configuration is out of range: ") + e.what() +
                                         "; reduce the model size, micro_batch_size or sequence_length"});
    st.pass.reset();
    st.done = true;
  }
  return true;
}

bool Simulation::done() const { return state_->done; }

double Simulation::progress() const {
  const State& st = *state_;
  if (st.done) return 1.0;
  if (st.plans.empty()) return 0.0;
  // Every order's pass counts alike, and a limited pass after them one more, whether it comes or not (the bar never
  // goes back; where none comes, it ends from the orders' share).
  const double passes = static_cast<double>(st.plans.size()) + 1.0;
  const RunPlan& plan = st.limited ? st.plans[st.chosen] : st.plans[std::min(st.unlimited.size(), st.plans.size() - 1)];
  const double part = st.pass && plan.steps > 0 ? static_cast<double>(st.pass->steps_done()) / static_cast<double>(plan.steps) : 0.0;
  const double before = st.limited ? static_cast<double>(st.plans.size()) : static_cast<double>(st.unlimited.size());
  return std::min(1.0, (before + part) / passes);
}

Simulation::RunProgress Simulation::run_progress() const {
  const State& st = *state_;
  if (!st.config.data.varies() || st.plans.empty()) return {};
  const int64_t orders = static_cast<int64_t>(st.plans.size());
  const int64_t order = st.done || st.limited ? static_cast<int64_t>(st.chosen) + 1
                                              : std::min(static_cast<int64_t>(st.unlimited.size()) + 1, orders);
  const int64_t steps = st.plans[static_cast<size_t>(order - 1)].steps;
  return {st.done ? steps : st.pass ? st.pass->steps_done() : 0, steps, st.limited ? 2 : 1, order, orders};
}

const Result& Simulation::result() const { return state_->r; }
Result Simulation::take_result() && { return std::move(state_->r); }

Result simulate(const Config& config, int64_t run_orders) {
  Simulation s(config, run_orders);
  // A run whose cache outgrows the GPU ends its first pass unfinished and replays a second one against the GPU.
  while (!s.advance()) {
  }
  return std::move(s).take_result();
}

}  // namespace memsim
