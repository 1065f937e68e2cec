// The Idem web console in a real Chromium (Debian's, driven by playwright-core).
// Run by crates/idem-server/tests/it/console.rs (the console lives in crates/idem-admin), which starts `idem serve` with
// seeded state and passes it in the environment:
//   IDEM_CONSOLE_URL         http://127.0.0.1:PORT
//   IDEM_ADMIN_TOKEN         the server's --admin-token
//   IDEM_TEST_CHROMIUM       the chromium binary (default /usr/bin/chromium)
//   IDEM_CONSOLE_KEY_PREFIX  the prefix of the key whose stored body is hostile
//   IDEM_CONSOLE_STUCK_KEY   tenant/operation/key of a pending leased record (on_unknown reject)
//   IDEM_CONSOLE_SCREENSHOT  where to save the overview screenshot (PNG)
// Prints one line per check; exits non-zero on the first failure.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const base = env("IDEM_CONSOLE_URL");
const token = env("IDEM_ADMIN_TOKEN");
const executablePath = env("IDEM_TEST_CHROMIUM", "/usr/bin/chromium");
const prefix = env("IDEM_CONSOLE_KEY_PREFIX");
const [stuckTenant, stuckOperation, stuckKey] = env("IDEM_CONSOLE_STUCK_KEY").split("/");
const screenshot = env("IDEM_CONSOLE_SCREENSHOT");
const shots = process.env.IDEM_CONSOLE_SHOTS_DIR; // optional: every view's screenshot
const ACTOR = "ops-browser";
const snap = async (page, name) => { if (shots) await page.screenshot({ path: join(shots, name + ".png"), fullPage: true }); };

function check(cond, what) {
  if (!cond) throw new Error("FAILED: " + what);
  console.log("ok - " + what);
}

/** Re-opens `hash` until `pred(page)` holds (the console does not poll by itself). */
async function until(page, hash, pred, what, ms = 30000) {
  const end = Date.now() + ms;
  for (;;) {
    await page.goto(base + "/console/" + hash);
    await page.reload(); // the same hash again is no navigation
    await page.waitForSelector("#view h1");
    if (await pred()) return;
    if (Date.now() > end) throw new Error("FAILED: " + what + " (waited " + ms / 1000 + " s)");
    await page.waitForTimeout(300);
  }
}

/**
 * Waits for the view whose heading is `title`: a hash change is no page
 * load, so the previous view stays on screen until the new one replaces it.
 */
async function viewTitled(page, title) {
  await page.waitForFunction((t) => document.querySelector("#view h1")?.textContent === t, title);
}

