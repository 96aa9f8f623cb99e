#include "versions.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace memsim {

namespace {

// ---------------------------------------------------------------------------------------------------------
// [SECTION] Release tables: every release a date can pick, oldest first.
// ---------------------------------------------------------------------------------------------------------
// The rules' boundaries (softmax torch 1.11, lazy loading 1.13, transformers 4.31 ... 4.56, peft 0.6 and 0.12,
// bitsandbytes 0.43.2) all lie after the first entry of their table, so a date before a table's first release
// sets the same switches as that release.

// docs/versions.md "Release-date table": minor releases from memory (+-2 days) there. Patch releases that a
// rule needs (2.1.1: transformers' SDPA default needs torch >= 2.1.1) and the releases after 2.9 come from
// pytorch/pytorch RELEASE.md "Release cadence table", which gives 2.1.1 and 2.1.2 as months only (Nov, Dec 2023)
// and 2.10 as Jan 2026: a month-only date is its last day here, so that no release is assumed before it could
// have happened. 2.11-2.15 are the days that table plans (not verified against the actual releases).
constexpr Release kTorch[] = {
    {{1, 10, 0}, {2021, 10, 21}}, {{1, 11, 0}, {2022, 3, 10}},  {{1, 12, 0}, {2022, 6, 28}},
    {{1, 13, 0}, {2022, 10, 28}}, {{2, 0, 0}, {2023, 3, 15}},   {{2, 1, 0}, {2023, 10, 4}},
    {{2, 1, 1}, {2023, 11, 30}},  {{2, 1, 2}, {2023, 12, 31}},  {{2, 2, 0}, {2024, 1, 30}},
    {{2, 3, 0}, {2024, 4, 24}},   {{2, 4, 0}, {2024, 7, 24}},   {{2, 5, 0}, {2024, 10, 17}},
    {{2, 5, 1}, {2024, 10, 29}},  {{2, 6, 0}, {2025, 1, 29}},   {{2, 7, 0}, {2025, 4, 23}},
    {{2, 8, 0}, {2025, 8, 6}},    {{2, 9, 0}, {2025, 10, 15}},  {{2, 10, 0}, {2026, 1, 31}},
    {{2, 11, 0}, {2026, 3, 18}},  {{2, 12, 0}, {2026, 5, 13}},  {{2, 13, 0}, {2026, 7, 8}},
    {{2, 14, 0}, {2026, 9, 2}},   {{2, 15, 0}, {2026, 10, 28}},
};

// docs/versions.md "Release-date table" (from memory there, +-2 days; 4.31, 4.37, 4.51, 4.53, 4.55 and 4.57
// cross-checked against axolotl's "upgrade transformers" commits). 5.0.0's date is inferred, not found: its rc0 is
// dated 2025-12-01 (a press report), #43203 (merged 2026-01-09) is in 5.0.0 (snowflakedb/ArcticTraining#373), and
// v5.5.0 followed on 2026-04-02 after weekly minors; 2026-01-26 is placed between, +-4 weeks. Only
// training.checkpoint_reentrant reads it.
constexpr Release kTransformers[] = {
    {{4, 30, 0}, {2023, 6, 7}},  {{4, 31, 0}, {2023, 7, 18}}, {{4, 32, 0}, {2023, 8, 22}},  {{4, 33, 0}, {2023, 9, 7}},
    {{4, 34, 0}, {2023, 10, 3}}, {{4, 35, 0}, {2023, 11, 2}}, {{4, 36, 0}, {2023, 12, 11}}, {{4, 37, 0}, {2024, 1, 22}},
    {{4, 38, 0}, {2024, 2, 21}}, {{4, 39, 0}, {2024, 3, 20}}, {{4, 40, 0}, {2024, 4, 18}},  {{4, 41, 0}, {2024, 5, 17}},
    {{4, 42, 0}, {2024, 6, 27}}, {{4, 43, 0}, {2024, 7, 23}}, {{4, 44, 0}, {2024, 8, 6}},   {{4, 45, 0}, {2024, 9, 25}},
    {{4, 46, 0}, {2024, 10, 24}}, {{4, 47, 0}, {2024, 12, 5}}, {{4, 48, 0}, {2025, 1, 10}}, {{4, 49, 0}, {2025, 2, 17}},
    {{4, 50, 0}, {2025, 3, 21}}, {{4, 51, 0}, {2025, 4, 5}},  {{4, 52, 0}, {2025, 5, 20}},  {{4, 53, 0}, {2025, 6, 26}},
    {{4, 54, 0}, {2025, 7, 25}}, {{4, 55, 0}, {2025, 8, 5}},  {{4, 56, 0}, {2025, 8, 29}},  {{4, 57, 0}, {2025, 10, 3}},
    {{5, 0, 0}, {2026, 1, 26}},
};

// docs/versions.md: huggingface/peft tag commit dates.
constexpr Release kPeft[] = {
    {{0, 4, 0}, {2023, 7, 17}},  {{0, 5, 0}, {2023, 8, 22}},  {{0, 6, 0}, {2023, 11, 2}},  {{0, 6, 2}, {2023, 11, 13}},
    {{0, 7, 0}, {2023, 12, 6}},  {{0, 7, 1}, {2023, 12, 12}}, {{0, 8, 0}, {2024, 1, 30}},  {{0, 8, 2}, {2024, 2, 1}},
    {{0, 9, 0}, {2024, 2, 28}},  {{0, 10, 0}, {2024, 3, 21}}, {{0, 11, 0}, {2024, 5, 16}}, {{0, 11, 1}, {2024, 5, 17}},
    {{0, 12, 0}, {2024, 7, 24}}, {{0, 13, 0}, {2024, 9, 25}}, {{0, 13, 2}, {2024, 10, 11}}, {{0, 14, 0}, {2024, 12, 6}},
    {{0, 15, 0}, {2025, 3, 19}}, {{0, 15, 2}, {2025, 4, 15}}, {{0, 16, 0}, {2025, 7, 3}},  {{0, 17, 0}, {2025, 8, 1}},
    {{0, 17, 1}, {2025, 8, 21}}, {{0, 18, 0}, {2025, 11, 13}},
};

// docs/versions.md: bitsandbytes-foundation/bitsandbytes tag commit dates. 0.39.0 is untagged (its version bump is
// dated 2023-05-23, taken as the month's end), and so are 0.41.1-0.41.3, which no rule tells apart from 0.41.0.
constexpr Release kBitsandbytes[] = {
    {{0, 39, 0}, {2023, 5, 31}},  {{0, 39, 1}, {2023, 6, 19}}, {{0, 40, 0}, {2023, 7, 11}}, {{0, 41, 0}, {2023, 7, 22}},
    {{0, 42, 0}, {2024, 1, 7}},   {{0, 43, 0}, {2024, 3, 8}},  {{0, 43, 1}, {2024, 4, 11}}, {{0, 43, 2}, {2024, 7, 23}},
    {{0, 43, 3}, {2024, 7, 30}},  {{0, 44, 0}, {2024, 9, 23}}, {{0, 44, 1}, {2024, 9, 30}}, {{0, 45, 0}, {2024, 12, 5}},
    {{0, 45, 5}, {2025, 4, 7}},   {{0, 46, 0}, {2025, 5, 27}}, {{0, 46, 1}, {2025, 7, 2}},  {{0, 47, 0}, {2025, 8, 11}},
    {{0, 48, 0}, {2025, 9, 30}},  {{0, 48, 2}, {2025, 10, 29}}, {{0, 49, 0}, {2025, 12, 11}},
};

// docs/versions.md: microsoft/DeepSpeed tag commit dates (the tags it lists, not every patch release).
constexpr Release kDeepspeed[] = {
    {{0, 9, 0}, {2023, 4, 13}},  {{0, 9, 5}, {2023, 6, 22}},  {{0, 10, 0}, {2023, 7, 17}}, {{0, 10, 3}, {2023, 9, 11}},
    {{0, 11, 0}, {2023, 10, 6}}, {{0, 12, 0}, {2023, 11, 3}}, {{0, 12, 6}, {2023, 12, 20}}, {{0, 13, 0}, {2024, 1, 19}},
    {{0, 14, 0}, {2024, 3, 7}},  {{0, 14, 4}, {2024, 6, 21}}, {{0, 15, 0}, {2024, 8, 22}}, {{0, 15, 4}, {2024, 11, 6}},
    {{0, 16, 0}, {2024, 11, 25}}, {{0, 16, 4}, {2025, 2, 20}}, {{0, 16, 9}, {2025, 5, 23}}, {{0, 17, 0}, {2025, 6, 2}},
    {{0, 17, 6}, {2025, 9, 19}}, {{0, 18, 0}, {2025, 10, 7}},
};

// pytorch/ao release tags (`git for-each-ref refs/tags`, creator dates of v0.1 ... v0.18.0; release candidates
// left out).
constexpr Release kTorchao[] = {
    {{0, 1, 0}, {2024, 4, 4}},   {{0, 2, 0}, {2024, 5, 20}},  {{0, 3, 0}, {2024, 6, 25}},  {{0, 4, 0}, {2024, 8, 6}},
    {{0, 5, 0}, {2024, 9, 10}},  {{0, 6, 0}, {2024, 10, 8}},  {{0, 6, 1}, {2024, 10, 21}}, {{0, 7, 0}, {2024, 12, 5}},
    {{0, 8, 0}, {2025, 1, 14}},  {{0, 9, 0}, {2025, 2, 20}},  {{0, 10, 0}, {2025, 4, 2}},  {{0, 11, 0}, {2025, 5, 9}},
    {{0, 12, 0}, {2025, 7, 14}}, {{0, 13, 0}, {2025, 9, 2}},  {{0, 14, 1}, {2025, 10, 20}}, {{0, 15, 0}, {2025, 12, 16}},
    {{0, 16, 0}, {2026, 2, 5}},  {{0, 17, 0}, {2026, 3, 25}}, {{0, 18, 0}, {2026, 7, 31}},
};

// docs/versions.md: Dao-AILab/flash-attention tag commit dates (the tags it lists).
constexpr Release kFlashAttn[] = {
    {{2, 0, 0}, {2023, 7, 17}},  {{2, 3, 0}, {2023, 9, 26}}, {{2, 4, 0}, {2023, 12, 22}}, {{2, 5, 0}, {2024, 1, 22}},
    {{2, 6, 0}, {2024, 7, 10}},  {{2, 7, 0}, {2024, 11, 12}}, {{2, 8, 0}, {2025, 6, 14}}, {{2, 8, 3}, {2025, 8, 14}},
};

// docs/versions.md (pytorch/torchtune tag dates), with the patch tags 0.1.1, 0.2.1 and 0.3.1 (`git for-each-ref
// refs/tags` of pytorch/torchtune).
constexpr Release kTorchtune[] = {
    {{0, 1, 0}, {2024, 4, 15}}, {{0, 1, 1}, {2024, 4, 18}}, {{0, 2, 0}, {2024, 7, 15}}, {{0, 2, 1}, {2024, 7, 25}},
    {{0, 3, 0}, {2024, 9, 17}}, {{0, 3, 1}, {2024, 10, 2}}, {{0, 4, 0}, {2024, 11, 13}}, {{0, 5, 0}, {2024, 12, 13}},
    {{0, 6, 0}, {2025, 3, 18}}, {{0, 6, 1}, {2025, 4, 7}},
};

// Unsloth numbers its releases by year and month (pypi unsloth 2024.8, 2025.3.19: the notebooks print "Unsloth
// 2024.8"). Each month's releases are dated here on the month's last day, as torch's month-only dates are, so that
// no release is assumed before it could have happened; the rules in frameworks.cpp (derive_unsloth) take a change
// from the first month whose releases all have it (docs/research/unsloth.md, tags July-2024 ... November-2025 of
// unslothai/unsloth). 2026.8 is the newest release read (HEAD 015bdef0, 2026-08-22).
constexpr Release kUnsloth[] = {
    {{2024, 1, 0}, {2024, 1, 31}}, {{2024, 2, 0}, {2024, 2, 29}}, {{2024, 3, 0}, {2024, 3, 31}}, {{2024, 4, 0}, {2024, 4, 30}},
    {{2024, 5, 0}, {2024, 5, 31}}, {{2024, 6, 0}, {2024, 6, 30}}, {{2024, 7, 0}, {2024, 7, 31}}, {{2024, 8, 0}, {2024, 8, 31}},
    {{2024, 9, 0}, {2024, 9, 30}}, {{2024, 10, 0}, {2024, 10, 31}}, {{2024, 11, 0}, {2024, 11, 30}}, {{2024, 12, 0}, {2024, 12, 31}},
    {{2025, 1, 0}, {2025, 1, 31}}, {{2025, 2, 0}, {2025, 2, 28}}, {{2025, 3, 0}, {2025, 3, 31}}, {{2025, 4, 0}, {2025, 4, 30}},
    {{2025, 5, 0}, {2025, 5, 31}}, {{2025, 6, 0}, {2025, 6, 30}}, {{2025, 7, 0}, {2025, 7, 31}}, {{2025, 8, 0}, {2025, 8, 31}},
    {{2025, 9, 0}, {2025, 9, 30}}, {{2025, 10, 0}, {2025, 10, 31}}, {{2025, 11, 0}, {2025, 11, 30}}, {{2025, 12, 0}, {2025, 12, 31}},
    {{2026, 1, 0}, {2026, 1, 31}}, {{2026, 2, 0}, {2026, 2, 28}}, {{2026, 3, 0}, {2026, 3, 31}}, {{2026, 4, 0}, {2026, 4, 30}},
    {{2026, 5, 0}, {2026, 5, 31}}, {{2026, 6, 0}, {2026, 6, 30}}, {{2026, 7, 0}, {2026, 7, 31}}, {{2026, 8, 0}, {2026, 8, 31}},
};

// huggingface/trl tag creator dates (`git for-each-ref refs/tags` of huggingface/trl): the minor releases, and the
// patch tags of 0.9 and 0.10 (their .0 tags are missing from the mirror).
constexpr Release kTrl[] = {
    {{0, 7, 0}, {2023, 8, 30}},  {{0, 8, 0}, {2024, 3, 19}},  {{0, 9, 3}, {2024, 6, 5}},   {{0, 10, 1}, {2024, 8, 29}},
    {{0, 11, 0}, {2024, 9, 19}}, {{0, 12, 0}, {2024, 11, 1}}, {{0, 13, 0}, {2024, 12, 15}}, {{0, 14, 0}, {2025, 1, 29}},
    {{0, 15, 0}, {2025, 2, 13}}, {{0, 16, 0}, {2025, 3, 22}}, {{0, 17, 0}, {2025, 4, 24}}, {{0, 18, 0}, {2025, 5, 28}},
    {{0, 19, 0}, {2025, 6, 20}}, {{0, 20, 0}, {2025, 7, 29}}, {{0, 21, 0}, {2025, 8, 5}},  {{0, 22, 0}, {2025, 8, 29}},
    {{0, 23, 0}, {2025, 9, 10}}, {{0, 24, 0}, {2025, 10, 16}}, {{0, 25, 0}, {2025, 11, 5}}, {{0, 26, 0}, {2025, 12, 9}},
    {{0, 27, 0}, {2026, 1, 16}}, {{0, 28, 0}, {2026, 2, 10}}, {{0, 29, 0}, {2026, 2, 25}}, {{1, 0, 0}, {2026, 3, 30}},
    {{1, 1, 0}, {2026, 4, 12}},  {{1, 2, 0}, {2026, 4, 17}},  {{1, 3, 0}, {2026, 4, 26}},  {{1, 4, 0}, {2026, 5, 8}},
    {{1, 5, 0}, {2026, 5, 25}},  {{1, 6, 0}, {2026, 6, 11}},  {{1, 7, 0}, {2026, 6, 25}},  {{1, 8, 0}, {2026, 7, 9}},
    {{1, 9, 0}, {2026, 7, 21}},
};

// vLLM's release tags (creator dates of the tags in the AppMana/forks-vllm-ampere mirror, which carries upstream's
// tags; the v0.8.x tags are lightweight, dated by their commits): the minor releases, and 0.7.3, 0.8.5 and 0.9.1,
// where the rules below change.
constexpr Release kVllm[] = {
    {{0, 6, 0}, {2024, 9, 4}},   {{0, 7, 0}, {2025, 1, 26}},  {{0, 7, 3}, {2025, 2, 20}},  {{0, 8, 0}, {2025, 3, 18}},
    {{0, 8, 5}, {2025, 4, 28}},  {{0, 9, 0}, {2025, 5, 27}},  {{0, 9, 1}, {2025, 6, 10}},  {{0, 9, 2}, {2025, 7, 6}},
    {{0, 10, 0}, {2025, 7, 23}}, {{0, 10, 1}, {2025, 8, 18}}, {{0, 10, 2}, {2025, 10, 7}}, {{0, 11, 0}, {2025, 10, 10}},
    {{0, 12, 0}, {2025, 12, 2}}, {{0, 13, 0}, {2025, 12, 18}}, {{0, 14, 0}, {2026, 1, 16}}, {{0, 15, 0}, {2026, 1, 28}},
    {{0, 16, 0}, {2026, 2, 24}}, {{0, 17, 0}, {2026, 3, 6}},  {{0, 18, 0}, {2026, 3, 19}}, {{0, 19, 0}, {2026, 4, 2}},
    {{0, 20, 0}, {2026, 4, 27}}, {{0, 21, 0}, {2026, 5, 14}},
};

// linkedin/Liger-Kernel tag creator dates (`git for-each-ref refs/tags`): 0.5.4 brought the GRPO loss
// (chunked_loss/grpo_loss.py), 0.8.0 its vocabulary-streaming log-probabilities (#1160); docs/research/liger-grpo.md.
constexpr Release kLiger[] = {
    {{0, 5, 0}, {2024, 12, 9}},  {{0, 5, 4}, {2025, 2, 24}}, {{0, 5, 10}, {2025, 5, 22}}, {{0, 6, 0}, {2025, 7, 8}},
    {{0, 6, 1}, {2025, 7, 28}},  {{0, 6, 2}, {2025, 8, 21}},  {{0, 6, 3}, {2025, 10, 27}}, {{0, 6, 4}, {2025, 11, 21}},
    {{0, 6, 5}, {2026, 2, 3}},   {{0, 7, 0}, {2026, 2, 12}},  {{0, 8, 0}, {2026, 4, 30}},  {{0, 8, 1}, {2026, 7, 22}},
    {{0, 8, 2}, {2026, 8, 18}},
};

constexpr LibraryInfo kLibraries[] = {
    {Library::Torch, "torch", "versions.torch", kTorch, "docs/versions.md release-date table; pytorch RELEASE.md",
     "softmax keeping its input, zero_grad(set_to_none), the optimizer's foreach default, the SDPA default, CUDA "
     "module loading"},
    {Library::Transformers, "transformers", "versions.transformers", kTransformers, "docs/versions.md release-date table",
     "the default attention, the loss path, the HF Trainer's optimizer and its empty_cache in 4.41"},
    {Library::Peft, "peft", "versions.peft", kPeft, "docs/versions.md (huggingface/peft tags)", "the adapters' dtype"},
    {Library::Bitsandbytes, "bitsandbytes", "versions.bitsandbytes", kBitsandbytes,
     "docs/versions.md (bitsandbytes tags)", "whether 4-bit linears keep their input"},
    {Library::Deepspeed, "deepspeed", "versions.deepspeed", kDeepspeed, "docs/versions.md (DeepSpeed tags)", ""},
    {Library::Torchao, "torchao", "versions.torchao", kTorchao, "pytorch/ao tags", ""},
    {Library::FlashAttn, "flash-attn", "versions.flash_attn", kFlashAttn, "docs/versions.md (flash-attention tags)", ""},
    {Library::Torchtune, "torchtune", "versions.torchtune", kTorchtune, "docs/versions.md (pytorch/torchtune tags)",
     "torchtune's loss (chunked from 0.3) and optimizer (fused from 0.4)"},
    {Library::Unsloth, "unsloth", "versions.unsloth", kUnsloth, "docs/research/unsloth.md (unslothai/unsloth tags)",
     "Unsloth's loss path, its gradient-checkpointing buffers and its dequantization buffer"},
    {Library::Trl, "trl", "versions.trl", kTrl, "huggingface/trl tags",
     "a preference objective's log-probabilities and which logits live through the reference forward; GRPO's "
     "generation batch, KV cache, reference and scoring passes; stated for supervised fine-tuning under the HF "
     "Trainer, that the Trainer is TRL's SFTTrainer, whose token accuracy and entropy copy the logits after the loss"},
    {Library::Vllm, "vllm", "versions.vllm", kVllm, "vLLM tags (docs/research/grpo.md C.1)",
     "what a colocated engine's gpu_memory_utilization counts: the whole process (0.8.0-0.9.0) or the engine alone"},
    {Library::Liger, "liger-kernel", "versions.liger", kLiger, "linkedin/Liger-Kernel tags (docs/research/liger-grpo.md)",
     "what Liger's fused GRPO loss keeps per completion: a 16-bit weight gradient (0.5.4-0.7.x) or an fp32 one and "
     "its cast (0.8+)"},
};
static_assert(std::size(kLibraries) == kLibraryCount);

bool digits(std::string_view s, size_t& pos, int& out, size_t max_digits) {
  const size_t start = pos;
  long long v = 0;
  while (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos])) && pos - start < max_digits)
    v = v * 10 + (s[pos++] - '0');
  if (pos == start || (pos < s.size() && std::isdigit(static_cast<unsigned char>(s[pos])))) return false;
  out = static_cast<int>(v);
  return true;
}

