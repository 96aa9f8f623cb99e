// Issue #4, "exact paper tables": the published memory formulas of the ZeRO paper, DeepSpeed's model-state
// estimators, Megatron-LM's theoretical_memory_usage.py and Korthikanti et al.'s Table 2, each re-implemented
// below with the source's own arithmetic (the lines are quoted, with repository, path and commit), checked first
// against the numbers the source itself publishes, then compared with memsim under the source's assumptions.
//
// Where a source counts something memsim does not, or the reverse, the test names the term, says why, and checks
// everything else exactly; no tolerance stands in for a term. Where memsim disagrees with a source in a way that
// looks like memsim's error, the exact expectation is kept in a test tagged  that states the finding
// (Catch2 reports such a test as passing while it fails; once memsim is fixed it fails, and the tag goes).
// Catch2 2.x has no SKIP(): a comparison memsim cannot make yet is reported with WARN and its reason, and the
// reference function is still checked against the source's published numbers.
//
// theoretical_refs.jsonl (shared/validation) holds 79 theoretical references: the 72 cells of ZeRO Table 1, the
// 6 rows of Korthikanti Table 2 for GPT-3 175B and the HF "18 bytes/param" rule; every one is checked here.
// tests/core/test_simulate.cpp already checks four cells of ZeRO Table 1 (7.5B, N_d = 64) to 0.05 GB; here all
// 72 cells are checked to the byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/simulate.h"
#include "core/tables.h"
#include "core/train_step.h"
#include "test_util.h"

using namespace memsim;