const userDataDir = mkdtempSync(join(tmpdir(), "idem-chromium-"));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  viewport: { width: 1366, height: 768 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const problems = [];
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  // Answers the test provokes (401, 403) are logged as "Failed to load
  // resource"; any other error (a CSP violation, an exception) counts.
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push("console error: " + m.text());
  });
  page.on("dialog", (d) => { problems.push("dialog opened: " + d.message()); d.dismiss(); });
  page.on("request", (r) => { if (!r.url().startsWith(base)) problems.push("request elsewhere: " + r.url()); });

  // Not logged in: the console sends the browser to the login page.
  await page.goto(base + "/console/");
  check(page.url() === base + "/console/login", "an anonymous visit lands on the login page");

  // A wrong token: the form again, 401, a generic error.
  await page.fill("#actor", ACTOR);
  await page.fill("#token", "not-the-token-0123456789");
  const [refused] = await Promise.all([
    page.waitForResponse((r) => r.url() === base + "/console/login" && r.request().method() === "POST"),
    page.click("#login"),
  ]);
  await page.waitForSelector("#login-error");
  check(refused.status() === 401, "a wrong token is refused with 401");
  check((await page.textContent("#login-error")).includes("not valid"), "the login form says the token is not valid");
  const cookies = await context.cookies();
  check(!cookies.some((c) => c.name === "idem_session"), "no session cookie after a wrong token");

  // The right token.
  await page.fill("#actor", ACTOR);
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(base + "/console/"), page.click("#login")]);
  await page.waitForSelector("#view h1");
  check((await page.textContent("#who")) === ACTOR, "logged in, the operator's name is shown");
  const session = (await context.cookies()).find((c) => c.name === "idem_session");
  check(session && session.httpOnly && session.secure && session.sameSite === "Strict",
    "the session cookie is HttpOnly, Secure, SameSite=Strict");
  check(await page.evaluate(() => !document.cookie.includes("idem_session")), "scripts cannot read the session cookie");

  // The overview (the landing view), for the README: what needs an operator.
  await page.waitForSelector("#requests svg");
  const overview = await page.textContent("#view");
  check(overview.includes("Runs needing attention") && overview.includes("Request outcomes"), "the overview shows outcomes and attention");
  await page.screenshot({ path: screenshot });
  check(true, "overview screenshot saved to " + screenshot);

  // Keys: find the key by prefix; its stored body is shown as text.
  await page.goto(base + "/console/#/keys");
  await page.waitForSelector("#filters");
  await page.fill("#f-prefix", prefix);
  await page.click("#filters button[type=submit]");
  await page.waitForFunction((p) => location.hash.includes("prefix=" + encodeURIComponent(p)), prefix);
  const keyLink = page.locator("#view table a", { hasText: prefix }).first();
  await keyLink.waitFor();
  check((await page.locator("#view table a").count()) >= 1, "the key is found by its prefix");
  await keyLink.click();
  await page.waitForSelector("#stored-response pre.response-body");
  const shown = await page.textContent("#stored-response pre.response-body");
  check(shown.includes("<script>window.__pwned=1</script>"), "the stored body's <script> is shown as text");
  check(shown.includes("onerror"), "the stored body's <img onerror> is shown as text");
  check(await page.evaluate(() => window.__pwned === undefined), "window.__pwned is undefined: nothing ran");
  check((await page.locator("#view script, #view img").count()) === 0, "no script or img element came from the body");
  check((await page.textContent("#view")).includes("Fingerprint"), "the key detail shows its fingerprint");
  await snap(page, "key");

  // A stuck forward on a route whose upstream does not deduplicate: the
  // release says what it cannot stop, and waits for the operator's word
  // that they checked the upstream.
  const stuckHash = "#/key?tenant=" + encodeURIComponent(stuckTenant) + "&operation=" +
    encodeURIComponent(stuckOperation) + "&key=" + encodeURIComponent(stuckKey);
  await page.goto(base + "/console/" + stuckHash);
  await page.waitForSelector("#release-box");
  check((await page.textContent("#release-warning")).includes("may still land"),
    "a release says a running forward may still land upstream");
  check((await page.textContent("#view")).includes("reject"), "the key shows its on_unknown policy");
  check(await page.isDisabled("#release"), "release waits for the operator's upstream check");
  await page.check("#force");
  await page.check("#upstream-checked");
  check(!(await page.isDisabled("#release")), "checked upstream: release is possible");
  await snap(page, "release");
  await page.click("#release");
  await page.waitForFunction(() => document.getElementById("notice")?.textContent.includes("done"));
  check(true, "the stuck key was released with force and the upstream checked");

  // Webhooks: the dead receipt, replayed, becomes processed.
  await page.goto(base + "/console/#/webhooks?state=dead");
  await viewTitled(page, "Webhook receipts");
  const deadLink = page.locator("#view table a").first();
  await deadLink.waitFor();
  const delivery = await deadLink.textContent();
  check(delivery.length > 0, "a dead receipt is listed: " + delivery);
  await deadLink.click();
  await page.waitForSelector("#replay");
  await snap(page, "receipt");
  await page.click("#replay");
  await page.waitForFunction(() => document.getElementById("notice")?.textContent.includes("done"));
  check(true, "the replay was accepted");
  const receiptHash = await page.evaluate(() => location.hash);
  await until(page, receiptHash, async () => (await page.textContent("#view .kv")).includes("processed"),
    "the replayed receipt is processed");
  check(true, "the replayed receipt is shown as processed");

  // Runs: the run that needs attention, resolved as sent.
  await page.goto(base + "/console/#/runs?state=needs_attention");
  await viewTitled(page, "Runs");
  const runLink = page.locator("#view table a").first();
  await runLink.waitFor();
  await runLink.click();
  await page.waitForSelector("#timeline");
  check((await page.locator("#timeline li").count()) >= 1, "the run's timeline of steps is shown");
  check((await page.textContent("#run-state")).includes("needs_attention"), "the run needs attention");
  await snap(page, "run");
  await page.click("#resolve-sent");
  await page.waitForFunction(() => document.getElementById("notice")?.textContent.includes("done"));
  const runHash = await page.evaluate(() => location.hash);
  let state = "";
  await until(page, runHash, async () => {
    state = (await page.textContent("#run-state")).trim();
    return state !== "needs_attention";
  }, "the resolved run leaves needs_attention");
  check(true, "the resolved run's new state is shown: " + state);

  // Tasks: the task that needs attention, its timeline, resolved as sent.
  await page.goto(base + "/console/#/tasks?state=needs_attention");
  await viewTitled(page, "Tasks");
  const taskLink = page.locator("#view table a").first();
  await taskLink.waitFor();
  await taskLink.click();
  await page.waitForSelector("#task-timeline");
  const steps = await page.locator("#task-timeline li").count();
  check(steps >= 6, "the task's timeline of claims and actions is shown (" + steps + " entries)");
  check((await page.textContent("#task-state")).includes("needs_attention"), "the task needs attention");
  const payload = await page.locator("table.kv tr", { has: page.locator("th", { hasText: /^Payload$/ }) })
    .locator("td").textContent();
  check(payload.includes("123456789012345678901234567890"),
    "the task's payload is shown with every digit (" + payload.replace(/\s+/g, " ") + ")");
  await snap(page, "task");
  await page.click("#task-resolve-sent");
  await page.waitForFunction(() => document.getElementById("notice")?.textContent.includes("done"));
  const taskHash = await page.evaluate(() => location.hash);
  await until(page, taskHash, async () => (await page.textContent("#task-state")).trim() === "ready",
    "the resolved task leaves needs_attention");
  check(true, "the resolved task is ready again");

  // A state-changing request without the CSRF token is refused.
  const noCsrf = await page.evaluate(async () => {
    const r = await fetch("/admin/v1/webhooks/replay", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": "no-csrf-1" },
      body: JSON.stringify({ endpoint: "github", delivery_id: "x" }),
    });
    return [r.status, (await r.json()).type];
  });
  check(noCsrf[0] === 403 && noCsrf[1].endsWith("/csrf"), "a POST without the CSRF token gets 403 csrf");

  // The audit log names the operator.
  await page.goto(base + "/console/#/audit");
  await viewTitled(page, "Audit log");
  const audit = await page.textContent("#view");
  check(audit.includes(ACTOR), "the audit log names the operator");
  await snap(page, "audit");

  check(problems.length === 0, "no page errors, CSP violations or outside requests" +
    (problems.length ? ": " + problems.join("; ") : ""));

  // Logging out ends the session server-side.
  await page.click("#logout");
  await page.waitForURL(base + "/console/login");
  const stale = await fetch(base + "/console/api/session", { headers: { Cookie: "idem_session=" + session.value } });
  check(stale.status === 401, "after logout the old session cookie is refused (ended server-side)");
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
