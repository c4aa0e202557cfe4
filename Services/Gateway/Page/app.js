// The web Live Activity: one card per dispatch of the user, live from the
// gateway's event streams. Plain JS, no framework, nothing from elsewhere.
"use strict";

const store = {
  get(key, fallback) {
    try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
  },
  set(key, value) { localStorage.setItem(key, JSON.stringify(value)); },
};

const TERMINAL = new Set(["replied", "failed", "cancelled"]);
const $ = (id) => document.getElementById(id);
const cards = new Map(); // id → {el, event, receivedAt, lastSeq, local, previewText}
let token = store.get("fd.token", "");
let targetsCache = store.get("fd.targets", null);

// A token in the address (#token=…) is kept, then removed from the address.
if (location.hash.startsWith("#token=")) {
  token = decodeURIComponent(location.hash.slice(7));
  store.set("fd.token", token);
  history.replaceState(null, "", location.pathname);
}

function newID() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

async function api(method, path, body, extraHeaders) {
  const headers = { Authorization: `Bearer ${token}`, ...(extraHeaders || {}) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let json = null;
  if (response.status !== 204) { try { json = await response.json(); } catch { json = null; } }
  return { status: response.status, json };
}

// MARK: Which dispatches are open (survives reload) and what waits offline.

function rememberOpen(id, seq) {
  const open = store.get("fd.open", {});
  open[id] = seq;
  store.set("fd.open", open);
}
function forgetOpen(id) {
  const open = store.get("fd.open", {});
  delete open[id];
  store.set("fd.open", open);
}
function outbox() { return store.get("fd.outbox", []); }
function setOutbox(list) { store.set("fd.outbox", list); }

// MARK: Rendering

function fmtElapsed(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, "0")} elapsed`;
}

function routeName(project, target) {
  if (!project || !target) return "Routing…";
  return `${project.name} · ${target.name}`;
}

function cardFor(id) {
  let card = cards.get(id);
  if (card) return card;
  const el = $("activity-template").content.firstElementChild.cloneNode(true);
  el.dataset.id = id;
  el.querySelector(".cancel").addEventListener("click", () => cancel(id));
  el.querySelector(".open").addEventListener("click", () => toggleOpen(id));
  el.querySelector(".edit").addEventListener("click", () => toggleEdit(id));
  $("activities").prepend(el);
  card = { el, event: null, receivedAt: 0, lastSeq: 0, local: null, previewText: "" };
  cards.set(id, card);
  $("empty").hidden = true;
  return card;
}

function setAccent(el, color) {
  if (color && /^#[0-9a-fA-F]{3,8}$/.test(color)) el.style.setProperty("--accent", color);
}

function renderSteps(el, state, step) {
  // Bars: routing, sending, replied. Done = filled, current = pulsing (not while queued).
  const done = { drafted: 0, routing: 0, sending: 1, replied: 3 }[state] ?? Math.min(step, 3);
  const current = { drafted: 1, routing: 1, sending: 2, queued: Math.min(step + 1, 3) }[state] ?? 0;
  const mark = (node, i) => { node.className = i < done ? "done" : i + 1 === current ? "current" : ""; };
  el.querySelectorAll(".bars i").forEach(mark);
  el.querySelectorAll(".steps li").forEach(mark);
  const labels = el.querySelectorAll(".steps li");
  labels[0].textContent = state === "queued" && step === 0 ? "Drafted" : "Routing";
  labels[1].textContent = state === "queued" ? "Queued" : "Sending";
}

// Preview lines: words already shown stay; new ones fade in.
function renderPreview(card, lines) {
  const box = card.el.querySelector(".preview");
  const text = lines.join("\n");
  const before = card.previewText;
  card.previewText = text;
  box.replaceChildren();
  let shown = 0;
  const keep = text.startsWith(before) ? before.length : 0;
  for (const line of lines) {
    const p = document.createElement("p");
    const words = line.split(/(\s+)/);
    for (const w of words) {
      const span = document.createElement("span");
      span.textContent = w;
      if (w.trim()) {
        span.className = shown >= keep ? "word fresh" : "word";
      }
      shown += w.length;
      p.appendChild(span);
    }
    shown += 1;
    box.appendChild(p);
  }
}

function render(id) {
  const card = cards.get(id);
  if (!card) return;
  const { el } = card;
  const e = card.event;
  const local = card.local;
  const state = e ? e.state : "queued";
  el.className = `activity state-${state}${local ? " local" : ""}`;
  el.dataset.state = state;
  const project = e?.project ?? local?.project;
  const target = e?.target ?? local?.target;
  setAccent(el, project?.accent);
  el.querySelector(".glyph").textContent = project?.glyph ?? "FD";
  el.querySelector(".title").textContent =
    state === "queued" ? "Front Desk · queued" : TERMINAL.has(state) ? `Front Desk · ${state}` : "Front Desk · live";
  el.querySelector(".route").textContent = routeName(project, target);
  el.querySelector(".echo").textContent = e?.input ?? local?.input ?? "";
  renderSteps(el, state, e?.step ?? 0);

  let line = e?.activity ?? "Queued — will dispatch on reconnect";
  if (state === "sending") line = `${e.activity} · step 2 / 3`;
  if (state === "failed" && e.error) line = `Failed — ${e.error.message || e.error.code}`;
  if (state === "cancelled") line = `Cancelled${e.cancel?.reason ? ` — ${e.cancel.reason}` : ""}`;
  el.querySelector(".line").textContent = line;
  el.querySelector(".line").hidden = state === "queued"; // the queued box says it

  const preview = state === "sending" || state === "replied" ? e.preview ?? [] : [];
  if (preview.join("\n") !== card.previewText) renderPreview(card, preview);

  const queued = state === "queued";
  el.querySelector(".queued-box").hidden = !queued;
  if (queued) {
    const waitingFor = local ? "No connection · will dispatch on reconnect" :
      e?.queue?.reason === "retry_wait" ? "Agent busy · will retry by itself" : "Agent offline · will dispatch on reconnect";
    el.querySelector(".footer").textContent = waitingFor;
    el.querySelector(".best-route").textContent = project && target ? `${project.name} / ${target.name}` : "—";
  }
  const reply = el.querySelector(".reply");
  if (state === "replied" && e.reply !== undefined) reply.textContent = e.reply;
  tick(id);
}

function tick(id) {
  const card = cards.get(id);
  if (!card) return;
  const e = card.event;
  const now = Date.now();
  let elapsed = 0;
  if (e) {
    elapsed = (e.elapsedMs || 0) + (TERMINAL.has(e.state) ? 0 : now - card.receivedAt);
  } else if (card.local) {
    elapsed = now - card.local.createdAt;
  }
  card.el.querySelector(".elapsed").textContent = fmtElapsed(elapsed);
  const eta = card.el.querySelector(".eta");
  if (e && e.state === "sending" && typeof e.etaMs === "number") {
    const left = Math.max(0, Math.ceil((e.etaMs - (now - card.receivedAt)) / 1000));
    eta.textContent = `~${left}s left`;
    eta.hidden = false;
  } else {
    eta.hidden = true;
  }
}
setInterval(() => { for (const id of cards.keys()) tick(id); }, 250);
// The browser may say "online" while the gateway cannot be reached (or
// answers 503): what waits in the outbox is tried again every few seconds,
// not only on the browser's "online" event.
setInterval(() => { if (token && (outbox().length || cancelsToSend().length)) flushOutbox(); }, 3000);
// Another tab sent or cancelled a request this one shows waiting: the card follows.
window.addEventListener("storage", (ev) => {
  if (ev.key !== "fd.outbox") return;
  const waiting = new Set(outbox().map((r) => r.id));
  const cancelled = cancelledLocally();
  for (const [id, card] of cards) {
    if (!card.local || waiting.has(id)) continue;
    if (cancelled.includes(id)) showCancelledLocally(id, card.local);
    else { rememberOpen(id, 0); follow(id); }
  }
});

function show(id, event) {
  const card = cardFor(id);
  if (card.event && event.seq <= card.lastSeq) return; // a repeat, or older
  card.event = event;
  card.lastSeq = event.seq;
  card.receivedAt = Date.now();
  card.local = null;
  if (TERMINAL.has(event.state)) forgetOpen(id); else rememberOpen(id, event.seq);
  render(id);
}

// MARK: Event streams (fetch, so the token goes in a header; resumes after Last-Event-ID)

const streams = new Map();

async function follow(id) {
  if (streams.get(id)) return;
  streams.set(id, true);
  let failures = 0;
  try {
    while (true) {
      const card = cards.get(id);
      if (card?.event && TERMINAL.has(card.event.state)) return;
      try {
        const headers = { Authorization: `Bearer ${token}` };
        if (card?.lastSeq) headers["Last-Event-ID"] = String(card.lastSeq);
        const response = await fetch(`/v1/dispatches/${encodeURIComponent(id)}/events`, { headers, cache: "no-store" });
        if (response.status === 404 || response.status === 401) {
          if (response.status === 404) forgetOpen(id);
          // Sent from another tab, and refused there: not left "queued" here.
          if (response.status === 404 && card?.local) refusedLocally(card.local, "the gateway does not know this request");
          return;
        }
        if (response.status === 204) { forgetOpen(id); return; } // it ended, and we have all of it
        if (!response.ok || !response.body) throw new Error(`status ${response.status}`);
        failures = 0;
        await readEvents(response.body, (e) => show(id, e));
      } catch (error) {
        failures += 1;
      }
      const wait = Math.min(5000, 300 * 2 ** Math.min(failures, 4));
      await new Promise((r) => setTimeout(r, wait));
    }
  } finally {
    streams.delete(id);
  }
}

async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  while (true) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (!data) continue;
      try { onEvent(JSON.parse(data)); } catch { /* not an event */ }
    }
  }
}

// MARK: Actions

// Requests cancelled while they waited in the page (in any tab: kept with
// the outbox): one a flush was sending at that moment is cancelled at the
// gateway once it is in.
function cancelledLocally() { return store.get("fd.cancelled", []); }
function noteCancelledLocally(id) { store.set("fd.cancelled", [...cancelledLocally().filter((x) => x !== id), id].slice(-100)); }
// Cancels of requests a flush had sent when they were cancelled: sent (again) until the gateway answers.
function cancelsToSend() { return store.get("fd.cancels-to-send", []); }
function setCancelsToSend(list) { store.set("fd.cancels-to-send", list.slice(-100)); }

function showCancelledLocally(id, local) {
  const card = cardFor(id);
  card.local = null;
  card.event = { dispatchId: id, seq: 0, state: "cancelled", input: local.input, project: local.project, target: local.target,
    cancel: { reason: "user" }, elapsedMs: Date.now() - local.createdAt };
  forgetOpen(id);
  render(id);
}

async function cancel(id) {
  const card = cards.get(id);
  if (!card) return;
  if (card.local && outbox().some((r) => r.id === id)) {
    // Never sent (or being sent right now): it leaves the outbox, and the card says so.
    noteCancelledLocally(id);
    setOutbox(outbox().filter((r) => r.id !== id));
    showCancelledLocally(id, card.local);
    return;
  }
  card.el.classList.add("cancelling");
  setTimeout(() => card.el.classList.remove("cancelling"), 600);
  try {
    await api("POST", `/v1/dispatches/${encodeURIComponent(id)}/cancel`, { reason: "user" });
  } catch {
    card.el.classList.remove("cancelling");
  }
}

function toggleOpen(id) {
  const card = cards.get(id);
  const reply = card.el.querySelector(".reply");
  const e = card.event;
  if (!reply.hidden) { reply.hidden = true; return; }
  reply.textContent = e?.reply ?? (e?.preview ?? []).join("\n") ?? "";
  reply.hidden = false;
}

async function loadTargets() {
  try {
    const r = await api("GET", "/v1/targets");
    if (r.status === 200) {
      targetsCache = r.json.projects;
      store.set("fd.targets", targetsCache);
    }
  } catch { /* offline: the cached table */ }
  return targetsCache || [];
}

async function toggleEdit(id) {
  const card = cards.get(id);
  const list = card.el.querySelector(".targets");
  if (!list.hidden) { list.hidden = true; return; }
  const projects = navigator.onLine ? await loadTargets() : (targetsCache || []);
  list.replaceChildren();
  for (const p of projects) {
    for (const t of p.targets) {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.type = "button";
      b.dataset.project = p.id;
      b.dataset.target = t.id;
      const dot = document.createElement("span");
      dot.className = `dot${t.online ? " online" : ""}`;
      const name = document.createElement("span");
      name.textContent = `${p.name} / ${t.name}`;
      const parked = document.createElement("span");
      parked.className = "parked";
      parked.textContent = (t.online ? "online" : `offline${t.parked ? ` · ${t.parked} queued` : ""}`) + (navigator.onLine ? "" : " (last known)");
      b.append(dot, name, parked);
      b.addEventListener("click", () => reroute(id, p, t));
      li.appendChild(b);
      list.appendChild(li);
    }
  }
  list.hidden = false;
}

async function reroute(id, project, target) {
  const card = cards.get(id);
  card.el.querySelector(".targets").hidden = true;
  const projectView = { id: project.id, name: project.name, glyph: project.glyph, accent: project.accent };
  const targetView = { id: target.id, name: target.name };
  if (card.local) {
    // Still in this page: the route goes with it as hints.
    const list = outbox().map((r) => (r.id === id ? { ...r, project: projectView, target: targetView, hinted: true } : r));
    setOutbox(list);
    card.local = list.find((r) => r.id === id);
    render(id);
    return;
  }
  await api("POST", `/v1/dispatches/${encodeURIComponent(id)}/reroute`, { project: project.id, target: target.id });
}

// MARK: The request box: a best guess as you type; offline, requests wait here.

let guessTimer = null;
let lastGuess = null;

function localGuess(input) {
  const words = input.toLowerCase().normalize("NFD").replace(/[\u0300-\u036f]/g, "");
  const has = (term) => {
    const t = term.toLowerCase().normalize("NFD").replace(/[\u0300-\u036f]/g, "").replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    return new RegExp(`(^|[^\\p{L}\\p{N}])${t}($|[^\\p{L}\\p{N}])`, "u").test(words);
  };
  let best = null;
  for (const p of targetsCache || []) {
    for (const t of p.targets) {
      const terms = [...(t.keywords || []), ...(t.contacts || []), t.name, p.name];
      const score = terms.filter(has).length;
      if (score > 0 && (!best || score > best.score)) best = { score, project: p, target: t };
    }
  }
  if (!best) return null;
  const p = best.project;
  return { project: { id: p.id, name: p.name, glyph: p.glyph, accent: p.accent }, target: { id: best.target.id, name: best.target.name }, route: { confidence: null, reason: "guessed in this page" } };
}

function showGuess(g) {
  lastGuess = g;
  $("guess").hidden = !g;
  if (!g) return;
  $("guess-route").textContent = `${g.project.name} / ${g.target.name}`;
  $("guess-confidence").textContent = typeof g.route?.confidence === "number" ? `${Math.round(g.route.confidence * 100)}%` : "";
}

async function guess(input) {
  if (!input.trim()) return showGuess(null);
  if (navigator.onLine) {
    try {
      const r = await api("GET", `/v1/route?input=${encodeURIComponent(input)}`);
      if ($("request-input").value !== input) return;
      if (r.status === 200) return showGuess(r.json);
      if (r.status === 422) return showGuess(null);
    } catch { /* offline after all */ }
  }
  showGuess(localGuess(input));
}

async function submitRequest(input) {
  const id = newID();
  const entry = { id, input, createdAt: Date.now(), createdAtText: new Date().toISOString(), project: lastGuess?.project, target: lastGuess?.target, hinted: false };
  if (!navigator.onLine) return queueLocally(entry);
  try {
    const r = await api("POST", "/v1/dispatches", { id, input, createdAt: entry.createdAtText });
    if (retryable(r.status)) return queueLocally(entry); // starting, or the broker pushes back: it waits here and goes out by itself
    if (r.status === 202) tokenRefused = null;
    if (r.status !== 202) {
      $("request-error").textContent = r.json?.error?.message ?? `the gateway answered ${r.status}`;
      $("request-error").hidden = false;
      return;
    }
    cardFor(id);
    rememberOpen(id, 0);
    follow(id);
  } catch {
    queueLocally(entry); // the network went away under us
  }
}

function queueLocally(entry) {
  setOutbox([...outbox().filter((r) => r.id !== entry.id), entry]);
  const card = cardFor(entry.id);
  card.local = entry;
  render(entry.id);
}

// A request the gateway refused once it could answer (it waited for a 5xx
// or the network): the card says why, as it would have at once.
function refusedLocally(entry, message) {
  const card = cardFor(entry.id);
  card.local = null;
  card.event = { dispatchId: entry.id, seq: 0, state: "failed", input: entry.input, project: entry.project, target: entry.target,
    error: { code: "refused", message }, elapsedMs: Date.now() - entry.createdAt };
  render(entry.id);
}

// An answer worth trying again later: the gateway starting or pushed back, or a proxy's.
function retryable(status) { return status >= 500 || status === 408 || status === 429; }

let flushing = false;
let tokenRefused = null;
async function flushOutbox() {
  if (flushing || !navigator.onLine || (tokenRefused !== null && tokenRefused === token)) return;
  flushing = true;
  const used = token;
  try {
    for (const entry of outbox()) {
      if (!outbox().some((x) => x.id === entry.id)) continue; // sent or cancelled meanwhile (maybe by another tab)
      if (cancelledLocally().includes(entry.id)) { setOutbox(outbox().filter((x) => x.id !== entry.id)); continue; }
      const body = { id: entry.id, input: entry.input, createdAt: entry.createdAtText };
      if (entry.hinted && entry.project && entry.target) { body.project = entry.project.id; body.target = entry.target.id; }
      let r;
      try { r = await api("POST", "/v1/dispatches", body); } catch { return; }
      if (r.status === 401) { if (token === used) tokenRefused = used; return; } // not again until the token changes
      if (r.status === 202 || (r.status >= 400 && r.status < 500 && !retryable(r.status))) {
        setOutbox(outbox().filter((x) => x.id !== entry.id));
        const cancelled = cancelledLocally().includes(entry.id);
        if (r.status === 202 && cancelled) {
          setCancelsToSend([...cancelsToSend(), entry.id]);
        } else if (r.status === 202) {
          rememberOpen(entry.id, 0);
          follow(entry.id);
        } else if (!cancelled) {
          refusedLocally(entry, r.json?.error?.message ?? `the gateway answered ${r.status}`);
        }
      }
    }
    for (const id of cancelsToSend()) {
      let r;
      try { r = await api("POST", `/v1/dispatches/${encodeURIComponent(id)}/cancel`, { reason: "user" }); } catch { return; }
      if (!retryable(r.status) && r.status !== 401) setCancelsToSend(cancelsToSend().filter((x) => x !== id));
    }
  } finally {
    flushing = false;
  }
}

function setNetwork() {
  const online = navigator.onLine;
  $("network").dataset.online = String(online);
  $("network").textContent = online ? "online" : "offline";
  if (online) {
    flushOutbox();
    for (const id of cards.keys()) if (!cards.get(id).local) follow(id);
  }
}

// MARK: Start

function start() {
  $("token").value = token;
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token = $("token").value.trim();
    tokenRefused = null;
    store.set("fd.token", token);
    resume();
  });
  $("request-input").addEventListener("input", (ev) => {
    clearTimeout(guessTimer);
    const value = ev.target.value;
    guessTimer = setTimeout(() => guess(value), 150);
  });
  $("request-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("request-input").value.trim();
    if (!input) return;
    $("request-error").hidden = true;
    $("request-input").value = "";
    submitRequest(input);
    showGuess(null);
  });
  $("request-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("request-form").requestSubmit(); }
  });
  window.addEventListener("online", setNetwork);
  window.addEventListener("offline", setNetwork);
  resume();
}

// Every open dispatch comes back from its last seq; what waited offline goes out.
async function resume() {
  if (!token) return;
  loadTargets();
  for (const entry of outbox()) {
    const card = cardFor(entry.id);
    card.local = entry;
    render(entry.id);
  }
  const open = store.get("fd.open", {});
  for (const id of Object.keys(open)) {
    if (cards.get(id)?.local) continue;
    try {
      const r = await api("GET", `/v1/dispatches/${encodeURIComponent(id)}`);
      if (r.status === 200) show(id, r.json);
      else if (r.status === 404) { forgetOpen(id); continue; }
    } catch { /* offline: the stream retries */ }
    cardFor(id);
    follow(id);
  }
  setNetwork();
}

start();