namespace {

// ------------------------------------------------------------------------------------------------------------------
// Helpers over a simulated step program (requested bytes, before the allocator's rounding).

struct PhaseRange {
  uint32_t begin = 0, end = 0;
};

PhaseRange phase_range(const StepProgram& p, const std::string& prefix) {
  for (size_t i = 0; i < p.phases.size(); ++i)
    if (p.phases[i].name.rfind(prefix, 0) == 0)
      return {p.phases[i].first_event,
              i + 1 < p.phases.size() ? p.phases[i + 1].first_event : static_cast<uint32_t>(p.events.size())};
  FAIL("no phase starting with \"" << prefix << "\"");
  return {};
}

const std::string& label_of(const StepProgram& p, const Event& e) { return p.labels[p.tensors[e.tensor].label]; }

// Live bytes of a component right after event `upto` (inclusive).
int64_t live_after(const StepProgram& p, uint32_t upto, Component c) {
  int64_t live = 0;
  for (uint32_t i = 0; i <= upto && i < p.events.size(); ++i)
    if (p.events[i].component == c)
      live += (p.events[i].op == Event::Op::Alloc ? 1 : -1) * p.tensors[p.events[i].tensor].bytes;
  return live;
}

// Live bytes carrying one label just before the first phase whose name starts with `prefix`.
int64_t live_label_before_phase(const StepProgram& p, const std::string& prefix, const std::string& label) {
  const uint32_t end = phase_range(p, prefix).begin;
  int64_t live = 0;
  for (uint32_t i = 0; i < end; ++i)
    if (label_of(p, p.events[i]) == label)
      live += (p.events[i].op == Event::Op::Alloc ? 1 : -1) * p.tensors[p.events[i].tensor].bytes;
  return live;
}

// The allocations of one component inside a phase.
std::vector<uint32_t> allocs_in_phase(const StepProgram& p, const std::string& prefix, Component c) {
  const PhaseRange r = phase_range(p, prefix);
  std::vector<uint32_t> out;
  for (uint32_t i = r.begin; i < r.end; ++i)
    if (p.events[i].op == Event::Op::Alloc && p.events[i].component == c) out.push_back(i);
  return out;
}

int64_t saved_activations_at_first_backward(const Config& c, size_t device = 0, const char* phase = "backward") {
  Result r = simulate(c);
  REQUIRE(r.ok);
  REQUIRE(device < r.devices.size());
  return live_bytes_before_phase(r.devices[device].program, phase, Component::Activations);
}

// Exactly one transformer layer's saved activations: the model with two layers minus the model with one.
int64_t one_layer_saved(Config c) {
  c.model.num_hidden_layers = 1;
  const int64_t one = saved_activations_at_first_backward(c);
  c.model.num_hidden_layers = 2;
  return saved_activations_at_first_backward(c) - one;
}

int64_t exact(double v) {  // a reference value that the chosen inputs make an integer
  REQUIRE(std::isfinite(v));
  REQUIRE(v == std::floor(v));
  return static_cast<int64_t>(v);
}

std::string fixed2(double v) {  // Python f"{v:.2f}" (both round the exact binary value correctly)
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// ==================================================================================================================
// 1. ZeRO paper: Rajbhandari, Rasley, Ruwase, He, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
//    Models", SC'20, arXiv:1910.02054, sec. 5.1-5.3 and Table 1 ("Per-device memory consumption of different
//    optimizations in ZeRO-DP as a function of DP degree"; GB = 1e9 B; K = 12 for mixed-precision Adam):
//      baseline DP : (2 + 2 + K) * Psi
//      P_os        : 2 Psi + 2 Psi + K Psi / N_d
//      P_os+g      : 2 Psi + (2 + K) Psi / N_d
//      P_os+g+p    : (2 + 2 + K) Psi / N_d
// ==================================================================================================================

double zero_paper_bytes(double psi, double nd, int stage) {
  const double K = 12;
  switch (stage) {
    case 0: return (2 + 2 + K) * psi;
    case 1: return 2 * psi + 2 * psi + K * psi / nd;
    case 2: return 2 * psi + (2 + K) * psi / nd;
    default: return (2 + 2 + K) * psi / nd;
  }
}

// shared/validation/theoretical_refs.jsonl, ids theory-zero-table1-{7.5B,128B,1T}-nd{N}-{baseline_dp, zero1_pos,
// zero2_pos_g, zero3_pos_g_p}: "measured.bytes" (the formula's value, truncated to whole bytes).
struct ZeroCell {
  int64_t psi, nd;
  int64_t bytes[4];
  const char* printed[3];  // Table 1 as printed (P_os, P_os+g, P_os+g+p), GB; MEMORY_FORMULAS.md sec. 2.1
};
constexpr ZeroCell kZeroTable1[] = {
    {7500000000LL, 1, {120000000000LL, 120000000000LL, 120000000000LL, 120000000000LL}, {"120", "120", "120"}},
    {7500000000LL, 4, {120000000000LL, 52500000000LL, 41250000000LL, 30000000000LL}, {"52.5", "41.3", "30"}},
    {7500000000LL, 16, {120000000000LL, 35625000000LL, 21562500000LL, 7500000000LL}, {"35.6", "21.6", "7.5"}},
    {7500000000LL, 64, {120000000000LL, 31406250000LL, 16640625000LL, 1875000000LL}, {"31.4", "16.6", "1.88"}},
    {7500000000LL, 256, {120000000000LL, 30351562500LL, 15410156250LL, 468750000LL}, {"30.4", "15.4", "0.47"}},
    {7500000000LL, 1024, {120000000000LL, 30087890625LL, 15102539062LL, 117187500LL}, {"30.1", "15.1", "0.12"}},
    {128000000000LL, 1, {2048000000000LL, 2048000000000LL, 2048000000000LL, 2048000000000LL}, {"2048", "2048", "2048"}},
    {128000000000LL, 4, {2048000000000LL, 896000000000LL, 704000000000LL, 512000000000LL}, {"896", "704", "512"}},
    {128000000000LL, 16, {2048000000000LL, 608000000000LL, 368000000000LL, 128000000000LL}, {"608", "368", "128"}},
    {128000000000LL, 64, {2048000000000LL, 536000000000LL, 284000000000LL, 32000000000LL}, {"536", "284", "32"}},
    {128000000000LL, 256, {2048000000000LL, 518000000000LL, 263000000000LL, 8000000000LL}, {"518", "263", "8"}},
    {128000000000LL, 1024, {2048000000000LL, 513500000000LL, 257750000000LL, 2000000000LL}, {"513", "257", "2"}},
    {1000000000000LL, 1, {16000000000000LL, 16000000000000LL, 16000000000000LL, 16000000000000LL}, {"16000", "16000", "16000"}},
    {1000000000000LL, 4, {16000000000000LL, 7000000000000LL, 5500000000000LL, 4000000000000LL}, {"7000", "5500", "4000"}},
    {1000000000000LL, 16, {16000000000000LL, 4750000000000LL, 2875000000000LL, 1000000000000LL}, {"4750", "2875", "1000"}},
    {1000000000000LL, 64, {16000000000000LL, 4187500000000LL, 2218750000000LL, 250000000000LL}, {"4187", "2218", "250"}},
    {1000000000000LL, 256, {16000000000000LL, 4046875000000LL, 2054687500000LL, 62500000000LL}, {"4046", "2054", "62.5"}},
    {1000000000000LL, 1024, {16000000000000LL, 4011718750000LL, 2013671875000LL, 15625000000LL}, {"4011", "2013", "15.6"}},
};

TEST_CASE("ZeRO paper Table 1: the formulas give every printed cell", "[reference][zero]") {
  for (const ZeroCell& z : kZeroTable1) {
    for (int stage = 0; stage <= 3; ++stage) {
      const double v = zero_paper_bytes(static_cast<double>(z.psi), static_cast<double>(z.nd), stage);
      INFO("Psi " << z.psi << ", N_d " << z.nd << ", stage " << stage);
      CHECK(static_cast<int64_t>(std::floor(v)) == z.bytes[stage]);  // the jsonl's value
      if (stage == 0) continue;
      // The paper prints 3-4 significant digits, some truncated (4187.5 -> 4187), some rounded (0.1172 -> 0.12):
      // the formula is within one unit of the last printed digit.
      const std::string printed = z.printed[stage - 1];
      const size_t dot = printed.find('.');
      const int decimals = dot == std::string::npos ? 0 : static_cast<int>(printed.size() - dot - 1);
      INFO("printed " << printed << " GB, formula " << v / 1e9 << " GB");
      CHECK(std::fabs(v / 1e9 - std::stod(printed)) < std::pow(10.0, -decimals));
    }
  }
}

TEST_CASE("ZeRO paper Table 1: memsim's per-device model states, all 72 cells to the byte", "[reference][zero]") {
  // One flat parameter of Psi elements, as the paper counts; bf16 or fp16 weights and gradients, fp32 master
  // weights and AdamW's two fp32 moments (K = 12). memsim's model_state_bytes is the persistent weights +
  // gradients + optimizer states of one device.
  for (const char* precision : {"bf16_mixed", "fp16_mixed"}) {
    for (const ZeroCell& z : kZeroTable1) {
      ModelShape shape;
      shape.params_total = z.psi;
      shape.pre = {ParamTensor{"all parameters", z.psi, ParamKind::Matmul, 4096}};
      for (int stage = 0; stage <= 3; ++stage) {
        Config c;
        c.parallel.zero_stage = stage;
        c.parallel.data_parallel_size = z.nd;
        c.training.precision = precision;
        StepContext ctx{c, shape, *find_precision(precision), *find_optimizer("adamw"), nullptr};
        const ModelStates m = model_state_bytes(ctx);
        const int64_t got = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes;
        INFO(precision << ": Psi " << z.psi << ", N_d " << z.nd << ", stage " << stage << ": memsim " << got
                       << " B, paper " << z.bytes[stage] << " B");
        if (z.psi % z.nd == 0) {
          CHECK(got == z.bytes[stage]);
        } else {
          // 7.5e9 / 1024 is not whole: the paper's partitions are fractional, DeepSpeed pads each flat partition to
          // whole elements (stage_1_and_2.py flatten_dense_tensors_aligned) and memsim rounds each partition up.
          // The three partitioned states (2 + 2 + 12 bytes per element) add less than one element each.
          CHECK(got >= z.bytes[stage]);
          CHECK(got - z.bytes[stage] < 2 + 2 + 12);
        }
      }
    }
  }
}

// ==================================================================================================================
// 2. DeepSpeed's estimators.
//    microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py @ 022f223697296f182f1b677d83d41a4abb062b0b
//    microsoft/DeepSpeed deepspeed/runtime/zero/stage3.py        @ 0003660dc804f11976ecbc725585d43774952fab
//    Published examples: microsoft/DeepSpeed docs/code-docs/source/memory.rst @ 077e6740178eba4ccff1b3ea9a7981578d3d42e4
//    (t5-3b: 2851M total params, 32M largest layer params, 1 node x 8 GPUs; printed as bytes / 2**30, "GB").
// ==================================================================================================================

struct DsEstimate {
  int64_t cpu_mem = 0, gpu_mem = 0, largest_layer_memory = 0;
};

// def estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=True,
//                                           additional_buffer_factor=1.5):
DsEstimate estimate_zero2_model_states_mem_needs(double total_params, double num_gpus_per_node = 1, double num_nodes = 1,
                                                 bool cpu_offload = true, double additional_buffer_factor = 1.5) {
  //     total_gpus = num_nodes * num_gpus_per_node
  const double total_gpus = num_nodes * num_gpus_per_node;
  double gpu_mem = 0, cpu_mem = 0;
  if (cpu_offload) {
    //     gpu_mem = 2 * total_params
    //     cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    gpu_mem = 2 * total_params;
    cpu_mem = total_params * std::max(4 * total_gpus, 16.0) * additional_buffer_factor;
  } else {
    //     # GPU's total_params multipliers: 2 = params_16bit,
    //     # 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit(momentum and variance)
    //     gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
    //     cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    gpu_mem = 2 * total_params + std::trunc(18 * total_params / total_gpus);
    cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor;
  }
  //     return int(cpu_mem), int(gpu_mem)
  return {static_cast<int64_t>(cpu_mem), static_cast<int64_t>(gpu_mem)};
}

// def estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
//                                           cpu_offload=True, cpu_offload_params=True, zero_init=True,
//                                           additional_buffer_factor=1.5):
DsEstimate estimate_zero3_model_states_mem_needs(double total_params, double largest_layer_params,
                                                 double num_gpus_per_node = 1, double num_nodes = 1,
                                                 bool cpu_offload = true, bool cpu_offload_params = true,
                                                 bool zero_init = true, double additional_buffer_factor = 1.5) {
  //     total_gpus = num_nodes * num_gpus_per_node
  //     gpus_factor = 1 / num_nodes
  //     largest_layer_memory = (4 * largest_layer_params)
  const double total_gpus = num_nodes * num_gpus_per_node;
  const double gpus_factor = 1 / num_nodes;
  const double largest_layer_memory = 4 * largest_layer_params;
  double gpu_mem = 0, cpu_mem = 0;
  if (cpu_offload) {
    if (cpu_offload_params) {
      //         gpu_mem = largest_layer_memory
      gpu_mem = largest_layer_memory;
      if (zero_init)  //     cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
        cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor;
      else  //               cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        cpu_mem = total_params * std::max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor;
    } else {
      //         gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
      gpu_mem = largest_layer_memory + std::trunc(2 * total_params / total_gpus);
      if (zero_init)  //     cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
        cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor;
      else  //               cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
        cpu_mem = total_params * std::max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor;
    }
  } else {
    //     gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
    gpu_mem = largest_layer_memory + std::trunc(18 * total_params / total_gpus);
    if (zero_init)  //     cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
      cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor;
    else  //               cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
      cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor;
  }
  //     return int(cpu_mem), int(gpu_mem), largest_layer_memory
  return {static_cast<int64_t>(cpu_mem), static_cast<int64_t>(gpu_mem), static_cast<int64_t>(largest_layer_memory)};
}

std::string gb(int64_t bytes) { return fixed2(static_cast<double>(bytes) / 1073741824.0); }  // f"{x/2**30:.2f}"

TEST_CASE("DeepSpeed estimators reproduce memory.rst's printed t5-3b tables", "[reference][deepspeed]") {
  // estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6, largest_layer_params=32e6,
  //                                                num_gpus_per_node=8, num_nodes=1):
  //    per CPU  |  per GPU |   Options
  //     71.69GB |   0.12GB | cpu_offload=1, cpu_offload_params=1, zero_init=1
  //    127.45GB |   0.12GB | cpu_offload=1, cpu_offload_params=1, zero_init=0
  //     63.72GB |   0.78GB | cpu_offload=1, cpu_offload_params=0, zero_init=1
  //    127.45GB |   0.78GB | cpu_offload=1, cpu_offload_params=0, zero_init=0
  //      1.43GB |   6.09GB | cpu_offload=0, cpu_offload_params=0, zero_init=1
  //    127.45GB |   6.09GB | cpu_offload=0, cpu_offload_params=0, zero_init=0
  struct Row {
    bool offload, offload_params, zero_init;
    const char *cpu, *gpu;
  };
  const Row z3[] = {{true, true, true, "71.69", "0.12"},   {true, true, false, "127.45", "0.12"},
                    {true, false, true, "63.72", "0.78"},  {true, false, false, "127.45", "0.78"},
                    {false, false, true, "1.43", "6.09"},  {false, false, false, "127.45", "6.09"}};
  for (const Row& r : z3) {
    const DsEstimate e = estimate_zero3_model_states_mem_needs(2851e6, 32e6, 8, 1, r.offload, r.offload_params, r.zero_init);
    INFO("offload " << r.offload << ", offload_params " << r.offload_params << ", zero_init " << r.zero_init);
    CHECK(gb(e.cpu_mem) == r.cpu);
    CHECK(gb(e.gpu_mem) == r.gpu);
  }
  // estimate_zero2_model_states_mem_needs_all_cold(total_params=2851e6, num_gpus_per_node=8, num_nodes=1):
  //    127.45GB |   5.31GB | cpu_offload=1
  //    127.45GB |  15.93GB | cpu_offload=0
  const DsEstimate off = estimate_zero2_model_states_mem_needs(2851e6, 8, 1, true);
  CHECK(gb(off.cpu_mem) == "127.45");
  CHECK(gb(off.gpu_mem) == "5.31");
  const DsEstimate on = estimate_zero2_model_states_mem_needs(2851e6, 8, 1, false);
  CHECK(gb(on.cpu_mem) == "127.45");
  // The printed 15.93 is stale: it is memory.rst's prose formula for ZeRO-2 without offload, "4 params + 16
  // params / (total number of gpus)", which the code no longer computes. The code at 022f223 gives
  // 2P + int(18P/N) = 11.28 "GB" (MEMORY_FORMULAS.md sec. 2.2 [≠]).
  CHECK(gb(static_cast<int64_t>(4 * 2851e6 + std::trunc(16 * 2851e6 / 8))) == "15.93");
  CHECK(gb(on.gpu_mem) == "11.28");
}

// A Llama-2-7B-shaped model trained by DeepSpeed on one node of 8 GPUs (num_gpus_per_node = 8, num_nodes = 1).
Config deepspeed_llama2_7b(int64_t stage, const char* precision) {
  Config c = single_gpu_config("llama-2-7b.json", 1, 512);
  c.training.framework = "deepspeed";
  c.training.precision = precision;
  c.training.optimizer = "adamw";
  c.training.activation_checkpointing = "full";
  c.parallel.zero_stage = stage;
  c.parallel.data_parallel_size = 8;
  return c;
}

TEST_CASE("DeepSpeed estimate_zero2_model_states_mem_needs, no offload: memsim's model states term by term",
          "[reference][deepspeed]") {
  // gpu_mem = 2 * total_params + int(18 * total_params / total_gpus), with
  //   2  = params_16bit                                  -> memsim weights (unpartitioned under ZeRO-2)
  //   18 = 2_grads_16bit                                 -> memsim gradients: the flat gradient partition
  //      + 4_params_32bit + 8_optimizer_states_32bit     -> memsim optimizer states: fp32 master + m + v partition
  //      + 4_grads_32bit                                 -> not a model state: the fp32 copy of the gradient
  //        partition that DeepSpeedZeroOptimizer.step (same file and commit) makes for each group's update,
  //            single_grad_partition = self.flatten(self.averaged_gradients[i]).to(
  //                self.single_partition_of_fp32_groups[i].dtype)
  //        and frees after it (`self.single_partition_of_fp32_groups[i].grad = None`, `del single_grad_partition`).
  //        memsim replays it as a temporary of the optimizer step.
  // So the estimator is the ZeRO paper's 2 Psi + 14 Psi / N plus that transient 4 Psi / N, and matches memsim at
  // the moment of the update. The estimator's cpu_mem (host RAM to build the model) has no counterpart in memsim.
  for (const char* precision : {"bf16_mixed", "fp16_mixed"}) {
    Result r = simulate(deepspeed_llama2_7b(2, precision));
    REQUIRE(r.ok);
    const int64_t P = r.params_total, N = 8;
    REQUIRE(P == r.params_trainable);
    REQUIRE(P % N == 0);
    const DsEstimate est = estimate_zero2_model_states_mem_needs(static_cast<double>(P), 8, 1, false);
    INFO(precision << ": total_params " << P << ", estimator gpu_mem " << est.gpu_mem);
    const ModelStates& m = r.model_states;
    CHECK(m.weights_bytes == 2 * P);
    CHECK(m.gradients_bytes == 2 * P / N);
    CHECK(m.optimizer_bytes == (4 + 8) * P / N);

    const StepProgram& prog = r.devices[0].program;
    const auto temps = allocs_in_phase(prog, "optimizer step 2", Component::Temporaries);
    REQUIRE(temps.size() == 1);
    const uint32_t at = temps[0];
    CHECK(label_of(prog, prog.events[at]) == "optimizer temporary");
    const int64_t fp32_grads = prog.tensors[prog.events[at].tensor].bytes;
    CHECK(fp32_grads == 4 * P / N);
    const int64_t states_at_update = live_after(prog, at, Component::Weights) + live_after(prog, at, Component::Gradients) +
                                     live_after(prog, at, Component::OptimizerStates) + fp32_grads;
    CHECK(states_at_update == est.gpu_mem);
  }
  // cpu_offload=True: gpu_mem = 2 * total_params. ZeRO-Offload keeps only the 16-bit weights on the GPU; the
  // gradient partition and the fp32 master and states live on the host (16 / N bytes per parameter per GPU).
  Config c = deepspeed_llama2_7b(2, "bf16_mixed");
  c.parallel.offload_optimizer = "cpu";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t P = r.params_total;
  const DsEstimate est = estimate_zero2_model_states_mem_needs(static_cast<double>(P), 8, 1, true);
  const ModelStates& m = r.model_states;
  CHECK(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes == static_cast<int64_t>(est.gpu_mem));
  CHECK(r.devices[0].host_bytes == 16 * P / 8);
}

TEST_CASE("DeepSpeed estimate_zero3_model_states_mem_needs, no offload: the partitioned terms", "[reference][deepspeed]") {
  // gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus), where 18 = 2 (16-bit parameter
  // partition) + 16 (fp32 params, grads, momentum and variance; memory.rst "18: 16b for fp32 ... +2b for fp16
  // params"). What matches memsim exactly:
  //   2 / N  -> memsim weights (the 16-bit partition; every tensor partitioned: persistence threshold 1 element)
  //   12 / N -> memsim optimizer states (fp32 params + m + v)
  // What differs, deliberately:
  //   - largest_layer_memory = 4 * largest_layer_params, the gathered 16-bit params and grads of the largest
  //     *module* (model_to_params: max over modules of sum(p.numel() for p in m.parameters(recurse=False)); for
  //     this model the embedding or lm_head). memsim instead replays DeepSpeed's per-layer all-gathers with
  //     prefetch (Communication) and the full-size gradients of the layer in backward: not the same quantity.
  //   - memsim's gradients are the 16-bit flat gradient partition, 2 / N (stage3.py _setup_for_real_optimizer:
  //     grad_partitions_flat_buffer in gradient_accumulation_dtype = the model dtype under ZeRO), which the
  //     estimator does not count.
  //   - the estimator's 4 / N fp32 gradients are the per-sub-group upcast of the step
  //     (stage3.py::_prepare_fp32_grad_for_sub_group); see the  test below.
  for (const char* precision : {"bf16_mixed", "fp16_mixed"}) {
    Config c = deepspeed_llama2_7b(3, precision);
    c.parallel.zero_param_persistence_threshold = 1;
    Result r = simulate(c);
    REQUIRE(r.ok);
    const int64_t P = r.params_total, N = 8;
    REQUIRE(P % N == 0);
    INFO(precision << ": total_params " << P);
    CHECK(r.model_states.weights_bytes == 2 * P / N);
    CHECK(r.model_states.optimizer_bytes == 12 * P / N);
    CHECK(r.model_states.gradients_bytes == 2 * P / N);
  }
  // cpu_offload (optimizer only): gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus): the 16-bit
  // partition stays, everything else goes to the host. With cpu_offload_params too: gpu_mem = largest_layer_memory
  // alone. memsim's model states are the partitioned terms (largest_layer_memory is the gather, not a state).
  Config c = deepspeed_llama2_7b(3, "bf16_mixed");
  c.parallel.zero_param_persistence_threshold = 1;
  c.parallel.offload_optimizer = "cpu";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t P = r.params_total, N = 8;
  const ModelStates& m = r.model_states;
  CHECK(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes == 2 * P / N);
  CHECK(r.devices[0].host_bytes == 16 * P / N);
  c.parallel.offload_params = "cpu";
  r = simulate(c);
  REQUIRE(r.ok);
  CHECK(r.model_states.weights_bytes + r.model_states.gradients_bytes + r.model_states.optimizer_bytes == 0);
  CHECK(r.devices[0].host_bytes == 18 * P / N);
}

TEST_CASE("was a finding, fixed: ZeRO-3's optimizer step upcasts the gradient partition to fp32 (estimator's 4_grads_32bit)",
          "[reference][deepspeed]") {
  // deepspeed/runtime/zero/stage3.py @ 0003660d, DeepSpeedZeroOptimizer_Stage3.step -> _prepare_sub_group ->
  // _prepare_fp32_grad_for_sub_group:
  //     single_grad_partition = self.flatten(self.averaged_gradients[sub_group_id]).to(
  //         self.fp32_partitioned_groups_flat[sub_group_id].dtype)
  //     self.fp32_partitioned_groups_flat[sub_group_id].grad = single_grad_partition
  // freed in _release_sub_group (`.grad = None`). memsim models this transient for ZeRO-1/2 only
  // (optimizer_step.cpp optimizer_step: `if (shard_opt_ && !shard_weights_ && recipe_.grad_bytes < 4)`), so at ZeRO-3 the
  // step lacks 4 * P / N bytes (here 4 * 6,738,415,616 / 8 = 3,369,207,808 B) that both DeepSpeed and its
  // estimator count. (DeepSpeed upcasts one sub-group at a time, sub_group_size = 1e9 elements by default; this
  // partition, 842M elements, is one sub-group per parameter group. The expectation uses memsim's own ZeRO-1/2
  // simplification, one flat partition, so that the two stages agree.)
  Config c = deepspeed_llama2_7b(3, "bf16_mixed");
  c.parallel.zero_param_persistence_threshold = 1;
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t P = r.params_total, N = 8;
  const StepProgram& prog = r.devices[0].program;
  int64_t largest = 0;
  for (uint32_t i : allocs_in_phase(prog, "optimizer step 2", Component::Temporaries))
    largest = std::max(largest, prog.tensors[prog.events[i].tensor].bytes);
  CHECK(largest == 4 * P / N);
}

// ==================================================================================================================
// 3. Megatron-LM megatron/training/theoretical_memory_usage.py @ 00caa53af30912914981c86f39db123961678bbd
//    (NVIDIA/Megatron-LM). Its own assumptions: bf16 parameters with fp32 main gradients and fp32 main parameters
//    (18 B/param, or 6 + 12/DP with the distributed optimizer), no linear biases, no position embeddings, the
//    padded vocabulary, and Korthikanti et al.'s per-layer activations for a GPT layer with dropout.
//    Published figures: docs/api-guide/dist_optimizer.md @ 9fc9377109abd18b2a97f897e0a3565ad40a1a66.
// ==================================================================================================================

struct MegatronArgs {
  double hidden_size = 0, num_attention_heads = 0, kv_channels = 0, num_query_groups = 0;
  bool group_query_attention = false;
  double ffn_hidden_size = 0;
  bool swiglu = false;
  std::string normalization = "LayerNorm";
  double num_layers = 0, padded_vocab_size = 0;
  bool untie_embeddings_and_output_weights = false;
  double num_experts = 0;  // 0: None
  double moe_ffn_hidden_size = 0, moe_shared_expert_intermediate_size = 0;  // 0: None
  int64_t moe_layer_freq = 1;
  double tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1;
  bool use_distributed_optimizer = false;
  double seq_length = 0, micro_batch_size = 0;
  double virtual_pipeline_model_parallel_size = 0;  // 0: None
};

struct MegatronWeights {
  double num_total_parameters = 0, num_parameters_on_most_loaded_model_shard = 0, weight_and_optimizer_memory = 0;
};

// def compute_weight_and_optimizer_memory(args, verbose=False): (dense and MoE layers; no MLA or MTP here)
MegatronWeights compute_weight_and_optimizer_memory(MegatronArgs args) {
  //     query_projection_size = args.kv_channels * args.num_attention_heads
  //     query_projection_to_hidden_size_ratio = query_projection_size / args.hidden_size
  const double query_projection_size = args.kv_channels * args.num_attention_heads;
  const double query_projection_to_hidden_size_ratio = query_projection_size / args.hidden_size;
  //     if not args.group_query_attention:
  //         args.num_query_groups = args.num_attention_heads
  if (!args.group_query_attention) args.num_query_groups = args.num_attention_heads;
  //     num_experts = 1 if args.num_experts is None else args.num_experts
  //     gated_linear_multiplier = 3 / 2 if args.swiglu else 1
  const double num_experts = args.num_experts == 0 ? 1 : args.num_experts;
  const double gated_linear_multiplier = args.swiglu ? 3.0 / 2 : 1;
  //     shared_expert_ffn_hidden_size = (0 if args.moe_shared_expert_intermediate_size is None else ...)
  const double shared_expert_ffn_hidden_size = args.moe_shared_expert_intermediate_size;
  double num_dense_layers = 0, num_moe_layers = 0, moe_ffn_hidden_size = 0;
  if (args.num_experts != 0) {
    //         moe_layer_pattern = [1 if (i % args.moe_layer_freq == 0) else 0 for i in range(args.num_layers)]
    for (int64_t i = 0; i < static_cast<int64_t>(args.num_layers); ++i) num_moe_layers += i % args.moe_layer_freq == 0;
    //         num_dense_layers = args.num_layers - sum(moe_layer_pattern)
    //         num_moe_layers = sum(moe_layer_pattern)
    //         moe_ffn_hidden_size = args.moe_ffn_hidden_size
    num_dense_layers = args.num_layers - num_moe_layers;
    moe_ffn_hidden_size = args.moe_ffn_hidden_size;
  } else {
    num_dense_layers = args.num_layers;
  }
  //     norm_size = 1 if args.normalization == "RMSNorm" else 2
  const double norm_size = args.normalization == "RMSNorm" ? 1 : 2;
  //         self_attn_term = (2 * args.hidden_size * args.hidden_size *
  //             ((1 + (args.num_query_groups / args.num_attention_heads)) * query_projection_to_hidden_size_ratio))
  const double self_attn_term = 2 * args.hidden_size * args.hidden_size *
                                ((1 + (args.num_query_groups / args.num_attention_heads)) * query_projection_to_hidden_size_ratio);
  //     num_parameters_in_transformer_layer_dense = (2 * args.hidden_size *
  //         ((args.ffn_hidden_size * gated_linear_multiplier) + norm_size) + self_attn_term)
  const double dense = 2 * args.hidden_size * ((args.ffn_hidden_size * gated_linear_multiplier) + norm_size) + self_attn_term;
  //     num_parameters_in_transformer_layer_moe = (2 * args.hidden_size * (
  //         +(moe_ffn_hidden_size * num_experts * gated_linear_multiplier)
  //         + (shared_expert_ffn_hidden_size * gated_linear_multiplier) + norm_size) + self_attn_term)
  const double moe = 2 * args.hidden_size *
                         (+(moe_ffn_hidden_size * num_experts * gated_linear_multiplier) +
                          (shared_expert_ffn_hidden_size * gated_linear_multiplier) + norm_size) +
                     self_attn_term;
  //     embedding_size = args.hidden_size * args.padded_vocab_size
  //     final_layernorm = norm_size * args.hidden_size
  const double embedding_size = args.hidden_size * args.padded_vocab_size;
  const double final_layernorm = norm_size * args.hidden_size;
  //     if args.untie_embeddings_and_output_weights: num_parameters_in_embedding_layers = 2 * embedding_size
  //     else: num_parameters_in_embedding_layers = embedding_size
  const double num_parameters_in_embedding_layers = args.untie_embeddings_and_output_weights ? 2 * embedding_size : embedding_size;
  //     num_parameters_in_transformer_block = (num_parameters_in_transformer_layer_dense * num_dense_layers
  //         + num_parameters_in_transformer_layer_moe * num_moe_layers + final_layernorm)
  const double num_parameters_in_transformer_block = dense * num_dense_layers + moe * num_moe_layers + final_layernorm;
  const double num_parameters_in_mtp_block = 0;  // mtp_num_layers is None
  MegatronWeights w;
  w.num_total_parameters = num_parameters_in_transformer_block + num_parameters_in_mtp_block + num_parameters_in_embedding_layers;
  //     num_parameters_on_most_loaded_model_shard = (
  //         (num_parameters_in_transformer_block / args.pipeline_model_parallel_size)
  //         + num_parameters_in_mtp_block + embedding_size) / args.tensor_model_parallel_size
  //     if args.untie_embeddings_and_output_weights and args.pipeline_model_parallel_size == 1:
  //         num_parameters_on_most_loaded_model_shard += (embedding_size / args.tensor_model_parallel_size)
  w.num_parameters_on_most_loaded_model_shard =
      ((num_parameters_in_transformer_block / args.pipeline_model_parallel_size) + num_parameters_in_mtp_block + embedding_size) /
      args.tensor_model_parallel_size;
  if (args.untie_embeddings_and_output_weights && args.pipeline_model_parallel_size == 1)
    w.num_parameters_on_most_loaded_model_shard += embedding_size / args.tensor_model_parallel_size;
  //     num_bytes_per_parameter = (18 if not args.use_distributed_optimizer else 6 + (12 / args.data_parallel_size))
  //     weight_and_optimizer_memory = (num_parameters_on_most_loaded_model_shard * num_bytes_per_parameter)
  const double num_bytes_per_parameter = !args.use_distributed_optimizer ? 18 : 6 + (12 / args.data_parallel_size);
  w.weight_and_optimizer_memory = w.num_parameters_on_most_loaded_model_shard * num_bytes_per_parameter;
  return w;
}

// def compute_activation_memory(args, num_microbatches, verbose=False):  (the path report_theoretical_memory takes
// when `args.sequence_parallel and args.recompute_granularity == 'selective'`)
double compute_activation_memory(const MegatronArgs& args, std::optional<double> num_microbatches) {
  //     activation_memory = (args.seq_length * args.micro_batch_size * args.hidden_size) * (
  //         18 + (4 * (args.ffn_hidden_size / args.hidden_size)))
  double activation_memory = (args.seq_length * args.micro_batch_size * args.hidden_size) *
                             (18 + (4 * (args.ffn_hidden_size / args.hidden_size)));
  //     activation_memory *= args.num_layers
  activation_memory *= args.num_layers;
  //     # Input to embedding (pp_size microbatches in flight).
  //     activation_memory += (8 * args.seq_length * args.micro_batch_size * args.pipeline_model_parallel_size)
  activation_memory += 8 * args.seq_length * args.micro_batch_size * args.pipeline_model_parallel_size;
  //     # Dropout in embedding layer (pp_size microbatches in flight).
  //     activation_memory += (args.seq_length * args.micro_batch_size * args.hidden_size * args.pipeline_model_parallel_size)
  activation_memory += args.seq_length * args.micro_batch_size * args.hidden_size * args.pipeline_model_parallel_size;
  //     if args.virtual_pipeline_model_parallel_size is not None:
  //         interleaved_schedule_memory_penalty = 1 + ((args.pipeline_model_parallel_size - 1)
  //             / (args.pipeline_model_parallel_size * args.virtual_pipeline_model_parallel_size))
  //         activation_memory *= interleaved_schedule_memory_penalty
  if (args.virtual_pipeline_model_parallel_size != 0)
    activation_memory *= 1 + ((args.pipeline_model_parallel_size - 1) /
                              (args.pipeline_model_parallel_size * args.virtual_pipeline_model_parallel_size));
  //     if args.virtual_pipeline_model_parallel_size is None and args.pipeline_model_parallel_size > 1:
  //         if num_microbatches is not None:
  //             activation_memory *= min(1, num_microbatches / args.pipeline_model_parallel_size)
  if (args.virtual_pipeline_model_parallel_size == 0 && args.pipeline_model_parallel_size > 1 && num_microbatches)
    activation_memory *= std::min(1.0, *num_microbatches / args.pipeline_model_parallel_size);
  //     if args.pipeline_model_parallel_size == 1:
  //         # Inputs to output layer and CE loss.
  //         activation_memory += (args.seq_length * args.micro_batch_size * args.hidden_size * 4
  //             * (1 + (args.padded_vocab_size / args.hidden_size)))
  if (args.pipeline_model_parallel_size == 1)
    activation_memory += args.seq_length * args.micro_batch_size * args.hidden_size * 4 *
                         (1 + (args.padded_vocab_size / args.hidden_size));
  //     return activation_memory / args.tensor_model_parallel_size
  return activation_memory / args.tensor_model_parallel_size;
}

// def compute_activation_memory_without_sp(args, num_microbatches, verbose=False): its per-layer term
//     per_layer_memory = (args.seq_length * args.micro_batch_size * args.hidden_size
//         * (10 + (24 / args.tensor_model_parallel_size)))
// The rest of that function adds the same embedding terms, logits and final-norm output at 2 bytes
// ((logits_size + final_ln_output) * 2) and multiplies everything by `overhead_factor = 1.05` ("buffer for optimizer
// and miscellaneous temporaries"): a margin, not a tensor, so only the per-layer term is compared (it is Korthikanti
// Table 2's "tensor parallel + selective recompute" row, checked in section 4).
double compute_activation_memory_without_sp_per_layer(const MegatronArgs& args) {
  return args.seq_length * args.micro_batch_size * args.hidden_size * (10 + (24 / args.tensor_model_parallel_size));
}

MegatronArgs megatron_args_llama3_8b(double t, double pp, double dp, bool distributed) {
  // tests/data/hf/llama-3-8b.json as Megatron arguments (--swiglu --normalization RMSNorm --group-query-attention
  // --num-query-groups 8 --untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type rope).
  // 128256 is a multiple of 128 * t for t = 1, 2, so Megatron's padded vocabulary is the vocabulary itself.
  MegatronArgs a;
  a.hidden_size = 4096, a.num_attention_heads = 32, a.kv_channels = 128, a.num_query_groups = 8;
  a.group_query_attention = true;
  a.ffn_hidden_size = 14336, a.swiglu = true, a.normalization = "RMSNorm";
  a.num_layers = 32, a.padded_vocab_size = 128256, a.untie_embeddings_and_output_weights = true;
  a.tensor_model_parallel_size = t, a.pipeline_model_parallel_size = pp, a.data_parallel_size = dp;
  a.use_distributed_optimizer = distributed;
  return a;
}

TEST_CASE("Megatron compute_weight_and_optimizer_memory: bytes per parameter as dist_optimizer.md publishes",
          "[reference][megatron]") {
  // dist_optimizer.md: "| `bf16` parameters, `fp32` gradients | 18 | 6 + 12/d |"
  for (double dp : {1.0, 2.0, 4.0, 8.0, 64.0}) {
    const MegatronArgs plain = megatron_args_llama3_8b(1, 1, dp, false), dist = megatron_args_llama3_8b(1, 1, dp, true);
    const MegatronWeights a = compute_weight_and_optimizer_memory(plain), b = compute_weight_and_optimizer_memory(dist);
    CHECK(a.weight_and_optimizer_memory == 18 * a.num_parameters_on_most_loaded_model_shard);
    CHECK(b.weight_and_optimizer_memory == (6 + 12 / dp) * b.num_parameters_on_most_loaded_model_shard);
  }
  // Llama-3-8B: 8,030,261,248 parameters (Meta's model card: 8.03B); the formula counts them all (no biases).
  CHECK(exact(compute_weight_and_optimizer_memory(megatron_args_llama3_8b(1, 1, 1, false)).num_total_parameters) == 8030261248LL);
}

TEST_CASE("Megatron compute_weight_and_optimizer_memory vs memsim's most loaded device (Llama-3-8B, TP x PP)",
          "[reference][megatron]") {
  // memsim: framework megatron, bf16 parameters with fp32 main gradients and fp32 master (the 18 B/param recipe),
  // ZeRO 0 = Megatron's plain optimizer, ZeRO 1 = the distributed optimizer (memsim has no separate switch: both
  // shard exactly the fp32 master and Adam moments over DP and keep bf16 params and fp32 grads whole, so the
  // model-state bytes are dist_optimizer.md's 6 + 12/d).
  //
  // The formula's one approximation against memsim's exact per-rank shapes: it divides *every* parameter by tp
  // and the final norm by pp, while Megatron replicates norm weights on every TP rank and keeps the final norm on
  // the last pipeline stage (memsim does the same, model.cpp apply_tensor_parallel). So, exactly:
  //   memsim = formula + (L/pp) * norms_per_layer * (1 - 1/t)     (per-layer norms replicated, not split)
  //                    + (pp == 1 ? final_norm * (1 - 1/t)         (final norm replicated)
  //                               : -final_norm / (pp * t))        (the formula's share of it on stage 0)
  const int64_t h = 4096, L = 32, dp = 4;
  const double norms_per_layer = 2.0 * h, final_norm = h;  // RMSNorm: norm_size = 1
  for (auto [t, pp] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {2, 2}, {1, 4}, {2, 4}}) {
    for (int64_t zero : {0, 1}) {
      Config c = single_gpu_config("llama-3-8b.json", 1, 4096);
      c.training.framework = "megatron";
      c.training.precision = "bf16_fp32_grads";
      c.training.optimizer = "adamw";
      c.training.activation_checkpointing = "full";
      c.parallel.tensor_parallel_size = t;
      c.parallel.pipeline_parallel_size = pp;
      c.parallel.data_parallel_size = dp;
      c.parallel.zero_stage = zero;
      Result r = simulate(c);
      REQUIRE(r.ok);
      const MegatronWeights w = compute_weight_and_optimizer_memory(megatron_args_llama3_8b(t, pp, dp, zero == 1));
      const double correction = static_cast<double>(L) / pp * norms_per_layer * (1 - 1.0 / t) +
                                (pp == 1 ? final_norm * (1 - 1.0 / t) : -final_norm / (pp * t));
      const int64_t P = exact(w.num_parameters_on_most_loaded_model_shard + correction);
      INFO("t " << t << ", pp " << pp << ", zero " << zero << ": formula shard " << w.num_parameters_on_most_loaded_model_shard
                << " params, correction " << correction);
      const ModelStates& m = r.devices[0].model_states;  // stage 0: the formula's "most loaded" shard
      CHECK(m.weights_bytes == 2 * P);
      CHECK(m.gradients_bytes == 4 * P);
      REQUIRE(P % dp == 0);
      CHECK(m.optimizer_bytes == (zero == 1 ? 12 * P / dp : 12 * P));
      const double bytes_per_param = zero == 1 ? 6 + 12.0 / dp : 18;
      CHECK(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes ==
            exact(w.weight_and_optimizer_memory + bytes_per_param * correction));
    }
  }
}

TEST_CASE("dist_optimizer.md's fp32 row (16 / 8 + 8/d) in memsim, its fp16 row (20 / 4 + 16/d) is not modelled",
          "[reference][megatron]") {
  // "| `fp32` parameters, `fp32` gradients | 16 | 8 + 8/d |"
  Config c = single_gpu_config("llama-3.2-1b.json", 1, 1024);
  c.training.framework = "megatron";
  c.training.precision = "fp32";
  c.parallel.data_parallel_size = 4;
  for (int64_t zero : {0, 1}) {
    c.parallel.zero_stage = zero;
    Result r = simulate(c);
    REQUIRE(r.ok);
    const int64_t P = r.params_total;
    REQUIRE(P % 4 == 0);
    const ModelStates& m = r.model_states;
    CHECK(m.weights_bytes + m.gradients_bytes == 8 * P);
    CHECK(m.optimizer_bytes == (zero == 1 ? 8 * P / 4 : 8 * P));
  }
  // "| `fp16` parameters, `fp16` gradients | 20 | 4 + 16/d |": Megatron keeps fp32 main gradients beside the fp16
  // model gradients (2 + 2 + 4 main params + 4 main grads + 8 moments). memsim's fp16_mixed is DeepSpeed's fp16
  // (2 + 2 + 12 = 16) and there is no Megatron fp16 recipe.
  WARN("skipped: Megatron fp16 params + fp16 grads (20 / 4 + 16/d B/param) -- memsim has no precision recipe with "
       "separate fp32 main gradients for fp16 parameters");
}

TEST_CASE("Megatron compute_weight_and_optimizer_memory vs memsim on Mixtral-8x7B: the router weight", "[reference][megatron]") {
  // MoE layers: the formula counts attention, experts, shared experts and norms but not the router
  // (MEMORY_FORMULAS.md sec. 1.1 [≠]); memsim counts the router's [E, h] weight (HF MixtralSparseMoeBlock.gate).
  // TP of MoE layers is not modelled in memsim, and the formula ignores expert parallelism: t = pp = 1.
  MegatronArgs a;
  a.hidden_size = 4096, a.num_attention_heads = 32, a.kv_channels = 128, a.num_query_groups = 8;
  a.group_query_attention = true, a.swiglu = true, a.normalization = "RMSNorm";
  a.ffn_hidden_size = 14336, a.num_experts = 8, a.moe_ffn_hidden_size = 14336, a.moe_layer_freq = 1;
  a.num_layers = 32, a.padded_vocab_size = 32000, a.untie_embeddings_and_output_weights = true;
  const MegatronWeights w = compute_weight_and_optimizer_memory(a);
  Config c = single_gpu_config("mixtral-8x7b.json", 1, 1024);
  c.training.framework = "megatron";
  c.training.precision = "bf16_fp32_grads";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t router = 32LL * 4096 * 8;  // L * h * E
  CHECK(r.params_total == exact(w.num_total_parameters) + router);
  const ModelStates& m = r.model_states;
  CHECK(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes == exact(w.weight_and_optimizer_memory) + 18 * router);
}

// ==================================================================================================================
// 4. Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198,
//    Table 2: activation memory per transformer layer, in bytes (16-bit activations, 1-byte dropout masks, a GPT
//    layer: LayerNorm, attention with softmax dropout, 4h GeLU MLP, hidden dropout; LayerNorm statistics ignored).
// ==================================================================================================================

struct Table2 {
  double s, b, h, a, t;
  double no_parallelism() const { return s * b * h * (34 + 5 * a * s / h); }
  double tensor_parallel() const { return s * b * h * (10 + 24 / t + 5 * a * s / (h * t)); }
  double tensor_sequence_parallel() const { return s * b * h * (34 / t + 5 * a * s / (h * t)); }
  double tensor_parallel_selective() const { return s * b * h * (10 + 24 / t); }
  double tensor_sequence_parallel_selective() const { return s * b * h * (34 / t); }
  double full_recompute() const { return s * b * h * 2; }
};

constexpr int64_t kS = 2048, kB = 1, kH = 12288, kA = 96, kT = 8;  // GPT-3 175B at micro-batch 1, TP 8

TEST_CASE("Korthikanti Table 2 for GPT-3 175B: theoretical_refs.jsonl's six rows", "[reference][korthikanti]") {
  // theory-korthikanti-table2-gpt3-175b-*: s = 2048, b = 1, h = 12288, a = 96, t = 8; 5as/h = 80 for GPT-3
  // (the paper's sec. 5).
  const Table2 g{kS, kB, kH, kA, kT};
  CHECK(5.0 * kA * kS / kH == 80);
  CHECK(exact(g.no_parallelism()) == 2868903936LL);
  CHECK(exact(g.tensor_parallel()) == 578813952LL);
  CHECK(exact(g.tensor_sequence_parallel()) == 358612992LL);
  CHECK(exact(g.tensor_parallel_selective()) == 327155712LL);
  CHECK(exact(g.tensor_sequence_parallel_selective()) == 106954752LL);
  CHECK(exact(g.full_recompute()) == 50331648LL);
  // Megatron's without-SP per-layer term is the "tensor parallel + selective recompute" row.
  MegatronArgs m;
  m.seq_length = kS, m.micro_batch_size = kB, m.hidden_size = kH, m.tensor_model_parallel_size = kT;
  CHECK(compute_activation_memory_without_sp_per_layer(m) == g.tensor_parallel_selective());
}

// GPT-3 175B as Megatron trains it (Brown et al. 2020 Table 2.1: 96 layers, d_model 12288, 96 heads of 128,
// context 2048; Megatron pads the 50257-token vocabulary to a multiple of 128 * t: 51200).
Config gpt3_175b(int64_t t, bool sp, const char* checkpointing, const char* attention, double dropout = 0.1) {
  Config c;
  ModelConfig& m = c.model;
  m.name = "GPT-3 175B shape";
  m.model_type = "gpt2";
  m.hidden_size = kH;
  m.num_hidden_layers = 96;
  m.num_attention_heads = kA;
  m.num_key_value_heads = kA;
  m.head_dim = kH / kA;
  m.intermediate_size = 4 * kH;
  m.vocab_size = 51200;
  m.max_position_embeddings = kS;
  m.tie_word_embeddings = true;
  m.hidden_act = "gelu";
  m.attention_bias = true;
  m.mlp_bias = true;
  m.norm_type = NormType::LayerNorm;
  m.mlp_gated = false;
  m.position_embedding_type = PositionType::Absolute;
  m.attention_dropout = dropout;
  m.hidden_dropout = dropout;
  c.training.micro_batch_size = kB;
  c.training.sequence_length = kS;
  c.training.framework = "megatron";
  c.training.precision = "bf16_fp32_grads";
  c.training.activation_checkpointing = checkpointing;
  c.training.attention = attention;
  c.parallel.data_parallel_size = 1;
  c.parallel.zero_stage = 0;
  c.parallel.tensor_parallel_size = t;
  c.parallel.sequence_parallel = sp;
  return c;
}

TEST_CASE("Korthikanti Table 2 vs memsim's saved activations of one GPT-3 175B layer", "[reference][korthikanti]") {
  // Terms memsim adds to every row, each stated by the source it follows:
  //  - LayerNorm statistics: aten native_layer_norm saves fp32 mean and rstd per token, 2 norms x 8 B = 16sb
  //    (the paper leaves LayerNorm's mean and variance out, sec. 4.1); divided by t under sequence parallelism.
  //  - FlashAttention (memsim's Megatron default, as TE's fused attention) replaces the 5as^2b term (softmax 2,
  //    its dropout mask 1, dropout output 2 bytes per score) by the fp32 logsumexp, 4abs: the kernel recomputes the
  //    scores and regenerates the dropout mask from its RNG state (Dao et al. 2022 sec. 3.1; MEMORY_FORMULAS.md
  //    sec. 3.2).
  //  - Unfused ("eager") attention in memsim is HF's eager_attention_forward, softmax(..., dtype=torch.float32):
  //    the saved softmax is fp32, 4as^2b instead of the paper's 2 (the fused kernel of Megatron's
  //    FusedScaleMaskSoftmax returns, and saves, 16-bit probabilities). So eager is 5as^2b + 2as^2b.
  const Table2 g{kS, kB, kH, kA, kT}, g1{kS, kB, kH, kA, 1};
  const int64_t s = kS, b = kB, a = kA, t = kT;
  const int64_t ln_stats = 16 * s * b, lse = 4 * a * b * s, fp32_softmax = 2 * a * s * s * b;
  SECTION("no parallelism") {
    CHECK(one_layer_saved(gpt3_175b(1, false, "none", "eager")) == exact(g1.no_parallelism()) + fp32_softmax + ln_stats);
    CHECK(one_layer_saved(gpt3_175b(1, false, "none", "flash_attention_2")) ==
          exact(g1.no_parallelism()) - 5 * a * s * s * b + lse + ln_stats);
  }
  SECTION("tensor parallel, t = 8") {
    CHECK(one_layer_saved(gpt3_175b(t, false, "none", "eager")) == exact(g.tensor_parallel()) + fp32_softmax / t + ln_stats);
    CHECK(one_layer_saved(gpt3_175b(t, false, "none", "flash_attention_2")) ==
          exact(g.tensor_parallel()) - 5 * a * s * s * b / t + lse / t + ln_stats);
  }
  SECTION("tensor + sequence parallel") {
    CHECK(one_layer_saved(gpt3_175b(t, true, "none", "eager")) ==
          exact(g.tensor_sequence_parallel()) + fp32_softmax / t + ln_stats / t);
    CHECK(one_layer_saved(gpt3_175b(t, true, "none", "flash_attention_2")) ==
          exact(g.tensor_sequence_parallel()) - 5 * a * s * s * b / t + lse / t + ln_stats / t);
  }
  SECTION("tensor parallel + selective recompute (unfused attention: the recomputed scores are not kept)") {
    CHECK(one_layer_saved(gpt3_175b(t, false, "selective", "eager")) == exact(g.tensor_parallel_selective()) + ln_stats);
  }
  SECTION("tensor + sequence parallel + selective recompute") {
    CHECK(one_layer_saved(gpt3_175b(t, true, "selective", "eager")) ==
          exact(g.tensor_sequence_parallel_selective()) + ln_stats / t);
  }
  SECTION("full recomputation: the layer input, replicated over TP ranks without SP") {
    CHECK(one_layer_saved(gpt3_175b(t, false, "full", "flash_attention_2")) == exact(g.full_recompute()));
  }
}

TEST_CASE("was a finding, fixed: selective recompute with flash attention keeps the logsumexp", "[reference][korthikanti]") {
  // Megatron's selective recompute checkpoints the core attention (--recompute-granularity selective, module
  // core_attn): the checkpoint keeps its inputs q, k, v, and o_proj keeps the output; the kernel's own saved
  // logsumexp is dropped and recomputed. Table 2's "tensor + sequence parallel + selective recompute" row is then
  // exact (plus the LayerNorm statistics). memsim drops the s^2 tensors of eager attention under selective
  // recompute but keeps the flash kernel's fp32 logsumexp (activations.cpp layer_forward: the LSE is pushed to the
  // saved set whatever keep_s2 is): 4abs/t = 4 * 96 * 1 * 2048 / 8 = 98,304 B per layer too many for GPT-3
  // 175B at t = 8 (9.4 MB over 96 layers).
  const Table2 g{kS, kB, kH, kA, kT};
  CHECK(one_layer_saved(gpt3_175b(kT, true, "selective", "flash_attention_2")) ==
        exact(g.tensor_sequence_parallel_selective()) + 16 * kS * kB / kT);
}

// ==================================================================================================================
// 5. Megatron's compute_activation_memory (the SP + selective path) against memsim's whole first-stage device.
// ==================================================================================================================

// A GPT-style model (1.3B-class) with a 51200-token vocabulary: a multiple of 128 * t for t = 2, 4, so Megatron's
// padded vocabulary is the vocabulary itself.
Config megatron_gpt(int64_t layers, int64_t t, int64_t pp, double dropout) {
  Config c = gpt3_175b(t, true, "selective", "eager", dropout);
  c.model.name = "GPT, 2048 hidden";
  c.model.hidden_size = 2048;
  c.model.num_attention_heads = 16;
  c.model.num_key_value_heads = 16;
  c.model.head_dim = 128;
  c.model.intermediate_size = 4 * 2048;
  c.model.num_hidden_layers = layers;
  c.parallel.pipeline_parallel_size = pp;
  return c;
}

MegatronArgs megatron_gpt_args(int64_t layers, int64_t t, int64_t pp) {
  MegatronArgs a;
  a.seq_length = kS, a.micro_batch_size = kB, a.hidden_size = 2048, a.ffn_hidden_size = 4 * 2048;
  a.num_layers = static_cast<double>(layers), a.padded_vocab_size = 51200;
  a.tensor_model_parallel_size = static_cast<double>(t), a.pipeline_model_parallel_size = static_cast<double>(pp);
  return a;
}

// memsim's terms beside the formula's, per micro-batch on the first stage (t-way SP, s b tokens):
//  - input ids (int64) and, where the stage also computes the loss, labels: 8sb each, on every TP rank (the formula
//    divides its 8sb "Input to embedding" by t);
//  - LayerNorm statistics, 16sb/t per layer and 8sb/t for the final norm (Korthikanti ignores them);
//  - memsim's eager attention under selective recompute keeps no scores and no logsumexp, as Megatron (these tests
//    use it because memsim's flash path keeps the logsumexp under selective recompute: see the FINDING above).
int64_t memsim_extras(int64_t layers_on_stage, int64_t t, bool with_loss) {
  const int64_t sb = kS * kB;
  return (with_loss ? 16 : 8) * sb + layers_on_stage * 16 * sb / t + (with_loss ? 8 * sb / t : 0);
}

TEST_CASE("Megatron compute_activation_memory vs memsim, pp = 1, no dropout", "[reference][megatron]") {
  // The formula counts Korthikanti's dropout masks (2sbh per layer inside its 34sbh, and the embedding dropout's sbh);
  // with dropout 0 (as Llama-era Megatron recipes run) there are none, and memsim saves 32sbh/t per layer.
  const int64_t L = 4, t = 4, sbh = kS * kB * 2048;
  const double formula = compute_activation_memory(megatron_gpt_args(L, t, 1), std::nullopt);
  const int64_t masks = (2 * L + 1) * sbh / t;
  CHECK(saved_activations_at_first_backward(megatron_gpt(L, t, 1, 0.0)) ==
        exact(formula) - masks - 8 * kS * kB / t + memsim_extras(L, t, true));
}

TEST_CASE("was a finding, fixed: the embedding dropout mask of pre-LN models (Megatron's `s*b*h*pp`, Korthikanti sec. 4.3)",
          "[reference][megatron]") {
  // compute_activation_memory, within its own assumptions (hidden dropout > 0):
  //     # Dropout in embedding layer (pp_size microbatches in flight).
  //     activation_memory += (args.seq_length * args.micro_batch_size * args.hidden_size * args.pipeline_model_parallel_size)
  // Megatron's LanguageModelEmbedding applies embedding_dropout to the embeddings (HF GPT2Model: self.drop), which
  // saves a 1-byte mask of s b h / t (SP) per micro-batch in flight. memsim saves this mask only for post-LN
  // encoders (activations.cpp embed_forward: `if (cfg_.model.post_layernorm)`), so for a GPT-style model with
  // hidden_dropout > 0 it is missing: sbh/t = 2048 * 1 * 2048 / 4 = 1,048,576 B here; 3,145,728 B for GPT-3 175B
  // at t = 8 (s = 2048, b = 1), times the micro-batches in flight on the first pipeline stage.
  const int64_t L = 4, t = 4;
  const double formula = compute_activation_memory(megatron_gpt_args(L, t, 1), std::nullopt);
  CHECK(saved_activations_at_first_backward(megatron_gpt(L, t, 1, 0.1)) ==
        exact(formula) - 8 * kS * kB / t + memsim_extras(L, t, true));
}

TEST_CASE("Megatron compute_activation_memory vs memsim: the first pipeline stage's micro-batches in flight",
          "[reference][megatron][pp]") {
  // "We are trying to compute the maximum activation footprint, so all calculations in this function are for the
  // first pipeline stage": L/pp layers for each of pp micro-batches in flight under 1F1B, discounted by
  // min(1, num_microbatches / pp) when there are fewer micro-batches. memsim: stage 0's saved activations at the
  // first backward of step 2, where 1F1B holds min(m, pp) micro-batches. No dropout (see above), t = 2 with SP.
  const int64_t L = 8, t = 2, pp = 4, sbh = kS * kB * 2048;
  for (int64_t m : {8, 4, 2}) {
    Config c = megatron_gpt(L, t, pp, 0.0);
    c.training.gradient_accumulation_steps = m;
    const double formula = compute_activation_memory(megatron_gpt_args(L, t, pp), static_cast<double>(m));
    const int64_t in_flight = std::min(m, pp);
    // the formula's masks and its ids (8sb/t) for the micro-batches in flight
    const int64_t masks = in_flight * (2 * (L / pp) + 1) * sbh / t;
    const int64_t ids = in_flight * 8 * kS * kB / t;
    INFO("micro-batches " << m << ": formula " << formula);
    CHECK(saved_activations_at_first_backward(c, 0, "backward (step 2") ==
          exact(formula) - masks - ids + in_flight * memsim_extras(L / pp, t, false));
  }
  // The interleaved schedule's penalty 1 + (pp - 1) / (pp * vpp) is checked against memsim's simulated
  // interleaved order in test_distributed.cpp ("interleaved 1F1B: the first stage holds ...").
}

// ==================================================================================================================
// 6. HF transformers docs/source/en/model_memory_anatomy.md (249ef81), theoretical_refs.jsonl
//    theory-hf-anatomy-bytes-per-param: mixed-precision AdamW = 18 bytes/param: weights 6 ("fp32 + fp16 copy"),
//    gradients 4 (fp32), optimizer 8. With torch.autocast the fp32 weights, grads and moments are the persistent
//    16 bytes; the 2-byte low-precision copy of each linear weight is cached by autocast during the forward
//    (aten/src/ATen/autocast_mode.cpp cached_cast: fp32 leaf tensors that require grad) and saved by the matmul
//    until its backward. Embeddings and norms are not autocast ops, so they have no copy.
// ==================================================================================================================

TEST_CASE("HF model-memory anatomy, 18 bytes/param: the persistent 16 and each layer's 2-byte weight copies",
          "[reference][hf]") {
  Config c = single_gpu_config("llama-2-7b.json", 1, 512);
  c.training.precision = "amp_bf16";
  c.training.optimizer = "adamw";
  Result r = simulate(c);
  REQUIRE(r.ok);
  const int64_t P = r.params_total;
  CHECK(r.model_states.weights_bytes == 4 * P);
  CHECK(r.model_states.gradients_bytes == 4 * P);
  CHECK(r.model_states.optimizer_bytes == 8 * P);
  // At the end of the forward, every decoder layer's cached copy is alive: 2 bytes per linear weight element.
  ModelShape shape = build_model_shape(c.model);
  const StepProgram& prog = r.devices[0].program;
  const uint32_t end = phase_range(prog, "backward").begin;
  std::vector<int64_t> per_layer(static_cast<size_t>(shape.num_layers), 0);
  for (uint32_t i = 0; i < end; ++i) {
    const Event& e = prog.events[i];
    if (label_of(prog, e) != "autocast low-precision weight copies") continue;
    const Tensor& tn = prog.tensors[e.tensor];
    if (tn.layer < 0) continue;  // lm_head's copy: the test below
    per_layer[static_cast<size_t>(tn.layer)] += (e.op == Event::Op::Alloc ? 1 : -1) * tn.bytes;
  }
  for (int64_t l = 0; l < shape.num_layers; ++l) CHECK(per_layer[static_cast<size_t>(l)] == 2 * matmul_numel(shape.layer));
}

TEST_CASE("was a finding, fixed: autocast also caches the low-precision copy of lm_head's weight", "[reference][hf]") {
  // lm_head (or, tied, the embedding matrix used by F.linear) is an fp32 leaf parameter that requires grad, so
  // cached_cast caches its bf16 copy like any other linear weight and the matmul saves it for lm_head's backward.
  // memsim creates the cached copies only for decoder layers (activations.cpp: casts_[layer] in layer_forward*),
  // so under amp_bf16/amp_fp16 the copy of the head, 2 * V * h bytes, is missing from forward to the loss backward:
  // 2 * 32000 * 4096 = 262,144,000 B for Llama-2-7B, 2 * 128256 * 4096 = 1,050,673,152 B for Llama-3-8B.
  Config c = single_gpu_config("llama-2-7b.json", 1, 512);
  c.training.precision = "amp_bf16";
  Result r = simulate(c);
  REQUIRE(r.ok);
  ModelShape shape = build_model_shape(c.model);
  const int64_t expected = 2 * (shape.num_layers * matmul_numel(shape.layer) + 32000LL * 4096);
  CHECK(live_label_before_phase(r.devices[0].program, "backward", "autocast low-precision weight copies") == expected);
}

}  // namespace
