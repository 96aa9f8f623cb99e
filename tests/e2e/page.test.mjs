// End-to-end tests of the served page in headless Chromium, driven by playwright-core (node's test runner).
//   node --test tests/e2e/page.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { decodePng, distinctColors, share } from "./png.mjs";
import { base, browser, cli, cliConfig, cliEstimate, openPage, press, requests, root, shots, site, tabTo, until, useBrowser, patience } from "./harness.mjs";

useBrowser();

test("the default page draws the verdict, breakdown and timeline", async () => {
  const { page, errors } = await openPage();
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.hidden_size, 5120);
  assert.equal(state.config.parallel.zero_stage, 3);
  assert.equal(state.config.hardware.gpu, "a100-80gb");
  const hash = await page.evaluate(() => window.location.hash);
  assert.ok(hash.startsWith("#memsim=3&"), "the fragment is kept current: " + hash.slice(0, 40));
  const png = await page.screenshot({ path: path.join(shots, "default-1280x720.png") });
  const img = decodePng(png);
  assert.ok(distinctColors(img, 0, 0, 1280, 720) > 50, "canvas is not blank");
  assert.ok(distinctColors(img, 480, 60, 780, 120) > 10, "verdict and bar region are drawn");
  assert.ok(distinctColors(img, 480, 500, 780, 200) > 3, "timeline region is drawn");
  // The charts go through the WebGL2 renderer (its shaders compiled under GLSL ES 3.00), and its quads reach the
  // canvas: the allocated memory's blue fills the bottom of the timeline.
  const { charts } = await page.evaluate(() => window.memsim.state());
  assert.equal(charts.renderer, "webgl2", JSON.stringify(charts));
  assert.ok(charts.timeline_draws > 0, JSON.stringify(charts));
  const blue = share(img, 530, 629, 700, 25, (r, g, b) => b > r + 80 && b > 150);
  assert.ok(blue > 0.5, `the timeline's blue covers ${(100 * blue).toFixed(0)}% of its bottom`);
  // Frames drawn while nothing changes (here on mouse moves: an idle page draws none) draw the timeline from the
  // instances uploaded once.
  for (let i = 0; i < 5; i++) {
    await page.mouse.move(100 + 20 * i, 300);
    await page.waitForTimeout(100);
  }
  const later = (await page.evaluate(() => window.memsim.state())).charts;
  assert.ok(later.timeline_draws > charts.timeline_draws, JSON.stringify([charts, later]));
  assert.equal(later.timeline_uploads, charts.timeline_uploads, JSON.stringify([charts, later]));
  assert.deepEqual(errors, []);
  await page.close();
});

test("a shared link reopens exactly its setup", async () => {
  const frag = cliConfig(["--hf-config", path.join(root, "tests/data/hf/mistral-7b-v0.1.json"),
                          "--set", "training.micro_batch_size=2", "--set", "hardware.gpu=h100-sxm", "--format", "fragment"]).trim();
  const { page, errors } = await openPage("#" + frag);
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.fragment, frag);
  assert.equal(state.config.model.intermediate_size, 14336);
  assert.equal(state.config.training.micro_batch_size, 2);
  assert.equal(await page.evaluate(() => window.location.hash), "#" + frag);
  assert.deepEqual(errors, []);
  await page.close();
});

test("editing follows into the fragment without a reload", async () => {
  const { page } = await openPage();
  await page.evaluate(() => { window.notReloaded = true; });
  await page.evaluate(() => window.memsim.loadText(JSON.stringify({ model_type: "llama", hidden_size: 4096,
    num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8, intermediate_size: 14336, vocab_size: 128256 }), "config.json"));
  await page.waitForTimeout(100);
  const hash = await page.evaluate(() => window.location.hash);
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.hidden_size, 4096);
  // The shape is Llama 3 8B's, so the link names that catalogue model and what differs from it.
  assert.equal(hash, "#" + state.fragment);
  assert.ok(hash.startsWith("#memsim=3&model=llama-3-8b&"), hash.slice(0, 120));
  assert.equal(await page.evaluate(() => window.notReloaded), true);
  await page.close();  // keyboard.test.mjs changes inputs with the keyboard
});

