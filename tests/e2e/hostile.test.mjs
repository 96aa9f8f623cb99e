// Hostile input through the page (the robustness issue's point 8): from a setup the user has changed, a hostile link
// opened, hostile configs pasted and oversized files dropped. Each keeps the setup as it was, adds exactly one
// message to the status line's log, and leaves the page drawing, with no error in the console.
//   node --test tests/e2e/hostile.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import path from "node:path";
import { decodePng, distinctColors } from "./png.mjs";
import { cli, openPage, shots, state, useBrowser, patience } from "./harness.mjs";

useBrowser();

// The browser's paste event with `text`, as Ctrl+V outside a text field delivers it.
const paste = (page, text) => page.evaluate((t) => {
  const data = new DataTransfer();
  data.setData("text", t);
  window.dispatchEvent(new ClipboardEvent("paste", { clipboardData: data }));
}, text);

// A drop of one file named `name` holding `text`; `claimedBytes` makes the File report another size, as a file of
// gigabytes would, without the test allocating one.
const drop = (page, name, text, claimedBytes) => page.evaluate(([n, t, size]) => {
  const file = new File([t], n, { type: "application/json" });
  if (size) Object.defineProperty(file, "size", { value: size });
  const data = new DataTransfer();
  data.items.add(file);
  if (size) Object.defineProperty(data, "files", { value: [file] });
  window.dispatchEvent(new DragEvent("drop", { dataTransfer: data, cancelable: true }));
}, [name, text, claimedBytes || 0]);

test("hostile links, pasted configs and dropped files keep the user's setup and add one message each", async () => {
  // The user's own setup: a link that changes fields from the defaults.
  const link = execFileSync(cli, ["config", "--set", "training.micro_batch_size=2", "--set", "hardware.gpu=h100-sxm",
                                  "--format", "fragment"]).toString().trim();
  const { page, errors } = await openPage("#" + link, { width: 1280, height: 800 });
  const mine = (await state(page)).config;
  assert.equal(mine.training.micro_batch_size, 2);
  assert.equal(mine.hardware.gpu, "h100-sxm");

  const nested = 100000;  // far past the decoders' 64 levels: a recursive reader would overflow its stack
  const inputs = [
    // The full form (schema=N, every field written out, as links were before the short form) has no checksum, so
    // these reach the decoders; a short link altered so is refused by its checksum first (links.test.mjs).
    ["link with markup and an overflowing number", () => page.evaluate(() => {
      location.hash = "#schema=2&training.micro_batch_size=99999999999999999999&model.model_type=%3Cimg%20src%3Dx%3E";
    })],
    ["link with a terminal escape and a cut UTF-8 character", () => page.evaluate(() => {
      location.hash = "#schema=2&hardware.gpu=%1B%5B31m%E2%82";
    })],
    ["short link cut in chat", () => page.evaluate((l) => { location.hash = "#" + l.slice(0, l.length - 12); }, link)],
    ["pasted JSON nested 100,000 levels", () => paste(page, '{"model":' + "[".repeat(nested) + "]".repeat(nested) + "}")],
    ["pasted JSON whose numbers overflow", () => paste(page,
      '{"model":{"hidden_size":1e400,"num_hidden_layers":9007199254740993},"training":{"micro_batch_size":-1}}')],
    ["pasted HF config whose expert width wraps int64", () => paste(page,
      '{"model_type":"deepseek_v3","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,' +
      '"n_shared_experts":9007199254740993,"moe_intermediate_size":1024}')],
    ["pasted Accelerate YAML with a control character", () => paste(page, "distributed_type: FSDP\u0007\nfsdp_config: [[[")],
    ["dropped file of 3 GB", () => drop(page, "huge.json", "{}", 3 * 1024 ** 3)],
    ["dropped file of 9 MiB (over the decoders' 8 MiB)", () => drop(page, "big.json",
      '{"model":{"name":"' + "x".repeat(9 * 1024 * 1024) + '"}}')],
    ["dropped binary file", () => drop(page, "weights.bin", "\u0000\u0001\u0002\u00ff".repeat(1000))],
  ];
  for (const [what, act] of inputs) {
    const before = (await state(page)).messages.length;
    await act();
    await page.waitForFunction((n) => window.memsim.state().messages.length > n, before, { timeout: patience })
      .catch(() => assert.fail(what + ": no message"));
    await page.waitForTimeout(200);  // a second message, were there one, would come in the next frames
    const s = await state(page);
    assert.equal(s.messages.length, before + 1, what + ": " + JSON.stringify(s.messages.slice(before)));
    const message = s.messages.at(-1);
    assert.ok(!/[\u0000-\u001f]/.test(message), what + ": control characters in " + JSON.stringify(message));
    assert.ok(message.length < 400, what + ": a message of " + message.length + " characters");
    assert.deepEqual(s.config, mine, what + ": the setup changed");
    console.log(what + " -> " + message);
  }
  const img = decodePng(await page.screenshot({ path: path.join(shots, "hostile-after-1280x800.png") }));
  assert.ok(distinctColors(img, 0, 0, 1280, 800) > 50, "the page still draws");
  assert.equal(await page.evaluate(() => document.querySelectorAll("img, script:not([src])").length), 0);
  assert.deepEqual(errors, []);
  await page.close();
});
