// Programs with several block kinds and the convolutional ops (src/core/ops.h): torchvision's ResNets (the resnet and
// resnet_basic programs) and ConvNeXts (convnext), their exact parameter counts against torchvision's published
// totals, one block's saved set against the closed form of its ops' autograd rules, and the decoder's errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "core/advice.h"
#include "core/architecture.h"
#include "core/serialize.h"
#include "core/simulate.h"
#include "core/validate.h"
#include "test_programs.h"
#include "test_util.h"

using namespace memsim;

namespace {

Config resnet_config(const std::string& program, const std::string& args, const std::string& precision = "fp32") {
  Config c;
  c.model.architecture = program;
  c.model.architecture_args = args;
  c.training.framework = "hf_loop";
  c.training.precision = precision;
  c.training.optimizer = "sgd_momentum";
  c.training.activation_checkpointing = "none";
  c.training.micro_batch_size = 4;
  c.peft.method = "none";
  c.parallel.zero_stage = 0;
  c.parallel.data_parallel_size = 1;
  return c;
}

int64_t params_of(const std::string& program, const std::string& args) {
  return model_shape_of(resnet_config(program, args).model).params_total;
}

// One more block of the first stage's repeated kind: live activation bytes when backward starts, with 3 blocks minus 2.
int64_t layer1_block(const Config& base, const std::string& key = "layers1", const std::string& args = "") {
  auto at_backward = [&](int layers1) {
    Config c = base;
    c.model.architecture_args = args + (args.empty() ? "" : ",") + key + "=" + std::to_string(layers1);
    return activations_before_backward(c);
  };
  return at_backward(3) - at_backward(2);
}

template <typename F>
std::string resnet_edited(F&& edit) {
  return program_edited("resnet", edit);
}

}  // namespace

TEST_CASE("ResNet programs: exact parameter counts of torchvision's ResNets, ResNeXt and Wide ResNet", "[architecture]") {
  // torchvision.models.*_Weights.IMAGENET1K_V1 "num_params".
  CHECK(params_of("resnet_basic", "") == 11689512);                                              // resnet18
  CHECK(params_of("resnet_basic", "layers1=3,layers2=4,layers3=6,layers4=3") == 21797672);      // resnet34
  CHECK(params_of("resnet", "") == 25557032);                                                    // resnet50
  CHECK(params_of("resnet", "layers3=23") == 44549160);                                          // resnet101
  CHECK(params_of("resnet", "layers2=8,layers3=36") == 60192808);                                // resnet152
  CHECK(params_of("resnet", "groups=32,width_per_group=4") == 25028904);                         // resnext50_32x4d
  CHECK(params_of("resnet", "groups=32,width_per_group=8,layers3=23") == 88791336);              // resnext101_32x8d
  CHECK(params_of("resnet", "width_per_group=128") == 68883240);                                 // wide_resnet50_2
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("resnet", "", a).empty());
  CHECK(a->repeat == 16);
  CHECK(a->blocks.size() == 8);  // per stage: its first block (stride, downsample) and the repeated rest
  std::vector<int64_t> runs(a->blocks.size(), 0);
  for (int32_t k : a->kind_of_layer) ++runs[static_cast<size_t>(k)];
  CHECK(runs == std::vector<int64_t>{1, 2, 1, 3, 1, 5, 1, 2});
  // The first block's input: the stem's 64 x 56 x 56 map (conv 7x7/2, max pool 3x3/2).
  CHECK(a->blocks[0].tensors[static_cast<size_t>(a->blocks[0].input)].shape == std::vector<int64_t>{64, 56, 56});
  CHECK(a->head.tensors[static_cast<size_t>(a->head.input)].shape == std::vector<int64_t>{2048, 7, 7});
}

