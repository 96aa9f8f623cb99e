// One training step on one device as an ordered list of allocations and frees. The step builder
// (train_step.cpp and the files step_builder.h names) writes it; simulate.cpp replays it through the caching-allocator model
// (allocator.h), run_replay.cpp step after step for a run.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace memsim {

// What a byte is for. The order is the order of the stacked bar in the interface.
enum class Component : uint8_t {
  Weights,
  Gradients,
  OptimizerStates,
  Activations,
  Temporaries,
  Communication,
  Overhead,       // inside the allocator: cuBLAS workspaces
  OtherModels,    // frozen models beside the policy: a preference objective's or GRPO's reference copy
  Generation,     // GRPO's rollouts: the KV cache of model.generate, or a colocated vLLM engine
  count
};
constexpr int kComponentCount = static_cast<int>(Component::count);
const char* component_id(Component c);     // "weights", ... (JSON keys)
const char* component_label(Component c);  // "Weights", ... (interface)

struct Event {  // 8 bytes: a 70B step has tens of thousands
  // EmptyCache: torch.cuda.empty_cache(), every pool's cached whole segments back to the driver (vLLM's sleep
  // runs it after unmapping its pool); it names no tensor.
  enum class Op : uint8_t { Alloc, Free, EmptyCache };
  Op op;
  Component component;
  uint32_t tensor;  // index into StepProgram::tensors
};

// CUDA streams the step allocates on. The caching allocator reuses a cached block only for a request on the
// stream that allocated it (CUDACachingAllocator.cpp BlockComparatorSize orders by stream first; get_free_block
// rejects another stream's block), so FSDP's side streams keep pools of their own.
// Engine: a colocated vLLM engine's CuMemAllocator pool (its own torch MemPool, shared with no other request).
enum class Stream : uint8_t { Compute = 0, AllGather = 1, ReduceScatter = 2, Engine = 3 };

struct Tensor {  // 16 bytes
  int64_t bytes;
  Component component;
  Stream stream;
  uint16_t label;  // index into StepProgram::labels
  int16_t layer;   // transformer layer the tensor belongs to, -1 for none (layers are at most 4096)
};

struct Phase {
  std::string name;      // "forward (step 1, micro-batch 1)", "optimizer step 1", ...
  uint32_t first_event;  // index of the phase's first event
};

struct StepProgram {
  std::vector<Tensor> tensors;
  std::vector<Event> events;
  std::vector<std::string> labels;
  std::vector<Phase> phases;

  // A run replay (train_step.h build_run) recycles the ids of freed tensors, or a run of thousands of steps would
  // keep a table entry for every tensor it ever made. Ids freed in one step are reused from the next step on
  // (recycle_freed_ids), so within one step's events every id names one tensor.
  bool recycle_ids = false;
  std::vector<uint32_t> freed_ids, reusable_ids;

  // Names a second model's tensors and phases while its builder writes here (PPO's "value model: ").
  std::string label_prefix;
  uint32_t label(std::string text);
  // Inline, and flattened: the step builder calls these for every event, and the compiler otherwise keeps
  // vector's append out of line, a call per event (flatten measured 7-12% off whole simulations).
  [[gnu::flatten]] uint32_t alloc(Component c, int64_t bytes, uint32_t label_id, int32_t layer = -1, Stream stream = Stream::Compute) {
    const Tensor t{bytes, c, stream, static_cast<uint16_t>(label_id), static_cast<int16_t>(layer)};
    uint32_t id;
    if (recycle_ids && !reusable_ids.empty()) {
      id = reusable_ids.back();
      reusable_ids.pop_back();
      tensors[id] = t;
    } else {
      tensors.push_back(t);
      id = static_cast<uint32_t>(tensors.size() - 1);
    }
    events.push_back({Event::Op::Alloc, c, id});
    return id;
  }
  [[gnu::flatten]] void free(uint32_t tensor) {
    events.push_back({Event::Op::Free, tensors[tensor].component, tensor});
    if (recycle_ids) freed_ids.push_back(tensor);
  }
  // A live tensor turns out to belong to another component (a no_grad forward's intermediate that a graph node
  // keeps after all): its allocation event, the latest event that names it, says so too.
  void recategorize(uint32_t tensor, Component c) {
    tensors[tensor].component = c;
    for (auto it = events.rbegin(); it != events.rend(); ++it)
      if (it->tensor == tensor && it->op == Event::Op::Alloc) {
        it->component = c;
        break;
      }
  }
  // Its event names a 0-byte tensor of its own, so that a reader that takes every event for an allocation or a free
  // counts nothing for it.
  void empty_cache() {
    tensors.push_back({0, Component::Generation, Stream::Compute, 0, -1});
    events.push_back({Event::Op::EmptyCache, Component::Generation, static_cast<uint32_t>(tensors.size() - 1)});
  }
  void recycle_freed_ids() {
    reusable_ids.insert(reusable_ids.end(), freed_ids.begin(), freed_ids.end());
    freed_ids.clear();
  }
  void phase(std::string name) {
    phases.push_back({label_prefix.empty() ? std::move(name) : label_prefix + name, static_cast<uint32_t>(events.size())});
  }
};

// What step 2's forward leaves allocated for its backward: the tensors allocated from its first forward phase that
// are still live when its first backward phase begins (the saved activations, the batch and the loss; under a
// pipeline schedule every micro-batch in flight; and whatever else the forward leaves live: autocast's weight copies,
// a sharded model's gathered head), each rounded as the caching allocator rounds a request
// (CachingAllocator::round_size) but not to its blocks (a block split or left whole is the allocator's, not the
// graph's). The calibration harness measures the saved part on torch's autograd graph (tools/calibrate/programs.py
// saved_set_bytes). -1 where the program has no step-2 forward followed by a backward. result_json leaves it out for a
// run replay, whose program is its peak step's.
int64_t forward_retained_bytes(const StepProgram& p);

}  // namespace memsim
