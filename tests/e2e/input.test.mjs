// The wheel, touch and a phone's page, and idle CPU, in headless Chromium: real wheel events (page.mouse.wheel), real
// touch events (CDP Input.dispatchTouchEvent, page.touchscreen.tap); the page's state (window.memsim.state(): the
// config, the inputs panel's scroll, the frames drawn) only observes.
//   node --test tests/e2e/input.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { decodePng, distinctColors } from "./png.mjs";
import { base, browser, openPage, shots, useBrowser, patience } from "./harness.mjs";

useBrowser();

const state = (page) => page.evaluate(() => window.memsim.state());
const phone = { width: 390, height: 844 };
// A phone as Playwright describes one: three device pixels to a CSS pixel, touch, a mobile viewport.
const phoneOptions = { deviceScaleFactor: 3, isMobile: true, hasTouch: true };

// Waits until the inputs panel's scroll has settled (the same over a few frames) and returns it.
async function settledScroll(page) {
  let last = null;
  for (let i = 0; i < 40; i++) {
    const s = (await state(page)).scroll;
    if (last && s.inputs === last.inputs) return s;
    last = s;
    await page.waitForTimeout(150);
  }
  return last;
}

// A finger on the canvas, through the DevTools protocol (as a touch screen sends them): down at `from`, moved by
// (dx, dy) in `moves` steps, then lifted.
async function swipe(page, from, dx, dy, moves = 10) {
  const cdp = await page.context().newCDPSession(page);
  const at = (i) => [{ x: from[0] + (dx * i) / moves, y: from[1] + (dy * i) / moves }];
  await cdp.send("Input.dispatchTouchEvent", { type: "touchStart", touchPoints: at(0) });
  for (let i = 1; i <= moves; i++) {
    await cdp.send("Input.dispatchTouchEvent", { type: "touchMove", touchPoints: at(i) });
    await page.waitForTimeout(20);
  }
  await cdp.send("Input.dispatchTouchEvent", { type: "touchEnd", touchPoints: [] });
  await cdp.detach();
}

test("the phone's page (390x844, touch, 3x) requests no fullscreen and logs no error on load", async () => {
  const page = await browser.newPage({ viewport: phone, ...phoneOptions });
  await page.addInitScript(() => {  // counts requests for fullscreen, which need a user gesture and were refused
    window.fullscreenRequests = 0;
    const original = Element.prototype.requestFullscreen;
    Element.prototype.requestFullscreen = function () { window.fullscreenRequests++; return original.apply(this, arguments); };
  });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error" || /fullscreen/i.test(m.text())) errors.push(m.text()); });
  await page.goto(base);
  await page.waitForFunction(() => window.memsim && window.Module && window.Module.calledRun, null, { timeout: patience });
  await page.waitForTimeout(1500);
  assert.equal(await page.evaluate(() => window.fullscreenRequests), 0);
  assert.equal(await page.evaluate(() => document.fullscreenElement), null);
  const img = decodePng(await page.screenshot({ path: path.join(shots, "phone-390x844-3x.png") }));
  assert.ok(distinctColors(img, 0, 0, img.width, img.height) > 50, "the page is drawn");
  assert.deepEqual(errors, []);
  await page.close();
});

for (const [width, height, over] of [[1280, 800, [200, 400]], [390, 844, [120, 720]]]) {
  test(`the wheel: a notch scrolls the inputs panel about three rows, in its direction (${width}x${height})`, async () => {
    const { page, errors } = await openPage("", { width, height });
    await page.mouse.move(...over);  // over the inputs panel
    const start = await settledScroll(page);
    assert.equal(start.inputs, 0);
    assert.ok(start.inputs_max > 10 * start.row, JSON.stringify(start));
    await page.mouse.wheel(0, 100);  // one notch down, as Chromium reports it
    const down = await settledScroll(page);
    const rows = down.inputs / down.row;
    console.log(`# ${width}x${height}: one notch down scrolled the inputs ${down.inputs} px, ${rows.toFixed(1)} rows of ` +
                `${down.row} px (of ${down.inputs_max} px)`);
    assert.ok(rows >= 2 && rows <= 4, `one notch scrolls about three rows, not ${rows.toFixed(1)}`);
    await page.mouse.wheel(0, 100);
    const twice = await settledScroll(page);
    assert.ok(Math.abs(twice.inputs - 2 * down.inputs) <= 1, JSON.stringify([down, twice]));
    await page.mouse.wheel(0, -100);  // one notch up comes back one notch
    assert.ok(Math.abs((await settledScroll(page)).inputs - down.inputs) <= 1);
    // A trackpad's small deltas scroll in proportion.
    await page.mouse.wheel(0, 12);
    const small = (await settledScroll(page)).inputs - down.inputs;
    assert.ok(small > 0 && small < down.inputs / 4, `12 px of trackpad scrolled ${small} px`);
    assert.deepEqual(errors, []);
    await page.close();
  });
}

