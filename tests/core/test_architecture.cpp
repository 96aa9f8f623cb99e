// Model programs (src/core/architecture.h): the ViT program's exact parameter counts against torchvision's published
// totals, one block's saved set against the closed form of its ops' autograd rules, and the decoder's field-named
// errors for a bad program.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/architecture.h"
#include "core/ops.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

Config vit_config(const std::string& args, int64_t micro_batch = 8) {
  Config c;
  c.model.architecture = "vit";
  c.model.architecture_args = args;
  c.training.framework = "hf_trainer";
  c.training.precision = "amp_bf16";
  c.training.activation_checkpointing = "none";
  c.training.attention = "sdpa";
  c.training.micro_batch_size = micro_batch;
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

int64_t params_of(const std::string& args) { return model_shape_of(vit_config(args).model).params_total; }

// One block's saved activations: live activation bytes when backward starts, with L + 1 blocks minus with L.
int64_t per_block(Config c, const std::string& args, const std::string& layers_key = "num_hidden_layers") {
  auto at_backward = [&](int layers) {
    c.model.architecture_args = args + "," + layers_key + "=" + std::to_string(layers);
    return activations_before_backward(c);
  };
  return at_backward(2) - at_backward(1);
}

// The built-in ViT program with one edit applied to its JSON.
template <typename F>
std::string vit_edited(F&& edit) {
  return program_edited("vit", edit);
}

}  // namespace

TEST_CASE("ViT program: exact parameter counts of torchvision's ViT-B/16, B/32 and L/16", "[architecture]") {
  // torchvision.models vit_b_16 / vit_b_32 / vit_l_16, IMAGENET1K_V1 "num_params": the same tensors as HF
  // ViTForImageClassification without a pooler (class token, positions, conv patch embedding, blocks, final norm,
  // 1000-way head).
  CHECK(params_of("num_labels=1000") == 86567656);
  CHECK(params_of("num_labels=1000,patch_size=32") == 88224232);
  CHECK(params_of("num_labels=1000,hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096") ==
        304326632);
}

TEST_CASE("ViT block under autocast: its saved set is the sum of its ops' rules", "[architecture]") {
  // N = b (grid^2 + 1) rows, h wide. LayerNorm saves its fp32 input (4Nh) and mean and rstd (8N) twice; q, k and v
  // each save a bf16 cast of the first norm's fp32 output (6Nh); SDPA keeps q, k, v and its output (8Nh) and an fp32
  // logsumexp per head and row (4aN); the second norm's fp32 input (4Nh); fc1 a cast of its input (2Nh); GELU its
  // input (8Nh, f = 4h); fc2 GELU's bf16 output (8Nh). 40Nh + 16N + 4aN in all.
  const int64_t b = 8, N = b * 197, h = 768, a = 12;
  Config c = vit_config("num_labels=1000", b);
  CHECK(per_block(c, "num_labels=1000") == 40 * N * h + 16 * N + 4 * a * N);
  // Pure bf16: the tensors are bf16 and the linears read them as they are: x (2Nh) and the first norm's output (2Nh,
  // once for q, k and v), q, k, v and the output (8Nh), h (2Nh) and the second norm's output (2Nh), fc1's and GELU's
  // outputs (16Nh): 32Nh + 16N + 4aN.
  c.training.precision = "bf16_pure";
  CHECK(per_block(c, "num_labels=1000") == 32 * N * h + 16 * N + 4 * a * N);
}

