// Kubemoot dashboard: draws the server's snapshots, pushed as server-sent events.
// Every value from shared state is inserted as text (never as HTML): model, agent and
// provider names come from other processes and must not be able to inject markup.
"use strict";

const GiB = 1024;
let latest = null;          // the last snapshot
let receivedAt = 0;         // when it arrived (browser clock), to age it between events
let chosenCall = null;      // the key of the call whose decision is open (a chip clicked)
window.kubemootUpdates = 0; // how many snapshots this page has drawn (tests read it)

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function gib(mib) { return mib === null || mib === undefined ? "?" : (mib / GiB).toFixed(1) + " GiB"; }

function age(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 90) return Math.round(seconds) + " s ago";
  if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
  return (seconds / 3600).toFixed(1) + " h ago";
}

function hue(text) {
  let h = 0;
  for (const c of text) h = (h * 31 + c.codePointAt(0)) % 360;
  return h;
}

// Seconds to add to the server's ages: time passed since the snapshot arrived.
function drift() { return latest ? (Date.now() - receivedAt) / 1000 : 0; }

function providerCard(p, fresh) {
  const ageNow = p.ageSeconds === null ? null : p.ageSeconds + drift();
  const stale = ageNow !== null && ageNow > fresh;
  const status = !p.ready ? "down" : stale ? "stale" : "ready";
  const label = !p.ready ? "not ready" : stale ? "stale" : "ready";
  const total = p.totalVramMiB;
  const bar = el("div", { class: "bar", "data-testid": "vram-bar" });
  if (total) {
    // `name` is what the hover says the figure is; `text` the label on the bar (for the
    // free segment the label is already the figure, so the two differ).
    const part = (cls, mib, name, text = name) => {
      if (!mib) return;
      bar.append(el("span", { class: cls, style: `width:${(100 * mib / total).toFixed(2)}%`,
        title: `${name}: ${gib(mib)}` }, text));
    };
    for (const m of p.models) part("resident", m.sizeMiB, m.name);
    for (const l of p.loading) part("loading", l.mib, "loading " + l.model);
    part("reserve", Math.min(p.reserveMiB, total), "reserve");
    part("free", p.freeMiB, "free", gib(p.freeMiB) + " free");
  } else {
    bar.append(el("span", { class: "free", style: "width:100%" }, "VRAM total unknown"));
  }
  const models = el("ul", {},
    p.models.map(m => el("li", { "data-model": m.name },
      `${m.name} — ${gib(m.sizeMiB)}, ${m.inUse} call(s) on ${p.maxParallel} slot(s)`)),
    p.loading.map(l => el("li", { class: "loading" }, `${l.model} — loading ${gib(l.mib)} (${l.state})`)));
  return el("div", { class: "provider", "data-provider": p.provider, "data-status": status },
    el("div", { class: "title" },
      el("span", { class: "name" }, p.provider),
      el("span", { class: "endpoint" }, p.endpoint),
      el("span", { class: "badge " + status, title: p.reason || "" }, label)),
    bar,
    el("div", { class: "facts" },
      `${gib(p.residentMiB)} resident · ${gib(p.loadingMiB)} loading · ${gib(p.reserveMiB)} reserve`
      + ` · ${gib(p.freeMiB)} free of ${gib(total)}`
      + ` · ${p.slotsInUse} call(s) on ${p.slotsTotal} slot(s) · probed ${age(ageNow)}`
      + (p.reason ? ` · ${p.reason}` : "")),
    models);
}

// A segment narrower than its label would show the label cut ("re" for reserve, "2.0" for
// "2.0 GiB free"), which reads as a wrong figure. Such a label is dropped instead: the
// segment's title and the facts line under the bar still give its figure, and the model
// list its model. Widths exist only once the card is laid out, hence after insertion.
function dropCutLabels(root) {
  for (const seg of root.querySelectorAll('[data-testid="vram-bar"] span')) {
    if (seg.scrollWidth > seg.clientWidth) {
      seg.textContent = "";
      seg.classList.add("unlabelled");
    }
  }
}

function callKey(c) { return `${c.agent} ${c.threadId} ${c.phase} ${c.startedAt}`; }

function callChip(c) {
  const gpu = c.provider || "static";
  const key = callKey(c);
  return el("span", {
      class: "call" + (c.ok ? "" : " failed") + (key === chosenCall ? " chosen" : ""),
      "data-testid": "call", "data-key": key, role: "button", tabindex: 0,
      "data-agent": c.agent, "data-provider": c.provider || "", "data-model": c.model || "",
      "data-phase": c.phase, "data-evicted": (c.evicted || []).join(","),
      style: `background:hsl(${hue(gpu)} 70% 94%)`,
      title: `${c.phase} · ${c.action} · waited ${c.waitedSeconds.toFixed(1)} s · ran ${c.seconds.toFixed(1)} s`,
    },
    el("span", { class: "gpu" }, gpu),
    el("span", { class: "model" }, c.model || "?"),
    el("span", { class: "phase" }, c.phase),
    c.evicted && c.evicted.length ? el("span", { class: "evicted" }, "evicted " + c.evicted.join(", ")) : null);
}