TEST_CASE("a bottleneck block's saved set is the sum of its ops' rules, in place where torchvision writes in place",
          "[architecture]") {
  // layer1's repeated bottleneck (width w = 64, 256 out, 56 x 56): conv1 saves x (the previous block's output, counted
  // there); bn1 saves conv1's output c1; relu_ writes bn1's output b1, which relu (its result) and conv2 (its input)
  // save; bn2 saves c2; relu_ writes b2, saved by relu and conv3; bn3 saves c3 [4w]; out += x and relu_ write bn3's
  // output b3 [4w], the block's output. Four [w] maps and two [4w] maps per sample, plus each batch norm's fp32 mean
  // and inverse deviation per channel (not per sample).
  const int64_t b = 4, hw = 56 * 56, w = 64;
  const int64_t stats = 8 * (w + w + 4 * w);
  CHECK(layer1_block(resnet_config("resnet", "")) == 4 * b * hw * (4 * w + 2 * 4 * w) + stats);
  // Under autocast the convolutions run in bf16 and batch norm keeps its input's dtype: half of it.
  CHECK(layer1_block(resnet_config("resnet", "", "amp_bf16")) == 2 * b * hw * (4 * w + 2 * 4 * w) + stats);
  // (In place or not, the saved set is the same here: batch norm does not save its output, so an out-of-place ReLU
  // would free it after reading it; in place saves the transient of a second map, not a saved one.)
  // ResNet-18's basic block: bn1 saves c1, relu_ writes b1 (saved by relu and conv2), bn2 saves c2, out += x and
  // relu_ write b2: four [64] maps.
  CHECK(layer1_block(resnet_config("resnet_basic", "")) == 4 * b * hw * 4 * w + 8 * (w + w));
}

TEST_CASE("ConvNeXt program: exact parameter counts of torchvision's ConvNeXt-T/S/B/L", "[architecture]") {
  CHECK(params_of("convnext", "") == 28589128);                          // convnext_tiny
  CHECK(params_of("convnext", "depth3=27") == 50223688);                 // convnext_small
  CHECK(params_of("convnext", "dim1=128,depth3=27") == 88591464);        // convnext_base
  CHECK(params_of("convnext", "dim1=192,depth3=27") == 197767336);       // convnext_large
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("convnext", "", a).empty());
  CHECK(a->repeat == 21);  // 18 blocks and 3 downsampling layers
  // Stochastic depth rises linearly over the 18 blocks, the downsampling layers not counted (torchvision's
  // stage_block_id): 0 in the first block, 0.1 in the last.
  const ArchOp& sd = a->blocks[0].ops[9];
  REQUIRE(sd.kind == OpKind::DropPath);
  CHECK(sd.p_at(0) == 0.0);
  CHECK(a->blocks[6].ops[9].p_at(20) == Approx(0.1));
  CHECK(a->blocks[4].ops[9].p_at(8) == Approx(0.1 * 6 / 17));  // stage 3's first block is the seventh
}

TEST_CASE("a ConvNeXt block's saved set is the sum of its ops' rules", "[architecture]") {
  // Stage 1's block (C = 96 at 56 x 56), stochastic depth off: the depthwise conv's output (layer_norm keeps it
  // through the permuted view), the norm's output (fc1's input), fc1's [4C] output (gelu's input), gelu's [4C]
  // output (fc2's input), fc2's output (layer_scale's mul keeps it for the scale's gradient) and the block's output
  // (result += input writes the product in place); the norm's fp32 mean and rstd per row.
  const int64_t b = 4, hw = 56 * 56, c = 96;
  const Config cfg = resnet_config("convnext", "");
  CHECK(layer1_block(cfg, "depth1", "stochastic_depth_prob=0") == 4 * b * hw * 12 * c + 8 * b * hw);
  // With stochastic depth the product is a new tensor and the noise, one value per sample, is saved; the mul's
  // output goes once the product is made.
  const int64_t with_sd = layer1_block(cfg, "depth1", "stochastic_depth_prob=0.5");
  CHECK(with_sd == 4 * b * hw * 12 * c + 8 * b * hw + 4 * b);
}

TEST_CASE("max pooling saves its input and int64 indices, a CNN runs through the engines", "[architecture]") {
  Config c = resnet_config("resnet", "");
  c.training.micro_batch_size = 2;
  const Result r = simulate(c);
  REQUIRE(r.ok);
  bool indices = false;
  for (const auto& l : r.devices[0].program.labels) indices |= l == "max_pool indices (saved)";
  CHECK(indices);
  // Sharded data parallelism and checkpointing take the blocks as units, whatever their kinds.
  for (const char* sharding : {"zero3", "fsdp1", "fsdp2"}) {
    Config d = resnet_config("resnet", "");
    d.parallel.data_parallel_size = 4;
    if (std::string(sharding) == "zero3") d.parallel.zero_stage = 3;
    else d.parallel.sharding = sharding;
    d.training.activation_checkpointing = "full";
    INFO(sharding);
    CHECK(validate(d).empty());
    const Result s = simulate(d);
    REQUIRE(s.ok);
    CHECK(s.devices[0].peak.allocated_bytes > 0);
  }
}