TEST_CASE("ViT program: checkpointing, eager attention and batch move the peak the way their mechanisms say", "[architecture]") {
  Config c = vit_config("num_labels=1000", 32);
  const Result plain = simulate(c);
  REQUIRE(plain.ok);
  CHECK(plain.params_total == 86567656);
  c.training.activation_checkpointing = "full";
  const Result ckpt = simulate(c);
  REQUIRE(ckpt.ok);
  CHECK(ckpt.devices[0].peak.allocated_bytes < plain.devices[0].peak.allocated_bytes);
  c.training.activation_checkpointing = "none";
  c.training.attention = "eager";  // [b, heads, 197, 197] probabilities per block
  const Result eager = simulate(c);
  REQUIRE(eager.ok);
  CHECK(eager.devices[0].peak.allocated_bytes > plain.devices[0].peak.allocated_bytes);
  // LoRA on query and value: the base is frozen, so far less is saved and no base optimizer state exists.
  c.training.attention = "sdpa";
  c.peft.method = "lora";
  c.peft.target_modules = "query,value";
  const Result lora = simulate(c);
  REQUIRE(lora.ok);
  CHECK(lora.params_trainable == 12 * 2 * (8 * 768 + 768 * 8));
  CHECK(lora.devices[0].peak.allocated_bytes < plain.devices[0].peak.allocated_bytes);
  // all-linear matches nn.Linear only: not the patch embedding's convolution (PEFT's _maybe_include_all_linear_layers).
  c.peft.target_modules = "all-linear";
  const Result all = simulate(c);
  REQUIRE(all.ok);
  const int64_t per_layer = 4 * 2 * 8 * 768 + 2 * 8 * (768 + 3072);  // query, key, value, output dense; fc1, fc2
  CHECK(all.params_trainable == 12 * per_layer + 8 * (768 + 1000));  // and the classifier
  CHECK(default_lora_targets(c.model) == "query,value");
  // ZeRO-3 and FSDP shard a program's parameters like any family's: each of 4 ranks keeps a quarter of the weights,
  // gradients and optimizer states between steps (DeepSpeed's default buckets, 5e8 elements, still make its peak
  // above the single GPU's for a model this small).
  c.peft.method = "none";
  c.parallel.data_parallel_size = 4;
  c.parallel.zero_stage = 3;
  const ModelStates& whole = plain.devices[0].model_states;
  for (const char* engine : {"deepspeed", "fsdp1", "fsdp2"}) {
    c.parallel.sharding = engine;
    const Result sharded = simulate(c);
    INFO(engine);
    REQUIRE(sharded.ok);
    const ModelStates& part = sharded.devices[0].model_states;
    CHECK(part.optimizer_bytes == Approx(whole.optimizer_bytes / 4.0).epsilon(0.01));
    CHECK(part.weights_bytes < whole.weights_bytes / 3);
  }
}

TEST_CASE("timm's ViT program: DeiT's exact counts, and one fused qkv linear saves one autocast copy", "[architecture]") {
  // timm deit_tiny / deit_small / deit_base_patch16_224 (timm's model table: 5.72M, 22.05M, 86.57M): the same
  // tensors as ViT with q, k and v in one qkv linear.
  auto deit = [](const std::string& args) {
    Config c = vit_config("");
    c.model.architecture = "vit_timm";
    c.model.architecture_args = "qkv_bias=1," + args;
    return c;
  };
  CHECK(model_shape_of(deit("embed_dim=192,num_heads=3").model).params_total == 5717416);
  CHECK(model_shape_of(deit("embed_dim=384,num_heads=6").model).params_total == 22050664);
  CHECK(model_shape_of(deit("embed_dim=768,num_heads=12").model).params_total == 86567656);
  // The block under autocast: as the HF program's (40Nh + 16N + 4aN) less two of the three bf16 copies of the first
  // norm's output (one linear reads it), 36Nh + 16N + 4aN; q, k and v are views of the one qkv output, which the
  // attention keeps whole.
  const int64_t b = 8, N = b * 197, h = 768, a = 12;
  Config c = deit("");
  c.training.micro_batch_size = b;
  CHECK(per_block(c, "qkv_bias=1", "depth") == 36 * N * h + 16 * N + 4 * a * N);
  // timm's stochastic depth rises linearly over the blocks (dpr = torch.linspace(0, drop_path_rate, depth)): `layer`
  // in a block's probability names the block's index.
  std::shared_ptr<const Architecture> prog;
  REQUIRE(decode_architecture("vit_timm", "drop_path_rate=0.1", prog).empty());
  const ArchOp& dp = prog->blocks[0].ops[8];
  REQUIRE(dp.kind == OpKind::DropPath);
  REQUIRE(dp.p_per_layer.size() == 12);
  CHECK(dp.p_at(0) == 0);
  CHECK(dp.p_at(11) == Approx(0.1));
  CHECK(dp.p_at(6) == Approx(0.1 * 6 / 11));
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][6]["p"] = "layer / 6"; })) ==
        "model.architecture: block.ops[6].p: must be a probability from 0 to below 1; it is 1 in block 6");
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][9]["out_features"] = "intermediate_size + layer"; }))
            .find("names 'layer'") != std::string::npos);  // a shape cannot vary per block: the blocks share parameters
  // DropPath with p > 0 saves one random value per sample for each of its two branches (in the residual's dtype, fp16
  // here as the branch is) and makes transients only.
  c.training.precision = "amp_fp16";
  CHECK(per_block(c, "qkv_bias=1,drop_path_rate=0.1", "depth") - per_block(c, "qkv_bias=1", "depth") == 2 * 2 * b);
}

