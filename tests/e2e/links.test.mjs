// Short links in the page: how long the links of typical setups are (printed, and held to 400 characters), a link
// cut off or altered in chat refused with one message while the page keeps its setup, what chat clients append
// ignored, a pasted link opened, and an old full-length link opened and rewritten short.
//   node --test tests/e2e/links.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import path from "node:path";
import { cli, openPage, root, useBrowser, patience } from "./harness.mjs";

useBrowser();

const state = (page) => page.evaluate(() => window.memsim.state());
const cliConfig = (args) => JSON.parse(execFileSync(cli, ["config", ...args]).toString());
const cliLink = (args) => execFileSync(cli, ["config", ...args, "--format", "fragment"]).toString().trim();

// The typical setups of the links issue, from the catalogue's presets (memsim-cli presets) as the page picks them.
const setups = {
  "the page's default setup": [],
  "QLoRA of Llama 3.1 70B on one H100": [
    "--preset", "llama-3.1-70b", "--set", "training.framework=hf_trainer", "--set", "peft.method=lora",
    "--set", "peft.base_quantization=nf4", "--set", "peft.double_quantization=true", "--set", "peft.target_modules=all-linear",
    "--set", "peft.lora_rank=16", "--set", "peft.lora_alpha=32", "--set", "parallel.data_parallel_size=1",
    "--set", "parallel.zero_stage=0", "--set", "hardware.gpu=h100-sxm", "--set", "training.micro_batch_size=1",
    "--set", "training.sequence_length=2048", "--set", "training.gradient_accumulation_steps=16"],
  "Llama 3.1 405B on TP 8 x PP 16 (interleaved) x DP 4": [
    "--preset", "llama-3.1-405b", "--set", "training.framework=megatron", "--set", "training.precision=bf16_fp32_grads",
    "--set", "training.micro_batch_size=1", "--set", "training.sequence_length=8192",
    "--set", "training.gradient_accumulation_steps=32", "--set", "training.activation_checkpointing=selective",
    "--set", "parallel.data_parallel_size=4", "--set", "parallel.zero_stage=1", "--set", "parallel.tensor_parallel_size=8",
    "--set", "parallel.sequence_parallel=true", "--set", "parallel.pipeline_parallel_size=16",
    "--set", "parallel.pipeline_schedule=interleaved_1f1b", "--set", "hardware.gpu=h100-sxm"],
};

test("the links of typical setups: lengths printed, each within 400 characters", async () => {
  for (const [name, args] of Object.entries(setups)) {
    const frag = cliLink(args);
    const { page, errors } = await openPage(args.length ? "#" + frag : "");
    const s = await state(page);
    assert.deepEqual(s.config, cliConfig(args), name);
    const href = await page.evaluate(() => location.href);  // what Copy link copies: the page's address and the fragment
    assert.equal(href.slice(href.indexOf("#") + 1), s.fragment, name + ": the address bar holds the short link");
    console.log(`link length, ${name}: ${href.length} characters (fragment ${s.fragment.length}): ${href}`);
    assert.ok(href.length <= 400, `${name}: ${href.length} characters`);
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test("a link cut off or altered in chat is refused with one message, and the page keeps its setup", async () => {
  const link = cliLink(setups["QLoRA of Llama 3.1 70B on one H100"]);
  const { page, errors } = await openPage("#" + cliLink(["--set", "training.micro_batch_size=2"]));
  const before = await state(page);
  assert.equal(before.config.training.micro_batch_size, 2);
  const cuts = [
    [link.slice(0, link.indexOf("&c=")), /incomplete: it lacks the checksum.*cut off in chat/],   // at a field boundary
    [link.slice(0, link.indexOf("&gpu=")), /incomplete: it lacks the checksum.*cut off in chat/],
    [link.slice(0, 60), /incomplete.*cut off in chat/],                                            // inside a field
    [link.replace("micro_batch_size=1", "micro_batch_size=8"), /incomplete or altered \(checksum mismatch\)/],
  ];
  for (const [bad, message] of cuts) {
    const count = (await state(page)).messages.length;
    await page.evaluate((h) => { location.hash = h; }, bad);  // as a pasted link reaches the page: hashchange
    await page.waitForFunction((n) => window.memsim.state().messages.length > n, count, { timeout: patience });
    const s = await state(page);
    assert.equal(s.messages.length, count + 1, "one message");
    assert.match(s.messages.at(-1), /could not be opened, so the current setup is kept/);
    assert.match(s.messages.at(-1), message);
    assert.deepEqual(s.config, before.config, "the setup is kept");
  }
  // Opened from the address bar on load, a cut link leaves the defaults with the message.
  const { page: fresh } = await openPage("#" + link.slice(0, link.indexOf("&c=")));
  const f = await state(fresh);
  assert.equal(f.config.model.hidden_size, 5120);
  assert.match(f.messages.at(-1), /cut off in chat/);
  await fresh.close();
  assert.deepEqual(errors, []);
  await page.close();
});

test("what chat clients append to a link is ignored, and the address bar drops it", async () => {
  const args = setups["Llama 3.1 405B on TP 8 x PP 16 (interleaved) x DP 4"];
  const link = cliLink(args);
  for (const tail of [").", ".", "\"", "'>", "!?", "),"]) {
    const { page, errors } = await openPage("#" + link + tail);
    const s = await state(page);
    assert.deepEqual(s.config, cliConfig(args), JSON.stringify(tail));
    assert.equal(await page.evaluate(() => location.hash), "#" + link, JSON.stringify(tail));
    assert.ok(!s.messages.some((m) => /could not be opened/.test(m)), JSON.stringify(s.messages));
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test("a link pasted onto the page opens; an old full-length link opens and is rewritten short", async () => {
  const { page, errors } = await openPage();
  const args = setups["QLoRA of Llama 3.1 70B on one H100"];
  const link = cliLink(args);
  await page.evaluate((text) => {
    const data = new DataTransfer();
    data.setData("text", text);
    window.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data }));
  }, "https://example.org/memsim/#" + link + ").");
  await page.waitForFunction(() => window.memsim.state().config.peft.method === "lora", null, { timeout: patience });
  assert.deepEqual((await state(page)).config, cliConfig(args));
  // The schema-2 golden link, every field written out as links were before: the same setup as its config file.
  const full = readFileSync(path.join(root, "tests/golden/v2.fragment"), "utf8").trim();
  await page.evaluate((f) => window.memsim.openFragment(f), full);
  await page.waitForFunction(() => window.memsim.state().config.hardware.gpu === "rtx-4090", null, { timeout: patience });
  const s = await state(page);
  assert.deepEqual(s.config, cliConfig(["--config", path.join(root, "tests/golden/v2.expected.json")]));
  const hash = await page.evaluate(() => location.hash);
  assert.ok(hash.startsWith("#memsim=3&") && hash.length < full.length / 3, hash);
  assert.deepEqual(errors, []);
  await page.close();
});
