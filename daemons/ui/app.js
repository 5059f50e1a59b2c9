// mq console: plain JavaScript over the JSON API of docs/api.md (no framework, no network access needed).
// Pages (hash routes): #/ queue list, #/queue/NAME a queue, #/dlq/NAME a dead-letter queue and its redrive.
// With --auth-file every API call carries the token of the header's field (Authorization: Bearer), kept in
// sessionStorage: this tab only, gone when it closes; a 401 asks for it (docs/security.md).
"use strict";

const POLL_MS = 2000;
const SPARK_POINTS = 30;
const view = document.getElementById("view");
const errorBox = document.getElementById("error");
const live = document.getElementById("live");
let page = 0; // incremented on every navigation: pollers of an older page stop
const sendHistory = new Map(); // queue -> [{t, total}] from mq_messages_sent_total
const TOKEN_KEY = "mq-token";
const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token");
let metricsForbidden = false; // a token without admin on * may not read /metrics: no sparklines then

// -- helpers -------------------------------------------------------------------------------

function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "value") el.value = value;
    else if (value !== null && value !== undefined && value !== false) el.setAttribute(key, value === true ? "" : value);
  }
  for (const kid of kids.flat()) {
    if (kid !== null && kid !== undefined && kid !== false) el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

class ApiError extends Error {
  constructor(status, body) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
    this.code = body.error || `http_${status}`;
    this.details = body.details;
  }
}

async function api(method, path, { body, headers, text } = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers = { ...headers, Authorization: `Bearer ${token}` };
  const resp = await fetch(path, { method, body, headers });
  const raw = await resp.text();
  if (!resp.ok) {
    let parsed;
    try {
      parsed = JSON.parse(raw);
    } catch {
      parsed = { error: `http_${resp.status}`, message: raw.slice(0, 300) || resp.statusText };
    }
    throw new ApiError(resp.status, parsed);
  }
  if (text) return { resp, raw };
  return raw ? JSON.parse(raw) : null;
}

// Every queue name starting with prefix: GET / answers 1,000 a page, then next_after (docs/api.md).
async function listQueues(prefix) {
  const names = [];
  let after = "";
  do {
    const page = await api("GET", `/?prefix=${q(prefix)}${after ? `&after=${q(after)}` : ""}`);
    names.push(...page.queues);
    after = page.next_after || "";
  } while (after);
  return names;
}

function showError(err) {
  errorBox.hidden = false;
  if (err instanceof ApiError && err.status === 401) {
    // mq runs with --auth-file: ask for a token (or a valid one) in the header's field.
    const had = Boolean(sessionStorage.getItem(TOKEN_KEY));
    tokenForm.hidden = false; // shown only where mq asks for a token
    tokenForm.classList.add("needed");
    errorBox.replaceChildren(
      h("strong", {}, "401 "), h("code", { class: "code" }, err.code), ": ",
      h("span", { id: "token-prompt" }, had
        ? "the token in use is not valid: enter another in the token field above."
        : "this mq needs a token: enter yours in the token field above."),
    );
    if (document.activeElement !== tokenInput) tokenInput.focus();
    return;
  }
  if (err instanceof ApiError) {
    errorBox.replaceChildren(
      h("strong", {}, `${err.status} `), h("code", { class: "code" }, err.code), `: ${err.message}`,
      err.details ? h("div", { class: "mono" }, JSON.stringify(err.details)) : null,
    );
  } else {
    errorBox.replaceChildren(h("strong", {}, "error: "), String(err && err.message ? err.message : err));
  }
}

function clearError() {
  errorBox.hidden = true;
  errorBox.replaceChildren();
}

// Run an action from a button or form; show its API error instead of throwing.
function act(fn) {
  return async (event) => {
    if (event) event.preventDefault();
    clearError();
    const notice = document.getElementById("notice");
    if (notice) notice.replaceChildren(); // the next notice is this action's
    try {
      await fn(event);
    } catch (err) {
      showError(err);
    }
  };
}

