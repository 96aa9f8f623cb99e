// What helps, as a user does the task (a) with the mouse: Llama-3.1-8B full fine-tuning on one RTX 4090 does
// not fit; What helps makes it fit while it stays full fine-tuning of the same model with the same global batch.
//   node --test tests/e2e/advice.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { decodePng } from "./png.mjs";
import { cli, openPage, shots, until, useBrowser } from "./harness.mjs";

useBrowser();

const verdicts = (page, config) => page.evaluate((c) => window.memsim.estimate(c).devices.map((d) => d.verdict), config);
const globalBatch = (c) => c.training.micro_batch_size * c.training.gradient_accumulation_steps * c.parallel.data_parallel_size;

// The first row of What helps whose "peak after" reads green ("fits"): the y of its first line, or -1.
function firstFittingRow(png, x0, x1, y0, y1) {
  const img = decodePng(png);
  for (let y = y0; y < y1; y++) {
    let green = 0;
    for (let x = x0; x < x1; x++) {
      const i = (y * img.width + x) * img.bpp;
      const [r, g, b] = [img.pixels[i], img.pixels[i + 1], img.pixels[i + 2]];
      if (g > 150 && g > r + 80 && g > b + 60) green++;
    }
    if (green >= 3) return y + 5;  // a few pixels into the text line
  }
  return -1;
}

test("task (a): the 8B full fine-tuning on one RTX 4090 fits through What helps and stays full fine-tuning", async () => {
  const fragment = execFileSync(cli, ["config", "--preset", "llama-3.1-8b", "--set", "hardware.gpu=rtx-4090",
                                      "--set", "parallel.data_parallel_size=1", "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + fragment, { width: 1280, height: 800 });
  let clicks = 0;
  const keystrokes = 0;
  const click = async (x, y) => { clicks++; await page.mouse.click(x, y); };
  const before = await page.evaluate(() => window.memsim.state());
  assert.equal(before.config.hardware.gpu, "rtx-4090");
  assert.equal(before.config.peft.method, "none");
  assert.ok((await verdicts(page, before.config)).some((v) => v !== "fits"), "the setup does not fit as given");

  await click(690, 74);  // the "What helps" tab of the results panel, under the pinned verdict line
  // The list fills in over frames (some 40 simulations of an 8B model); the pairs come after the single changes,
  // below the fold: wait for a row that fits, scrolling the list down with the wheel.
  await page.waitForTimeout(3000);
  let y = -1;
  for (let i = 0; i < 60 && y < 0; i++) {
    y = firstFittingRow(await page.screenshot(), 1020, 1180, 90, 465);
    if (y > 0) break;
    await page.mouse.move(860, 300);
    await page.mouse.wheel(0, 120);
    await page.waitForTimeout(400);
  }
  await page.screenshot({ path: path.join(shots, "advice-8b-4090-1280x800.png") });
  assert.ok(y > 0, "a row of What helps fits");
  await until(page, () => click(1228, y),  // its Apply
              (frag) => window.memsim.state().fragment !== frag, before.fragment);
  const after = await page.evaluate(() => window.memsim.state());
  assert.deepEqual(await verdicts(page, after.config), ["fits"]);
  assert.equal(after.config.peft.method, "none", "still full fine-tuning");
  assert.deepEqual(after.config.model, before.config.model);
  assert.equal(globalBatch(after.config), globalBatch(before.config));
  assert.equal(after.config.training.sequence_length, before.config.training.sequence_length);
  assert.equal(after.config.parallel.offload_params, "cpu", "the row that fits first offloads to the CPU");
  await page.screenshot({ path: path.join(shots, "advice-applied-1280x800.png") });
  console.log(`task (a): ${clicks} clicks and ${keystrokes} keystrokes (the setup opened from a link; the wheel scrolls to the pairs)`);
  assert.deepEqual(errors, []);
  await page.close();
});