TEST_CASE("several block kinds and in-place ops: the decoder's errors name the field and the place", "[architecture]") {
  CHECK(first_error(resnet_edited([](auto& j) { j["block"] = j["blocks"][1]; })).find(
            "model.architecture: block: a program has either \"block\"") == 0);
  CHECK(first_error(resnet_edited([](auto& j) { j["blocks"][1].erase("repeat"); })) ==
        "model.architecture: blocks[1].repeat: is missing: how many times this kind of block runs");
  // A first block (stride 2, downsample) cannot repeat: it changes the shape.
  CHECK(first_error(resnet_edited([](auto& j) { j["blocks"][2]["repeat"] = 2; })) ==
        "model.architecture: blocks[2].output: the block repeats, so its output must have its input's shape; y differs");
  CHECK(first_error(resnet_edited([](auto& j) {
          for (auto& k : j["blocks"]) k["repeat"] = 0;
        })).find("blocks[0].output") != std::string::npos);
  // Writing in place what a later op still reads.
  CHECK(first_error(resnet_edited([](auto& j) { j["blocks"][1]["ops"][2]["in"] = "b1", j["blocks"][1]["ops"][6]["in"] = "b1"; }))
            .find("model.architecture: blocks[1].ops[") == 0);
  CHECK(first_error(resnet_edited([](auto& j) { j["blocks"][1]["ops"][8]["in"] = {"x", "b3"}; })) ==
        "model.architecture: blocks[1].ops[8].inplace: writes its input, so the input must be an activation this stage "
        "makes; \"x\" is not");
  // Convolution's groups must divide its channels.
  CHECK(first_error(resnet_edited([](auto& j) { j["embeddings"]["ops"][0]["groups"] = 2; })) ==
        "model.architecture: embeddings.ops[0]: conv2d's groups (2) must divide its in channels (3) and out_channels (64)");
  CHECK(first_error(resnet_edited([](auto& j) { j["embeddings"]["ops"][3]["padding"] = 2; })) ==
        "model.architecture: embeddings.ops[3]: max_pool2d's padding must be at most half its kernel (PyTorch's rule)");
  // A program's image may be small (PyTorch's ResNet runs on 16 x 16), but not smaller than the stem's kernel.
  CHECK(first_error("resnet", "image_size=16").empty());
}

TEST_CASE("What helps: a smaller micro-batch under batch norm says that it changes training", "[architecture]") {
  auto note_of = [](const Config& c) {
    for (const auto& s : suggestion_candidates(c))
      if (s.id == "micro_batch_smaller") return s.cost;
    return std::string("none");
  };
  Config resnet = resnet_config("resnet", "");
  resnet.training.micro_batch_size = 64;
  CHECK(note_of(resnet).find("batch norm's statistics then come from fewer samples") != std::string::npos);
  Config convnext = resnet_config("convnext", "");  // layer norm: per sample
  convnext.training.micro_batch_size = 64;
  CHECK(note_of(convnext) == "same global batch; smaller matmuls run less efficiently");
}

TEST_CASE("a timm config.json imports as the program that builds its model", "[architecture]") {
  // timm's push_to_hf_hub config (timm/resnet50.tv_in1k on the Hub): the model's name, its classes, pretrained_cfg.
  const Parsed r = model_from_hf_json(R"({"architecture": "resnet101", "num_classes": 10, "num_features": 2048,
      "pretrained_cfg": {"tag": "tv_in1k", "input_size": [3, 176, 176], "classifier": "fc"}})");
  REQUIRE(r.ok);
  CHECK(r.config.model.architecture == "resnet");
  CHECK(r.config.model.architecture_args == "layers3=23,num_classes=10,num_channels=3,image_size=176");
  CHECK(model_shape_of(r.config.model).params_total == 44549160 - 2049 * 1000 + 2049 * 10);
  // timm's ViT names its image size img_size; DeiT's qkv has a bias.
  const Parsed v = model_from_hf_json(R"({"architecture": "vit_base_patch16_224", "num_classes": 1000,
      "pretrained_cfg": {"input_size": [3, 384, 384]}})");
  REQUIRE(v.ok);
  CHECK(v.config.model.architecture == "vit_timm");
  CHECK(v.config.model.architecture_args == "qkv_bias=1,num_classes=1000,in_chans=3,img_size=384");
  // A timm model no program builds is one error naming the field and what memsim builds.
  const Parsed bad = model_from_hf_json(R"({"architecture": "resnet50d", "num_classes": 1000, "pretrained_cfg": {}})");
  REQUIRE(!bad.ok);
  CHECK(bad.errors.front().field == "model.architecture");
  CHECK(bad.errors.front().message.find("model.architecture: the timm model \"resnet50d\" has no built-in program; the timm models memsim builds: ") == 0);
  CHECK(bad.errors.front().message.find("convnext_tiny") != std::string::npos);
  // Every timm name a program declares decodes, with the torchvision totals the presets carry.
  for (const auto& name : timm_model_names()) {
    std::string program, args;
    REQUIRE(architecture_for_timm(name, program, args));
    std::shared_ptr<const Architecture> a;
    INFO(name);
    CHECK(decode_architecture(program, args, a).empty());
  }
}