// Call fn now and every ms while the page is the same; a failing poll shows its error and retries.
function poll(fn, ms = POLL_MS) {
  const mine = page;
  const tick = async () => {
    if (mine !== page) return;
    try {
      await fn();
      live.classList.remove("stale");
    } catch (err) {
      live.classList.add("stale");
      if (mine === page) showError(err);
    }
    if (mine === page) setTimeout(tick, ms);
  };
  tick();
}

const q = (name) => encodeURIComponent(name);
const fmtAge = (s) => (s === null || s === undefined ? "—" : s < 60 ? `${s.toFixed(1)} s` : s < 3600 ? `${(s / 60).toFixed(1)} min` : `${(s / 3600).toFixed(1)} h`);
const fmtTime = (ms) => (ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "—");

function decodeBody(b64) {
  const bytes = Uint8Array.from(atob(b64 || ""), (c) => c.charCodeAt(0));
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  return text.length > 120 ? text.slice(0, 120) + "…" : text;
}

function card(label, value, cls) {
  return h("div", { class: `card ${cls || ""}` }, h("div", { class: "n" }, value), h("div", { class: "l" }, label));
}

// The send totals per queue from /metrics (Prometheus text), remembered for the sparklines.
async function sampleSendRates() {
  if (metricsForbidden) return;
  let raw;
  try {
    ({ raw } = await api("GET", "/metrics", { text: true }));
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 403)) throw err;
    metricsForbidden = true; // the page works without sparklines
    return;
  }
  const now = Date.now();
  for (const line of raw.split("\n")) {
    const m = line.match(/^mq_messages_sent_total\{queue="((?:[^"\\]|\\.)*)"\} ([0-9.e+]+)$/);
    if (!m) continue;
    const points = sendHistory.get(m[1]) || [];
    points.push({ t: now, total: Number(m[2]) });
    if (points.length > SPARK_POINTS + 1) points.shift();
    sendHistory.set(m[1], points);
  }
}

function sparkline(queue) {
  const points = sendHistory.get(queue) || [];
  const rates = [];
  for (let i = 1; i < points.length; i++) {
    rates.push((points[i].total - points[i - 1].total) / Math.max(0.001, (points[i].t - points[i - 1].t) / 1000));
  }
  const last = rates.length ? rates[rates.length - 1] : 0;
  const max = Math.max(1, ...rates);
  const w = 90, ht = 18;
  const step = w / (SPARK_POINTS - 1); // newest point at the right edge
  const xy = rates.map((r, i) => `${w - (rates.length - 1 - i) * step},${ht - (r / max) * (ht - 2) - 1}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", w);
  svg.setAttribute("height", ht);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", xy || `0,${ht - 1}`);
  svg.append(line);
  return h("span", {}, svg, " ", h("span", { class: "rate" }, `${last.toFixed(1)}/s`));
}

// -- the queue list --------------------------------------------------------------------------

function listPage() {
  let prefix = new URLSearchParams(location.hash.split("?")[1] || "").get("prefix") || "";
  const body = h("tbody", {});
  const filter = h("input", { id: "filter", placeholder: "filter by prefix", value: prefix, pattern: "[A-Za-z0-9_.\\-]*" });  // FIFO names end .fifo
  filter.addEventListener("input", () => {
    prefix = filter.value;
    refresh().catch(showError);
  });
  const newName = h("input", { id: "new-queue", placeholder: "new queue name", required: true });
  const created = h("div", {});
  view.replaceChildren(
    h("h1", {}, "Queues"),
    h("div", { class: "row" }, filter,
      h("form", { id: "create-form", class: "row", onsubmit: act(async () => {
        const name = newName.value.trim();
        await api("PUT", `/${q(name)}`);
        newName.value = "";
        created.replaceChildren(h("div", { class: "notice" }, "Created ", h("a", { href: `#/queue/${q(name)}` }, name)));
        await refresh();
      }) }, newName, h("button", { type: "submit" }, "Create queue"))),
    created,
    h("table", { id: "queues" },
      h("thead", {}, h("tr", {}, h("th", {}, "queue"), h("th", { class: "num" }, "ready"), h("th", { class: "num" }, "in flight"),
        h("th", { class: "num" }, "delayed"), h("th", { class: "num" }, "oldest"), h("th", {}, "sends"))),
      body),
    h("p", { class: "muted", id: "count" }),
  );

  async function refresh() {
    const [queues] = await Promise.all([listQueues(prefix), sampleSendRates()]);
    const shown = queues.slice(0, 200);
    const stats = await Promise.all(shown.map((name) => api("GET", `/${q(name)}`).catch(() => null)));
    body.replaceChildren(...shown.map((name, i) => {
      const s = stats[i] || {};
      return h("tr", { "data-queue": name },
        h("td", {}, h("a", { href: `#/queue/${q(name)}` }, name)),
        h("td", { class: "num ready" }, s.ready ?? "—"),
        h("td", { class: "num in-flight" }, s.in_flight ?? "—"),
        h("td", { class: "num delayed" }, s.delayed ?? "—"),
        h("td", { class: "num oldest" }, fmtAge(s.oldest_ready_age_seconds)),
        h("td", {}, sparkline(name)));
    }));
    document.getElementById("count").textContent =
      `${queues.length} queue(s)${queues.length > shown.length ? `, first ${shown.length} shown` : ""}`;
  }
  poll(refresh);
}