test("the keyboard picks a model preset and the fragment follows", async () => {
  const { page, errors } = await openPage();
  await until(page, async () => {
    await page.keyboard.press("Escape");
    await page.mouse.click(130, 80);         // the preset combo, top of the model panel
    await page.waitForTimeout(500);          // the combo opens on the next frames
    await page.keyboard.type("mixtral 8x7", { delay: 30 });  // the search box has focus
    await page.waitForTimeout(300);
    await page.keyboard.press("Enter");      // Enter picks the first match
  }, () => window.memsim.state().config.model.num_experts === 8);
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.model.num_experts, 8);
  assert.equal(state.config.model.name, "Mixtral 8x7B v0.1");
  assert.ok((await page.evaluate(() => location.hash)).includes("&model=mixtral-8x7b&"), "a catalogue model is its id");
  await page.screenshot({ path: path.join(shots, "preset-mixtral.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("what helps lists changes that lower the peak, and Apply changes the setup", async () => {
  const { page, errors } = await openPage();
  await page.mouse.click(695, 74);           // the "What helps" tab of the results panel
  await page.waitForTimeout(400);
  await page.screenshot({ path: path.join(shots, "what-helps.png") });
  const before = await page.evaluate(() => window.memsim.state());
  await until(page, () => page.mouse.click(1228, 120),  // Apply on the first (largest) suggestion
              (frag) => window.memsim.state().fragment !== frag, before.fragment);
  const after = await page.evaluate(() => window.memsim.state());
  assert.notEqual(after.fragment, before.fragment);
  const [p0, p1] = await page.evaluate(([a, b]) => [a, b].map((s) => window.memsim.estimate(s.config).devices[0].peak.device_bytes), [before, after]);
  assert.ok(p1 < p0, `applied change lowers the peak: ${p0} -> ${p1}`);
  assert.deepEqual(errors, []);
  await page.close();
});

test("the fit explorer fills its heatmap and a click applies a cell", async () => {
  const { page, errors } = await openPage();
  await page.mouse.click(607, 74);           // the "Fit explorer" tab
  await page.waitForTimeout(3000);           // a few cells per frame
  await page.screenshot({ path: path.join(shots, "fit-explorer.png") });
  const img = decodePng(await page.screenshot());
  assert.ok(distinctColors(img, 550, 117, 700, 220) > 20, "heatmap drawn");
  assert.ok((await page.evaluate(() => window.memsim.state())).charts.heatmap_draws > 0, "by the WebGL2 renderer");
  const green = share(img, 552, 122, 100, 20, (r, g, b) => g > r + 80 && g > b + 80);
  assert.ok(green > 0.5, `micro-batch 1 x sequence 512 fits: its cell is ${(100 * green).toFixed(0)}% green`);
  await until(page, () => page.mouse.click(605, 132),  // micro-batch 1, sequence 512 (once computed)
              () => window.memsim.state().config.training.micro_batch_size === 1);
  const state = await page.evaluate(() => window.memsim.state());
  assert.equal(state.config.training.micro_batch_size, 1);
  assert.equal(state.config.training.sequence_length, 512);
  assert.deepEqual(errors, []);
  await page.close();
});

test("Save JSON downloads the setup, and DeepSpeed JSON its training part", async () => {
  const { page, errors } = await openPage();
  const { readFileSync } = await import("node:fs");
  const [download] = await Promise.all([page.waitForEvent("download"), page.mouse.click(483, 18)]);
  assert.equal(download.suggestedFilename(), "memsim-config.json");
  const saved = JSON.parse(readFileSync(await download.path(), "utf8"));
  const state = await page.evaluate(() => window.memsim.state());
  assert.deepEqual(saved, state.config);
  const [ds] = await Promise.all([page.waitForEvent("download"), page.mouse.click(587, 18)]);
  assert.equal(ds.suggestedFilename(), "ds_config.json");
  const dsConfig = JSON.parse(readFileSync(await ds.path(), "utf8"));
  assert.equal(dsConfig.zero_optimization.stage, 3);
  assert.equal(dsConfig.train_micro_batch_size_per_gpu, 4);
  assert.deepEqual(errors, []);
  await page.close();
});

test("hostile links keep the page alive with a message and the defaults", async () => {
  const bad = ["#schema=99&model.hidden_size=1", "#%%%", "#schema=1&model.hidden_size=<img src=x onerror=alert(1)>",
               "#" + "a".repeat(1 << 20), "#schema=1&training.precision=%3Cscript%3Ealert(1)%3C%2Fscript%3E"];
  for (const hash of bad) {
    const { page, errors } = await openPage(hash);
    const state = await page.evaluate(() => window.memsim.state());
    assert.equal(state.config.model.hidden_size, 5120, "falls back to the defaults for " + hash.slice(0, 30));
    assert.ok(state.messages.length > 0 && /could not be opened/.test(state.messages.at(-1)), JSON.stringify(state.messages));
    assert.equal(await page.evaluate(() => document.querySelectorAll("img, script:not([src])").length), 0);
    const img = decodePng(await page.screenshot());
    assert.ok(distinctColors(img, 0, 0, 1280, 720) > 50, "page still renders");
    assert.deepEqual(errors.filter((e) => !/Content Security Policy/.test(e)), []);
    await page.close();
  }
});

test("the page's numbers equal the CLI's for the same config", async () => {
  const { page } = await openPage();
  for (const args of [[], ["--hf-config", path.join(root, "tests/data/hf/gpt2.json"), "--set", "training.precision=fp32", "--set", "training.sequence_length=1024"],
                      ["--set", "parallel.zero_stage=0", "--set", "parallel.data_parallel_size=1", "--set", "hardware.gpu=h200"],
                      // a preference objective: the policy's and the reference's forwards, under the Trainer's ZeRO-3
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=dpo", "--set", "training.sequence_length=1024"],
                      // GRPO with a colocated vLLM engine asleep through training (generation, scoring, the empty_cache)
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=grpo", "--set", "training.sequence_length=1024",
                       "--set", "training.generation_engine=vllm_colocate", "--set", "training.vllm_sleep=true", "--set", "training.reference_model=copy"],
                      // KTO under TRL 0.16 (the KL batch's logits held), and GRPO generating inside optimizer steps
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=kto", "--set", "versions.trl=0.16", "--set", "training.sequence_length=1024"],
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=grpo", "--set", "training.sequence_length=1024",
                       "--set", "training.gradient_accumulation_steps=4", "--set", "training.steps_per_generation=3", "--set", "training.num_generations=4"],
                      // GRPO with a vLLM server on GPUs of its own: a second device, the weights split over two GPUs
                      // and a KV cache filling a 30% share
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=grpo", "--set", "training.sequence_length=1024",
                       "--set", "training.generation_engine=vllm_server", "--set", "training.vllm_server_tensor_parallel_size=2",
                       "--set", "training.vllm_server_gpu_memory_utilization=0.3"],
                      // PPO under LoRA: the value model's own builder writing into the policy's program, with the
                      // policy's adapters on it (ms-swift's preparation)
                      ["--set", "training.framework=hf_trainer", "--set", "training.objective=ppo", "--set", "training.sequence_length=1024",
                       "--set", "training.reward_model=same_as_policy", "--set", "peft.method=lora", "--set", "training.value_model=peft"]]) {
    const config = cliConfig(args);
    const fromCli = cliEstimate(config);
    const fromPage = await page.evaluate((c) => window.memsim.estimate(c), config);
    assert.deepEqual(fromPage.devices, fromCli.devices);
    assert.equal(fromPage.params_total, fromCli.params_total);
  }
  const bad = await page.evaluate(() => window.memsim.estimate("{\"training\":{\"micro_batch_size\":-1}}"));
  assert.equal(bad.ok, false);
  assert.equal(bad.errors[0].field, "training.micro_batch_size");
  await page.close();
});

