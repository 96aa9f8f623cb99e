// End-to-end tests of the model programs and towers on the served page (CNNs, vision-language towers, diffusion,
// Whisper, hybrids, LLaMA-Adapter): each sets an input the family adds, through the keyboard or a dropped
// config.json, and checks the page against the CLI. Split from page.test.mjs so that the runner's two files at a time
// share the work (page.test.mjs alone took 230 of the suite's 349 s).
//   node --test tests/e2e/programs.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { cli, cliEstimate, openPage, press, root, shots, tabTo, until, useBrowser } from "./harness.mjs";

useBrowser();

test("a dropped timm config.json becomes a CNN program: its inputs, a short link and the CLI's numbers", async () => {
  const { page, errors } = await openPage();
  const timm = { architecture: "resnet50", num_classes: 100, num_features: 2048,
    pretrained_cfg: { tag: "tv_in1k", input_size: [3, 224, 224], classifier: "fc" } };
  await page.evaluate((t) => window.memsim.loadText(JSON.stringify(t), "config.json"), timm);
  await until(page, async () => {}, () => window.memsim.state().config.model.architecture === "resnet");
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.architecture_args, "num_classes=100,num_channels=3,image_size=224");
  const hash = await page.evaluate(() => window.location.hash);
  assert.ok(hash.length < 200, "a short link: " + hash);
  // The page's numbers are the CLI's for the same config.
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  assert.equal(fromPage.params_total, 25557032 - 2049 * 900);
  await page.screenshot({ path: path.join(shots, "timm-resnet50-1280x720.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("a dropped LLaVA config.json becomes a vision-language model: its tower, a short link and the CLI's numbers", async () => {
  const { page, errors } = await openPage();
  const llava = readFileSync(path.join(root, "tests/data/hf/llava-1.5-7b-hf.json"), "utf8");
  await page.evaluate((t) => window.memsim.loadText(t, "config.json"), llava);
  await until(page, async () => {}, () => window.memsim.state().config.model.vision_tower === "clip_vision");
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.hidden_size, 4096);
  assert.ok(state.config.model.vision_tower_args.includes("image_size=336"), state.config.model.vision_tower_args);
  const hash = await page.evaluate(() => window.location.hash);
  assert.ok(hash.length < 400, "a short link: " + hash);
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 7063427072);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, "llava-config-1280x720.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("a dropped Qwen2.5-VL config.json brings its windowed tower; the page and the CLI agree", async () => {
  const { page, errors } = await openPage();
  const qwen = readFileSync(path.join(root, "tests/data/hf/qwen2.5-vl-7b-instruct.json"), "utf8");
  await page.evaluate((t) => window.memsim.loadText(t, "config.json"), qwen);
  await until(page, async () => {}, () => window.memsim.state().config.model.vision_tower === "qwen2_5_vl_vision");
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.hidden_size, 3584);
  assert.ok(state.config.model.vision_tower_args.includes("fullatt2=15"), state.config.model.vision_tower_args);
  const hash = await page.evaluate(() => window.location.hash);
  assert.ok(hash.length < 400, "a short link: " + hash);
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 8292166656);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  assert.deepEqual(errors, []);
  await page.close();
});

