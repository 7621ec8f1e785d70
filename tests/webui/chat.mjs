// The chat page (GET /) in headless Chromium, driven by Playwright against a real
// `ferrum serve`: it asks for the API key, shows the model's name, streams a greedy answer equal
// to the API's own, stops a long answer (the engine aborts it and frees its KV blocks), and
// resets the conversation. Run by scripts/test-webui.sh, which installs Chromium and
// playwright-core. Env: FERRUM_BIN, FERRUM_WEBUI_MODEL (the model to serve),
// FERRUM_WEBUI_PROMPT, FERRUM_WEBUI_SYSTEM (system prompt), FERRUM_SCREENSHOT (where the
// screenshot goes).
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { createRequire } from "node:module";
import assert from "node:assert/strict";

// playwright-core lives where scripts/test-webui.sh installed it (PLAYWRIGHT_PREFIX).
const { chromium } = createRequire(process.env.PLAYWRIGHT_PREFIX + "/")("playwright-core");

const KEY = "webui-test-key";
const model = process.env.FERRUM_WEBUI_MODEL;
const prompt = process.env.FERRUM_WEBUI_PROMPT || "Hello there";
const shot = process.env.FERRUM_SCREENSHOT || "target/webui/chat.png";
const system = process.env.FERRUM_WEBUI_SYSTEM ?? "Be brief.";

function startServer() {
  const proc = spawn(process.env.FERRUM_BIN, ["serve", "--model", model, "--port", "0",
    "--served-model-name", "ferrum-test", "--api-key", KEY], { stdio: ["ignore", "ignore", "pipe"] });
  const lines = [];
  return new Promise((resolve, reject) => {
    const rl = createInterface({ input: proc.stderr });
    const timer = setTimeout(() => reject(new Error("the server did not start:\n" + lines.join("\n"))), 120000);
    rl.on("line", (line) => {
      lines.push(line);
      const at = line.indexOf("http://");
      if (at >= 0 && !line.includes("chat page")) {
        clearTimeout(timer);
        resolve({ proc, base: line.slice(at).trim(), lines });
      }
    });
    proc.on("exit", (code) => reject(new Error(`the server exited (${code}):\n` + lines.join("\n"))));
  });
}

async function api(base, path, body) {
  const r = await fetch(base + path, {
    method: body ? "POST" : "GET",
    headers: { "content-type": "application/json", authorization: "Bearer " + KEY },
    body: body ? JSON.stringify(body) : undefined,
  });
  return r.headers.get("content-type").includes("json") ? r.json() : r.text();
}

async function gauges(base) {
  const text = await api(base, "/metrics");
  const get = (name) => Number(text.split("\n").find((l) => l.startsWith(name + "{")).split(" ").pop());
  return { free: get("ferrum_kv_blocks_free"), total: get("ferrum_kv_blocks_total"),
           running: get("ferrum_num_requests_running"), generated: get("ferrum_generation_tokens_total") };
}

// Inside the page: once assistant answer `index` shows more than `chars` characters, clicks
// the button `id` at once (no round trip to the test between seeing the text and clicking).
function clickWhenAnswered(page, index, chars, id) {
  return page.evaluate(([index, chars, id]) => new Promise((resolve, reject) => {
    const deadline = Date.now() + 120000;
    const tick = () => {
      const m = document.querySelectorAll(".msg.assistant")[index];
      if (m && m.querySelector(".text").textContent.length > chars) {
        document.getElementById(id).click();
        resolve();
      } else if (Date.now() > deadline) {
        reject(new Error(`answer ${index} did not show`));
      } else {
        setTimeout(tick, 2);
      }
    };
    tick();
  }), [index, chars, id]);
}

