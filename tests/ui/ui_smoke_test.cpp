// The interface without a window: ImGui frames rendered headless (like Dear ImGui's example_null), so the
// UI code runs in the native test suite. Hostile input must leave the setup intact and show a message.
#include <catch2/catch.hpp>
#include <imgui.h>

#include "core/architecture.h"
#include "core/serialize.h"
#include "core/validate.h"
#include "headless.h"
#include "ui/app.h"
#include "ui/question.h"

using namespace memsim;

TEST_CASE("the app draws its default frame at 1280x720 and 800x600", "[ui]") {
  for (auto [w, h] : {std::pair{1280.0f, 720.0f}, std::pair{800.0f, 600.0f}}) {
    HeadlessImGui gui(w, h);
    std::string published;
    ui::PlatformHooks hooks;
    hooks.publish_fragment = [&](const std::string& f) { published = f; };
    ui::App app(hooks);
    for (int i = 0; i < 3; ++i) CHECK(gui.frame(app) > 1000);
    CHECK(app.result().ok);
    CHECK(published == config_to_fragment(Config{}));
  }
}

TEST_CASE("hovering the timeline builds the what-is-alive tooltip", "[ui]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  gui.frame(app);
  ImGui::GetIO().MousePos = ImVec2(900, 600);  // inside the timeline chart
  const int without = gui.frame(app);
  CHECK(gui.frame(app) >= without);
  ImGui::GetIO().MousePos = ImVec2(1200, 560);
  CHECK(gui.frame(app) > 1000);
}

TEST_CASE("a hostile link keeps the current setup and shows a message", "[ui]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  Config c;
  c.training.micro_batch_size = 2;
  app.set_config(c);
  for (const std::string& bad : std::vector<std::string>{"#schema=99", "#garbage", "#schema=1&model.hidden_size=<img src=x>",
                                "#schema=1&model.hidden_size=-1", std::string("#schema=1&") + std::string(1 << 20, 'x')}) {
    CHECK(!app.load_fragment(bad));
    CHECK(app.config() == c);
    REQUIRE(!app.messages().empty());
    CHECK(app.messages().back().kind == ui::Message::Kind::Error);
    gui.frame(app);
  }
  CHECK(app.load_fragment("#" + config_to_fragment(Config{})));
  CHECK(app.config() == Config{});
}

TEST_CASE("a cut or altered link keeps the setup and says so, what a chat client appends is ignored", "[ui]") {
  HeadlessImGui gui(1280, 720);
  std::string published;
  ui::PlatformHooks hooks;
  hooks.publish_fragment = [&](const std::string& f) { published = f; };
  ui::App app(hooks);
  Config c;
  c.training.micro_batch_size = 2;
  app.set_config(c);
  gui.frame(app);
  Config shared;
  shared.parallel.zero_stage = 2;
  shared.hardware.gpu = "h100-sxm";
  const std::string link = config_to_fragment(shared);
  const size_t messages = app.messages().size();
  CHECK(!app.load_fragment("#" + link.substr(0, link.find("&c="))));  // cut at a field boundary
  CHECK(app.config() == c);
  REQUIRE(app.messages().size() == messages + 1);  // one message
  CHECK(app.messages().back().kind == ui::Message::Kind::Error);
  CHECK(app.messages().back().text.find("could not be opened, so the current setup is kept") != std::string::npos);
  CHECK(app.messages().back().text.find("cut off in chat") != std::string::npos);
  std::string altered = link;
  altered.replace(altered.find("zero_stage=2"), 12, "zero_stage=1");
  CHECK(!app.load_fragment("#" + altered));
  CHECK(app.config() == c);
  CHECK(app.messages().back().text.find("checksum mismatch") != std::string::npos);
  // Whole, with a sentence's ")." after it: it opens, and the address bar gets the link without them.
  CHECK(app.load_fragment("#" + link + ")."));
  gui.frame(app);
  CHECK(app.config() == shared);
  CHECK(published == link);
}

TEST_CASE("a dropped config.json replaces only the model", "[ui]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  CHECK(app.load_text(R"({"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,
                          "num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256})", "config.json"));
  CHECK(app.config().model.hidden_size == 4096);
  CHECK(app.config().training == Config{}.training);
  CHECK(app.result().params_total == 8030261248);
  CHECK(!app.load_text("{\"hidden_size\": \"big\"}", "bad.json"));
  CHECK(app.config().model.hidden_size == 4096);
  gui.frame(app);
}

TEST_CASE("a dropped model program replaces the model, and a bad one keeps the setup with a message naming where", "[ui]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  const std::string vit(builtin_architecture("vit"));
  CHECK(app.load_text(vit, "vit.json"));
  CHECK(!app.config().model.architecture.empty());
  CHECK(app.config().training == Config{}.training);
  CHECK(app.result().params_total == 86567656 - 769000 + 768 * 2 + 2);  // ViTConfig's default 2 labels
  gui.frame(app);
  // The question's LoRA takes the family's targets (PEFT's mapping for ViT: query and value), not Llama's.
  Config lora = app.config();
  ui::set_method(lora, ui::Method::Lora);
  CHECK(lora.peft.target_modules == "query,value");
  CHECK(validate(lora).empty());
  const Config before = app.config();
  std::string bad = vit;
  bad.replace(bad.find("\"gelu\""), 6, "\"swish\"");
  CHECK(!app.load_text(bad, "mine.json"));
  CHECK(app.config() == before);
  REQUIRE(!app.messages().empty());
  CHECK(app.messages().back().text.find("mine.json was read as a model program and not loaded, so the current setup is "
                                        "kept. model.architecture: block.ops[10].op: \"swish\" is not an op") == 0);
  gui.frame(app);
}