test("on a phone, the keyboard sets a Qwen2-VL image's height and the tower's arguments follow", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "qwen2-vl-7b", "--set", "peft.method=lora", "--set",
                                  "parallel.data_parallel_size=1", "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + frag, { width: 390, height: 844 });
  const header = await tabTo(page, "Vision tower");
  if (header.includes("closed")) await press(page, "Space");
  assert.ok((await tabTo(page, "image_height")).startsWith("image_height: 448"));
  await page.keyboard.type("720", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.vision_tower_args.includes("image_height=720"));
  await page.screenshot({ path: path.join(shots, "qwen2-vl-image-height-390x844.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("LLaVA-NeXT: the Vision tower's anyres image size sets its tiles, and the page agrees with the CLI", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "llava-v1.6-mistral-7b", "--set", "peft.method=lora", "--set",
                                  "parallel.data_parallel_size=1", "--set", "training.sequence_length=4096",
                                  "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + frag, { width: 1280, height: 800 });
  const header = await tabTo(page, "Vision tower");
  if (header.includes("closed")) await press(page, "Space");
  assert.ok((await tabTo(page, "image_height")).startsWith("image_height: 0"));
  await page.keyboard.type("480", { delay: 30 });
  await press(page, "Enter");
  assert.ok((await tabTo(page, "image_width")).startsWith("image_width: 0"));
  await page.keyboard.type("640", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.vision_tower_args.includes("image_width=640"));
  const state = await page.evaluate(() => window.memsim.state());
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 7566747648 + 3407872);  // the preset and LoRA's adapters on q and v
  assert.equal(fromPage.params_total, fromCli.params_total);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, "llava-next-anyres-1280x800.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("on a phone, the Stable Diffusion UNet's resolution sets its latent, and the page agrees with the CLI", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "stable-diffusion-v1-5", "--set", "peft.method=lora", "--set",
                                  "peft.target_modules=to_k,to_q,to_v,to_out.0", "--set", "peft.lora_rank=4", "--set", "training.precision=fp16_autocast", "--set", "training.framework=hf_loop", "--set",
                                  "parallel.data_parallel_size=1", "--set", "training.micro_batch_size=1",
                                  "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + frag, { width: 390, height: 844 });
  assert.ok((await tabTo(page, "resolution")).startsWith("resolution: 512"));
  await page.keyboard.type("768", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.architecture_args.includes("resolution=768"));
  const state = await page.evaluate(() => window.memsim.state());
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 859520964 + 797184);  // the UNet and rank-4 LoRA on to_k, to_q, to_v, to_out.0
  assert.equal(fromPage.params_total, fromCli.params_total);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, "sd-unet-resolution-390x844.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("FLUX.1's transformer under QLoRA: its T5 length sets the joint tokens, and the page agrees with the CLI", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "flux-1-dev", "--set", "peft.method=lora", "--set", "peft.base_quantization=nf4",
                                  "--set", "peft.target_modules=to_k,to_q,to_v,to_out.0", "--set", "peft.lora_rank=4",
                                  "--set", "training.precision=bf16_autocast", "--set", "training.framework=hf_loop",
                                  "--set", "training.activation_checkpointing=full", "--set", "parallel.data_parallel_size=1",
                                  "--set", "training.micro_batch_size=1", "--set", "hardware.gpu=rtx-4090",
                                  "--set", "model.architecture_args=height=768,width=512,max_sequence_length=77,vae_on_gpu=0,text_encoder_on_gpu=0,text_encoder_2_on_gpu=0",
                                  "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + frag);
  assert.ok((await tabTo(page, "max_sequence_length")).startsWith("max_sequence_length: 77"));
  await page.keyboard.type("256", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.architecture_args.includes("max_sequence_length=256"));
  const state = await page.evaluate(() => window.memsim.state());
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 11901408320 + 4669440);  // the transformer and the blog's rank-4 adapters
  assert.equal(fromPage.params_total, fromCli.params_total);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, "flux-qlora-1280x800.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("on a phone, Whisper's label length sets its decoder rows, its link stays short, and the page agrees with the CLI", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "whisper-large-v3", "--set", "peft.method=lora", "--set", "peft.base_quantization=int8",
                                  "--set", "peft.target_modules=q_proj,v_proj", "--set", "peft.lora_rank=32",
                                  "--set", "training.precision=fp16_autocast", "--set", "training.activation_checkpointing=full",
                                  "--set", "parallel.data_parallel_size=1", "--set", "training.micro_batch_size=8",
                                  "--set", "hardware.gpu=t4", "--format", "fragment"]).toString().trim();
  assert.ok(frag.startsWith("memsim=3&model=whisper-large-v3&"), frag);
  assert.ok(frag.length < 300, frag);
  const { page, errors } = await openPage("#" + frag, { width: 390, height: 844 });
  assert.ok((await tabTo(page, "target_length")).startsWith("target_length: 448"));
  await page.keyboard.type("128", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.architecture_args.includes("target_length=128"));
  const state = await page.evaluate(() => window.memsim.state());
  // The link carries the one argument set, not the preset's eleven.
  assert.ok(state.fragment.includes("&architecture_args~=target_length=128&"), state.fragment);
  assert.ok(state.fragment.length < 300, state.fragment);
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, 1543490560 + 15728640);  // large-v3 and rank-32 LoRA on every q_proj and v_proj
  assert.equal(fromPage.params_total, fromCli.params_total);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, "whisper-int8-lora-390x844.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