TEST_CASE("Swin program: torchvision's Swin-T/S/B counts, and a pair of window blocks' saved set", "[architecture]") {
  CHECK(params_of("swin", "") == 28288354);                                   // swin_t
  CHECK(params_of("swin", "depth3=18,stochastic_depth_prob=0.3") == 49606258);  // swin_s
  CHECK(params_of("swin", "embed_dim=128,num_heads=4,depth3=18") == 87768224);  // swin_b
  // One program block is a plain and a shifted window block. Stage 1 in fp32, stochastic depth off (C = 96, 56 x 56
  // rows, 3 heads, 7 x 7 windows): per Swin block the window partition (qkv's input, C), the scaled q (C), matmul's
  // contiguous copies of the k and v views (C each; qkv's output itself is not saved), the fp32 probabilities (49
  // per head), the merged heads (proj's input, C), the first residual sum (norm2's input, C), norm2's output (C),
  // fc1's and gelu's outputs (4C each) and the block's output (C): 16C + 49 heads per row, and each norm's fp32 mean
  // and rstd. tools/calibrate/check_programs_torch.py measures the same set on torch's autograd graph.
  auto at_backward = [](const std::string& args) { return activations_before_backward(resnet_config("swin", args)); };
  const int64_t b = 4, rows = 56 * 56, C = 96, heads = 3;
  const int64_t per_swin_block = 4 * (16 * C + 49 * heads) + 2 * 8;
  CHECK(at_backward("depth1=4,stochastic_depth_prob=0") - at_backward("depth1=2,stochastic_depth_prob=0") ==
        2 * per_swin_block * rows * b);
  // The shifted block's roll and mask are transients only: with the shift the same saved set (stage 4's 7 x 7 map,
  // one window, has no shift at all: torchvision turns it off where the window covers the map).
  std::shared_ptr<const Architecture> a;
  REQUIRE(decode_architecture("swin", "", a).empty());
  int masked = 0;
  for (const auto& k : a->blocks)
    for (const auto& op : k.ops) masked += op.kind == OpKind::WindowAttention && op.masked;
  CHECK(masked == 3);  // the shifted blocks of stages 1 to 3
  // A map the windows do not tile is padded to whole windows, as torchvision's F.pad does: at 256 x 256 stage 1's
  // 64 x 64 map attends as 70 x 70 (4,900 rows); an odd map is padded to even before patch merging (200: 25 -> 26).
  REQUIRE(decode_architecture("swin", "image_size=256", a).empty());
  for (const auto& op : a->blocks[0].ops)
    if (op.kind == OpKind::WindowAttention) CHECK(a->blocks[0].tensors[static_cast<size_t>(op.in[0])].shape[0] == 4900);
  CHECK(a->blocks[0].tensors[static_cast<size_t>(a->blocks[0].output)].shape[0] == 64 * 64);
  REQUIRE(decode_architecture("swin", "image_size=200", a).empty());
  CHECK(a->blocks[4].tensors[static_cast<size_t>(a->blocks[4].input)].shape[0] == 13 * 13);  // 50 -> 25 -> 13
  CHECK(params_of("swin", "image_size=384") == 28288354);  // the bias tables depend on the window only
}