const { proc, base } = await startServer();
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(base + "/");

  // 1. The server has a key: the page asks for it, then shows the model.
  await page.locator("#key-box").waitFor({ state: "visible" });
  await page.fill("#api-key", KEY);
  await page.click("#save-key");
  await page.locator("#model").filter({ hasText: "ferrum-test" }).waitFor();
  console.log("ok - asks for the API key and shows the model's name");

  // 2. A greedy answer streams in and equals the API's answer to the same messages.
  await page.fill("#system", system);
  await page.$eval("#temperature", (el) => { el.value = "0"; el.dispatchEvent(new Event("input")); });
  await page.fill("#max-tokens", "24");
  await page.fill("#input", prompt);
  await page.press("#input", "Enter");
  const first = page.locator(".msg.assistant").first();
  await first.locator(".meta").waitFor({ timeout: 120000 });
  const shown = await first.locator(".text").textContent();
  const want = await api(base, "/v1/chat/completions", {
    model: "ferrum-test", temperature: 0, max_tokens: 24,
    messages: [...(system ? [{ role: "system", content: system }] : []), { role: "user", content: prompt }],
  });
  assert.equal(shown, want.choices[0].message.content);
  assert.ok(shown.length > 0, "an answer was shown");
  assert.equal(await page.locator(".msg.user").first().textContent(), prompt);
  console.log("ok - streams the greedy answer the API gives: " + JSON.stringify(shown.slice(0, 60)));
  await page.screenshot({ path: shot });
  console.log("  screenshot in " + shot);

  // 3. A long answer is stopped: the request is aborted and its blocks come back.
  await page.fill("#max-tokens", "");
  // Greedy: the tiny random model loops without an end-of-sequence token, so the answer is
  // still running when Stop is clicked (sampled, it may end by itself first).
  await page.$eval("#temperature", (el) => { el.value = "0"; el.dispatchEvent(new Event("input")); });
  await page.fill("#input", "Write a very long story.");
  await page.press("#input", "Enter");
  const second = page.locator(".msg.assistant").nth(1);
  // The tiny model reaches its 2048-token context in a second or two: Stop is clicked inside
  // the page as soon as the answer shows, so the test cannot lose that race.
  await clickWhenAnswered(page, 1, 20, "stop");
  await second.locator(".meta").filter({ hasText: "stopped" }).waitFor();
  let g;
  for (let i = 0; ; i++) {
    g = await gauges(base);
    if (g.running === 0 && g.free === g.total) break;
    assert.ok(i < 300, `blocks not freed after Stop: ${JSON.stringify(g)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const ctx = (await api(base, "/v1/models")).data[0].max_model_len;
  assert.ok(g.generated < ctx, `the answer ran to the context (${g.generated} tokens): Stop did not abort it`);
  assert.equal(await page.locator("#stop").isHidden(), true);
  console.log(`ok - Stop aborts the request and frees its blocks (${g.free}/${g.total} free)`);

  // 4. New conversation during an answer: the page empties, and the cut turn is not sent
  // as context with the next message.
  await page.fill("#input", "Write another very long story.");
  await page.press("#input", "Enter");
  await clickWhenAnswered(page, 2, 10, "reset");
  await page.locator("#stop").waitFor({ state: "hidden" });
  assert.equal(await page.locator(".msg").count(), 0);
  assert.equal(await page.locator("#empty").isVisible(), true);
  const sent = [];
  page.on("request", (r) => { if (r.url().endsWith("/v1/chat/completions")) sent.push(JSON.parse(r.postData())); });
  await page.fill("#max-tokens", "4");
  await page.fill("#input", "Hi");
  await page.press("#input", "Enter");
  await page.locator(".msg.assistant .meta").first().waitFor({ timeout: 120000 });
  const msgs = sent[0].messages;
  assert.deepEqual(msgs[msgs.length - 1], { role: "user", content: "Hi" });
  assert.equal(msgs.filter((m) => m.role !== "system").length, 1, JSON.stringify(msgs));
  console.log("ok - New conversation empties the page, also during an answer");
  assert.deepEqual(errors, [], "no script errors");
} catch (e) {
  failed = true;
  console.error("FAILED: " + (e.stack || e));
} finally {
  await browser.close();
  proc.kill("SIGTERM");
}
process.exit(failed ? 1 : 0);
