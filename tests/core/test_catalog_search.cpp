// The catalogue as people use it: several hundred models, each found by its name and its Hugging Face id, a
// nonsense search finding nothing, and the generated entries (from litgpt's config.py, tools/catalog/import_litgpt.py,
// and from copies of HF config.json, tools/catalog/import_hf_configs.py) as sound as the hand-collected ones: they
// load, simulate, count what their module structure holds and, for a sample, exactly what their publishers state.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>

#include "core/architecture.h"
#include "core/catalog.h"
#include "core/model.h"
#include "core/simulate.h"

using namespace memsim;

namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const ModelPreset* first(const std::string& query) {
  const auto found = search_model_presets(query);
  return found.empty() ? nullptr : found.front();
}

std::string first_id(const std::string& query) {
  const ModelPreset* p = first(query);
  return p ? p->id : std::string("(nothing)");
}

}  // namespace

TEST_CASE("catalogue: several hundred models, unique ids and HF ids, every one simulates a default setup", "[catalog]") {
  const auto& presets = model_presets();
  // 56 collected by hand + 199 from litgpt's config.py + 84 from HF config.json copies (the importers print their
  // counts).
  CHECK(presets.size() >= 300);
  std::set<std::string> ids, hf_ids;
  int generated = 0;
  for (const auto& p : presets) {
    INFO(p.id);
    CHECK(!p.id.empty());
    CHECK(!p.name.empty());
    CHECK(!p.hf_id.empty());
    CHECK(ids.insert(p.id).second);
    CHECK(hf_ids.insert(lower(p.hf_id)).second);
    for (const auto& a : p.hf_aliases) CHECK(hf_ids.insert(lower(a)).second);
    CHECK(!p.config_source.empty());
    if (!p.generated_from.empty()) {
      ++generated;
      CHECK(p.supported);  // the importers write only what memsim represents; the rest they list as skipped
      // Each names where its shape came from: litgpt's config.py, or the config.json copy (a Hugging Face page or a
      // file of a GitHub repository at a commit).
      const std::string& src = p.config_source;
      CHECK((src.find("litgpt") != std::string::npos || src.find("https://huggingface.co/") == 0 ||
             src.rfind("github:", 0) == 0));
    }
    if (!p.supported) continue;
    // The page's default setup (8 GPUs, ZeRO-3, micro-batch 4) with this model, the sequence within its positions.
    Config c;
    c.model = p.model;
    c.training.sequence_length = std::min<int64_t>(c.training.sequence_length, p.model.max_position_embeddings);
    const Result r = simulate(c);
    INFO((r.errors.empty() ? std::string() : r.errors[0].field + ": " + r.errors[0].message));
    CHECK(r.ok);
  }
  CHECK(generated >= 280);
}

TEST_CASE("catalogue: generated entries count exactly what their publishers state, for a sample", "[catalog]") {
  // The sample (tools/catalog/published.json) holds safetensors or model-card totals of the same tensors memsim
  // allocates, so the tolerance is zero: a missing bias, norm or tied head, or litgpt's tokenizer vocab_size read
  // in place of the padded embedding rows, changes the count by far more than one parameter, and a percentage
  // tolerance would hide it (a 1% band is wider than all the norms and biases of most of these models).
  int sampled = 0;
  for (const auto& p : model_presets()) {
    if (p.generated_from.empty() || p.params_published <= 0) continue;
    INFO(p.id << ": published " << p.params_published << " (" << p.params_source << ") " << p.params_expected_why);
    const ModelShape s = model_shape_of(p.model);
    if (p.params_expected == p.params_published) {
      CHECK(s.params_total == p.params_published);
    } else {
      CHECK(!p.params_expected_why.empty());
      CHECK(s.params_total == p.params_expected);
    }
    ++sampled;
  }
  CHECK(sampled >= 15);
  // The one documented difference: Qwen3-1.7B's checkpoint stores the head beside the embedding it is tied to.
  const ModelPreset* qwen = find_model_preset("qwen3-1.7b");
  REQUIRE(qwen != nullptr);
  CHECK(qwen->model.tie_word_embeddings);
  CHECK(qwen->params_published - qwen->params_expected == qwen->model.vocab_size * qwen->model.hidden_size);
}

TEST_CASE("catalogue: litgpt's block structures map onto memsim's fields", "[catalog]") {
  auto model = [](const char* id) {
    const ModelPreset* p = find_model_preset(id);
    REQUIRE(p != nullptr);
    return p->model;
  };
  // GptNeoxMLP, parallel residual with two LayerNorms, biases everywhere, untied (Pythia).
  const ModelConfig pythia = model("pythia-160m");
  CHECK(pythia.norm_type == NormType::LayerNorm);
  CHECK_FALSE(pythia.mlp_gated);
  CHECK(pythia.attention_bias);
  CHECK(pythia.mlp_bias);
  CHECK(pythia.norms_per_layer == 2);
  CHECK_FALSE(pythia.tie_word_embeddings);
  CHECK(pythia.vocab_size == 50304);  // padded_vocab_size, not the tokenizer's 50254
  // One shared norm feeding attention and MLP, a biased head (Phi-2).
  const ModelConfig phi2 = model("phi-2");
  CHECK(phi2.norms_per_layer == 1);
  CHECK(phi2.lm_head_bias);
  CHECK(phi2.vocab_size == 51200);
  // attn_bias alone: bias on q, k, v only (Qwen2.5).
  const ModelConfig qwen = model("qwen2.5-7b-instruct");
  CHECK(qwen.qkv_bias);
  CHECK_FALSE(qwen.attention_bias);
  // OLMo 2: q/k norms over the whole projection; Gemma 2: four norms, tied, 256-wide heads.
  CHECK_FALSE(model("olmo-2-1124-7b-instruct").qk_norm_per_head);
  const ModelConfig gemma = model("gemma-2-9b-it");
  CHECK(gemma.norms_per_layer == 4);
  CHECK(gemma.tie_word_embeddings);
  CHECK(gemma.head_dim == 256);
  // LLaMAMoE with its own expert width (Qwen3 MoE 2507).
  const ModelConfig moe = model("qwen3-30b-a3b-instruct-2507");
  CHECK(moe.num_experts == 128);
  CHECK(moe.num_experts_per_tok == 8);
  CHECK(moe.moe_intermediate_size == 768);
}

