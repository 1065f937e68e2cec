// The checkout page of the demo shop (served by `idem serve --provider-url …`
// at /checkout). The cart and its Idempotency-Key live in localStorage: the
// key is drawn when the cart is created, never when Pay is clicked, so every
// send of this cart (a double click, a reload, a retry) is one intent.
// Pay disables itself while a payment is in flight, but the key is what
// makes a second send harmless: the shop answers it with the first order.

const CART = "idem-checkout-cart";
const CUSTOMER = "idem-checkout-customer";
const PRICES = { "tee-m": 1500, mug: 900 };
const CURRENCY = "EUR";
// How long one Pay keeps asking for the final answer (202, 409 in flight,
// 429, 5xx, network errors), always with the cart's key.
const SETTLE_MS = 60000;

const $ = (id) => document.getElementById(id);

/** A v4 UUID: crypto.randomUUID where the context allows it. */
function uuid() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** This browser's customer id, drawn once. */
function customerId() {
  let c = localStorage.getItem(CUSTOMER);
  if (!c || !/^cus_[a-z0-9]{1,60}$/.test(c)) {
    c = "cus_web_" + uuid().slice(0, 8);
    localStorage.setItem(CUSTOMER, c);
  }
  return c;
}

/** A new cart: a new intent, so a new key, drawn now. */
function newCart(previous) {
  return {
    key: uuid(),
    created: new Date().toISOString(),
    sku: "tee-m",
    quantity: 1,
    customer: previous?.customer ?? customerId(),
    email: previous?.email ?? "shopper@example.com",
    sent: false,
    answers: [],
  };
}

/** The stored cart, or a new one when there is none (or it is unreadable). */
function loadCart() {
  try {
    const c = JSON.parse(localStorage.getItem(CART) ?? "null");
    if (c && typeof c.key === "string" && c.key && PRICES[c.sku] !== undefined &&
        Number.isInteger(c.quantity) && typeof c.customer === "string" &&
        typeof c.email === "string" && Array.isArray(c.answers)) {
      return c;
    }
  } catch {
    // Unreadable: start over below.
  }
  const c = newCart();
  saveCart(c);
  return c;
}

function saveCart(c) {
  localStorage.setItem(CART, JSON.stringify(c));
}

let cart = loadCart();
let inFlight = 0;

const amountOf = (c) => PRICES[c.sku] * c.quantity;
const money = (minor) => (minor / 100).toFixed(2) + " " + CURRENCY;

function setStatus(text) {
  $("status").textContent = text;
}

function render() {
  $("sku").value = cart.sku;
  $("quantity").value = String(cart.quantity);
  $("customer").value = cart.customer;
  $("email").value = cart.email;
  // Once sent, the cart is the intent its key names: it cannot change.
  $("fields").disabled = cart.sent;
  $("total").textContent = money(amountOf(cart));
  $("key").textContent = cart.key;
  $("created").textContent = new Date(cart.created).toLocaleString();
  $("pay").disabled = inFlight > 0;
  $("pay").textContent = cart.sent ? "Pay (again: same key)" : "Pay";
  const list = $("answers");
  list.replaceChildren(...cart.answers.map(answerItem));
}

function answerItem(a) {
  const li = document.createElement("li");
  li.className = "answer";
  li.dataset.status = String(a.status);
  li.dataset.order = a.order ?? "";
  li.dataset.replayed = String(a.replayed);
  const parts = [`${a.status} ${a.title}`];
  if (a.order) parts.push(`order ${a.order}`);
  li.textContent = parts.join(": ");
  if (a.status >= 400) li.classList.add("failed");
  if (a.replayed) {
    const tag = document.createElement("span");
    tag.className = "replayed";
    tag.textContent = " (replayed: the shop had this key already)";
    li.append(tag);
  }
  return li;
}

