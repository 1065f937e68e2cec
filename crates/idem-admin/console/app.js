// The Idem web console: a client of the admin API (/admin/v1).
// Every value from the server is rendered with textContent / DOM APIs, never
// as HTML: stored bodies, headers and errors are attacker-controlled.
// Every POST carries a fresh Idempotency-Key per user action (the same key if
// that action is retried after a network error) and the session's CSRF token.
"use strict";

(function () {
  const API = "/admin/v1";
  const PAGE = 25;
  let session = { actor: "", csrf: null };

  // ---- DOM helpers -------------------------------------------------------

  /** An element; attrs: class, text, on<event> (functions), anything else as an attribute. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = String(value);
      else node.setAttribute(name, String(value));
    }
    append(node, children);
    return node;
  }

  function stateBadge(state) {
    return el("span", { class: "state " + String(state || "").replace(/[^a-z_]/g, ""), text: state ?? "—" });
  }

  function show(value) {
    if (value === null || value === undefined || value === "") return "—";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function link(text, hash) {
    return el("a", { href: hash, text });
  }

  function hashFor(view, params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
    const s = q.toString();
    return "#/" + view + (s ? "?" + s : "");
  }

  function pre(text, cls) {
    return el("pre", { class: cls || "body", text });
  }

  function kv(rows) {
    return el("table", { class: "kv" },
      el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, v instanceof Node ? v : show(v))))));
  }

  /** A table: columns [label, item => value or Node]. */
  function table(columns, items, empty) {
    if (!items.length) return el("p", { class: "muted empty", text: empty || "Nothing matches." });
    return el("table", { class: "list" },
      el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", { text: label })))),
      el("tbody", {}, items.map((item) => el("tr", {}, columns.map(([, get]) => {
        const v = get(item);
        return el("td", {}, v instanceof Node ? v : show(v));
      })))));
  }

  // ---- notices ------------------------------------------------------------

  const notice = () => document.getElementById("notice");

  function say(text, isError, retry) {
    const n = notice();
    n.textContent = "";
    n.className = "notice" + (isError ? " error" : "");
    n.appendChild(document.createTextNode(text));
    if (retry) n.appendChild(el("button", { type: "button", id: "retry", text: "Retry", onclick: retry }));
    n.hidden = false;
  }

  function clearNotice() {
    notice().hidden = true;
    notice().textContent = "";
  }

  // ---- HTTP ---------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem) {
      const title = (problem && problem.title) || "HTTP " + status;
      super(problem && problem.detail ? title + ": " + problem.detail : title);
      this.status = status;
      this.problem = problem;
    }
  }

  async function readJson(res, reviver) {
    const type = res.headers.get("content-type") || "";
    if (!type.includes("json")) return null;
    try { return JSON.parse(await res.text(), reviver); } catch { return null; }
  }

  /**
   * A JSON.parse reviver for a client's JSON (a task's payload and result):
   * a number a double would change (123456789012345678901234567890, 1.50)
   * is kept as the text the server wrote (JSON.rawJSON), so JSON.stringify
   * shows it as it is stored. Browsers without source text access show the
   * double, as before.
   */
  function exactNumbers(key, value, context) {
    if (typeof value !== "number" || typeof JSON.rawJSON !== "function") return value;
    const source = context && context.source;
    return typeof source !== "string" || String(value) === source ? value : JSON.rawJSON(source);
  }

  async function get(path, params, reviver) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params || {})) if (v !== null && v !== undefined && v !== "") q.set(k, v);
    const url = API + path + (q.toString() ? "?" + q : "");
    const res = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (res.status === 401) return toLogin();
    const body = await readJson(res, reviver);
    if (!res.ok) throw new ApiError(res.status, body);
    return body;
  }

  function randomKey() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return "console-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  /**
   * A state-changing action: one Idempotency-Key for this user action; a
   * network error offers a retry that sends the same key again.
   */
  async function act(label, path, body, done) {
    const key = randomKey();
    const attempt = async () => {
      clearNotice();
      let res;
      try {
        res = await fetch(API + path, {
          method: "POST",
          credentials: "same-origin",
          headers: {
            "Content-Type": "application/json",
            Accept: "application/json",
            "Idempotency-Key": key,
            "X-CSRF-Token": session.csrf || "",
          },
          body: JSON.stringify(body),
        });
      } catch (e) {
        say(label + ": the server could not be reached. Retrying sends the same request (same key).", true, attempt);
        return;
      }
      if (res.status === 401) return toLogin();
      const answer = await readJson(res);
      if (!res.ok) {
        say(label + " failed: " + new ApiError(res.status, answer).message, true);
        return;
      }
      say(label + ": done" + (answer && answer.message ? " — " + answer.message : "") + ".", false);
      if (done) await done(answer);
    };
    await attempt();
  }

  function toLogin() {
    window.location.assign("/console/login");
    return new Promise(() => {});
  }

  // ---- filters and pagination ------------------------------------------------

  /** fields: [name, label, options?] (options → a select). */
  function filters(view, params, fields) {
    const form = el("form", { class: "filters", id: "filters" });
    for (const [name, label, options] of fields) {
      let input;
      if (options) {
        input = el("select", { name, id: "f-" + name }, el("option", { value: "", text: "any" }),
          options.map((o) => el("option", { value: o, text: o })));
        input.value = params.get(name) || "";
      } else {
        input = el("input", { name, id: "f-" + name, size: 18 });
        input.value = params.get(name) || "";
      }
      form.appendChild(el("label", {}, label, input));
    }
    form.appendChild(el("button", { type: "submit", class: "primary", text: "Filter" }));
    form.appendChild(el("button", { type: "button", text: "Clear", onclick: () => { location.hash = hashFor(view, {}); } }));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const next = {};
      for (const [name] of fields) next[name] = form.elements[name].value.trim();
      location.hash = hashFor(view, next);
    });
    return form;
  }

  function pager(view, params, nextCursor) {
    const base = Object.fromEntries(params.entries());
    const hasCursor = !!base.cursor;
    delete base.cursor;
    return el("div", { class: "pager" },
      el("button", { type: "button", text: "First", disabled: !hasCursor, onclick: () => { location.hash = hashFor(view, base); } }),
      el("button", { type: "button", text: "Next", id: "next-page", disabled: !nextCursor,
        onclick: () => { location.hash = hashFor(view, { ...base, cursor: nextCursor }); } }));
  }

  function listParams(params, names) {
    const out = { limit: PAGE };
    for (const n of [...names, "cursor"]) if (params.get(n)) out[n] = params.get(n);
    return out;
  }

  // ---- views ----------------------------------------------------------------

  const views = {};

  views.overview = async () => {
    const o = await get("/overview");
    const req = o.requests || {};
    const outcomes = req.outcomes || {};
    const total = Object.values(outcomes).reduce((a, b) => a + Number(b || 0), 0);
    const dead = Number(o.outbox?.dead || 0) + Number(o.webhooks?.dead || 0);
    const attention = Number(o.runs?.needs_attention || 0);
    const figure = (label, value, bad, href) => el("div", { class: "card" },
      el("div", { class: "muted", text: label }),
      el("div", { class: "figure" + (bad ? " bad" : "") }, href ? link(show(value), href) : show(value)));
    const age = o.outbox?.oldest_pending_age_ms;
    return [
      el("h1", { text: "Overview" }),
      el("div", { class: "grid" },
        figure("Requests, last " + (req.window_minutes || 60) + " min", total),
        figure("Outbox pending (oldest " + (age === null || age === undefined ? "—" : (age / 1000).toFixed(1) + " s") + ")", o.outbox?.pending ?? 0, false, "#/outbox"),
        figure("Dead (outbox + webhooks)", dead, dead > 0, Number(o.outbox?.dead || 0) > 0 || !Number(o.webhooks?.dead || 0) ? "#/outbox?state=dead" : "#/webhooks?state=dead"),
        figure("Runs needing attention", attention, attention > 0, hashFor("runs", { state: "needs_attention" }))),
      el("div", { class: "card", id: "requests" },
        el("h2", { text: "Request outcomes, last hour" }),
        chart(req.per_minute || []),
        table([["Outcome", (r) => r[0]], ["Requests", (r) => r[1]]], Object.entries(outcomes), "No requests in the last hour.")),
      el("div", { class: "grid" },
        counts("Outbox", o.outbox, ["pending", "dead"], "outbox"),
        counts("Webhook receipts", o.webhooks, null, "webhooks"),
        counts("Runs", o.runs, null, "runs"),
        counts("Keys", o.keys, null, "keys")),
    ];
  };

  function counts(title, obj, only, view) {
    const rows = Object.entries(obj || {}).filter(([k, v]) => typeof v === "number" && (!only || only.includes(k)));
    return el("div", { class: "card" }, el("h2", {}, link(title, "#/" + view)),
      table([["State", (r) => (view === "outbox" ? r[0] : link(r[0], hashFor(view, { state: r[0] })))], ["Count", (r) => r[1]]], rows, "None."));
  }

  /** Requests per minute as stacked bars: executed, replayed, every other outcome. */
  function chart(perMinute) {
    const W = 1280, H = 110, pad = 24;
    const rows = perMinute.slice(-60).map((m) => {
      const oc = m.outcomes || {};
      const executed = Number(oc.executed || 0), replayed = Number(oc.replayed || 0);
      const all = Object.values(oc).reduce((a, b) => a + Number(b || 0), 0);
      return { minute: m.minute, executed, replayed, other: all - executed - replayed, all };
    });
    const max = Math.max(1, ...rows.map((r) => r.all));
    const slot = (W - pad) / 60;
    const s = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H + 14}`, role: "img", "aria-label": "requests per minute" });
    s.appendChild(svg("line", { x1: pad, y1: H, x2: W, y2: H }));
    s.appendChild(svg("text", { x: 0, y: 10, text: String(max) }));
    s.appendChild(svg("text", { x: 0, y: H, text: "0" }));
    s.appendChild(svg("text", { x: pad, y: H + 12, text: "−60 min" }));
    s.appendChild(svg("text", { x: W - 22, y: H + 12, text: "now" }));
    const offset = 60 - rows.length;
    rows.forEach((r, i) => {
      let y = H;
      const x = pad + (offset + i) * slot + 1;
      for (const part of ["executed", "replayed", "other"]) {
        const h = (r[part] / max) * (H - 8);
        if (h <= 0) continue;
        y -= h;
        s.appendChild(svg("rect", { class: part, x, y, width: Math.max(1, slot - 2), height: h },
          svg("title", { text: `${r.minute}: ${part} ${r[part]}` })));
      }
    });
    return el("div", {}, s, el("div", { class: "legend" },
      el("span", {}, el("i", { class: "executed" }), "executed"),
      el("span", {}, el("i", { class: "replayed" }), "replayed"),
      el("span", {}, el("i", { class: "other" }), "other (mismatch, in flight, refused, …)")));
  }

  views.keys = async (params) => {
    const page = await get("/keys", listParams(params, ["tenant", "operation", "prefix", "state"]));
    return [
      el("h1", { text: "Keys" }),
      filters("keys", params, [["tenant", "Tenant"], ["operation", "Operation"], ["prefix", "Key prefix"], ["state", "State", ["pending", "completed", "failed"]]]),
      table([
        ["Tenant", (k) => k.tenant],
        ["Operation", (k) => k.operation],
        ["Key", (k) => link(k.key, hashFor("key", { tenant: k.tenant, operation: k.operation, key: k.key }))],
        ["State", (k) => stateBadge(k.state)],
        ["Status", (k) => k.status],
        ["Leased", (k) => (k.leased ? "yes, until " + show(k.locked_until) : "no")],
        ["Updated", (k) => k.updated_at],
        ["Expires", (k) => k.expires_at],
      ], page.items, "No key records match."),
      pager("keys", params, page.next_cursor),
    ];
  };

  views.key = async (params) => {
    const q = { tenant: params.get("tenant"), operation: params.get("operation"), key: params.get("key") };
    const k = await get("/key", q);
    const r = k.response;
    const out = [
      el("h1", {}, "Key ", el("code", { text: k.key })),
      el("p", {}, link("← Keys", hashFor("keys", { tenant: k.tenant, operation: k.operation }))),
      el("div", { class: "card" }, kv([
        ["Tenant", k.tenant], ["Operation", k.operation], ["Key", el("code", { text: k.key })],
        ["State", stateBadge(k.state)], ["Fingerprint", el("code", { text: show(k.fingerprint) })],
        ["Lease", k.leased ? "held until " + show(k.locked_until) : "none"],
        ["Resource", k.resource ? k.resource.type + " " + k.resource.id : null],
        ["Recovery point", k.recovery_point],
        ["On unknown outcome", k.on_unknown],
        ["Created", k.created_at], ["Updated", k.updated_at], ["Expires", k.expires_at],
      ])),
    ];
    if (k.state === "pending" && k.leased) {
      // Releasing deletes the record: the next retry forwards the request
      // again. Unless the upstream deduplicates (on_unknown "reforward"),
      // that is a second effect if the first landed, so the operator says
      // they looked it up; a live lease's forward may still be running.
      const mustCheck = k.on_unknown !== "reforward";
      const force = el("input", { type: "checkbox", id: "force" });
      const checked = el("input", { type: "checkbox", id: "upstream-checked" });
      const button = el("button", { type: "button", class: "danger", id: "release", text: "Release this pending key",
        onclick: () => act("Release", "/keys/release",
          { ...q, force: force.checked, upstream_checked: checked.checked }, () => render()) });
      const sync = () => { button.disabled = mustCheck && !checked.checked; };
      checked.addEventListener("change", sync);
      sync();
      const box = el("div", { class: "actions", id: "release-box" },
        el("p", { id: "release-warning", text: "Releasing deletes this record: the next retry with this key forwards the request again. " +
          "A forward its holder already sent keeps running upstream and may still land there, even after a release." }),
        el("label", {}, force, " release even if its lease is live"));
      if (mustCheck) {
        box.appendChild(el("label", {}, checked,
          " I looked this request up upstream: it did not land there, and no forward of it is still running " +
          "(this route's upstream does not deduplicate: on_unknown " + show(k.on_unknown) + ")"));
      }
      box.appendChild(button);
      out.push(box);
    }
    const resp = el("div", { class: "card", id: "stored-response" }, el("h2", { text: "Stored response" }));
    if (!r) resp.appendChild(el("p", { class: "muted", text: "No stored response." }));
    else {
      resp.appendChild(kv([["Status", r.status], ["Body size", r.body_bytes + " bytes"]]));
      resp.appendChild(el("h2", { text: "Headers" }));
      resp.appendChild(table([["Name", (h) => h[0]], ["Value", (h) => h[1]]], r.headers || [], "No headers."));
      resp.appendChild(el("h2", { text: "Body" }));
      if (r.body !== null && r.body !== undefined) resp.appendChild(pre(r.body, "body response-body"));
      else if (r.body_base64) resp.appendChild(el("div", {}, el("p", { class: "muted", text: "Not UTF-8; base64:" }), pre(r.body_base64)));
      else resp.appendChild(el("p", { class: "muted", text: "Empty." }));
    }
    out.push(resp);
    return out;
  };

  views.outbox = async (params) => {
    const [summary, page] = await Promise.all([
      get("/outbox"),
      get("/outbox/messages", listParams(params, ["state", "topic"])),
    ]);
    const age = summary.oldest_pending_age_ms;
    return [
      el("h1", { text: "Outbox" }),
      el("div", { class: "grid" },
        el("div", { class: "card" }, el("div", { class: "muted", text: "Pending" }), el("div", { class: "figure", text: show(summary.pending) })),
        el("div", { class: "card" }, el("div", { class: "muted", text: "Oldest pending" }), el("div", { class: "figure", text: age === null || age === undefined ? "—" : (age / 1000).toFixed(1) + " s" })),
        el("div", { class: "card" }, el("div", { class: "muted", text: "Dead" }), el("div", { class: "figure" + (summary.dead ? " bad" : ""), text: show(summary.dead) }))),
      filters("outbox", params, [["state", "State", ["pending", "dead", "sent"]], ["topic", "Topic"]]),
      table([
        ["Id", (m) => m.id],
        ["Message id", (m) => el("code", { text: show(m.message_id) })],
        ["Topic", (m) => m.topic],
        ["State", (m) => stateBadge(m.state)],
        ["Attempts", (m) => m.attempts],
        ["Last error", (m) => m.last_error],
        ["Created", (m) => m.created_at],
        ["Available", (m) => m.available_at],
        ["Payload", (m) => el("details", {}, el("summary", { text: "show" }),
          pre(m.payload ?? (m.payload_base64 ? "base64: " + m.payload_base64 : "")),
          table([["Header", (h) => h[0]], ["Value", (h) => h[1]]], m.headers || [], "No headers."))],
        ["", (m) => (m.state === "dead"
          ? el("button", { type: "button", text: "Requeue", onclick: () => act("Requeue " + m.message_id, "/outbox/requeue", { message_id: m.message_id }, () => render()) })
          : "")],
      ], page.items, "No messages match."),
      pager("outbox", params, page.next_cursor),
    ];
  };

  const RECEIPT_STATES = ["received", "processed", "failed", "dead", "stale"];

  function replayButton(r, id) {
    return el("button", { type: "button", id, class: "replay", text: "Replay",
      onclick: () => act("Replay " + r.delivery_id, "/webhooks/replay", { endpoint: r.endpoint, delivery_id: r.delivery_id }, () => render()) });
  }

  views.webhooks = async (params) => {
    const page = await get("/webhooks/receipts", listParams(params, ["endpoint", "state"]));
    return [
      el("h1", { text: "Webhook receipts" }),
      filters("webhooks", params, [["endpoint", "Endpoint"], ["state", "State", RECEIPT_STATES]]),
      table([
        ["Endpoint", (r) => r.endpoint],
        ["Delivery", (r) => link(r.delivery_id, hashFor("receipt", { endpoint: r.endpoint, delivery_id: r.delivery_id }))],
        ["Event", (r) => r.event_type],
        ["State", (r) => stateBadge(r.state)],
        ["Attempts", (r) => r.attempts],
        ["Last error", (r) => r.last_error],
        ["Received", (r) => r.received_at],
        ["Finished", (r) => r.finished_at],
        ["", (r) => (r.state === "dead" ? replayButton(r) : "")],
      ], page.items, "No receipts match."),
      pager("webhooks", params, page.next_cursor),
    ];
  };

  views.receipt = async (params) => {
    const r = await get("/webhooks/receipt", { endpoint: params.get("endpoint"), delivery_id: params.get("delivery_id") });
    return [
      el("h1", {}, "Delivery ", el("code", { text: r.delivery_id })),
      el("p", {}, link("← Receipts", hashFor("webhooks", { endpoint: r.endpoint }))),
      el("div", { class: "card" }, kv([
        ["Endpoint", r.endpoint], ["Delivery id", r.delivery_id], ["Event type", r.event_type],
        ["State", stateBadge(r.state)], ["Attempts", r.attempts], ["Last error", r.last_error],
        ["Entity", r.entity_id ? r.entity_id + " v" + show(r.entity_version) : null],
        ["Received", r.received_at], ["Finished", r.finished_at],
      ])),
      el("div", { class: "actions" }, replayButton(r, "replay"),
        el("span", { class: "muted", text: "A dead or failed delivery is run again; a processed one is left alone." })),
      el("div", { class: "card" }, el("h2", { text: "Headers (signatures are never shown)" }),
        table([["Name", (h) => h[0]], ["Value", (h) => h[1]]], r.headers || [], "No headers."),
        el("h2", { text: "Body (" + show(r.body_bytes) + " bytes)" }),
        r.body !== null && r.body !== undefined ? pre(r.body) : el("p", { class: "muted", text: "Not UTF-8." })),
    ];
  };

  /** A run's failure: {reason, step, detail} or text. */
  function failureText(f) {
    if (f === null || f === undefined) return null;
    if (typeof f !== "object") return String(f);
    return [f.reason, f.step ? "at step " + f.step : null, f.detail].filter(Boolean).join(" — ");
  }

  const RUN_STATES = ["running", "compensating", "needs_attention", "completed", "failed"];

  views.runs = async (params) => {
    const page = await get("/runs", listParams(params, ["state", "operation"]));
    return [
      el("h1", { text: "Runs" }),
      filters("runs", params, [["state", "State", RUN_STATES], ["operation", "Operation"]]),
      table([
        ["Run", (r) => link(r.id, hashFor("run", { id: r.id }))],
        ["Operation", (r) => r.operation],
        ["Tenant", (r) => r.tenant],
        ["Key", (r) => r.key],
        ["State", (r) => stateBadge(r.state)],
        ["Holder", (r) => r.holder],
        ["Fence", (r) => r.fence],
        ["Lease until", (r) => r.locked_until],
        ["Failure", (r) => failureText(r.failure)],
        ["Updated", (r) => r.updated_at],
      ], page.items, "No runs match."),
      pager("runs", params, page.next_cursor),
    ];
  };

  views.run = async (params) => {
    const id = params.get("id") || "";
    const r = await get("/runs/" + encodeURIComponent(id));
    const path = "/runs/" + encodeURIComponent(r.id);
    const actions = el("div", { class: "actions", id: "run-actions" });
    if (r.state === "needs_attention") {
      actions.append(
        el("span", { text: "An at-most-once step's outcome is unknown. Resolve it:" }),
        el("button", { type: "button", id: "resolve-sent", class: "primary", text: "It was sent",
          onclick: () => act("Resolve as sent", path + "/resolve", { as: "sent" }, () => render()) }),
        el("button", { type: "button", id: "resolve-not-sent", text: "It was not sent",
          onclick: () => act("Resolve as not sent", path + "/resolve", { as: "not_sent" }, () => render()) }));
    }
    if (r.state === "running" || r.state === "compensating") {
      actions.append(el("button", { type: "button", id: "resume", text: "Resume now (end the lease)",
        onclick: () => act("Resume", path + "/resume", {}, () => render()) }));
    }
    return [
      el("h1", {}, "Run ", el("code", { text: r.id })),
      el("p", {}, link("← Runs", "#/runs")),
      el("div", { class: "card" }, kv([
        ["State", el("span", { id: "run-state" }, stateBadge(r.state))],
        ["Operation", r.operation], ["Tenant", r.tenant], ["Key", r.key],
        ["Holder", r.holder], ["Fence", r.fence], ["Lease until", r.locked_until],
        ["Takeovers", r.takeovers], ["Blocked at step", r.blocked_step], ["Attention", r.attention],
        ["Failure", failureText(r.failure)], ["Deadline", r.deadline],
        ["Created", r.created_at], ["Updated", r.updated_at], ["Finished", r.finished_at],
      ])),
      actions,
      el("h2", { text: "Steps" }),
      timeline(r.steps || []),
    ];
  };

  function timeline(steps) {
    if (!steps.length) return el("p", { class: "muted", text: "No step has started." });
    return el("ol", { class: "timeline", id: "timeline" }, steps.map((s) => {
      const extra = [];
      if (s.derived_key) extra.push(["Derived key", el("code", { text: s.derived_key })]);
      if (s.message_id) extra.push(["Message id", el("code", { text: s.message_id })]);
      if (s.failure) extra.push(["Failure", s.failure]);
      if (s.result !== null && s.result !== undefined) extra.push(["Result", pre(typeof s.result === "string" ? s.result : JSON.stringify(s.result, null, 2))]);
      if (typeof s.compensation === "boolean") extra.push(["Compensation", s.compensation ? "yes (an undo step)" : "no"]);
      else if (s.compensation !== null && s.compensation !== undefined) extra.push(["Compensation", pre(JSON.stringify(s.compensation, null, 2))]);
      return el("li", { class: String(s.state || "").replace(/[^a-z_]/g, "") },
        el("div", { class: "step-head" },
          el("strong", { text: s.name }), stateBadge(s.state),
          s.kind ? el("span", { class: "muted", text: s.kind }) : null,
          el("span", { class: "muted", text: "attempts " + show(s.attempts) + (s.failures ? ", failures " + s.failures : "") + (s.fence !== undefined ? ", fence " + show(s.fence) : "") }),
          el("span", { class: "muted", text: show(s.started_at) + " → " + show(s.finished_at) })),
        extra.length ? kv(extra) : null);
    }));
  }

  const TASK_STATES = ["ready", "claimed", "done", "dead", "needs_attention"];

  views.tasks = async (params) => {
    const page = await get("/tasks", listParams(params, ["queue", "state"]));
    return [
      el("h1", { text: "Tasks" }),
      filters("tasks", params, [["queue", "Queue"], ["state", "State", TASK_STATES]]),
      table([
        ["Task", (t) => link(t.id, hashFor("task", { id: t.id }))],
        ["Queue", (t) => t.queue],
        ["Tenant", (t) => t.tenant],
        ["Key", (t) => t.key],
        ["State", (t) => stateBadge(t.state)],
        ["Attempt", (t) => show(t.attempt) + " of " + show(t.max_attempts)],
        ["Holder", (t) => t.holder],
        ["Fence", (t) => t.fence],
        ["Lease until", (t) => t.lease_expires_at],
        ["Created", (t) => t.created_at],
      ], page.items, "No tasks match."),
      pager("tasks", params, page.next_cursor),
    ];
  };

  views.task = async (params) => {
    const id = params.get("id") || "";
    const t = await get("/tasks/" + encodeURIComponent(id), null, exactNumbers);
    const path = "/tasks/" + encodeURIComponent(t.id);
    const actions = el("div", { class: "actions", id: "task-actions" });
    if (t.state === "needs_attention") {
      // The action whose outcome is unknown: the last one the timeline names.
      const asked = (t.timeline || []).filter((e) => e.kind === "action" && e.detail);
      const last = asked.length ? asked[asked.length - 1].detail : "";
      const name = (last.match(/ ([A-Za-z0-9._-]+): /) || [])[1] || "";
      actions.append(
        el("span", { text: "The outcome of " + (name || "an action") + " is unknown. Check the other system by its key, then:" }),
        el("button", { type: "button", id: "task-resolve-sent", class: "primary", text: "It was sent",
          onclick: () => act("Resolve as sent", path + "/resolve", { action: name, as: "sent" }, () => render()) }),
        el("button", { type: "button", id: "task-resolve-not-sent", text: "It was not sent",
          onclick: () => act("Resolve as not sent", path + "/resolve", { action: name, as: "not_sent" }, () => render()) }));
    }
    if (t.state === "dead" || t.state === "needs_attention") {
      actions.append(el("button", { type: "button", id: "task-retry", text: "Retry (one more attempt)",
        onclick: () => act("Retry", path + "/retry", {}, () => render()) }));
    }
    return [
      el("h1", {}, "Task ", el("code", { text: t.id })),
      el("p", {}, link("← Tasks", "#/tasks")),
      el("div", { class: "card" }, kv([
        ["State", el("span", { id: "task-state" }, stateBadge(t.state))],
        ["Queue", t.queue], ["Tenant", t.tenant], ["Key", t.key],
        ["Attempt", show(t.attempt) + " of " + show(t.max_attempts)],
        ["Holder", t.holder], ["Fence", t.fence], ["Lease until", t.lease_expires_at],
        ["Last error", t.last_error], ["Payload", pre(JSON.stringify(t.payload, null, 2))],
        ["Result", t.result === null || t.result === undefined ? null : pre(JSON.stringify(t.result, null, 2))],
        ["Created", t.created_at], ["Finished", t.finished_at],
      ])),
      actions,
      el("h2", { text: "Timeline" }),
      el("ol", { class: "timeline", id: "task-timeline" }, (t.timeline || []).map((e) =>
        el("li", { class: String(e.kind || "").replace(/[^a-z_]/g, "") },
          el("div", { class: "step-head" },
            el("strong", { text: e.kind }),
            el("span", { class: "muted", text: (e.actor ? e.actor + ", " : "") + (e.fence !== null && e.fence !== undefined ? "fence " + e.fence + ", " : "") + show(e.at) }),
            e.detail ? el("span", { text: e.detail }) : null)))),
    ];
  };

  views.audit = async (params) => {
    const page = await get("/audit", listParams(params, ["action"]));
    return [
      el("h1", { text: "Audit log" }),
      filters("audit", params, [["action", "Action"]]),
      table([
        ["At", (a) => a.at],
        ["Actor", (a) => a.actor],
        ["Action", (a) => a.action],
        ["Target", (a) => a.target],
        ["Detail", (a) => el("code", { text: JSON.stringify(a.detail ?? null) })],
        ["Idempotency key", (a) => el("code", { text: show(a.idempotency_key) })],
      ], page.items, "No actions recorded."),
      pager("audit", params, page.next_cursor),
    ];
  };

  // ---- routing ----------------------------------------------------------------

  const NAV = { key: "keys", receipt: "webhooks", run: "runs", task: "tasks" };
  let rendering = 0;

  async function render() {
    const ticket = ++rendering;
    const raw = location.hash.replace(/^#\/?/, "");
    const [name, query] = raw.split("?", 2);
    const view = Object.hasOwn(views, name) ? name : "overview";
    const params = new URLSearchParams(query || "");
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === (NAV[view] || view));
    const main = document.getElementById("view");
    try {
      const nodes = await views[view](params);
      if (ticket !== rendering) return;
      main.replaceChildren(...[nodes].flat());
      document.title = "Idem console — " + view;
    } catch (e) {
      if (ticket !== rendering) return;
      main.replaceChildren(el("h1", { text: "Could not load " + view }), el("p", { class: "notice error", text: e.message || String(e) }));
    }
  }

  async function start() {
    try {
      const res = await fetch("/console/api/session", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (res.status === 401) return toLogin();
      session = await res.json();
    } catch (e) {
      say("The server could not be reached: " + e.message, true, () => start());
      return;
    }
    document.getElementById("who").textContent = session.actor;
    document.getElementById("logout").addEventListener("click", async () => {
      await fetch("/console/logout", { method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": session.csrf || "" } });
      toLogin();
    });
    window.addEventListener("hashchange", () => { clearNotice(); render(); });
    await render();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