test("the page's numbers equal the CLI's for every preset (wasm and native agree to the byte)", async () => {
  const { page } = await openPage();
  // Every hand-collected preset, and every 8th of those generated from litgpt and from config.json copies
  // (src/core/catalog/models/litgpt_*.json, hf_*.json,
  // the same block structures again): each CLI run costs a process start, and the whole catalogue would take minutes.
  const { readdirSync, readFileSync } = await import("node:fs");
  const modelsDir = path.join(root, "src/core/catalog/models");
  const generated = readdirSync(modelsDir).filter((f) => f.startsWith("litgpt_") || f.startsWith("hf_"))
    .flatMap((f) => JSON.parse(readFileSync(path.join(modelsDir, f), "utf8")).models.map((m) => m.id));
  const ids = execFileSync(cli, ["presets"]).toString().split("\n").filter((l) => l && !l.includes("not simulated"))
    .map((l) => l.split(/\s+/)[0]).filter((id) => !generated.includes(id) || generated.indexOf(id) % 8 === 0);
  assert.ok(ids.length >= 70);
  for (const id of ids) {
    // A vision-language model's sequence holds an image's tokens as well (576 for LLaVA-1.5, 1,176 for LLaVA-NeXT's
    // default 336 x 336 image): 512 is refused there.
    const length = (n) => cliConfig(["--preset", id, "--set", "training.sequence_length=" + n]);
    let config;
    // (A program that states its own tokens, Mamba-2's sequence_length argument, refuses training.sequence_length.)
    try { config = length(512); } catch { try { config = length(1024); } catch { try { config = length(2048); } catch { config = cliConfig(["--preset", id]); } } }
    const fromCli = cliEstimate(config);
    const fromPage = await page.evaluate((c) => window.memsim.estimate(c), config);
    assert.deepEqual(fromPage.devices, fromCli.devices, id);
    assert.equal(fromPage.params_total, fromCli.params_total, id);
  }
  await page.close();
});

