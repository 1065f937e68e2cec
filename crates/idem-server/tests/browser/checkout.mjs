// The demo shop's checkout page (/checkout) in a real Chromium (Debian's,
// driven by playwright-core). Run by crates/idem-server/tests/it/checkout_page.rs,
// which starts the provider, the relay and the shop (`idem serve
// --provider-url …` on SQLite) with stock of tee-m, and passes:
//   IDEM_SHOP_URL       http://127.0.0.1:PORT
//   IDEM_TEST_CHROMIUM  the chromium binary (default /usr/bin/chromium)
// Prints one line per check, and `order-1 ID` / `order-2 ID` for the test
// to find in the database; exits non-zero on the first failure.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name, fallback) => {
  const v = process.env[name] ?? fallback;
  if (v === undefined) throw new Error(`${name} is not set`);
  return v;
};
const base = env("IDEM_SHOP_URL");
const executablePath = env("IDEM_TEST_CHROMIUM", "/usr/bin/chromium");

function check(cond, what) {
  if (!cond) throw new Error("FAILED: " + what);
  console.log("ok - " + what);
}

/** What the page shows in its answer list. */
const answers = (page) =>
  page.$$eval("#answers li.answer", (lis) =>
    lis.map((li) => ({ status: Number(li.dataset.status), order: li.dataset.order, replayed: li.dataset.replayed === "true", text: li.textContent })));

/** Waits until the page shows `n` answers and no payment is in flight. */
async function settled(page, n) {
  await page.waitForFunction(
    (n) => document.querySelectorAll("#answers li.answer").length >= n && !document.getElementById("pay").disabled,
    n,
    { timeout: 60000 },
  );
  return answers(page);
}

/** The shop's orders of `customer`, through its listing. */
async function ordersOf(page, customer) {
  return page.evaluate(async (c) => {
    const res = await fetch("/v1/orders?customer=" + encodeURIComponent(c));
    return (await res.json()).data.map((o) => o.id);
  }, customer);
}

const userDataDir = mkdtempSync(join(tmpdir(), "idem-chromium-"));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  viewport: { width: 1024, height: 768 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
const problems = [];
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("pageerror", (e) => problems.push("page error: " + e.message));
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) problems.push("console error: " + m.text());
  });
  page.on("request", (r) => { if (!r.url().startsWith(base)) problems.push("request elsewhere: " + r.url()); });
  const posts = [];
  page.on("request", (r) => {
    if (r.method() === "POST" && new URL(r.url()).pathname === "/v1/orders") posts.push(r.headers()["idempotency-key"]);
  });

  const first = await page.goto(base + "/checkout");
  check(first.status() === 200, "the page is served");
  const csp = first.headers()["content-security-policy"] ?? "";
  check(csp.includes("default-src 'none'") && csp.includes("script-src 'self'") && !csp.includes("unsafe"),
    "its Content-Security-Policy allows this origin only");
  await page.waitForFunction(() => document.getElementById("key").textContent.length > 0);
  const key1 = await page.textContent("#key");
  check(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(key1), "the cart has a v4 UUID key before Pay is clicked");
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem("idem-checkout-cart")));
  check(stored.key === key1 && stored.sent === false, "the key is stored with the cart");
  const customer = stored.customer;
  await page.fill("#quantity", "2");
  check((await page.textContent("#total")) === "30.00 EUR", "the total follows the cart");

  // The double click: a real one (its second click lands on the disabled
  // button), then two more submits that go around the disabled button.
  const box = await (await page.$("#pay")).boundingBox();
  await page.mouse.dblclick(box.x + box.width / 2, box.y + box.height / 2);
  const disabled = await page.evaluate(() => {
    const form = document.getElementById("cart");
    const pay = document.getElementById("pay");
    form.requestSubmit();
    form.requestSubmit();
    return pay.disabled;
  });
  check(disabled, "Pay is disabled while the payment is in flight");
  const shown = await settled(page, 3);
  check(shown.length === 3, "three sends, three answers (the second click hit the disabled button)");
  check(posts.length >= 3 && posts.every((k) => k === key1), `every POST carried the cart's key (${posts.length} POSTs)`);
  const order1 = shown[0].order;
  check(/^ord_[0-9a-f]{32}$/.test(order1), "the answer names an order");
  check(shown.every((a) => a.status === 201 && a.order === order1), "every answer names the same order: " + JSON.stringify(shown));
  check(shown.some((a) => a.replayed), "the later sends were answered from the shop's record");
  check((await ordersOf(page, customer)).length === 1, "the shop holds one order after the double click");

  // A reload keeps the cart, its key and its answers; Pay again is a retry.
  await page.reload();
  await page.waitForFunction(() => document.querySelectorAll("#answers li.answer").length === 3);
  check((await page.textContent("#key")) === key1, "after a reload the cart has the same key");
  check(await page.$eval("#fields", (f) => f.disabled), "a sent cart cannot be edited");
  await page.click("#pay");
  const again = await settled(page, 4);
  check(again.length === 4 && again[3].order === order1 && again[3].status === 201, "the retry after the reload names the same order");
  check(again[3].replayed, "the retry is shown as replayed");
  check(posts.at(-1) === key1, "the retry carried the same key");
  const listed = await ordersOf(page, customer);
  check(listed.length === 1 && listed[0] === order1, "the shop still holds exactly one order");
  await page.waitForFunction((id) => [...document.querySelectorAll("#orders li.order")].map((l) => l.dataset.order).join() === id, order1);
  check(true, "the page lists the one order");
  console.log("order-1 " + order1);

  // A new cart is a new intent: a new key, a second order.
  await page.click("#new-cart");
  const key2 = await page.textContent("#key");
  check(key2 !== key1 && key2.length === 36, "a new cart draws a new key");
  check((await answers(page)).length === 0 && !(await page.$eval("#fields", (f) => f.disabled)), "a new cart starts empty and editable");
  // Fields the shop refuses (400: nothing ordered, the key not used up):
  // the cart can be corrected and sent again with its key.
  await page.fill("#email", "shopper@localhost");
  await page.click("#pay");
  const refused = await settled(page, 1);
  check(refused[0].status === 400 && !(await page.$eval("#fields", (f) => f.disabled)), "a refused cart is editable again");
  await page.fill("#email", "shopper@example.com");
  await page.click("#pay");
  const second = (await settled(page, 2)).slice(1);
  check(second[0].status === 201 && second[0].order !== order1 && !second[0].replayed, "the new cart's Pay makes another order");
  check(posts.slice(-2).every((k) => k === key2), "with the new key, both times");
  check((await ordersOf(page, customer)).length === 2, "the shop holds two orders");
  console.log("order-2 " + second[0].order);

  check(problems.length === 0, "no page error, CSP violation or foreign request: " + problems.join("; "));
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
