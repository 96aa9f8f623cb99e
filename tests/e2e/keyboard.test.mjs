// The page with the keyboard alone: every action below is a key press (page.keyboard); the page's state
// (window.memsim.state(), the URL, the clipboard text, screenshots) only observes. state().focus is what the page's
// live region reads out for the focused control (src/ui/keyboard.h).
//   node --test tests/e2e/keyboard.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { decodePng, share } from "./png.mjs";
import { openPage, press, shots, state, tabOnceTo, tabTo, useBrowser, patience } from "./harness.mjs";

useBrowser();

async function typeText(page, text) {
  for (const ch of text) await press(page, ch);
}

test("keyboard: Tab reaches Copy link and Enter copies the link; Space on Copy summary copies the summary", async () => {
  const { page, errors } = await openPage("#schema=1&training.micro_batch_size=2");
  assert.equal((await state(page)).focus, "", "nothing is focused before a key is pressed");
  await tabTo(page, "Copy link");
  await press(page, "Enter");
  const link = await page.evaluate(() => window.memsimLastCopied);
  assert.ok(typeof link === "string" && link.includes("#memsim=3&") && link.includes("&micro_batch_size=2&"), String(link));
  await tabTo(page, "Copy summary");
  await press(page, " ");
  assert.match(await page.evaluate(() => window.memsimLastCopied), /\| device \| peak/);
  assert.deepEqual(errors.filter((e) => !/Permissions check failed/.test(e)), []);
  await page.close();
});

test("keyboard: micro-batch typed into its field, and the URL fragment follows", async () => {
  const { page, errors } = await openPage();
  await tabTo(page, "micro_batch_size: 4");  // Tab lands in the field with its text selected
  await typeText(page, "2");
  await press(page, "Enter");
  await page.waitForFunction(() => location.hash.includes("&micro_batch_size=2&"), null, { timeout: patience });
  assert.equal((await state(page)).config.training.micro_batch_size, 2);
  // Tab on to the field's + button and step it with Space.
  await tabOnceTo(page, "decrease micro_batch_size, button: 2");
  await tabOnceTo(page, "increase micro_batch_size, button: 2");
  await press(page, " ");
  await page.waitForFunction(() => location.hash.includes("&micro_batch_size=3&"), null, { timeout: patience });
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: the model group: a number typed in, and the fragment follows", async () => {
  const { page, errors } = await openPage();
  await tabTo(page, "hidden_size: 5120");
  await typeText(page, "4096");
  await press(page, "Enter");
  await page.waitForFunction(() => location.hash.includes("&hidden_size=4096&"), null, { timeout: patience });
  assert.equal((await state(page)).config.model.hidden_size, 4096);
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: a GPTQ base's group size typed in; the link keeps it", async () => {
  // LoRA on a GPTQ base (memsim-cli config --format fragment); its group size shows under the base storage list.
  const hash = "#memsim=2&model=llama-2-7b&micro_batch_size=2&sequence_length=1024&framework=hf_trainer&precision=" +
               "fp16_mixed&activation_checkpointing=none&method=lora&base_quantization=gptq&data_parallel_size=1&" +
               "zero_stage=0&c=m96kps";
  const { page, errors } = await openPage(hash);
  assert.equal((await state(page)).config.peft.base_quantization, "gptq");
  await tabTo(page, "quantization group size: 128", { back: true });
  await typeText(page, "64");
  await press(page, "Enter");
  await page.waitForFunction(() => location.hash.includes("&quant_group_size=64&"), null, { timeout: patience });
  const s = await state(page);
  assert.equal(s.config.peft.quant_group_size, 64);
  // Smaller groups store more scales and zeros: the estimate's weights grow.
  const weights = async (config) =>
    (await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(config))).devices[0].breakdown.weights;
  assert.ok(await weights(s.config) > await weights({ ...s.config, peft: { ...s.config.peft, quant_group_size: 128 } }));
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: the hardware and parallelism groups: lists open, the arrows move, Enter picks", async () => {
  const { page, errors } = await openPage();
  // The question's GPU list, 21 presses from the start. No lower limit: once under CI's load (session 33) the walk
  // passed it without reading it out, and a second round of the Tab order finds it instead of failing.
  await tabTo(page, "GPU: ");
  const gpu = (await state(page)).config.hardware.gpu;
  await press(page, " ");
  assert.match((await state(page)).focus, /, chosen$/, "the open list starts on the current GPU");
  await press(page, "ArrowDown");
  await press(page, "Enter");
  const after = await state(page);
  assert.notEqual(after.config.hardware.gpu, gpu);
  assert.ok((await page.evaluate(() => location.hash)).includes("&gpu=" + after.config.hardware.gpu + "&"));
  // Down to the parallelism group, closing the sections on the way as a keyboard user would (Enter on a heading):
  // about 20 presses instead of 60.
  // Under CI's load (session 35) one walk went past the Training heading, the section's first fields already
  // focused: a walk that overshoots goes back with Shift+Tab, as a keyboard user would.
  for (const section of ["Model", "Training", "Data", "Library versions"]) {
    try {
      await tabTo(page, section + " section, open", { limit: 20 });
    } catch {
      await tabTo(page, section + " section, open", { back: true, limit: 40 });
    }
    await press(page, "Enter");
  }
  await tabTo(page, "sharding stage: 3", { limit: 20 });
  await press(page, "Enter");
  assert.match((await state(page)).focus, /^3 .*, chosen$/);
  await press(page, "ArrowUp");
  await press(page, "Enter");
  await page.waitForFunction(() => location.hash.includes("&zero_stage=2&"), null, { timeout: patience });
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: What helps opens with Enter and Enter on Apply applies its first change", async () => {
  const { page, errors } = await openPage();
  const before = await state(page);
  await tabTo(page, "What helps, tab", { back: true });
  await press(page, "Enter");
  assert.equal((await state(page)).focus, "What helps, tab, shown");
  const apply = await tabTo(page, "Apply, button: ");
  await page.screenshot({ path: path.join(shots, "keyboard-what-helps.png") });
  await press(page, "Enter");
  const after = await state(page);
  assert.notEqual(after.fragment, before.fragment, apply);
  const [p0, p1] = await page.evaluate(([a, b]) => [a, b].map((s) => window.memsim.estimate(s.config).devices[0].peak.device_bytes), [before, after]);
  assert.ok(p1 < p0, `the applied change lowers the peak: ${p0} -> ${p1}`);
  assert.ok((await page.evaluate(() => location.hash)) === "#" + after.fragment);
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: a Fit explorer cell is reached with Tab and the arrows and applied with Space", async () => {
  const { page, errors } = await openPage();
  await tabTo(page, "Fit explorer, tab", { back: true });
  await press(page, " ");
  await page.waitForTimeout(3000);  // the sweep fills a few cells a frame
  await tabTo(page, "micro-batch 1, sequence 512: ");
  await press(page, "ArrowRight");
  await press(page, "ArrowDown");
  const focus = (await state(page)).focus;
  assert.ok(focus.startsWith("micro-batch 2, sequence 1024: ") && focus.includes("fits"), focus);
  // The focused cell is outlined in the navigation colour (ImGuiCol_NavHighlight, 66,150,250).
  const img = decodePng(await page.screenshot({ path: path.join(shots, "keyboard-fit-explorer.png") }));
  const outline = share(img, 660, 125, 130, 40, (r, g, b) => Math.abs(r - 66) < 20 && Math.abs(g - 150) < 20 && Math.abs(b - 250) < 20);
  assert.ok(outline > 0.02, `the focused cell's outline covers ${(100 * outline).toFixed(1)}% of its surroundings`);
  await press(page, " ");
  const s = await state(page);
  assert.equal(s.config.training.micro_batch_size, 2);
  assert.equal(s.config.training.sequence_length, 1024);
  assert.deepEqual(errors, []);
  await page.close();
});