TEST_CASE("HF ResNet, ConvNeXt and Swin config.json files import as the programs, with torchvision's counts",
          "[architecture]") {
  // transformers' ResNetConfig, ConvNextConfig and SwinConfig (the Hub's microsoft/resnet-50 and -18,
  // facebook/convnext-tiny-224, microsoft/swin-tiny-patch4-window7-224): the programs' hf_keys read depths and
  // hidden sizes from their lists, num_classes from id2label. transformers builds the same layers as torchvision
  // (ResNetBottleNeckLayer reduction 4 with the stride on the 3x3, ConvNextLayer with its layer scale, SwinLayer's
  // relative position bias per block), so the totals are torchvision's.
  struct Expect {
    const char* file;
    const char* program;
    int64_t params;
  };
  for (const Expect& e : {Expect{"microsoft-resnet-50.json", "resnet", 25557032},
                          Expect{"microsoft-resnet-18.json", "resnet_basic", 11689512},
                          Expect{"facebook-convnext-tiny-224.json", "convnext", 28589128},
                          Expect{"microsoft-swin-tiny-patch4-window7-224.json", "swin", 28288354}}) {
    INFO(e.file);
    const Parsed p = model_from_hf_json(read_file(source_path(std::string("tests/data/hf/") + e.file)));
    REQUIRE(p.ok);
    CHECK(p.config.model.architecture == e.program);
    CHECK(model_shape_of(p.config.model).params_total == e.params);
  }
  // A list entry read by its pointer, and id2label's size as the classes; the keys at the program's defaults are left
  // out of the arguments (ResNet-50's 3, 4, 6, 3 are the program's).
  const Parsed deeper = model_from_hf_json(R"({"model_type": "resnet", "depths": [3, 4, 23, 3], "layer_type": "bottleneck",
      "hidden_sizes": [256, 512, 1024, 2048], "id2label": {"0": "cat", "1": "dog"}})");
  REQUIRE(deeper.ok);
  CHECK(deeper.config.model.architecture_args == "layers3=23,num_classes=2");
  // A config whose structure no program has (basic blocks at bottleneck widths, absolute position embeddings) is one
  // error saying what each program needs.
  for (const char* bad : {R"({"model_type": "resnet", "depths": [2, 2, 2, 2], "layer_type": "basic"})",
                          R"({"model_type": "swin", "use_absolute_embeddings": true})"}) {
    const Parsed p = model_from_hf_json(bad);
    INFO(bad);
    REQUIRE(!p.ok);
    CHECK(p.errors.front().field == "model.architecture");
    CHECK(p.errors.front().message.find("needs") != std::string::npos);
  }
}

TEST_CASE("an HF vision config.json of a family no program reads is one line naming the programs", "[architecture]") {
  // transformers' EfficientNetConfig (google/efficientnet-b0): width and depth coefficients, no hidden_size.
  const Parsed p = model_from_hf_json(R"({"architectures": ["EfficientNetForImageClassification"], "model_type": "efficientnet",
      "width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280, "num_channels": 3})");
  REQUIRE(!p.ok);
  REQUIRE(p.errors.size() == 1);
  CHECK(p.errors.front().field == "model.model_type");
  CHECK(p.errors.front().message.find("Families written as model programs: ") != std::string::npos);
  CHECK(p.errors.front().message.find("resnet, resnet_basic, sd35_large_mmdit, sd35_medium_mmdit, sd3_mmdit, sd_unet, sd_vae_encoder, sdxl_unet, siglip_vision, swin") != std::string::npos);
  // A decoder's config that lacks a key still names each missing key.
  const Parsed q = model_from_hf_json(R"({"model_type": "llama", "num_hidden_layers": 2})");
  REQUIRE(!q.ok);
  CHECK(q.errors.front().field == "model.hidden_size");
}

TEST_CASE("CNN and Swin programs: every tensor freed once, after its last use, with and without checkpoints", "[architecture]") {
  // A stage that saved its own output (ResNet's blocks end in an in-place ReLU whose backward reads its result)
  // keeps it until its own backward: the next stage reads it but neither frees it nor frees it again (before
  // session 32 the next block's conv backward freed it, and the block's own backward freed it a second time).
  for (const char* program : {"resnet", "resnet_basic", "convnext", "swin"})
    for (const char* ckpt : {"none", "full"}) {
      Config c = resnet_config(program, "image_size=64");
      c.training.activation_checkpointing = ckpt;
      const Result r = simulate(c);
      REQUIRE(r.ok);
      INFO(program << ", checkpointing " << ckpt);
      CHECK(ledger_problem(r.devices[0].program).empty());
    }
  // forward_retained_bytes in closed form: one more basic block of layer 4 ([512, 2, 2] fp32 maps per image at 64
  // pixels) adds its four maps c1, b1, c2 and b2 and its two batch norms' fp32 mean and inverse deviation. (That the
  // last block's ReLU result is among them, is what tools/calibrate/check_programs_torch.py checks against torch.)
  auto retained = [](const std::string& args) {
    const Result r = simulate(resnet_config("resnet_basic", "image_size=64," + args));
    REQUIRE(r.ok);
    return forward_retained_bytes(r.devices[0].program);
  };
  CHECK(retained("layers4=3") - retained("layers4=2") == 4 * 4 * (512 * 2 * 2 * 4) + 2 * 2 * 512 * 4);
}

