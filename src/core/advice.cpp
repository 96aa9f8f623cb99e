#include "advice.h"

#include <algorithm>

#include "frameworks.h"
#include "simulate.h"
#include "tables.h"

namespace memsim {

namespace {

// The most loaded GPU's device peak, and the worst verdict over the GPUs (the verdicts are declared from best to
// worst). A change that leaves a GPU borderline does not make the setup fit.
int64_t worst_peak(const Result& r, Verdict& verdict) {
  int64_t peak = 0;
  verdict = Verdict::Fits;
  for (const auto& d : r.devices)
    peak = std::max(peak, d.peak.device_bytes), verdict = std::max(verdict, d.verdict);
  return peak;
}

}  // namespace

int64_t worst_device_peak(const Result& r) {
  if (!r.ok) return -1;
  Verdict verdict;
  return worst_peak(r, verdict);
}

int64_t worst_device_peak(const Config& config) { return worst_device_peak(simulate(config)); }

bool score_suggestion(Suggestion& s, int64_t peak_now, const Result& r) {
  if (!r.ok) return false;
  s.peak_bytes = worst_peak(r, s.verdict);
  s.fits = s.verdict == Verdict::Fits;
  s.saved_bytes = peak_now - s.peak_bytes;
  return true;
}

bool evaluate_suggestion(Suggestion& s, int64_t peak_now) { return score_suggestion(s, peak_now, simulate(s.config)); }

std::vector<Suggestion> rank_suggestions(std::vector<Suggestion> evaluated) {
  std::vector<Suggestion> out;
  // A change that saves less than 16 MiB would read as 0.00 GiB: not worth a row.
  for (auto& s : evaluated)
    if (s.saved_bytes >= (int64_t{16} << 20)) out.push_back(std::move(s));
  std::stable_sort(out.begin(), out.end(), [](const Suggestion& a, const Suggestion& b) { return a.saved_bytes > b.saved_bytes; });
  return out;
}

std::vector<Suggestion> suggest(const Config& base) {
  const int64_t peak_now = worst_device_peak(base);
  if (peak_now < 0) return {};
  std::vector<Suggestion> out;
  for (auto& s : suggestion_candidates(base))
    if (evaluate_suggestion(s, peak_now)) out.push_back(std::move(s));
  return rank_suggestions(std::move(out));
}

std::vector<Suggestion> suggestion_candidates(const Config& base) {
  std::vector<Suggestion> candidates;
  auto add = [&](std::string change, std::string cost, Config c) { candidates.push_back({std::move(change), std::move(cost), std::move(c)}); };
  const auto& t = base.training;
  const auto& p = base.parallel;
  const Resolved rs = resolve(base);
  const Sharding sharding = rs.sharding;
  const bool fsdp = sharding == Sharding::Fsdp1 || sharding == Sharding::Fsdp2;

  if (t.activation_checkpointing != "full") {
    Config c = base;
    c.training.activation_checkpointing = "full";
    add("Full activation checkpointing", "about 33% more compute: every layer's forward runs again in backward "
        "(Korthikanti et al. 2022)", c);
  }
  if (t.micro_batch_size > 1) {
    Config c = base;
    c.training.micro_batch_size = std::max<int64_t>(1, t.micro_batch_size / 2);
    c.training.gradient_accumulation_steps = t.gradient_accumulation_steps * (t.micro_batch_size / c.training.micro_batch_size);
    add("Halve the micro-batch, double the gradient accumulation", "same global batch; smaller matmuls run less "
        "efficiently", c);
  }
  if (p.data_parallel_size > 1 && p.zero_stage < 3 && p.pipeline_parallel_size == 1) {
    Config c = base;
    c.parallel.zero_stage = p.zero_stage + 1;
    add("ZeRO stage " + std::to_string(p.zero_stage + 1), c.parallel.zero_stage == 3
            ? "weights are all-gathered per layer in forward and backward: 1.5x the data-parallel traffic "
              "(ZeRO paper sec. 7)"
            : "no extra traffic: a reduce-scatter and all-gather replace the all-reduce (ZeRO paper sec. 7)", c);
  }
  if (p.data_parallel_size > 1 && p.zero_stage >= 1 && p.offload_optimizer == "none") {
    Config c = base;
    c.parallel.offload_optimizer = "cpu";
    if (fsdp) {
      c.parallel.zero_stage = 3;
      c.parallel.offload_params = "cpu";  // FSDP's CPUOffload moves parameters and optimizer together
    }
    add("Optimizer offload to CPU", "ZeRO-Offload or FSDP CPUOffload: the step runs on the CPU and gradients "
        "cross PCIe every step: often 1.5-3x slower; needs host RAM (shown below the devices)", c);
  }
  if (p.context_parallel_size == 1 && t.sequence_length >= 16384 && t.sequence_length % 4 == 0 &&
      p.data_parallel_size % 2 == 0 && !base.model.post_layernorm && base.model.kv_lora_rank == 0 && t.attention != "eager") {
    Config c = base;
    c.parallel.context_parallel_size = 2;
    c.parallel.data_parallel_size = p.data_parallel_size / 2;
    add("Context parallel 2 (ring attention), same GPUs", "each GPU holds half of every sequence; key/value "
        "chunks circulate between the pair every layer", c);
  }
  if (t.optimizer == "adamw" || t.optimizer == "adam") {
    Config c = base;
    c.training.optimizer = "adamw_8bit";
    add("8-bit AdamW (bitsandbytes)", "block-wise quantized states; usually matches 32-bit AdamW's quality "
        "(Dettmers et al. 2021)", c);
  }
  if (!base.peft.enabled()) {
    Config c = base;
    c.peft.method = "lora";
    c.peft.lora_rank = 16;
    c.peft.target_modules = "all-linear";
    add("LoRA (rank 16, all linears)", "trains 0.1-1% of the parameters: a fine-tuning method, not pre-training", c);
    c.peft.base_quantization = "nf4";
    c.peft.double_quantization = true;
    if (c.training.precision == "fp32") c.training.precision = "bf16_pure";
    add("QLoRA (4-bit NF4 base, LoRA rank 16)", "4-bit weights cost some quality and dequantization time "
        "(Dettmers et al. 2023)", c);
  }
  if (p.tensor_parallel_size == 1 && base.model.num_attention_heads % 2 == 0 && base.model.num_experts == 0 &&
      !base.model.post_layernorm && !base.peft.enabled() && p.data_parallel_size % 2 == 0) {
    Config c = base;
    c.parallel.tensor_parallel_size = 2;
    c.parallel.data_parallel_size = p.data_parallel_size / 2;
    c.parallel.sequence_parallel = base.training.sequence_length % 2 == 0;
    add("Tensor parallel 2 (with sequence parallel), same GPUs", "all-reduces inside every layer: fine within an "
        "NVLink node", c);
  }
  if (t.loss != "fused_linear" && !base.model.post_layernorm) {
    Config c = base;
    c.training.loss = "fused_linear";
    add("Fused linear cross-entropy (Liger)", "no full logits; about as fast", c);
  }
  if (!t.compile && t.activation_checkpointing != "full") {
    Config c = base;
    c.training.compile = true;
    add("torch.compile the layers", "compile time at start-up; Inductor recomputes the norms' fp32 copies and "
        "SwiGLU's activation in backward instead of saving them (usually faster, not slower)", c);
  }
  if (rs.attention == Attention::Eager) {
    Config c = base;
    c.training.attention = "sdpa";
    add("SDPA / FlashAttention instead of eager attention", "faster as well", c);
  }
  if (!t.activation_offload && t.activation_checkpointing == "none") {
    Config c = base;
    c.training.activation_offload = true;
    add("CPU activation offloading", "PCIe traffic each step; slower unless overlapped", c);
  }
  if (fsdp && t.gradient_accumulation_steps > 1 && p.fsdp_no_sync != "false" && p.pipeline_parallel_size == 1) {
    Config c = base;
    c.parallel.fsdp_no_sync = "false";
    add("Sync gradients every micro-batch", "Accelerate's sync_each_batch=True (in Fabric, "
        "no_backward_sync(enabled=False)): a reduce-scatter per micro-batch instead of one per step, where FSDP's "
        "no_sync() holds the whole model's unsharded gradients", c);
  }
  if (!rs.expandable_segments) {
    Config c = base;
    c.hardware.expandable_segments = "true";
    add("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "no change to the training itself: the allocator grows "
        "one segment per stream in 20 MiB pages instead of caching whole cudaMalloc blocks (PyTorch CUDA semantics "
        "docs: it helps where fragmentation wastes memory); mapped pages are kept until empty_cache", c);
  }
  // A 1F1B pipeline's first stage keeps the most micro-batches' activations in flight (the stage count, against
  // one on the last): giving it fewer layers and the others more evens the devices out (Megatron
  // --decoder-first-pipeline-num-layers; transformer_block.py get_num_layers_to_build). The first split that keeps
  // the other stages even is offered.
  if (p.pipeline_parallel_size > 1 && p.pipeline_schedule != "interleaved_1f1b" && p.pipeline_first_stage_layers == 0 &&
      p.pipeline_last_stage_layers == 0) {
    const int64_t layers = base.model.num_hidden_layers, stages = p.pipeline_parallel_size;
    for (int64_t first = layers / stages - 1; first >= 1; --first)
      if ((layers - first) % (stages - 1) == 0) {
        Config c = base;
        c.parallel.pipeline_first_stage_layers = first;
        add("Fewer layers on the first pipeline stage (" + std::to_string(first) + ", the others " +
                std::to_string((layers - first) / (stages - 1)) + " each)",
            "Megatron's --decoder-first-pipeline-num-layers: the first stage holds the most micro-batches in flight; "
            "the other stages then compute more, so the step can take a little longer",
            c);
        break;
      }
  }
  if (rs.softmax_saves_input) {
    Config c = base;
    c.training.softmax_saves_input = "false";
    add("PyTorch 1.11 or newer", "its softmax keeps only its output for backward, not its input as well "
        "(pytorch/pytorch#66018); check the rest of the stack supports it", c);
  }
  if (!rs.zero_grad_set_to_none) {
    Config c = base;
    c.training.zero_grad_set_to_none = "true";
    add("zero_grad(set_to_none=True)", "the default since PyTorch 2.0: gradients are freed after the step instead "
        "of zeroed in place, so they are not held through the next forward", c);
  }
  if (t.precision == "fp32") {
    // bf16 needs Ampere (sm_80) or newer; older GPUs get fp16 autocast, with its loss scaling.
    const GpuSpec* gpu = find_gpu(base.hardware.gpu);
    const bool bf16 = !gpu || gpu->compute_capability >= 80;
    Config c = base;
    c.training.precision = bf16 ? "amp_bf16" : "amp_fp16";
    if (bf16) add("bf16 autocast instead of fp32", "faster on tensor cores; bf16 needs Ampere or newer", c);
    else add("fp16 autocast instead of fp32", "faster on tensor cores; needs loss scaling (torch.cuda.amp.GradScaler), "
             "as this GPU has no bf16", c);
  }

  return candidates;
}

}  // namespace memsim