test("keyboard: the focus is outlined, and read out by the page's live region", async () => {
  const { page } = await openPage();
  const nav = (r, g, b) => Math.abs(r - 66) < 20 && Math.abs(g - 150) < 20 && Math.abs(b - 250) < 20;
  const region = [245, 2, 90, 32];  // around Copy link
  const before = share(decodePng(await page.screenshot()), ...region, nav);
  await tabTo(page, "Copy link");
  const focused = share(decodePng(await page.screenshot({ path: path.join(shots, "keyboard-focus.png") })), ...region, nav);
  assert.ok(before < 0.01 && focused > 0.05, `outline pixels around Copy link: ${before} before, ${focused} focused`);
  const live = await page.evaluate(() => ({ text: document.getElementById("focus").textContent,
                                             polite: document.getElementById("focus").getAttribute("aria-live") }));
  assert.equal(live.polite, "polite");
  assert.equal(live.text, (await state(page)).focus);
  await page.close();
});

test("keyboard: quick presses are not lost (one key event per frame)", async () => {
  const { page } = await openPage();
  await tabTo(page, "Copy link");
  const stops = [];
  for (let i = 0; i < 6; i++) { await press(page, "Tab"); stops.push((await state(page)).focus); }
  assert.equal(new Set(stops).size, 6, JSON.stringify(stops));
  await tabTo(page, "Copy link", { back: true });
  // Every focus the page announces from now on, in order (each animation frame looks; the app moves the focus at most
  // once in two frames, the press and the release of a key).
  await page.evaluate(() => {
    window.focusTrail = [];
    const look = () => {
      const focus = window.memsim.state().focus;
      if (focus !== window.focusTrail.at(-1)) window.focusTrail.push(focus);
      requestAnimationFrame(look);
    };
    look();
  });
  for (let i = 0; i < 6; i++) await page.keyboard.press("Tab");  // back to back, faster than frames
  await page.waitForFunction(() => window.memsim.state().frames.idle, null, { timeout: patience });
  const trail = await page.evaluate(() => window.focusTrail);
  // Not one press lost: the focus went through the six stops in order, and no further (a press taken twice).
  const at = trail.indexOf(stops[5]);
  assert.ok(at >= 0, `the sixth stop was never focused: ${JSON.stringify(trail)}`);
  assert.deepEqual(trail.slice(at - 5, at + 1), stops, JSON.stringify(trail));
  assert.equal(at, trail.length - 1, `the focus went on past the sixth stop: ${JSON.stringify(trail.slice(at))}`);
  await page.close();
});