TEST_CASE("zero_grad before backward: the last step's gradients live through the next forward", "[step]") {
  // training.zero_grad_at before_backward (PyTorch Lightning's closure: training_step, zero_grad, backward): when
  // step 2's forward begins, step 1's gradients are still allocated, every trainable weight's (fp32 here); they go
  // in a zero_grad phase just before step 2's first backward. after_step frees them after the optimizer step.
  Config c = resnet_config("resnet_basic", "image_size=64");
  const Result after = simulate(c);
  c.training.zero_grad_at = "before_backward";
  REQUIRE(validate(c).empty());
  const Result before = simulate(c);
  REQUIRE(after.ok);
  REQUIRE(before.ok);
  const auto& pb = before.devices[0].program;
  CHECK(live_bytes_before_phase(after.devices[0].program, "forward (step 2", Component::Gradients) == 0);
  CHECK(live_bytes_before_phase(pb, "forward (step 2", Component::Gradients) == 4 * before.params_trainable);
  CHECK(live_bytes_before_phase(pb, "backward (step 2", Component::Gradients) == 0);
  bool zero_grad_before_backward = false;
  for (size_t i = 1; i < pb.phases.size(); ++i)
    zero_grad_before_backward |= pb.phases[i - 1].name.rfind("zero_grad (before step 2", 0) == 0 && pb.phases[i].name.rfind("backward (step 2", 0) == 0;
  CHECK(zero_grad_before_backward);
  CHECK(ledger_problem(pb).empty());
  CHECK(before.devices[0].peak.allocated_bytes > after.devices[0].peak.allocated_bytes);
  // torch 1.x's zero_grad kept the gradients anyway (zeroed in place): where it runs changes nothing.
  c.training.zero_grad_set_to_none = "false";
  const int64_t kept_before = simulate(c).devices[0].peak.allocated_bytes;
  c.training.zero_grad_at = "after_step";
  CHECK(simulate(c).devices[0].peak.allocated_bytes == kept_before);
  c.training.zero_grad_at = "sometimes";
  CHECK_FALSE(validate(c).empty());
}

TEST_CASE("vit_torchvision program: torchvision's ViT-B/16, L/16 and H/14 counts, and the in-projection's copies", "[architecture]") {
  // torchvision.models.ViT_*_Weights num_params (vit_h_14 at 224 px: IMAGENET1K_SWAG_LINEAR_V1).
  CHECK(params_of("vit_torchvision", "") == 86567656);
  CHECK(params_of("vit_torchvision", "hidden_dim=1024,num_layers=24,num_heads=16,mlp_dim=4096") == 304326632);
  CHECK(params_of("vit_torchvision", "patch_size=14,hidden_dim=1280,num_layers=32,num_heads=16,mlp_dim=5120") == 632045800);
  // One encoder block's saved set in fp32 under torch 2.x's SDPA (the efficient kernel: fp32 cannot use flash), per
  // token: ln_1's input (E), in_proj's input (E: matmul's folded copy of ln_1's output), the contiguous [3, S, B, E]
  // copy q, k and v are slices of (3E), the kernel's output (E), out_proj's input (E: permute(...).contiguous()), ln_2's
  // input (E), fc1's input (E), GELU's input (4E) and fc2's input (4E): 17E floats, the norms' mean and rstd, and the
  // logsumexp, fp32 [heads, tokens padded to 32].
  Config c = resnet_config("vit_torchvision", "image_size=64,patch_size=16,hidden_dim=64,num_heads=2,mlp_dim=256,num_layers=2");
  c.training.attention = "sdpa";
  const int64_t b = 4, tokens = 17, E = 64;
  const int64_t two = activations_before_backward(c);
  c.model.architecture_args = "image_size=64,patch_size=16,hidden_dim=64,num_heads=2,mlp_dim=256,num_layers=3";
  CHECK(activations_before_backward(c) - two == b * (4 * 17 * E * tokens + 2 * 2 * 4 * tokens) + 4 * b * 2 * 32);
}