// A language model written as a program: its preset's link opens, sequence_length 8192 is typed into the program's
// own field, and the page's estimate of the result equals the CLI's. Returns the page's state and estimate.
async function programSequenceTyped(preset, settings, screenshot) {
  const frag = execFileSync(cli, ["config", "--preset", preset, ...settings.flatMap((s) => ["--set", s]),
                                  "--format", "fragment"]).toString().trim();
  assert.ok(frag.startsWith(`memsim=3&model=${preset}&`), frag);
  const { page, errors } = await openPage("#" + frag);
  assert.ok((await tabTo(page, "sequence_length")).startsWith("sequence_length: 2048"));
  await page.keyboard.type("8192", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.model.architecture_args.includes("sequence_length=8192"));
  const state = await page.evaluate(() => window.memsim.state());
  const fromPage = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(state.config));
  const fromCli = cliEstimate(JSON.stringify(state.config));
  assert.equal(fromPage.params_total, fromCli.params_total);
  assert.equal(fromPage.devices[0].peak.device_bytes, fromCli.devices[0].peak.device_bytes);
  await page.screenshot({ path: path.join(shots, screenshot) });
  assert.deepEqual(errors, []);
  await page.close();
  return { state, fromPage };
}

const oneH100 = ["training.precision=bf16_pure", "training.activation_checkpointing=full", "parallel.data_parallel_size=1",
                 "hardware.gpu=h100-sxm"];

test("Nemotron-H: a hybrid's pattern of 52 layers in three kinds, its sequence_length, the page agrees with the CLI", async () => {
  const { state, fromPage } = await programSequenceTyped("nemotron-h-8b",
      [...oneH100, "peft.method=lora", "peft.target_modules=q_proj,k_proj,v_proj,o_proj", "training.micro_batch_size=1"],
      "nemotron-h-8b-1280x800.png");
  assert.ok(state.fragment.includes("&architecture_args=sequence_length=8192&"), state.fragment);  // the preset sets none
  // the 8B and rank-8 LoRA on the 4 attention layers' q (4096 + 4096), k and v (4096 + 1024) and o (4096 + 4096)
  assert.equal(fromPage.params_total, 8100852736 + 4 * 8 * (8192 + 5120 + 5120 + 8192));
});

test("Mamba-2: its sequence_length sets the tokens, and the page agrees with the CLI", async () => {
  const { fromPage } = await programSequenceTyped("mamba2-2.7b", [...oneH100, "training.micro_batch_size=2"], "mamba2-1280x800.png");
  assert.equal(fromPage.params_total, 2702599680);  // state-spaces/mamba2-2.7b, tied
});

test("on a phone, litgpt's adapter_v2 shows its prompt length and start layer", async () => {
  const frag = execFileSync(cli, ["config", "--preset", "llama-3.2-1b", "--set", "training.framework=litgpt", "--set",
                                  "peft.method=adapter_v2", "--set", "parallel.data_parallel_size=1",
                                  "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + frag, { width: 390, height: 844 });
  assert.ok((await tabTo(page, "adapter start layer")).startsWith("adapter start layer: 2"));
  await page.keyboard.type("4", { delay: 30 });
  await press(page, "Enter");
  await until(page, async () => {}, () => window.memsim.state().config.peft.adapter_start_layer === 4);
  await page.screenshot({ path: path.join(shots, "adapter-v2-390x844.png") });
  assert.deepEqual(errors, []);
  await page.close();
});