test("at 800 pixels wide the interface still renders", async () => {
  const { page, errors } = await openPage("", { width: 800, height: 600 });
  const img = decodePng(await page.screenshot({ path: path.join(shots, "narrow-800x600.png") }));
  assert.ok(distinctColors(img, 0, 0, 800, 600) > 50);
  assert.deepEqual(errors, []);
  await page.close();
});

test("the shipped page has a strict CSP and no eval in its scripts", async () => {
  const { readFileSync } = await import("node:fs");
  const html = readFileSync(path.join(site, "index.html"), "utf8");
  const csp = /Content-Security-Policy" content="([^"]+)"/.exec(html);
  assert.ok(csp, "index.html carries a Content-Security-Policy");
  assert.ok(!/unsafe-inline|unsafe-eval'/.test(csp[1].replace("wasm-unsafe-eval", "")), csp[1]);
  assert.ok(!/<script>[^<]/.test(html), "no inline script");
  for (const js of ["memsim.js", "memsim-page.js"]) {
    const src = readFileSync(path.join(site, js), "utf8");
    assert.ok(!/\beval\(|new Function\(/.test(src), js + " has no eval (-sDYNAMIC_EXECUTION=0)");
    assert.ok(!/innerHTML|outerHTML|insertAdjacentHTML|document\.write/.test(src), js + " writes no HTML");
  }
});

test("the page requests nothing but its own files", async () => {
  assert.ok(requests.length > 0);
  const outside = requests.filter((u) => !u.startsWith(base) && !u.startsWith("data:"));
  assert.deepEqual(outside, []);
});

test("on a HiDPI screen (device pixel ratio 2) clicks land where they are drawn", async () => {
  const { page, errors } = await openPage("", { width: 1280, height: 720 }, { deviceScaleFactor: 2 });
  const before = await page.evaluate(() => window.memsim.state());
  await until(page, () => page.mouse.click(695, 74), () => true);  // the "What helps" tab, in CSS pixels
  await page.waitForTimeout(400);
  await until(page, () => page.mouse.click(1228, 120),  // Apply on the first suggestion
              (frag) => window.memsim.state().fragment !== frag, before.fragment);
  await page.screenshot({ path: path.join(shots, "hidpi-what-helps.png") });
  assert.deepEqual(errors, []);  // the fullscreen request that a HiDPI resize made (and its TypeError) is gone
  await page.close();
});

// Task (c) of issue #17: copy a link, open it in a fresh browser context (browser.newPage: no shared storage) and see
// the same result. The count is the user's clicks and keystrokes on the page; pasting into a new tab is the browser's.
test("task (c): Copy link copies a link that reopens exactly the setup and its result", async () => {
  const { page } = await openPage("#schema=1&training.micro_batch_size=2&parallel.zero_stage=2");
  const state = await page.evaluate(() => window.memsim.state());
  let clicks = 0;
  await until(page, () => { clicks++; return page.mouse.click(297, 18); },  // the "Copy link" button of the toolbar
              () => typeof window.memsimLastCopied === "string" && window.memsimLastCopied.includes("#"));
  const link = await page.evaluate(() => window.memsimLastCopied);
  assert.ok(link.startsWith(base), link);
  const peaks = (p, c) => p.evaluate((cfg) => window.memsim.estimate(cfg).devices.map((d) => [d.verdict, d.peak.device_bytes]), c);
  const shown = await peaks(page, state.config);
  await page.close();
  const { page: again } = await openPage(link.slice(base.length));
  const reopened = await again.evaluate(() => window.memsim.state());
  assert.deepEqual(reopened.config, state.config);
  assert.deepEqual(await peaks(again, reopened.config), shown, "the same verdict and peak");
  console.log(`task (c): ${clicks} click and 0 keystrokes; the link is ${link.length - base.length} characters after the address`);
  await again.close();
});

test("first meaningful frame: reported, not asserted (speed is a measurement, not a test)", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
  const wasmType = new Promise((resolve) => page.on("response", (r) => {
    if (r.url().endsWith("/memsim.wasm")) resolve(r.headers()["content-type"]);
  }));
  const t0 = Date.now();
  await page.goto(base);
  // The page's own clock (performance.now(), from navigation start): polling from here would only see the frame
  // once the browser runs a script between its long first frames.
  await page.waitForFunction(() => typeof window.memsimFirstFramePresented === "number", null, { timeout: patience, polling: 50 });
  const wall = Date.now() - t0;
  const m = await page.evaluate(() => {
    const res = (name) => performance.getEntriesByType("resource").find((r) => r.name.endsWith("/" + name));
    const wasm = res("memsim.wasm");
    return { ...window.memsim.state().timings, presented: window.memsimFirstFramePresented,
             html: performance.getEntriesByType("navigation")[0].responseEnd, js: res("memsim.js").responseEnd, wasm_fetched: wasm.responseEnd,
             runtime: window.memsimRuntimeInitialized, wasm_kb: Math.round(wasm.encodedBodySize / 1024) };
  });
  // The frame that counts shows a verdict, the breakdown and the timeline, and the wasm is served so that the browser
  // compiles it while it downloads: these are asserted.
  assert.equal(m.first_frame_result, true, JSON.stringify(m));
  assert.equal(await wasmType, "application/wasm");
  const ms = (x) => Math.round(x);
  console.log(`# first meaningful frame: on screen ${ms(m.presented)} ms after navigation (drawn at ${ms(m.first_frame_end)} ms; ` +
              `${wall} ms as seen by the test)`);
  console.log(`#   page ${ms(m.html)}, memsim.js ${ms(m.js)}, wasm (${m.wasm_kb} KB) ${ms(m.wasm_fetched)}, compiled and ` +
              `instantiated ${ms(m.runtime)}; main(): WebGL2 context ${ms(m.context - m.main)}, ImGui ${ms(m.imgui - m.context)}, ` +
              `first simulation ${ms(m.app - m.imgui)}; wait for the frame ${ms(m.first_frame_start - m.app)}; first frame: ` +
              `font atlas and backend ${ms(m.first_frame_device - m.first_frame_start)}, UI ${ms(m.first_frame_ui - m.first_frame_device)}, ` +
              `GL ${ms(m.first_frame_end - m.first_frame_ui)}; composited ${ms(m.presented - m.first_frame_end)} later`);
  await page.close();
});