// -- a queue ---------------------------------------------------------------------------------

async function sourcesOf(dlq) {
  const { queues } = await api("GET", "/");
  const attrs = await Promise.all(queues.map((name) => api("GET", `/${q(name)}/attributes`).catch(() => null)));
  return queues.filter((name, i) => attrs[i] && attrs[i].attributes.dead_letter_queue === dlq);
}

function queuePage(name) {
  const cards = h("div", { class: "cards", id: "stats" });
  const links = h("div", { class: "row", id: "links" });
  const notice = h("div", { id: "notice" });
  const say = (text) => notice.replaceChildren(h("div", { class: "notice" }, text));
  const peekBody = h("tbody", {});
  const attrForm = h("form", { id: "attributes", class: "attrs" });
  const sendBody = h("textarea", { id: "send-body", placeholder: "message body" });
  const sendType = h("input", { id: "send-type", placeholder: "text/plain; charset=utf-8" });
  const sendDelay = h("input", { id: "send-delay", type: "number", min: 0, max: 900, placeholder: "0" });
  const purgeArea = h("span", {});
  let lastPeek = "";

  const purgeButton = h("button", { id: "purge", class: "danger", type: "button", onclick: () => {
    purgeArea.replaceChildren(h("span", { class: "confirm" }, "Delete every message sent before now? ",
      h("button", { id: "purge-confirm", class: "danger", type: "button", onclick: act(async () => {
        const result = await api("POST", `/${q(name)}/purge`);
        purgeArea.replaceChildren();
        say(`Purged: ${result.removed} message(s) removed.`);
        await Promise.all([stats(), peek(true)]);
      }) }, "Yes, purge"), " ",
      h("button", { class: "secondary", type: "button", onclick: () => purgeArea.replaceChildren() }, "Cancel")));
  } }, "Purge…");

  view.replaceChildren(
    h("h1", {}, "Queue ", h("span", { class: "mono" }, name)),
    cards, links, notice,
    h("h2", {}, "Send a message"),
    h("form", { id: "send-form", onsubmit: act(async () => {
      const headers = { "Content-Type": sendType.value.trim() || "text/plain; charset=utf-8" };
      if (sendDelay.value) headers["X-Delay-Seconds"] = sendDelay.value;
      const { resp } = await api("POST", `/${q(name)}/messages`, { body: sendBody.value, headers, text: true });
      say(`Sent message ${resp.headers.get("X-Message-Id")}.`);
      sendBody.value = "";
      await Promise.all([stats(), peek(true)]);
    }) }, sendBody, h("div", { class: "row" }, "Content-Type ", sendType, " delay (s) ", sendDelay,
      h("button", { type: "submit" }, "Send"))),
    h("h2", {}, "Messages ", h("button", { id: "peek-refresh", class: "secondary", type: "button", onclick: act(() => peek(true)) }, "Refresh"),
      " ", purgeButton, " ", purgeArea),
    h("table", { id: "peek" }, h("thead", {}, h("tr", {}, ["id", "state", "receives", "sent", "content type", "attributes", "body", ""]
      .map((t) => h("th", {}, t)))), peekBody),
    h("h2", {}, "Attributes"),
    attrForm,
  );

  async function stats() {
    const s = await api("GET", `/${q(name)}`);
    cards.replaceChildren(card("ready", s.ready, "ready"), card("in flight", s.in_flight, "in-flight"),
      card("delayed", s.delayed, "delayed"), card("oldest ready", fmtAge(s.oldest_ready_age_seconds), "oldest"));
    const dlq = s.attributes.dead_letter_queue;
    links.replaceChildren(h("a", { href: "#/" }, "← all queues"),
      dlq ? h("span", {}, " · dead-letter queue: ", h("a", { href: `#/queue/${q(dlq)}` }, dlq)) : null,
      " · ", h("a", { href: `#/dlq/${q(name)}`, id: "dlq-link" }, "as a dead-letter queue (redrive)"));
  }

  async function peek(force) {
    const { messages } = await api("GET", `/${q(name)}/peek?limit=50`);
    const key = JSON.stringify(messages.map((m) => [m.message_id, m.state, m.receive_count]));
    if (!force && key === lastPeek) return;
    lastPeek = key;
    peekBody.replaceChildren(...messages.map((m) => h("tr", { "data-id": m.message_id },
      h("td", { class: "mono" }, m.message_id),
      h("td", { class: "state" }, m.state),
      h("td", { class: "num" }, m.receive_count),
      h("td", {}, fmtTime(m.sent_timestamp_ms)),
      h("td", {}, m.content_type || ""),
      h("td", { class: "mono" }, Object.keys(m.attributes || {}).length ? JSON.stringify(m.attributes) : ""),
      h("td", { class: "mono body-preview" }, decodeBody(m.body_base64)),
      h("td", {}, h("button", { class: "secondary delete", type: "button", onclick: act(async () => {
        await api("DELETE", `/${q(name)}/messages/${q(m.message_id)}`);
        say(`Deleted message ${m.message_id}.`);
        await Promise.all([stats(), peek(true)]);
      }) }, "Delete")))));
    if (!messages.length) peekBody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "no messages")));
  }

  async function attributes() {
    const { attributes: attrs } = await api("GET", `/${q(name)}/attributes`);
    const inputs = {};
    attrForm.replaceChildren(...Object.entries(attrs).flatMap(([key, value]) => {
      inputs[key] = h("input", { name: key, id: `attr-${key}`, value: value === null ? "" : String(value), placeholder: "default" });
      return [h("label", { for: `attr-${key}` }, key), inputs[key], h("span", { class: "muted" }, value === null ? "(none)" : "")];
    }), h("span", {}), h("button", { type: "submit", id: "save-attributes" }, "Save attributes"));
    attrForm.onsubmit = act(async () => {
      const changes = {};
      for (const [key, input] of Object.entries(inputs)) {
        const before = attrs[key] === null ? "" : String(attrs[key]);
        const now = input.value.trim();
        if (now === before) continue;
        changes[key] = now === "" ? null : /^-?[0-9]+$/.test(now) ? Number(now) : now;
      }
      await api("PUT", `/${q(name)}/attributes`, { body: JSON.stringify(changes), headers: { "Content-Type": "application/json" } });
      say(`Attributes saved: ${Object.keys(changes).join(", ") || "nothing changed"}.`);
      await Promise.all([attributes(), stats()]);
    });
  }

  attributes().catch(showError);
  peek(true).catch(showError);
  poll(async () => Promise.all([stats(), peek(false)]));
}