// A pre-release, dev or post suffix as pip prints it: "rc1", "a0", "b2", ".dev0", ".post1", "-rc1", each with
// optional digits.
bool release_suffix(std::string_view s) {
  if (s.empty()) return true;
  if (s[0] == '.' || s[0] == '-') s.remove_prefix(1);
  for (std::string_view tag : {"rc", "a", "b", "dev", "post", "alpha", "beta"}) {
    if (s.substr(0, tag.size()) != tag) continue;
    std::string_view rest = s.substr(tag.size());
    return std::all_of(rest.begin(), rest.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  }
  return false;
}

std::string two(int v) {
  std::string out = std::to_string(v);
  if (v < 10) out.insert(out.begin(), '0');
  return out;
}

std::string shown(const std::string& s) {
  std::string out = "\"";
  out.append(s, 0, 40);
  out.append(s.size() > 40 ? "...\"" : "\"");
  return out;
}

}  // namespace

std::span<const LibraryInfo> libraries() { return kLibraries; }

const LibraryInfo& library_info(Library lib) { return kLibraries[static_cast<size_t>(lib)]; }

std::string& version_field(VersionsConfig& v, Library lib) {
  switch (lib) {
    case Library::Torch: return v.torch;
    case Library::Transformers: return v.transformers;
    case Library::Peft: return v.peft;
    case Library::Bitsandbytes: return v.bitsandbytes;
    case Library::Deepspeed: return v.deepspeed;
    case Library::Torchao: return v.torchao;
    case Library::FlashAttn: return v.flash_attn;
    case Library::Torchtune: return v.torchtune;
    case Library::Unsloth: return v.unsloth;
    case Library::Trl: return v.trl;
    case Library::Vllm: return v.vllm;
    case Library::Liger: break;
  }
  return v.liger;
}

