// The question first (issue 17, point 3): from the default page, QLoRA of Llama-3.1-70B on one A100 80GB by mouse and
// keyboard alone, the verdict read back through the page's estimate (window.memsim.estimate), the clicks and
// keystrokes counted and printed; then the question section on a phone-sized page.
//   node --test tests/e2e/question.test.mjs   (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { openPage, shots, until, useBrowser, patience } from "./harness.mjs";

useBrowser();

const state = (page) => page.evaluate(() => window.memsim.state());

// Where the question's controls are on a 1280 x 800 page (CSS pixels): the first rows of the inputs panel.
const at = {
  model: [130, 80],   // the model picker
  qlora: [152, 105],  // the method's QLoRA button
  gpus: [100, 130],   // the GPUs field
};

// The verdict of every GPU of the page's setup, as the CLI's JSON says it.
async function verdicts(page) {
  return page.evaluate(() => {
    const out = window.memsim.estimate(JSON.stringify(window.memsim.state().config));
    const r = typeof out === "string" ? JSON.parse(out) : out;
    return r.devices.map((d) => d.verdict);
  });
}

test("question: QLoRA of Llama-3.1-70B on one A100 80GB from the default page, in at most 10 clicks and keys", async () => {
  const { page, errors } = await openPage("", { width: 1280, height: 800 });
  let clicks = 0, keys = 0;
  // Each step counts what a user does once. A loaded machine's frame can miss an event: then the step is done again
  // from a clean start (Escape closes a list left open, and Ctrl+A selects a search typed before), uncounted.
  const step = async (actions, predicate, arg) => {
    let c = 0, k = 0, attempt = 0;
    await until(page, async () => {
      c = 0, k = 0;
      if (attempt++ > 0) { await page.keyboard.press("Escape"); await page.waitForTimeout(300); }
      for (const a of actions) {
        if (a.click) {
          c++;
          await page.mouse.click(...a.click);
          await page.waitForTimeout(700);  // a list opens, or a field starts editing, on the next frames
          if (attempt > 1) { await page.keyboard.press("Control+A"); await page.waitForTimeout(200); }
        } else {
          for (const key of a.keys) {
            k++;
            if (key === "Enter") await page.waitForTimeout(400);  // the list filtered by what was typed
            await page.keyboard.press(key);
            await page.waitForTimeout(120);
          }
        }
      }
    }, predicate, arg);
    clicks += c, keys += k;
  };
  const before = await state(page);
  assert.equal(before.config.hardware.gpu, "a100-80gb", "the default card is the A100 80GB");
  assert.equal(before.config.parallel.data_parallel_size, 8);
  // 1. The model: open the picker, search, Enter picks the first match.
  await step([{ click: at.model }, { keys: ["1", "-", "7", "0", "Enter"] }],
             () => window.memsim.state().config.model.name === "Llama 3.1 70B");
  // 2. The method: QLoRA is one click (LoRA, an NF4 base, double quantization, every linear).
  await step([{ click: at.qlora }], () => window.memsim.state().config.peft.base_quantization === "nf4");
  let s = await state(page);
  assert.equal(s.config.peft.method, "lora");
  assert.equal(s.config.peft.double_quantization, true);
  assert.equal(s.config.peft.target_modules, "all-linear");
  // 3. One GPU: click the GPUs field (its text is selected) and type 1.
  await step([{ click: at.gpus }, { keys: ["1"] }],
             () => window.memsim.state().config.parallel.data_parallel_size === 1);
  await page.waitForFunction(() => !window.memsim.state().simulation.running && window.memsim.state().result.ok, null,
                             { timeout: patience });
  s = await state(page);
  const v = await verdicts(page);
  console.log(`task (b), QLoRA of Llama-3.1-70B on one A100 80GB: ${clicks} clicks and ${keys} keystrokes ` +
              `(${clicks + keys} in all); micro-batch ${s.config.training.micro_batch_size} x sequence ` +
              `${s.config.training.sequence_length}; verdict ${v.join(", ")}`);
  assert.deepEqual(v, ["fits"], "the setup fits");
  assert.equal(s.config.hardware.gpu, "a100-80gb");
  assert.equal(s.config.training.micro_batch_size, 1);
  assert.equal(s.config.training.sequence_length, 2048);
  assert.ok(clicks + keys <= 10, `${clicks + keys} clicks and keystrokes`);
  assert.ok(s.fragment.includes("model=llama-3.1-70b"), s.fragment);
  await page.screenshot({ path: path.join(shots, "question-qlora-70b-1280x800.png") });
  assert.deepEqual(errors, []);
  await page.close();

  // The same setup on a phone: the question heads the inputs, under the verdict and the timeline.
  const phone = await openPage("#" + s.fragment, { width: 390, height: 844 }, { isMobile: true, hasTouch: true });
  const p = await state(phone.page);
  assert.equal(p.config.parallel.data_parallel_size, 1);
  await phone.page.screenshot({ path: path.join(shots, "question-qlora-70b-390x844.png") });
  assert.deepEqual(phone.errors, []);
  await phone.page.close();
});