TEST_CASE("DINOv2's program: the backbones' exact counts, layer scale, and a classifier over the class token and the patch mean", "[architecture]") {
  // facebook/dinov2-small / -base / -large (Dinov2Model, no pooler: cls_token, mask_token, a 1,370-row position table
  // for 518 / 14, the patch conv, blocks with two layer scales, the final norm): sum(p.numel()) of
  // AutoModel.from_pretrained printed in public code, 22,056,576 / 86,580,480 / 304,368,640. The classifier on
  // [class token, patch mean] adds 2h x labels + labels.
  auto backbone = [](const std::string& size_args) {
    Config c = vit_config("");
    c.model.architecture = "dinov2";
    c.model.architecture_args = "image_size=518,patch_size=14,num_labels=10," + size_args;
    const ModelShape s = model_shape_of(c.model);
    const int64_t h = static_cast<int64_t>(architecture_arg(c.model.architecture_args, "hidden_size", 768));
    return s.params_total - (2 * h * 10 + 10);
  };
  CHECK(backbone("hidden_size=384,num_attention_heads=6") == 22056576);
  CHECK(backbone("hidden_size=768") == 86580480);
  CHECK(backbone("hidden_size=1024,num_hidden_layers=24,num_attention_heads=16") == 304368640);
  // Trained at 224 x 224: 16 x 16 patches of 14 and the class token; the position table is interpolated to them.
  Config c = vit_config("");
  c.model.architecture = "dinov2";
  c.model.architecture_args = "image_size=518,patch_size=14,num_labels=10";
  c.training.micro_batch_size = 16;
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture(c.model.architecture, c.model.architecture_args, a).empty());
  CHECK(a->tokens == 257);
  const Result r = simulate(c);
  REQUIRE(r.ok);
  // Layer scale saves its input for lambda1's gradient: two more [tokens, h] tensors per block than without it,
  // in the compute dtype of the branches (bf16 under autocast).
  const int64_t N = 16 * 257, h = 768;
  Config frozen_scales = c;
  frozen_scales.peft.method = "lora";
  frozen_scales.peft.target_modules = "query,value";
  frozen_scales.peft.modules_to_save = "layer_scale1,layer_scale2";
  Config plain_lora = frozen_scales;
  plain_lora.peft.modules_to_save = "";
  CHECK(per_block(frozen_scales, c.model.architecture_args) - per_block(plain_lora, c.model.architecture_args) == 2 * 2 * N * h);
}