// -- a dead-letter queue ---------------------------------------------------------------------

function dlqPage(name) {
  const cards = h("div", { class: "cards", id: "stats" });
  const sources = h("ul", { id: "sources" });
  const status = h("div", { id: "redrive-status" });
  const destination = h("select", { id: "redrive-destination" }, h("option", { value: "" }, "each message's original queue"));
  const rate = h("input", { id: "redrive-rate", type: "number", min: 1, max: 10000, value: "500" });

  view.replaceChildren(
    h("h1", {}, "Dead-letter queue ", h("span", { class: "mono" }, name)),
    h("div", { class: "row" }, h("a", { href: "#/" }, "← all queues"), " · ", h("a", { href: `#/queue/${q(name)}` }, "messages and attributes")),
    cards,
    h("h2", {}, "Sources (queues whose dead_letter_queue is this one)"), sources,
    h("h2", {}, "Redrive"),
    h("form", { id: "redrive-form", class: "row", onsubmit: act(async () => {
      const body = { max_messages_per_second: Number(rate.value || 500) };
      if (destination.value) body.destination = destination.value;
      await api("POST", `/${q(name)}/redrive`, { body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
      await redrive();
    }) }, "to ", destination, " at ", rate, " messages/s ",
      h("button", { type: "submit", id: "redrive-start" }, "Start redrive"),
      h("button", { type: "button", id: "redrive-cancel", class: "danger", onclick: act(async () => {
        await api("DELETE", `/${q(name)}/redrive`);
        await redrive();
      }) }, "Cancel redrive")),
    status,
  );

  async function redrive() {
    const { task } = await api("GET", `/${q(name)}/redrive`);
    if (!task) {
      status.replaceChildren(h("p", { class: "muted" }, "No redrive has run out of this queue."));
      return;
    }
    const total = Math.max(task.to_move || 0, task.moved + task.skipped, 1);
    status.replaceChildren(
      h("p", {}, "Last task ", h("code", {}, task.task_id), ": ", h("strong", { class: "state" }, task.state),
        ` — moved `, h("span", { class: "moved" }, task.moved), ` of ${task.to_move ?? "?"}, skipped ${task.skipped}`,
        task.destination ? ` → ${task.destination}` : " → original queues", task.error ? ` (error: ${task.error})` : ""),
      h("div", { class: "progress" }, h("div", { style: `width: ${Math.min(100, (100 * (task.moved + task.skipped)) / total)}%` })),
      h("p", { class: "muted" }, `started ${fmtTime(task.started_ms)}, updated ${fmtTime(task.updated_ms)}`));
  }

  async function stats() {
    const s = await api("GET", `/${q(name)}`);
    cards.replaceChildren(card("ready", s.ready, "ready"), card("in flight", s.in_flight, "in-flight"),
      card("oldest ready", fmtAge(s.oldest_ready_age_seconds), "oldest"));
  }

  (async () => {
    const [found, { queues }] = await Promise.all([sourcesOf(name), api("GET", "/")]);
    sources.replaceChildren(...(found.length ? found.map((src) => h("li", {}, h("a", { href: `#/queue/${q(src)}` }, src)))
      : [h("li", { class: "muted" }, "none")]));
    destination.append(...queues.filter((x) => x !== name).map((x) => h("option", { value: x }, x)));
  })().catch(showError);
  poll(async () => Promise.all([stats(), redrive()]), 1000);
}

// -- routing ---------------------------------------------------------------------------------

function route() {
  page += 1;
  clearError();
  const hash = location.hash || "#/";
  let m;
  if ((m = hash.match(/^#\/queue\/([^/?]+)$/))) queuePage(decodeURIComponent(m[1]));
  else if ((m = hash.match(/^#\/dlq\/([^/?]+)$/))) dlqPage(decodeURIComponent(m[1]));
  else listPage();
}

if (sessionStorage.getItem(TOKEN_KEY)) tokenForm.hidden = false;
tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const token = tokenInput.value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  tokenInput.value = "";
  tokenForm.classList.remove("needed");
  metricsForbidden = false;
  route();
});
document.getElementById("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  metricsForbidden = false;
  route();
});

window.addEventListener("hashchange", route);
route();