TEST_CASE("a file the page did not read (too large, binary, empty) is one message naming why, the setup kept", "[ui]") {
  ui::App app({});
  const Config before = app.config();
  CHECK(!app.load_text("", "\"huge.json\" (3.0 GiB; files over 256 MiB are not read)"));
  CHECK(!app.load_text(" \n", "\"empty.json\" (empty)"));
  CHECK(app.config() == before);
  REQUIRE(app.messages().size() == 2);
  CHECK(app.messages()[0].text == "\"huge.json\" (3.0 GiB; files over 256 MiB are not read) was not loaded, so the current "
                                  "setup is kept.");
}

TEST_CASE("a dropped Accelerate config (YAML or JSON) sets the layout and keeps the model", "[ui]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  const ModelConfig model = app.config().model;
  CHECK(app.load_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
                      "  fsdp_offload_params: true\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_version: 1\n"
                      "mixed_precision: bf16\nnum_machines: 2\nnum_processes: 16\n",
                      "default_config.yaml"));
  CHECK(app.config().parallel.sharding == "fsdp1");
  CHECK(app.config().parallel.offload_params == "cpu");
  CHECK(app.config().parallel.data_parallel_size == 16);
  CHECK(app.config().hardware.gpus_per_node == 8);
  CHECK(app.config().model == model);
  CHECK(app.load_text(R"({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2}, "num_processes": 4})", "a.json"));
  CHECK(app.config().parallel.sharding == "fsdp2");
  // A DeepSpeed config still goes to the DeepSpeed importer.
  CHECK(app.load_text(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})", "ds.json"));
  CHECK(app.config().parallel.sharding == "deepspeed");
  CHECK(app.config().parallel.offload_optimizer == "cpu");
  // Hostile YAML keeps the setup.
  const Config before = app.config();
  CHECK(!app.load_text("distributed_type: &a FSDP\nnum_processes: *a\n", "evil.yaml"));
  CHECK(app.config() == before);
  gui.frame(app);
}

TEST_CASE("the fine-tuning panel draws every PEFT method, and a refused one shows its field", "[ui][peft]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  for (const char* method : {"lora", "dora", "ia3", "ln_tuning", "prompt_tuning", "prefix_tuning", "adaption_prompt",
                             "adapter", "adapter_v2"}) {
    Config c;
    c.peft.method = method;
    if (c.peft.method == "ia3") c.peft.target_modules = "k_proj,v_proj,down_proj";
    if (c.peft.method == "ln_tuning") c.peft.target_modules = "input_layernorm,post_attention_layernorm,norm";
    if (c.peft.method == "prefix_tuning") c.training.activation_checkpointing = "none";
    app.set_config(c);
    for (int i = 0; i < 2; ++i) CHECK(gui.frame(app) > 1000);
    INFO(method);
    // litgpt's LLaMA-Adapter under the default framework (the HF Trainer) is refused, naming the method.
    const bool litgpt_only = c.peft.method == "adapter" || c.peft.method == "adapter_v2";
    CHECK(app.result().ok == !litgpt_only);
    if (!app.result().ok) CHECK(app.result().errors.at(0).field == "peft.method");
  }
}

// In the headless 1280x720 frame the default setup's bar spans the results panel from about x 470, and its device
// band covers about 50-66% of it (x 870-990); its row is found by hovering down the panel, so that a line added
// above the bar does not move the test off it.
TEST_CASE("hovering the device bar's band lists the published cases it comes from", "[ui][band]") {
  HeadlessImGui gui(1280, 720);
  ui::App app({});
  gui.frame(app);
  gui.frame(app);
  REQUIRE(app.result().devices.front().band.valid);
  auto hover = [&](float x, float y) {
    ImGui::GetIO().MousePos = ImVec2(x, y);
    gui.frame(app);
    return gui.frame(app);
  };
  // The bar's row: its left part (the weights segment) shows a segment's tooltip only, its band part that and a
  // line per neighbouring case (each glyph is 4 vertices). (The band's text line above it lists them all along.)
  // Both are found by hovering along the rows, so that a line added above the bar or a peak that moves the band
  // along it does not move the test off them.
  const int nowhere = hover(5000, 150);
  bool found = false;
  for (float y = 60; y < 400 && !found; y += 6) {
    int on_weights = nowhere, most = nowhere;
    for (float x = 300; x < 1280; x += 10) {
      const int v = hover(x, y);
      if (on_weights == nowhere) on_weights = v;
      most = std::max(most, v);
    }
    found = on_weights > nowhere && most > on_weights + 2000 && hover(5000, y) == nowhere;
  }
  CHECK(found);
}