TEST_CASE("catalogue search: by name and by Hugging Face id, in any case, and nothing for nonsense", "[catalog]") {
  CHECK(first_id("meta-llama/Llama-3.1-8B") == "llama-3.1-8b");
  CHECK(first_id("META-LLAMA/llama-3.1-8b") == "llama-3.1-8b");
  CHECK(first_id("  meta-llama/Llama-3.1-8B ") == "llama-3.1-8b");
  CHECK(first_id("meta-llama/Meta-Llama-3.1-8B") == "llama-3.1-8b");  // the repository's former name
  CHECK(first_id("Llama 3.1 8B") == "llama-3.1-8b");
  CHECK(first_id("llama-3.1-8b") == "llama-3.1-8b");
  CHECK(first_id("mixtral 8x7") == "mixtral-8x7b");  // what the page's keyboard test types
  CHECK(first_id("EleutherAI/pythia-160m") == "pythia-160m");
  CHECK(first_id("pythia 160m deduped") == "pythia-160m-deduped");
  CHECK(first_id("Qwen/Qwen2.5-Coder-7B-Instruct") == "qwen2.5-coder-7b-instruct");
  // Separators written differently still find the model.
  CHECK(first_id("llama3.1 8b") == "llama-3.1-8b");
  CHECK(first_id("smollm2 135m") == "smollm2-135m");
  // A search for one size finds its variants and not other sizes.
  for (const ModelPreset* p : search_model_presets("llama-3.1-8b")) {
    INFO(p->id);
    CHECK(lower(p->hf_id + " " + p->name).find("8b") != std::string::npos);
  }
  CHECK(search_model_presets("llama-3.1-8b").size() >= 2);  // the base and the Instruct model
  // Nothing for nonsense, for an almost-right id of a model that is not in the catalogue, or for one wrong word.
  CHECK(search_model_presets("zzqx-no-such-model").empty());
  CHECK(search_model_presets("meta-llama/Llama-9-1T").empty());
  CHECK(search_model_presets("llama qqqq").empty());
  // An empty search lists the whole catalogue, in order.
  CHECK(search_model_presets("").size() == model_presets().size());
  CHECK(search_model_presets("   ").size() == model_presets().size());
}

TEST_CASE("catalogue search: every model is the first result for its HF id and is found by its name", "[catalog]") {
  for (const auto& p : model_presets()) {
    INFO(p.id << " " << p.hf_id);
    CHECK(first(p.hf_id) == &p);
    CHECK(first(lower(p.hf_id)) == &p);
    for (const auto& a : p.hf_aliases) CHECK(first(a) == &p);
    const auto by_name = search_model_presets(p.name);
    CHECK(std::find(by_name.begin(), by_name.end(), &p) != by_name.end());
  }
}

TEST_CASE("catalogue: the HF config.json imports keep what each config says", "[catalog]") {
  auto preset = [](const char* id) -> const ModelPreset& {
    const ModelPreset* p = find_model_preset(id);
    REQUIRE(p != nullptr);
    return *p;
  };
  int imported = 0;
  for (const auto& p : model_presets())
    imported += p.generated_from.find("import_hf_configs") != std::string::npos;
  CHECK(imported >= 80);
  // Qwen2 1.5B ties its head (tie_word_embeddings true); DeepSeek-R1-Distill-Qwen-1.5B, the same block, does not:
  // the whole difference between the two totals is the untied 151936 x 1536 head.
  const ModelPreset& qwen2 = preset("qwen2-1.5b-instruct");
  const ModelPreset& r1 = preset("deepseek-r1-distill-qwen-1.5b");
  CHECK(qwen2.model.tie_word_embeddings);
  CHECK_FALSE(r1.model.tie_word_embeddings);
  CHECK(qwen2.model.qkv_bias);  // model_type qwen2: q, k and v carry biases
  CHECK(r1.model.hidden_size == qwen2.model.hidden_size);
  CHECK(r1.model.num_hidden_layers == qwen2.model.num_hidden_layers);
  CHECK(build_model_shape(r1.model).params_total - build_model_shape(qwen2.model).params_total ==
        r1.model.vocab_size * r1.model.hidden_size);
  // Mistral Nemo's head_dim (128) is not hidden_size / heads (5120 / 32 = 160).
  CHECK(preset("mistral-nemo-instruct-2407").model.head_dim == 128);
  // A reduced copy without num_key_value_heads (LLaMA 1) reads as multi-head attention.
  const ModelPreset& llama = preset("llama-65b");
  CHECK(llama.model.num_key_value_heads == llama.model.num_attention_heads);
  // Qwen-1's config.json gives twice the MLP width (QWenMLP halves it).
  CHECK(preset("qwen-14b-chat").model.intermediate_size == 27392 / 2);
  // Found by name and by HF id.
  CHECK(first_id("qwen1.5 7b chat") == "qwen1.5-7b-chat");
  CHECK(first_id("deepseek-ai/deepseek-coder-6.7b-instruct") == "deepseek-coder-6.7b-instruct");
  CHECK(first_id("Yi-1.5-34B") == "yi-1.5-34b");
  CHECK(first_id("mistral nemo") == "mistral-nemo-instruct-2407");
}