TEST_CASE("DINOv2 with a SwiGLU MLP (ViT-g/14): the program the config's use_swiglu_ffn picks, its count and saved set", "[architecture]") {
  // facebook/dinov2-giant's config.json (hidden 1536, 40 layers, 24 heads, mlp_ratio 4, use_swiglu_ffn true).
  const std::string giant = R"({"architectures": ["Dinov2Model"], "hidden_size": 1536, "image_size": 518,
      "layerscale_value": 1.0, "mlp_ratio": 4, "model_type": "dinov2", "num_attention_heads": 24, "num_channels": 3,
      "num_hidden_layers": 40, "patch_size": 14, "qkv_bias": true, "use_swiglu_ffn": true})";
  const Parsed p = model_from_hf_json(giant);
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "dinov2_swiglu");
  // The backbone by hand: Dinov2SwiGLUFFN's hidden_features = (int(6144 * 2 / 3) + 7) // 8 * 8 = 4096, so per block
  // weights_in 1536 x 8192 + 8192 and weights_out 4096 x 1536 + 1536 beside the attention, norms and layer scales
  // (28,336,640 per block); with the embeddings (cls, mask, patch conv, 1,370 x 1536 positions) and the final norm,
  // 1,136,480,768. The classifier on [class token, patch mean] adds 2 x 1536 x 2 + 2.
  CHECK(model_shape_of(p.config.model).params_total == 1136480768 + 2 * 1536 * 2 + 2);
  // use_swiglu_ffn absent or false is the plain MLP's program, as before.
  CHECK(model_from_hf_json(R"({"model_type": "dinov2", "hidden_size": 384, "num_attention_heads": 6})").config.model.architecture == "dinov2");
  // A config no program's assumptions meet is one error naming what each needs.
  const Parsed odd = model_from_hf_json(R"({"model_type": "dinov2", "use_swiglu_ffn": "yes"})");
  REQUIRE(!odd.ok);
  CHECK(odd.errors.front().message == "model.architecture: this model_type dinov2 config sets keys no built-in program models: "
                                      "\"dinov2\" needs use_swiglu_ffn false; \"dinov2_swiglu\" needs use_swiglu_ffn true");
  // The SwiGLU MLP saves weights_in's output (2F: silu reads x1, the product reads x2, both views of it), silu's
  // output F (the product's x2-gradient reads it) and the product F (weights_out's input): 4F per row, where the
  // GELU MLP saves fc1's and gelu's outputs (2 x 4h). Pure bf16, so no autocast copies differ.
  Config c = vit_config("hidden_size=768,num_attention_heads=12,num_labels=10", 4);
  c.training.precision = "bf16_pure";
  c.model.architecture = "dinov2_swiglu";
  const int64_t F = 2048, h = 768, N = 4 * 197;  // 224 / 16 = 14 x 14 patches and the class token
  Config plain = c;
  plain.model.architecture = "dinov2";
  CHECK(per_block(c, c.model.architecture_args) - per_block(plain, c.model.architecture_args) == 2 * N * (4 * F - 2 * 4 * h));
}

TEST_CASE("CLIP's vision tower program: exact counts, and quick_gelu keeps its sigmoid", "[architecture]") {
  // CLIPVisionModel of openai/clip-vit-base-patch32 and clip-vit-large-patch14 (fusion_bench's model pool prints
  // 87,456,000 and 303,179,776), plus CLIPForImageClassification's classifier: h x 2 + 2.
  Config c = vit_config("");
  c.model.architecture = "clip_vision";
  CHECK(model_shape_of(c.model).params_total == 87456000 + 768 * 2 + 2);
  c.model.architecture_args = "hidden_size=1024,num_hidden_layers=24,num_attention_heads=16,intermediate_size=4096,patch_size=14";
  CHECK(model_shape_of(c.model).params_total == 303179776 + 1024 * 2 + 2);
  // Pure bf16, B/32 at batch 8 (N = 8 x 50 rows): ViT's 32Nh + 16N + 4aN, and QuickGELU's sigmoid output, which
  // sigmoid_backward and the product's backward read (8Nh at f = 4h); 1.702 x is a transient.
  const int64_t N = 8 * 50, h = 768, a = 12;
  c.model.architecture_args = "";
  c.training.precision = "bf16_pure";
  CHECK(per_block(c, "num_labels=2") == 40 * N * h + 16 * N + 4 * a * N);
}

