import { test } from "node:test";
import path from "node:path";
import { useBrowser, openPage, tabTo, press, state, shots } from "./harness.mjs";
useBrowser();
for (const [w, h] of [[1280, 800], [390, 844]]) {
  test("qwen vision panel " + w, async () => {
    const { execFileSync } = await import("node:child_process");
    const frag = execFileSync(process.env.MEMSIM_CLI, ["config", "--preset", "qwen2.5-vl-7b", "--set", "peft.method=lora", "--set", "parallel.data_parallel_size=1", "--set", "model.vision_tower_args=image_height=1080,image_width=1920,max_pixels=1003520", "--format", "fragment"]).toString().trim();
    const { page } = await openPage("#" + frag, { width: w, height: h });
    const header = await tabTo(page, "Vision tower");
    console.log(header);
    if (header.includes("closed")) await press(page, "Space");
    await tabTo(page, "vision tower args");
    await page.waitForTimeout(500);
    await page.screenshot({ path: path.join(shots, `qwen-vision-${w}x${h}.png`) });
    const s = await state(page);
    console.log(s.focus);
    await page.close();
  });
}
