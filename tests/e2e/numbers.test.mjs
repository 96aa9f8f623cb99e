// Numbers that agree, on the served page: the verdict stays pinned above the results' tabs whichever is open (also
// after What helps applied a change), at 1280x800 and on a phone (390x844). One page load per size.
//   node --test tests/e2e/numbers.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { decodePng, share } from "./png.mjs";
import { openPage, shots, until, useBrowser, patience } from "./harness.mjs";

useBrowser();

// The verdict's colours (ui/band_view.cpp verdict_color): green, amber, red.
const verdictColour = (r, g, b) =>
  (g > 100 && g > 1.5 * r && g > 1.3 * b) || (r > 150 && g > 110 && b < 0.5 * g) || (r > 150 && r > 2 * g && r > 2 * b);

async function pinnedShare(page, rect, file) {
  const img = decodePng(await page.screenshot({ path: path.join(shots, file) }));
  return share(img, rect.x, rect.y, rect.w, rect.h, verdictColour);
}

test("the verdict stays pinned above the results' tabs, also after What helps applied a change (1280x800)", async () => {
  const { page, errors } = await openPage("", { width: 1280, height: 800 });
  // The verdict's words at the start of the pinned line; the message line that Apply shows moves the panels down.
  const pinned = { x: 480, y: 40, w: 40, h: 50 };
  assert.ok(await pinnedShare(page, pinned, "numbers-breakdown-1280x800.png") > 0.005, "the pinned verdict on the Breakdown tab");
  await page.mouse.click(606, 74);  // the "Fit explorer" tab
  await page.waitForTimeout(300);
  assert.ok(await pinnedShare(page, pinned, "numbers-explorer-1280x800.png") > 0.005, "with the Fit explorer open");
  await page.mouse.click(693, 74);  // the "What helps" tab, under the pinned line
  await page.waitForTimeout(400);
  const before = await page.evaluate(() => window.memsim.state());
  await until(page, () => page.mouse.click(1228, 117),  // Apply on the first suggestion
              (frag) => window.memsim.state().fragment !== frag, before.fragment, 6);
  await page.waitForFunction(() => !window.memsim.state().simulation.running, null, { timeout: patience });
  await page.waitForTimeout(300);
  assert.ok(await pinnedShare(page, pinned, "numbers-what-helps-applied-1280x800.png") > 0.005,
            "the pinned verdict is still there with What helps open");
  assert.deepEqual(errors, []);
  await page.close();
});

test("a phone shows the pinned verdict first (390x844)", async () => {
  const { page, errors } = await openPage("", { width: 390, height: 844 });
  assert.ok(await pinnedShare(page, { x: 18, y: 94, w: 40, h: 16 }, "numbers-phone-390x844.png") > 0.03);
  assert.deepEqual(errors, []);
  await page.close();
});