TEST_CASE("SigLIP's vision tower program: counts by hand, no class token, a frozen pooling head", "[architecture]") {
  // SiglipForImageClassification over siglip-base-patch16-224's vision config (SiglipVisionConfig's defaults): the
  // patch convolution with its bias, 196 positions, 12 blocks of 7,087,872, post_layernorm and the attention-pooling
  // head (7,087,104) = 92,884,224, plus the classifier h x 2 + 2. So400m/14 at 384 (27 blocks of 15,239,504, the
  // block Gemma 3's tower counts to its published total) with its head: 428,225,600.
  Config c = vit_config("");
  c.model.architecture = "siglip_vision";
  CHECK(model_shape_of(c.model).params_total == 92884224 + 768 * 2 + 2);
  c.model.architecture_args = "hidden_size=1152,num_hidden_layers=27,num_attention_heads=16,intermediate_size=4304,patch_size=14,image_size=384";
  const ModelShape so400m = model_shape_of(c.model);
  CHECK(so400m.params_total == 428225600 + 1152 * 2 + 2);
  // The pooling head runs for an output the classifier never reads: no gradient, so no optimizer state.
  CHECK(trainable_numel(so400m) == so400m.params_total - 15238352);
  // Pure bf16, B/16 at batch 8 (N = 8 x 196 rows, no class token): ViT's 32Nh + 16N + 4aN; the tanh GELU keeps
  // only its input, which fc1's output is.
  const int64_t N = 8 * 196, h = 768, a = 12;
  c.model.architecture_args = "";
  c.training.precision = "bf16_pure";
  CHECK(per_block(c, "num_labels=2") == 32 * N * h + 16 * N + 4 * a * N);
  // An HF vision config imports as the program; one without the pooling head is refused by name.
  const Parsed p = model_from_hf_json(R"({"architectures": ["SiglipVisionModel"], "hidden_act": "gelu_pytorch_tanh",
      "hidden_size": 1152, "image_size": 384, "intermediate_size": 4304, "model_type": "siglip_vision_model",
      "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14})");
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "siglip_vision");
  CHECK(model_shape_of(p.config.model).params_total == 428225600 + 1152 * 2 + 2);
  const Parsed headless = model_from_hf_json(R"({"model_type": "siglip_vision_model", "vision_use_head": false})");
  REQUIRE(!headless.ok);
  CHECK(headless.errors.front().message.find("vision_use_head true") != std::string::npos);
}

TEST_CASE("a bad program gets one error naming its field and the place in the program", "[architecture]") {
  CHECK(first_error("wav2vec2").find("model.architecture must be empty") == 0);
  CHECK(first_error("{\"memsim_architecture\": 1,").find("model.architecture is not valid JSON") == 0);
  // An unknown op.
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][10]["op"] = "swish"; })) ==
        "model.architecture: block.ops[10].op: \"swish\" is not an op; the vocabulary: " + op_names());
  CHECK(op_names().rfind("parameter, conv2d, batch_norm2d, max_pool2d, global_avg_pool, flatten_tokens, ", 0) == 0);
  // A shape that does not fit: fc2 reads the MLP's width but the residual add needs the hidden width.
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][11]["out_features"] = "intermediate_size"; })) ==
        "model.architecture: block.ops[13]: add needs equal shapes; mlp_out is [197, 3072], h [197, 768]");
  // A tensor that is never produced, and a cycle (an op reading what a later op makes).
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][1]["in"] = "x_normed"; })) ==
        "model.architecture: block.ops[1].in: tensor \"x_normed\" is not produced before this op (ops run in the order "
        "written, so a cycle shows here too)");
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][0]["in"] = "y"; })).find("block.ops[0].in: tensor \"y\" is not produced before this op") != std::string::npos);
  // A tensor made and never read.
  CHECK(first_error(vit_edited([](auto& j) { j["block"]["ops"][4]["in"] = {"q", "k", "q"}; })) ==
        "model.architecture: block: tensor \"v\" is produced but never read");
  // A block that does not keep its input's shape cannot repeat.
  CHECK(first_error(vit_edited([](auto& j) {
          j["block"]["output"] = "fc1";
          while (j["block"]["ops"].size() > 10) j["block"]["ops"].erase(10);
        })) == "model.architecture: block.output: the block repeats, so its output must have its input's shape; fc1 differs");
  // Expressions and hyperparameters.
  CHECK(first_error(vit_edited([](auto& j) { j["dims"]["grid"] = "image_size // patchsize"; })) ==
        "model.architecture: dims.grid: \"image_size // patchsize\" names 'patchsize', which is neither a hyperparameter "
        "nor a dimension (or the dimensions name each other in a cycle)");
  CHECK(first_error("vit", "image_size=224,depth=12") ==
        "model.architecture_args: \"depth\" is not a hyperparameter of this program; it has hidden_size, "
        "num_hidden_layers, num_attention_heads, intermediate_size, hidden_dropout_prob, attention_probs_dropout_prob, "
        "image_size, patch_size, num_channels, qkv_bias, num_labels");
  // Values that break a program that holds with its defaults are named as the arguments' fault.
  CHECK(first_error("vit", "patch_size=0").find("dims.grid") != std::string::npos);
  CHECK(first_error("vit", "num_attention_heads=7") ==
        "model.architecture_args: with \"num_attention_heads=7\" the program does not hold: model.architecture: "
        "block.ops[4]: attention's heads (7) must divide the widths of q and v");
  // An image smaller than a patch.
  CHECK(first_error("vit", "image_size=8") ==
        "model.architecture_args: with \"image_size=8\" the program does not hold: model.architecture: "
        "embeddings.ops[1]: conv2d's kernel 16 exceeds pixel_values [3, 8, 8]");
  std::shared_ptr<const Architecture> a;
  CHECK(decode_architecture("vit", "image_size=8", a).front().field == "model.architecture_args");
}