/** Reads the form into the cart, unless the cart was sent already. */
function edit() {
  if (cart.sent) return;
  const q = Number.parseInt($("quantity").value, 10);
  cart.sku = PRICES[$("sku").value] !== undefined ? $("sku").value : "tee-m";
  cart.quantity = Number.isInteger(q) && q >= 1 && q <= 99 ? q : 1;
  cart.customer = $("customer").value.trim();
  cart.email = $("email").value.trim();
  saveCart(cart);
  $("total").textContent = money(amountOf(cart));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The wait a `Retry-After` asks for, between 0.2 s and 5 s. */
function retryAfter(res) {
  const s = Number.parseFloat(res.headers.get("Retry-After") ?? "1");
  return Math.min(5000, Math.max(200, (Number.isFinite(s) ? s : 1) * 1000));
}

/**
 * Sends the cart's order with its key until a final answer: a 202 (still
 * running), a 409 in flight (another click's send is running), 429, 5xx
 * and network errors are asked again with the same key. `null` when the
 * answer did not come within SETTLE_MS.
 */
async function settle(c) {
  const body = JSON.stringify({
    customer: c.customer, sku: c.sku, quantity: c.quantity,
    amount: amountOf(c), currency: CURRENCY, email: c.email,
  });
  const end = Date.now() + SETTLE_MS;
  while (Date.now() < end) {
    let res;
    try {
      res = await fetch("/v1/orders", {
        method: "POST",
        headers: { "Content-Type": "application/json", "Idempotency-Key": c.key },
        body,
      });
    } catch {
      setStatus("The shop did not answer; asking again with the same key…");
      await sleep(1000);
      continue;
    }
    let json = null;
    try {
      json = await res.json();
    } catch {
      json = null;
    }
    const type = typeof json?.type === "string" ? json.type : "";
    if (res.status === 409 && type.endsWith("in-flight")) {
      setStatus("A payment of this cart is in flight; waiting for its answer…");
      await sleep(retryAfter(res));
      continue;
    }
    if (res.status === 202 || res.status === 429 || res.status >= 500) {
      setStatus("The payment is not finished yet; asking again with the same key…");
      await sleep(retryAfter(res));
      continue;
    }
    return {
      status: res.status,
      title: json?.title ?? json?.status ?? res.statusText,
      order: json?.id ?? json?.order ?? null,
      replayed: res.headers.get("Idempotent-Replayed") === "true",
      at: new Date().toISOString(),
    };
  }
  return null;
}

async function pay() {
  edit();
  const c = cart;
  if (!c.sent) {
    c.sent = true;
    saveCart(c);
  }
  inFlight += 1;
  render();
  setStatus("Paying…");
  try {
    const answer = await settle(c);
    if (answer === null) {
      setStatus("No final answer yet. Pay again later: the same key gets this cart's outcome.");
    } else {
      // A cart replaced meanwhile ("New cart") keeps no answers.
      if (cart.key === c.key) {
        cart.answers.push(answer);
        // A 400 is not kept for the key (nothing was ordered): the cart
        // can be corrected and sent again with its key.
        if (answer.status === 400) cart.sent = false;
        saveCart(cart);
      }
      if (answer.status === 400) {
        setStatus("The shop refused the cart's fields; correct them and Pay again.");
      } else if (answer.status >= 400) {
        setStatus("This cart's key has its answer for good; a New cart is a new order.");
      } else {
        setStatus(answer.replayed ? "Answered again, from the shop's record of this key." : "Answered.");
      }
    }
  } finally {
    inFlight -= 1;
    render();
    await listOrders();
  }
}

async function listOrders() {
  const list = $("orders");
  try {
    const res = await fetch("/v1/orders?customer=" + encodeURIComponent(cart.customer));
    if (!res.ok) {
      list.replaceChildren();
      return;
    }
    const { data } = await res.json();
    list.replaceChildren(...data.map((o) => {
      const li = document.createElement("li");
      li.className = "order";
      li.dataset.order = o.id;
      li.textContent = `${o.id}: ${o.status}, ${o.quantity} × ${o.sku}, ${money(o.amount)}`;
      return li;
    }));
  } catch {
    list.replaceChildren();
  }
}

$("cart").addEventListener("submit", (e) => {
  e.preventDefault();
  pay();
});
$("cart").addEventListener("input", edit);
$("new-cart").addEventListener("click", () => {
  cart = newCart(cart);
  saveCart(cart);
  setStatus("A new cart, with a new key.");
  render();
  listOrders();
});
render();
if (cart.sent && cart.answers.length === 0) {
  setStatus("This cart was sent, and its answer was not seen. Pay again: the same key gets its outcome.");
}
listOrders();
