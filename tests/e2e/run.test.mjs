// A run of varying shapes in the page: a link that replays a run of sample lengths fills it in over frames, the Run
// view draws it, and a link with a mistake in its data section opens with the mistake shown.
//   node --test tests/e2e/run.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { decodePng, distinctColors, share } from "./png.mjs";
import { cli, openPage, shots, until, useBrowser } from "./harness.mjs";

useBrowser();

const state = (page) => page.evaluate(() => window.memsim.state());
// The README's run: Llama-2-7B with LoRA on one GPU, sample lengths as percentiles, a thousand steps replayed.
const runArgs = ["--preset", "llama-2-7b", "--set", "training.framework=hf_trainer", "--set", "peft.method=lora",
                 "--set", "parallel.data_parallel_size=1", "--set", "parallel.zero_stage=0",
                 "--set", "training.sequence_length=2048", "--set", "training.activation_checkpointing=none",
                 "--set", "data.lengths=samples", "--set", "data.sample_lengths=p0=20,p50=150,p90=350,p99=600,p100=1100",
                 "--set", "data.steps=1000"];
const fragment = (args) => execFileSync(cli, ["config", ...args, "--format", "fragment"]).toString().trim();

// Waits until the page has simulated its setup; returns where the replay was each time it was seen still simulating:
// the order of the data (a run of drawn samples is replayed in three) and the step within it, as one number.
async function simulated(page) {
  const seen = [];
  for (let i = 0; i < 600; i++) {
    const s = (await state(page)).simulation;
    if (!s.running) return seen;
    seen.push(s.order * 1e6 + s.step);
    await page.waitForTimeout(50);
  }
  throw new Error("the run was still being simulated after 30 s");
}

// Clicks a point of the canvas until the page's state shows its effect; the Step | Run switch is at the top left
// of the timeline.
const runButton = { 1280: [537, 479], 390: [76, 367] };  // above the status line (ui/status_line.cpp)

for (const [width, height] of [[1280, 800], [390, 844]]) {
  test(`a link to a run of sample lengths fills in over frames and the Run view draws it (${width}x${height})`, async () => {
    const frag = fragment(runArgs);
    const { page, errors } = await openPage("#" + frag, { width, height });
    const progress = await simulated(page);
    const s = await state(page);
    // A thousand steps in three orders take more than a frame's share: the page drew frames meanwhile (counted by the
    // page: the test may first look when the run is done), and the progress it showed grew.
    assert.ok(s.simulation.frames > 1, `the run was simulated over ${s.simulation.frames} frames`);
    assert.ok(progress.every((step, i) => i === 0 || step >= progress[i - 1]), JSON.stringify(progress));
    assert.equal(s.result.ok, true);
    assert.equal(s.result.run_steps, 1000);
    assert.equal(s.result.view, "step");
    assert.equal(s.fragment, frag, "the link is kept once the run is simulated");
    const verdict = (await page.evaluate((f) => window.memsim.estimate(JSON.stringify(f)), s.config)).devices[0];
    assert.equal(verdict.run.allocated_peak_step, s.result.allocated_peak_step, "the page's numbers are the estimate's");
    await page.screenshot({ path: path.join(shots, `run-step-${width}x${height}.png`) });
    await until(page, () => page.mouse.click(...runButton[width]), () => window.memsim.state().result.view === "run");
    await page.waitForTimeout(300);
    const png = await page.screenshot({ path: path.join(shots, `run-view-${width}x${height}.png`) });
    const img = decodePng(png);
    assert.ok(distinctColors(img, 0, 0, width, height) > 50, "the page is drawn");
    if (width === 1280) {
      // The steps' allocated peaks (blue) fill the bottom of the memory chart, their tokens (orange) the one below.
      const blue = share(img, 520, 620, 700, 20, (r, g, b) => b > r + 80 && b > 150);
      assert.ok(blue > 0.5, `the allocated peaks' blue covers ${(100 * blue).toFixed(0)}% of the chart's bottom`);
      const orange = share(img, 520, 719, 700, 10, (r, g, b) => r > 180 && g > 100 && b < 110);
      assert.ok(orange > 0.3, `the tokens' orange covers ${(100 * orange).toFixed(0)}% of the lower chart's bottom`);
    }
    // Hovering a step shows it.
    await page.mouse.move(width === 1280 ? 800 : 200, width === 1280 ? 600 : 450);
    await page.waitForTimeout(300);
    await page.screenshot({ path: path.join(shots, `run-view-hover-${width}x${height}.png`) });
    // Another seed is another run: it fills in again, the previous result greyed under the progress meanwhile.
    await page.evaluate((f) => window.memsim.openFragment(f), fragment([...runArgs, "--set", "data.seed=2"]));
    await page.waitForTimeout(150);
    await page.screenshot({ path: path.join(shots, `run-simulating-${width}x${height}.png`) });
    await simulated(page);
    const again = await state(page);
    assert.equal(again.config.data.seed, 2);
    assert.equal(again.result.ok, true);
    assert.equal(again.result.view, "run", "the Run view stays chosen");
    assert.deepEqual(errors, []);
    await page.close();
  });
}

test("a link with a bad data.sample_lengths opens its other settings and shows the field's error", async () => {
  // Edited by hand, so written as a link without a checksum (schema=3 for memsim=3, no c=): a short link's checksum
  // would refuse the whole edited link.
  const frag = fragment([...runArgs, "--set", "training.micro_batch_size=2"]).replace(/^memsim=3&/, "schema=3&")
    .replace(/&c=[0-9a-z]+$/, "").replace(/sample_lengths=[^&]*/, "sample_lengths=p50%3D300%2Cp90%3Dlots");
  const { page, errors } = await openPage("#" + frag, { width: 1280, height: 800 });
  await simulated(page);
  const s = await state(page);
  assert.equal(s.config.training.micro_batch_size, 2, "the link's other settings are open");
  assert.equal(s.config.model.hidden_size, 4096);
  assert.equal(s.config.data.sample_lengths, "p50=300,p90=lots", "the user's text is kept, to be fixed");
  assert.equal(s.result.ok, false);
  assert.equal(s.result.error_field, "data.sample_lengths");
  assert.match(s.messages.at(-1), /data section has a problem.*data\.sample_lengths/);
  // The Data section is scrolled into view with the error under its field.
  const img = decodePng(await page.screenshot({ path: path.join(shots, "run-bad-sample-lengths.png") }));
  const red = share(img, 20, 60, 440, 720, (r, g, b) => r > 200 && g < 140 && b < 140);
  assert.ok(red > 0.002, `the field's error is drawn in the inputs (${(100 * red).toFixed(2)}% red)`);
  // Fixing the text simulates the run, and the link follows.
  await page.evaluate(() => window.memsim.loadText("20\n150\n350\n600\n1100\n150\n", "lengths.txt"));
  await simulated(page);
  const fixed = await state(page);
  assert.equal(fixed.result.ok, true);
  assert.equal(fixed.config.training.micro_batch_size, 2);
  assert.equal(fixed.config.data.dataset_samples, 6);
  assert.ok((await page.evaluate(() => location.hash)).includes("&dataset_samples=6&"));
  assert.deepEqual(errors, []);
  await page.close();
});