test("touch on a phone: a swipe over a number scrolls and changes nothing; a tap presses a + button", async () => {
  const { page, errors } = await openPage("", phone, phoneOptions);
  const before = await state(page);
  assert.equal(before.config.model.hidden_size, 5120);
  assert.equal(before.scroll.inputs, 0);
  // The inputs are the third panel on a phone (the verdict first), opening on the question: the GPUs field at y 663
  // (its + button at x 193), nodes at 715, micro_batch_size at 759; rows of about 25 px.
  await swipe(page, [85, 663], 0, -120);  // up, from the GPUs field
  const swiped = await settledScroll(page);
  console.log(`# a 120 px swipe up scrolled the inputs ${swiped.inputs} px`);
  assert.ok(Math.abs(swiped.inputs - 120) <= 3, `the panel follows the finger: ${swiped.inputs} px`);
  await swipe(page, [193, 715], 0, 60);  // down, starting on nodes' + button
  const back = await settledScroll(page);
  assert.ok(Math.abs(back.inputs - 60) <= 3, `and back: ${back.inputs} px`);
  await swipe(page, [85, 759], 90, 0);  // sideways over a number field: nothing scrolls sideways, nothing changes
  await page.waitForTimeout(300);
  let s = await state(page);
  assert.deepEqual(s.config, before.config, "no number changed");
  assert.equal(s.fragment, before.fragment);
  // A tap on micro_batch_size's + button (scrolled up by the panel's offset), then on the GPUs' + button.
  const y = (row0) => row0 - s.scroll.inputs;
  await page.touchscreen.tap(193, y(759));
  await page.waitForFunction(() => window.memsim.state().config.training.micro_batch_size === 5, null, { timeout: patience });
  await page.touchscreen.tap(193, y(663));
  await page.waitForFunction(() => window.memsim.state().config.parallel.data_parallel_size === 9, null, { timeout: patience });
  s = await state(page);
  assert.equal(s.config.model.hidden_size, 5120);
  assert.equal(s.config.training.micro_batch_size, 5);
  await page.screenshot({ path: path.join(shots, "phone-touch.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("a model program's inputs: the wheel scrolls over them and edits nothing; + sets one argument", async () => {
  // ResNet-50's preset link (the resnet program: one input per hyperparameter, under Details > Model).
  const hash = "#memsim=2&name=ResNet-50+%28ImageNet-1k+classifier%29&architecture=resnet&micro_batch_size=128&" +
               "precision=amp_bf16&data_parallel_size=1&zero_stage=0&c=7vjwa9";
  const { page, errors } = await openPage(hash, { width: 1280, height: 800 });
  const before = await state(page);
  assert.equal(before.config.model.architecture, "resnet");
  assert.equal(before.config.model.architecture_args, "");
  await page.mouse.move(120, 417);  // over layers3's number
  await page.mouse.wheel(0, 100);
  const scrolled = await settledScroll(page);
  assert.ok(scrolled.inputs > 0, "the wheel scrolls the panel");
  let s = await state(page);
  assert.equal(s.config.model.architecture_args, "", "the wheel edits no number");
  // layers3's + button, where the scroll has moved it.
  await page.mouse.click(242, 417 - scrolled.inputs);
  await page.waitForFunction(() => window.memsim.state().config.model.architecture_args === "layers3=7", null, { timeout: patience });
  s = await state(page);
  assert.ok(s.fragment.includes("architecture_args=layers3%3D7") || s.fragment.includes("layers3"), s.fragment);
  const r = await page.evaluate((c) => window.memsim.estimate(c), JSON.stringify(s.config));
  assert.equal(r.params_total, 25557032 + 1117184);  // one more bottleneck of layer3 (1024 -> 256 -> 1024, three batch norms)
  await page.screenshot({ path: path.join(shots, "program-inputs.png") });
  assert.deepEqual(errors, []);
  await page.close();
});

test("idle means idle: a static page draws no frames (idle CPU printed, not asserted)", async () => {
  for (const [width, height] of [[1280, 800], [390, 844]]) {
    const { page, errors } = await openPage("", { width, height });
    await page.waitForFunction(() => window.memsim.state().frames.idle, null, { timeout: patience });
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Performance.enable");
    const bcdp = await browser.newBrowserCDPSession();
    // CPU seconds of the page's main thread (its tasks), and of the renderer and GPU processes (compositing, SwiftShader).
    const taskSeconds = async () => (await cdp.send("Performance.getMetrics")).metrics.find((m) => m.name === "TaskDuration").value;
    const processSeconds = async () => (await bcdp.send("SystemInfo.getProcessInfo")).processInfo
      .filter((p) => p.type === "renderer" || p.type === "GPU").reduce((a, p) => a + p.cpuTime, 0);
    const f0 = (await state(page)).frames.drawn, t0 = await taskSeconds(), p0 = await processSeconds(), w0 = Date.now();
    await page.waitForTimeout(3000);
    const f1 = (await state(page)).frames.drawn, t1 = await taskSeconds(), p1 = await processSeconds();
    const wall = (Date.now() - w0) / 1000;
    console.log(`# idle ${width}x${height} over ${wall.toFixed(1)} s: ${f1 - f0} frames drawn; page main thread ` +
                `${((100 * (t1 - t0)) / wall).toFixed(1)}% of a core, renderer and GPU processes ${((100 * (p1 - p0)) / wall).toFixed(1)}%`);
    assert.equal(f1 - f0, 0, "no frame is drawn while nothing happens");
    // Input wakes it: a move of the mouse draws frames, and then it sleeps again.
    await page.mouse.move(width / 2, height / 2);
    await page.waitForFunction((n) => window.memsim.state().frames.drawn > n, f1, { timeout: patience });
    await page.waitForFunction(() => window.memsim.state().frames.idle, null, { timeout: patience });
    const woken = (await state(page)).frames.drawn - f1;
    assert.ok(woken >= 1 && woken <= 10, `a mouse move drew ${woken} frames`);
    assert.deepEqual(errors, []);
    await bcdp.detach();
    await page.close();
  }
});
