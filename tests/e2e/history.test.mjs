// Undo and history, the status line, the clipboard of the text fields and the verdict read out, on the served page:
// real key presses (Ctrl+Z, Ctrl+Shift+Z, Ctrl+V, Ctrl+C), the browser's Back, and the page's live regions.
//   node --test tests/e2e/history.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { base, browser, openPage, press, shots, state, tabOnceTo, tabTo, useBrowser, patience } from "./harness.mjs";

useBrowser();

const microBatch = (page) => page.evaluate(() => window.memsim.state().config.training.micro_batch_size);
const waitMicroBatch = (page, n) =>
  page.waitForFunction((n) => window.memsim.state().config.training.micro_batch_size === n, n, { timeout: patience });
const verdictRegion = (page) => page.evaluate(() => document.getElementById("verdict").textContent);
const VERDICT = /^(Fits|Borderline|Does not fit|Out of memory): \d+\.\d GiB of \d+\.\d GiB usable$/;

test("undo, redo, Back, Reset; Ctrl+V and Ctrl+C in a field; the verdict read out", async () => {
  const { page, errors } = await openPage("", { width: 1280, height: 800 },
                                          { permissions: ["clipboard-read", "clipboard-write"] });
  const opened = await page.evaluate(() => [history.length, location.hash]);
  // The verdict, in a live region of its own.
  await page.waitForFunction(() => document.getElementById("verdict").textContent !== "", null, { timeout: patience });
  const verdict = await verdictRegion(page);
  assert.match(verdict, VERDICT);
  assert.equal(verdict, (await state(page)).verdict);
  assert.equal(await page.evaluate(() => document.getElementById("verdict").getAttribute("aria-live")), "polite");

  // A number typed digit by digit: one browser history entry.
  await tabTo(page, "micro_batch_size: 4");
  await press(page, "1");
  await press(page, "6");
  await press(page, "Enter");
  await waitMicroBatch(page, 16);
  const typed = await page.evaluate(() => [history.length, location.hash]);
  assert.equal(typed[0], opened[0] + 1, "one entry for the typed number");
  assert.ok(typed[1].includes("&micro_batch_size=16&"), typed[1]);
  // Its - and + buttons, in words.
  await tabOnceTo(page, "decrease micro_batch_size, button: 16");
  await tabOnceTo(page, "increase micro_batch_size, button: 16");
  // The new verdict is read out once the edit is done.
  await page.waitForFunction((v) => document.getElementById("verdict").textContent !== v, verdict, { timeout: patience });
  assert.match(await verdictRegion(page), VERDICT);

  // Ctrl+V into the field: the browser's paste event, from the clipboard.
  await page.evaluate(() => navigator.clipboard.writeText("8"));
  await tabTo(page, "micro_batch_size: 16", { back: true, limit: 6 });  // back in the field: editing it, text selected
  await page.waitForFunction(() => window.memsim.state().text_field.copy === "16", null, { timeout: patience });
  await press(page, "Control+v");
  await press(page, "Enter");
  await waitMicroBatch(page, 8);
  // Ctrl+C from a field: its text reaches the clipboard through the copy event.
  await page.evaluate(() => navigator.clipboard.writeText("nothing yet"));
  await press(page, "Enter");  // edits the field again, its text selected
  await page.waitForFunction(() => window.memsim.state().text_field.copy === "8", null, { timeout: patience });
  await press(page, "Control+c");
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "8");
  // Ctrl+X copies it as well, and takes it out of the field; Escape puts it back.
  await page.evaluate(() => navigator.clipboard.writeText("nothing yet"));
  await press(page, "Control+x");
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "8");
  await page.waitForFunction(() => window.memsim.state().text_field.copy === "", null, { timeout: patience });
  await press(page, "Escape");
  await page.waitForFunction(() => !window.memsim.state().text_field.editing, null, { timeout: patience });
  assert.equal(await microBatch(page), 8);

  // Ctrl+Z and Ctrl+Shift+Z: 4, 16 (typed), 8 (pasted).
  await press(page, "Control+z");
  await waitMicroBatch(page, 16);
  await press(page, "Control+z");
  await waitMicroBatch(page, 4);
  assert.equal(await page.evaluate(() => location.hash), opened[1]);
  await press(page, "Control+Shift+Z");
  await waitMicroBatch(page, 16);
  // Back: each undo and redo was an entry too, so Back steps through the setups as they were shown.
  await page.goBack();
  await waitMicroBatch(page, 4);
  await page.goBack();
  await waitMicroBatch(page, 16);
  await page.goForward();
  await waitMicroBatch(page, 4);
  await page.goBack();
  await waitMicroBatch(page, 16);

  // Reset: the defaults, undoable.
  await tabTo(page, "Reset, button: ", { back: true });
  await press(page, "Enter");
  await waitMicroBatch(page, 4);
  assert.equal(await page.evaluate(() => location.hash), opened[1]);
  assert.match((await state(page)).messages.at(-1), /^Reset to the default setup/);
  await page.screenshot({ path: path.join(shots, "history-status-line-1280x800.png") });
  await press(page, "Control+z");
  await waitMicroBatch(page, 16);

  // With a clipboard, Copy link says so.
  await tabTo(page, "Copy link", { back: true });
  await press(page, "Enter");
  await page.waitForFunction(() => window.memsimCopyResult === true, null, { timeout: patience });
  await page.waitForFunction(() => /^Link copied/.test(window.memsim.state().messages.at(-1)), null, { timeout: patience });
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), await page.evaluate(() => window.memsimLastCopied));
  assert.deepEqual(errors, []);
  await page.close();
});

test("no clipboard API (plain HTTP): Copy link shows the link to copy by hand and says it was NOT copied", async () => {
  const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
  await context.addInitScript(() => {
    Object.defineProperty(Navigator.prototype, "clipboard", { get: () => undefined, configurable: true });
  });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(base);
  await page.waitForFunction(() => window.memsim && window.Module && window.Module.calledRun, null, { timeout: patience });
  await page.evaluate(() => window.memsim.ready);
  assert.equal(await page.evaluate(() => navigator.clipboard), undefined);
  await tabTo(page, "Copy link");
  await press(page, "Enter");
  await page.waitForFunction(() => /NOT copied/.test(window.memsim.state().messages.at(-1) || ""), null, { timeout: patience });
  const s = await state(page);
  assert.ok(!s.messages.some((m) => /Link copied/.test(m)), JSON.stringify(s.messages));
  // The link, selected in a read-only field: Ctrl+C copies it through the copy event, which needs no clipboard API.
  await page.waitForFunction(() => window.memsim.state().focus.startsWith("The link to copy by hand") &&
                                   window.memsim.state().text_field.editing, null, { timeout: patience });
  await page.evaluate(() => window.addEventListener("copy", (e) => { window.copiedByHand = e.clipboardData.getData("text/plain"); }));
  await press(page, "Control+c");
  const link = await page.evaluate(() => window.memsimLastCopied);
  assert.ok(link.includes("#memsim=3&"), link);
  assert.equal(await page.evaluate(() => window.copiedByHand), link);
  await page.screenshot({ path: path.join(shots, "history-not-copied-390x844.png") });
  assert.deepEqual(errors, []);
  await context.close();
});
