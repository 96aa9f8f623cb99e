// Every model preset of the catalogue loads and counts exactly what its publisher states (or, where the
// published scope differs, what the preset says memsim must count and why).
#include <catch2/catch.hpp>

#include "core/architecture.h"
#include "core/catalog.h"
#include "core/model.h"
#include "core/simulate.h"

using namespace memsim;

TEST_CASE("the catalogue has the models people use", "[catalog]") {
  const auto& presets = model_presets();
  CHECK(presets.size() >= 40);
  for (const char* id : {"gpt2", "llama-2-7b", "llama-3.1-405b", "llama-3.2-1b", "mistral-7b-v0.1", "mixtral-8x22b",
                         "qwen2.5-72b", "qwen3-30b-a3b", "qwen3-235b-a22b", "gemma-2-27b", "phi-4", "deepseek-v3",
                         "olmo-2-13b", "falcon-7b", "bert-large-uncased"}) {
    INFO(id);
    CHECK(find_model_preset(id) != nullptr);
  }
}

TEST_CASE("every supported preset counts its published total", "[catalog]") {
  int checked = 0;
  for (const auto& p : model_presets()) {
    INFO(p.id << ": " << p.unsupported_reason);
    if (!p.supported) {
      CHECK(!p.unsupported_reason.empty());  // the interface shows why the preset cannot be picked
      continue;
    }
    const ModelShape s = model_shape_of(p.model);
    // Every preset carries a count to check; where it is not the published total, the preset says why.
    CHECK(p.params_expected > 0);
    if (p.params_published > 0 && p.params_expected != p.params_published) CHECK(!p.params_expected_why.empty());
    if (p.params_expected > 0) {
      INFO("published " << p.params_published << " (" << p.params_source << "); " << p.params_expected_why);
      CHECK(s.params_total == p.params_expected);
      ++checked;
    }
    Config c;
    c.model = p.model;
    // A vision-language model's sequence holds an image's tokens as well (576 for LLaVA-1.5, 1,176 for LLaVA-NeXT's
    // default 336 x 336 image).
    // (A model program's tokens are its own arguments.)
    if (p.model.architecture.empty())
      c.training.sequence_length = p.model.vision_tower.empty() ? 512 : std::max<int64_t>(1024, vision_image_tokens(p.model) + 64);
    c.training.micro_batch_size = 1;
    Result r = simulate(c);
    CHECK(r.ok);
  }
  CHECK(checked == static_cast<int>(model_presets().size()));
}

static const ModelPreset& preset(const char* id) {
  const ModelPreset* p = find_model_preset(id);
  REQUIRE(p != nullptr);
  return *p;
}

TEST_CASE("where a published total counts something else, the difference is what the preset says", "[catalog]") {
  // Gemma 3 4B/12B/27B: the HF total is Gemma3ForConditionalGeneration. It adds the SigLIP tower (27 layers of
  // 1152 with biases, MLP 4304, 64 x 64 patches of 14 at 896 px, post LayerNorm) and the projector
  // (mm_input_projection_weight 1152 x hidden, mm_soft_emb_norm 1152) to the text model memsim counts.
  const int64_t v = 1152, mlp = 4304;
  const int64_t siglip = 3 * 14 * 14 * v + v + 4096 * v + 27 * (4 * (v * v + v) + 2 * (v * mlp) + mlp + v + 4 * v) + 2 * v;
  CHECK(siglip == 416866032);
  for (const char* id : {"gemma-3-4b", "gemma-3-12b", "gemma-3-27b"}) {
    INFO(id);
    const ModelPreset& p = preset(id);
    CHECK(p.params_published - p.params_expected == siglip + v * p.model.hidden_size + v);
  }
  // Falcon-7B: the safetensors store lm_head.weight beside the word embedding it is tied to.
  const ModelPreset& falcon = preset("falcon-7b");
  CHECK(falcon.model.tie_word_embeddings);
  CHECK(falcon.params_published - falcon.params_expected == falcon.model.vocab_size * falcon.model.hidden_size);
  // StableLM 2 1.6B: the model card's table leaves out two 2048-vectors per layer of what the checkpoint holds.
  const ModelPreset& stablelm = preset("stablelm-2-1.6b");
  CHECK(stablelm.params_expected - stablelm.params_published == stablelm.model.num_hidden_layers * 2 * 2048);
  // Phi-3.5-MoE: PhiMoE's 65 norms are LayerNorms with a bias and its head has a bias (lm_head_bias); both are
  // modelled, so the count equals the published total (it was 65 x 4096 + 32064 short when read as Llama-style).
  const ModelPreset& phi = preset("phi-3.5-moe");
  CHECK(phi.params_published == phi.params_expected);
  CHECK(phi.model.norm_type == NormType::LayerNorm);
  CHECK(phi.model.lm_head_bias);
}