const std::string& version_field(const VersionsConfig& v, Library lib) {
  return version_field(const_cast<VersionsConfig&>(v), lib);
}

std::string version_text(Version v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

bool parse_version(std::string_view text, Version& out) {
  // A local build label (torch's "+cu121") names the build, not the release.
  if (auto plus = text.find('+'); plus != std::string_view::npos) {
    std::string_view local = text.substr(plus + 1);
    if (local.empty() || !std::all_of(local.begin(), local.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_';
        }))
      return false;
    text = text.substr(0, plus);
  }
  if (!text.empty() && (text[0] == 'v' || text[0] == 'V')) text.remove_prefix(1);  // a git tag: v0.43.2
  int parts[3] = {0, 0, 0};
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    if (!digits(text, pos, parts[i], 4)) return false;
    if (pos == text.size() || i == 2 || text[pos] != '.' || pos + 1 >= text.size() ||
        !std::isdigit(static_cast<unsigned char>(text[pos + 1])))
      break;
    ++pos;
  }
  if (!release_suffix(text.substr(pos))) return false;
  out = {parts[0], parts[1], parts[2]};
  return true;
}

// The build date of a nightly: ".dev" followed by exactly eight digits that make a valid day (YYYYMMDD). Other dev
// builds (transformers' "4.46.0.dev0", a source build's "2.7.0a0+git...") name no date and stand for their release.
static bool nightly_date(std::string_view text, Date& out) {
  const size_t at = text.find(".dev");
  if (at == std::string_view::npos) return false;
  std::string_view digits8 = text.substr(at + 4);
  if (const size_t plus = digits8.find('+'); plus != std::string_view::npos) digits8 = digits8.substr(0, plus);
  if (digits8.size() != 8 || !std::all_of(digits8.begin(), digits8.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return false;
  const std::string day = std::string(digits8.substr(0, 4)) + "-" + std::string(digits8.substr(4, 2)) + "-" + std::string(digits8.substr(6, 2));
  return parse_date(day, out);
}

bool parse_date(std::string_view text, Date& out) {
  if (text.size() != 7 && text.size() != 10) return false;
  size_t pos = 0;
  Date d;
  if (!digits(text, pos, d.year, 4) || pos != 4 || text[pos++] != '-' || !digits(text, pos, d.month, 2) || pos != 7)
    return false;
  d.day = 1;
  if (text.size() == 10 && (text[pos++] != '-' || !digits(text, pos, d.day, 2) || pos != 10)) return false;
  static constexpr int kDays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (d.year < 2000 || d.year > 2100 || d.month < 1 || d.month > 12 || d.day < 1 || d.day > kDays[d.month - 1])
    return false;
  out = d;
  return true;
}

void validate_versions(const VersionsConfig& v, std::vector<FieldError>& errors) {
  for (const auto& lib : kLibraries) {
    const std::string& text = version_field(v, lib.library);
    Version parsed;
    if (text != "latest" && !parse_version(text, parsed))
      errors.push_back({std::string(lib.field), std::string(lib.field) + " must be a version such as " +
                                                    (lib.library == Library::Unsloth ? "2024.8 or 2025.3.19"
                                                                                     : "2.1 or 2.1.2") +
                                                    ", or latest; got " + shown(text)});
  }
  Date d;
  if (!v.date.empty() && !parse_date(v.date, d))
    errors.push_back({"versions.date", "versions.date must be a date such as 2023-10 or 2023-10-15 (from 2000 on), or "
                                       "empty for none; got " + shown(v.date)});
}

bool StackVersions::below(Library l, Version v) const {
  const LibraryVersion& lv = (*this)[l];
  return !lv.latest && lv.version < v;
}

StackVersions stack_versions(const VersionsConfig& v) {
  StackVersions s;
  s.has_date = !v.date.empty() && parse_date(v.date, s.date);
  for (const auto& lib : kLibraries) {
    LibraryVersion& out = s.lib[static_cast<size_t>(lib.library)];
    const std::string& text = version_field(v, lib.library);
    if (text != "latest" && parse_version(text, out.version)) {
      out.latest = false;
      Date built;
      if (!lib.releases.empty() && nightly_date(text, built)) {
        // The newest release before the nightly's day (a release tagged that day is on its own branch, not in it),
        // but not older than the newest release below X.Y.0 itself: an X.Y.0 nightly is built after X.(Y-1)'s branch
        // cut, so it holds that release's changes even before the release is tagged.
        const Version stated = out.version;
        const Release* pick = nullptr;
        const Release* floor = nullptr;
        for (const Release& r : lib.releases) {
          if (r.date < built) pick = &r;
          if (r.version < Version{stated.major, stated.minor, 0}) floor = &r;
        }
        if (floor && (!pick || pick->version < floor->version)) pick = floor;
        if (pick) out.version = pick->version, out.nightly = true, out.built = built;
      }
      continue;
    }
    if (!s.has_date || lib.releases.empty()) continue;
    // The newest release dated on or before the day; before the table, its first release stands in.
    const Release* pick = &lib.releases.front();
    out.before_table = s.date < pick->date;
    for (const Release& r : lib.releases)
      if (r.date <= s.date) pick = &r;
    out.latest = false;
    out.from_date = true;
    out.version = pick->version;
  }
  return s;
}

std::string describe_version(const StackVersions& s, Library lib) {
  const LibraryVersion& lv = s[lib];
  std::string out = std::string(library_info(lib).name) + " " + (lv.latest ? "latest" : version_text(lv.version));
  if (lv.nightly) {
    const std::string date = std::to_string(lv.built.year) + "-" + two(lv.built.month) + "-" + two(lv.built.day);
    out += " (the newest release before the nightly build of " + date + ")";
  }
  if (lv.from_date) {
    const std::string date = std::to_string(s.date.year) + "-" + two(s.date.month) + "-" + two(s.date.day);
    out += lv.before_table ? " (the oldest release memsim knows; versions.date " + date + " is before it)"
                           : " (current at versions.date " + date + ")";
  }
  return out;
}

}  // namespace memsim