TEST_CASE("the page's hyperparameter inputs edit model.architecture_args, which keeps only what differs", "[architecture]") {
  CHECK(set_architecture_arg("", "num_labels", 10, 2) == "num_labels=10");
  CHECK(set_architecture_arg("num_labels=10, image_size=384", "num_labels", 2, 2) == "image_size=384");
  CHECK(set_architecture_arg("num_labels=10,image_size=384", "image_size", 448, 224) == "num_labels=10,image_size=448");
  CHECK(set_architecture_arg("num_labels=10", "hidden_dropout_prob", 0.1, 0) == "num_labels=10,hidden_dropout_prob=0.1");
  CHECK(architecture_arg("num_labels=10, image_size = 384", "image_size", 224) == 384);
  CHECK(architecture_arg("num_labels=ten", "num_labels", 2) == 2);
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("vit", "num_labels=10", a).empty());
  REQUIRE(a->defaults.size() == 11);
  CHECK(a->defaults.back() == std::pair<std::string, double>{"num_labels", 2});
  CHECK(architecture_value(*a, "num_labels") == 10);
}

TEST_CASE("a config with a program validates its combination, naming the field, and keeps every value", "[architecture]") {
  Config c = vit_config("num_labels=10");
  CHECK(validate(c).empty());
  c.parallel.tensor_parallel_size = 2;
  c.parallel.data_parallel_size = 1;
  const auto errors = validate(c);
  REQUIRE(!errors.empty());
  CHECK(errors.front().field == "parallel.tensor_parallel_size");
  CHECK(c.parallel.tensor_parallel_size == 2);
  Config d = vit_config("");
  d.model.architecture.clear();
  d.model.architecture_args = "num_labels=10";
  REQUIRE(validate(d).size() == 1);
  CHECK(validate(d).front().field == "model.architecture_args");
}

TEST_CASE("a memsim config may hold its program inline, as an object, and keeps it through JSON and a link", "[architecture]") {
  const std::string program(builtin_architecture("vit"));
  const Parsed p = config_from_json(R"({"schema": 2, "model": {"architecture": )" + program +
                                    R"(, "architecture_args": "num_labels=10"}, "training": {"framework": "hf_trainer"}})");
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture.front() == '{');
  CHECK(validate(p.config).empty());
  const Parsed again = config_from_json(config_to_json(p.config));
  REQUIRE(again.ok);
  CHECK(again.config == p.config);
  const Parsed linked = config_from_fragment(config_to_fragment(p.config));
  REQUIRE(linked.ok);
  CHECK(linked.config == p.config);
  const Result r = simulate(p.config);
  REQUIRE(r.ok);
  CHECK(r.params_total == 86567656 - 769000 + 768 * 10 + 10);
}

TEST_CASE("an HF ViT config.json imports as the ViT program with its hyperparameters", "[architecture]") {
  const std::string config_json = R"({"architectures": ["ViTForImageClassification"], "model_type": "vit",
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "image_size": 384, "patch_size": 16, "num_channels": 3, "qkv_bias": true,
    "id2label": {"0": "cat", "1": "dog", "2": "bird"}})";
  const Parsed p = model_from_hf_json(config_json);
  REQUIRE(p.ok);
  CHECK(p.config.model.architecture == "vit");
  CHECK(p.config.model.architecture_args.find("image_size=384") != std::string::npos);
  CHECK(p.config.model.architecture_args.find("num_labels=3") != std::string::npos);
  // 24 x 24 patches + the class token.
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture(p.config.model.architecture, p.config.model.architecture_args, a).empty());
  CHECK(a->tokens == 577);
}
