// What the end-to-end tests share: the served site, one headless Chromium (playwright-core), and helpers that open
// the page and wait for the effects of canvas interactions. A test file calls useBrowser() once.
import { before, after } from "node:test";
import { execFileSync, spawn } from "node:child_process";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import net from "node:net";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");
export const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "../..");
export const site = process.env.MEMSIM_SITE || path.join(root, "build/web/site");
export const cli = process.env.MEMSIM_CLI || path.join(root, "build/native/memsim-cli");
// How long a test waits for the page to show an effect it expects, in ms. Waits end as soon as the effect shows; the
// limit only has to outlast a loaded machine: CI runs two Chromiums on two cores, whose software-rendered frames
// then take up to a second, and a number typed key by key takes two frames a key.
export const patience = 30000;

// The CLI beside the page: `memsim-cli config ARGS...` as text, and the estimate of a config's JSON as an object.
export function cliConfig(args) { return execFileSync(cli, ["config", ...args]).toString(); }
export function cliEstimate(configJson) {
  const dir = mkdtempSync(path.join(tmpdir(), "memsim-e2e-"));
  writeFileSync(path.join(dir, "c.json"), configJson);
  return JSON.parse(execFileSync(cli, ["estimate", "--config", path.join(dir, "c.json")]).toString());
}
export const shots = process.env.MEMSIM_SCREENSHOTS || mkdtempSync(path.join(tmpdir(), "memsim-shots-"));

let server;
export let browser, base;  // set once the browser is up (live bindings: importers see them)
export const requests = [];

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

async function waitForServer(url) {
  for (let i = 0; i < 100; i++) {
    try { const r = await fetch(url); if (r.ok) return; } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("server did not start: " + url);
}

// Serves the site and starts Chromium before the file's tests, and stops both after them.
export function useBrowser() {
  before(async () => {
    const port = await freePort();
    base = `http://127.0.0.1:${port}/`;
    server = spawn("python3", [path.join(root, "scripts/serve.py"), site, String(port)], { stdio: "ignore" });
    await waitForServer(base);
    browser = await chromium.launch({
      executablePath: process.env.MEMSIM_CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-gpu", "--use-gl=swiftshader", "--enable-unsafe-swiftshader", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    });
  });
  after(async () => {
    if (browser) await browser.close();
    if (server) server.kill();
  });
}

export async function openPage(hash = "", viewport = { width: 1280, height: 720 }, options = {}) {
  const page = await browser.newPage({ viewport, acceptDownloads: true, ...options });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
  page.on("request", (r) => requests.push(r.url()));
  await page.goto(base + hash);
  await page.waitForFunction(() => window.memsim && window.Module && window.Module.calledRun, null, { timeout: 20000 });
  await page.evaluate(() => window.memsim.ready);
  await page.waitForTimeout(300);  // a few frames
  return { page, errors };
}

// Canvas interactions land on a later animation frame, which a loaded machine delays: repeat an action until
// the page's state shows its effect.
export async function until(page, action, predicate, arg, attempts = 4) {
  for (let i = 0; i < attempts; i++) {
    await action();
    try {
      await page.waitForFunction(predicate, arg, { timeout: 10000 });  // then act again: a click lost
      return;
    } catch {}
  }
  throw new Error("the interaction had no effect: " + predicate.toString());
}

// The keyboard's helpers (keyboard.test.mjs, history.test.mjs). state() is what the page reports: its config, URL
// fragment and, in focus, what its live region reads out for the focused control (src/ui/keyboard.h).
export const state = (page) => page.evaluate(() => window.memsim.state());
// Three animation frames: the app has run two frames since, the key's press in one and its release in the next
// (src/platform/key_queue.h), and the focus it moved is announced.
export const frames = (page) => page.evaluate(() => new Promise((r) => {
  let n = 0;
  const step = () => (++n === 3 ? r() : requestAnimationFrame(step));
  requestAnimationFrame(step);
}));

// Presses a key and waits until the app has taken it: the key queue holds nothing more (it hands the app the press in
// one frame and the release in the next, src/platform/key_queue.h), and two frames have begun since its last event
// (ImGui 1.86 applies the Tab focus a frame after the press, and the frame reads it out). Neither animation frames
// nor the app's drawn frames will do: under load, frames drawn for the previous key's settling after the count was
// read made press() return before this key was handled, so the next state read showed the focus one press behind
// and tabTo stopped with a Tab still queued (the focus then seemed to move two steps for one press).
// It also checks that the press reached GLFW and ImGui once per key of the chord, neither lost nor doubled.
export async function press(page, key) {
  const before = (await state(page)).keys;
  await page.keyboard.press(key);
  await page.waitForFunction((received) => {
    const k = window.memsim.state().keys;
    return k.received > received && !k.pending && k.frames_since >= 2;
  }, before.received, { polling: "raf", timeout: patience });
  if (/Control|Meta/.test(key)) return;  // the page's clipboard bridge presses Ctrl+V itself (web_main.cpp memsim_paste)
  const keys = (await state(page)).keys;
  const chord = key.split("+").length;
  assert.deepEqual([keys.received - before.received, keys.fed - before.fed], [chord, chord],
                   `${key}: key presses that reached GLFW and ImGui`);
}

// Presses Tab (or Shift+Tab) until the focus is on a control whose words start with `prefix`, and returns its words.
// The results panel and the end of the inputs are nearer backwards from the toolbar.
export async function tabTo(page, prefix, { back = false, limit = 250 } = {}) {
  const seen = [];
  for (let i = 0; i < limit; i++) {
    await press(page, back ? "Shift+Tab" : "Tab");
    const focus = (await state(page)).focus;
    if (focus.startsWith(prefix)) return focus;
    seen.push(focus.slice(0, 40));
  }
  throw new Error("Tab never reached " + prefix + "; the focus went through " + JSON.stringify(seen.slice(-24)));
}

// Tab to the next control, whose words are `words`.
export async function tabOnceTo(page, words) {
  await press(page, "Tab");
  assert.equal((await state(page)).focus, words);
}