// One call's decision: the options it was priced against (seconds, cheapest first),
// the gates that ruled copies out, and what it did. Opened by clicking its chip.
function callDetail(calls) {
  const panel = document.getElementById("call-detail");
  const c = calls.find(call => callKey(call) === chosenCall);
  if (!c) { panel.hidden = true; panel.replaceChildren(); return; }
  const d = c.decision;
  const head = el("h3", {}, `${c.agent} · ${c.phase} · ${c.action} on ${c.provider || "static"}`
    + (c.model ? ` (${c.model})` : ""));
  if (!d) {
    panel.replaceChildren(head, el("p", { class: "empty" }, "This call carries no decision record."));
    panel.hidden = false;
    return;
  }
  const options = el("table", { "data-testid": "decision-options" },
    el("thead", {}, el("tr", {}, ["kind", "provider", "model", "seconds", "victims"].map(h => el("th", {}, h)))),
    el("tbody", {}, d.options.length ? d.options.map(o => el("tr", {
        class: `${o.provider}/${o.model}` === d.chosen ? "chosen" : "" },
      el("td", {}, o.kind), el("td", {}, o.provider), el("td", {}, o.model),
      el("td", {}, o.seconds.toFixed(2)), el("td", {}, (o.victims || []).join(", ") || "—")))
      : [el("tr", { class: "empty" }, el("td", { colspan: 5 }, "no option was priced"))]));
  const gates = el("ul", { "data-testid": "decision-gates" },
    d.failedGates.length ? d.failedGates.map(g => el("li", {}, `${g.candidate}: ${g.gate} — ${g.reason}`))
      : [el("li", { class: "empty" }, "no gate failed")]);
  const cut = d.leftOut ? Object.entries(d.leftOut).map(([k, n]) => `${n} more ${k}`).join(", ") : "";
  panel.replaceChildren(head,
    el("p", {}, `chosen ${d.chosen || "—"} · victims ${(d.victims || []).join(", ") || "none"}`
      + (d.reason ? ` · ${d.reason}` : "") + (cut ? ` · not shown: ${cut}` : "")),
    el("h4", {}, "Options (seconds before the call can start)"), options,
    el("h4", {}, "Gates that failed"), gates);
  panel.hidden = false;
}

function fillTable(id, rows, empty, columns) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" },
    el("td", { colspan: columns }, empty))]));
}

function draw() {
  if (!latest) return;
  const s = latest;
  const providers = document.getElementById("providers");
  providers.replaceChildren(...(s.providers.length
    ? s.providers.map(p => providerCard(p, s.freshnessSeconds))
    : [el("p", { class: "empty" }, "No provider has been probed yet.")]));
  dropCutLabels(providers);
  fillTable("agents", s.agents.map(a => el("tr", { "data-agent": a.agent },
    el("td", {}, a.agent),
    el("td", { "data-testid": "agent-calls" }, a.calls),
    el("td", {}, el("div", { class: "calls" }, a.recent.map(callChip))),
    el("td", {}, a.waitedSeconds.toFixed(1) + " s"),
    el("td", {}, a.evictions))), "No call has finished yet.", 5);
  callDetail(s.agents.flatMap(a => a.recent));
  const now = s.now + drift();
  fillTable("tickets", s.tickets.map(t => el("tr", { "data-ticket": t.ticketId },
    el("td", {}, t.provider), el("td", {}, t.model), el("td", {}, t.state),
    el("td", {}, t.modelFootprintMiB), el("td", {}, t.holderId),
    el("td", {}, Math.max(0, Math.round(now - t.startedAt)) + " s"))), "No live ticket.", 6);
  fillTable("demand", s.demand.map(d => el("tr", {},
    el("td", {}, d.kind),
    el("td", {}, d.kind === "sel" ? d.models.join(", ") : d.model),
    el("td", {}, d.agent || "—"),
    el("td", {}, d.kind === "sel" ? d.frequency : d.count))), "No demand recorded.", 4);
  document.getElementById("updated").textContent =
    `updated ${new Date(s.now * 1000).toLocaleTimeString()} (state version ${s.version})`;
}

// The page is live, but the shared store behind it may not be: then every number on it
// is frozen at the moment the store went away, and the page must say so.
function showStore(status, store) {
  const banner = document.getElementById("store-lost");
  if (store && !store.reachable) {
    const since = new Date(store.lostSince * 1000).toLocaleTimeString();
    status.dataset.state = "lost";
    status.textContent = "shared state lost";
    banner.textContent = `The shared state has not answered since ${since} (${store.reason}). ` +
      "What you see is the last picture; it updates again when the store is back.";
    banner.hidden = false;
  } else {
    status.dataset.state = "live";
    status.textContent = "live";
    banner.hidden = true;
  }
}

function connect() {
  const status = document.getElementById("connection");
  const source = new EventSource("/events");
  source.addEventListener("state", event => {
    latest = JSON.parse(event.data);
    receivedAt = Date.now();
    window.kubemootUpdates += 1;
    showStore(status, latest.store);
    draw();
  });
  source.onerror = () => {
    status.dataset.state = "lost";
    status.textContent = "reconnecting…";
  };
}

// One listener for every chip, present and future (the table is redrawn on each update).
function chooseCall(event) {
  const chip = event.target.closest('[data-testid="call"]');
  if (!chip) return;
  if (event.type === "keydown" && event.key !== "Enter" && event.key !== " ") return;
  chosenCall = chosenCall === chip.dataset.key ? null : chip.dataset.key;
  draw();
}
document.getElementById("agents").addEventListener("click", chooseCall);
document.getElementById("agents").addEventListener("keydown", chooseCall);

// The snapshot the page was served with: drawn before the event stream's first update
// (not counted in kubemootUpdates, which counts what the stream brought).
const firstState = document.getElementById("first-state");
if (firstState) {
  latest = JSON.parse(firstState.textContent);
  receivedAt = Date.now();
  draw();
}
connect();
setInterval(draw, 1000); // ages move between events
window.addEventListener("resize", draw); // bar widths, and so which labels fit, change
