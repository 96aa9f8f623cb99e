// The model catalogue on the page (src/ui/model_picker.cpp): the picker finds a model by its Hugging Face id and
// picks it with Enter, and a search that finds nothing says so in the list. One page load for every check.
//   node --test tests/e2e/catalog.test.mjs     (scripts/test.sh sets MEMSIM_SITE, MEMSIM_CLI, NODE_PATH)
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { decodePng, share } from "./png.mjs";
import { openPage, requests, shots, until, useBrowser } from "./harness.mjs";

useBrowser();

// The "No match" line's colour (model_picker.cpp: 1.0, 0.62, 0.35; drawn about 242,151,85), which nothing else in the
// inputs column uses.
const noMatchOrange = (r, g, b) => r > 200 && g > 120 && g < 175 && b > 55 && b < 110;

async function search(page, text) {
  await page.keyboard.press("Escape");
  await page.mouse.click(130, 80);           // the preset combo, top of the model panel
  await page.waitForTimeout(1000);           // the combo opens on the next frames; its search box then has the focus
  await page.keyboard.type(text, { delay: 20 });  // replaces the last search, which is selected
  await page.waitForTimeout(400);
}

test("catalogue: a Hugging Face id finds its model, and nonsense shows a visible no match", async () => {
  const { page, errors } = await openPage("", { width: 1280, height: 800 });
  const before = requests.length;
  await until(page, async () => {
    await search(page, "meta-llama/Llama-3.1-8B");
    await page.screenshot({ path: path.join(shots, "catalog-search-1280x800.png") });
    await page.keyboard.press("Enter");      // Enter picks the first match
  }, () => window.memsim.state().config.model.name === "Llama 3.1 8B");
  const picked = await page.evaluate(() => window.memsim.state());
  assert.equal(picked.config.model.hidden_size, 4096);
  assert.equal(picked.config.model.vocab_size, 128256);
  assert.ok((await page.evaluate(() => location.hash)).includes("model=llama-3.1-8b&"));

  // A model that only the generated part of the catalogue has (litgpt's Pythia), in lower case.
  await until(page, async () => {
    await search(page, "eleutherai/pythia-1b");
    await page.keyboard.press("Enter");
  }, () => window.memsim.state().config.model.name === "pythia-1b");
  assert.equal((await page.evaluate(() => window.memsim.state())).config.model.num_hidden_layers, 16);

  // Nonsense: the list says "No match", and Enter picks nothing.
  const panel = [0, 60, 460, 440];           // the inputs column, where the combo's list opens below it
  const quiet = decodePng(await page.screenshot());
  assert.equal(share(quiet, ...panel, noMatchOrange), 0, "no orange text before the search");
  await search(page, "zzqx no such model");
  const img = decodePng(await page.screenshot({ path: path.join(shots, "catalog-no-match-1280x800.png") }));
  assert.ok(share(img, ...panel, noMatchOrange) > 0.0002, "the no-match line is drawn");
  await page.keyboard.press("Enter");
  await page.waitForTimeout(300);
  assert.equal((await page.evaluate(() => window.memsim.state())).config.model.name, "pythia-1b");
  await page.keyboard.press("Escape");
  assert.deepEqual(requests.slice(before).filter((u) => !u.startsWith("data:")), [], "searching makes no request");
  assert.deepEqual(errors, []);
  await page.close();
});
