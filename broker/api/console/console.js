// The fleetmq web console: a page of the management API (docs/api.md), no build step, no library.
// It keeps the API key in the tab's sessionStorage and calls /api/v1 with it; every view is one
// hash route (#/clients/<id>, ...), rendered from the API's answers with DOM nodes (never innerHTML
// of data), so a client id or a payload cannot inject markup.
"use strict";

const API = "/api/v1";
const main = document.getElementById("main");
const errorBox = document.getElementById("error");
let timer = null; // the current view's refresh
let lastRates = {}; // node -> [delivered, reported_at], for messages per second

// -- small helpers -------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) e.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return e;
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function key() { return sessionStorage.getItem("fleetmq-api-key"); }

function showError(message) {
  errorBox.textContent = message;
  errorBox.hidden = !message;
}

async function call(method, path, body) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401) { sessionStorage.removeItem("fleetmq-api-key"); location.hash = "#/signin"; throw new Error("signed out"); }
  const text = await r.text();
  const data = text && (r.headers.get("Content-Type") || "").includes("json") ? JSON.parse(text) : text;
  if (!r.ok) throw new Error(data.detail || `${r.status} ${r.statusText}`);
  showError("");
  return data;
}

function when(ts) { return ts ? new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) : ""; }

function every(seconds, fn) {
  fn().catch((e) => showError(e.message));
  timer = setInterval(() => fn().catch((e) => showError(e.message)), seconds * 1000);
}

// -- views ---------------------------------------------------------------------------------------
function signin() {
  document.getElementById("nav").hidden = true;
  const input = el("input", { id: "key", type: "password", size: 60, placeholder: "fmq_..." });
  const form = el("form", { id: "signin-form", on: { submit: async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("fleetmq-api-key", input.value.trim());
    try { await call("GET", "/nodes"); location.hash = "#/overview"; }
    catch (e) { sessionStorage.removeItem("fleetmq-api-key"); showError(`sign-in refused: ${e.message}`); }
  } } }, el("label", {}, "API key", input), el("button", { id: "signin", type: "submit" }, "Sign in"));
  main.replaceChildren(el("h1", {}, "Sign in"), el("p", {}, "With a key of `fleetmq-broker apikey`."), form);
}

function overview() {
  const tiles = el("div", { class: "tiles" });
  const nodes = el("div");
  main.replaceChildren(el("h1", {}, "Overview"), tiles, nodes);
  every(2, async () => {
    const { data } = await call("GET", "/nodes");
    let rate = 0;
    const rows = data.map((n) => {
      const before = lastRates[n.node];
      const r = before && n.reported_at > before[1] ? (n.delivered - before[0]) / (n.reported_at - before[1]) : null;
      if (!before || n.reported_at > before[1]) lastRates[n.node] = [n.delivered, n.reported_at];
      rate += r || 0;
      return el("tr", { "data-node": n.node }, el("td", {}, n.node),
        el("td", { class: n.status === "running" ? "on" : "off" }, n.status), el("td", {}, n.connections),
        el("td", {}, n.sessions), el("td", {}, r === null ? "" : r.toFixed(1)), el("td", {}, n.version),
        el("td", {}, n.config_hash.slice(0, 12)), el("td", {}, n.uptime_s === null ? "" : `${Math.round(n.uptime_s)} s`));
    });
    const sum = (f) => data.reduce((s, n) => s + n[f], 0);
    tiles.replaceChildren(
      el("div", { class: "tile" }, el("b", { id: "total-nodes" }, data.filter((n) => n.status === "running").length), "nodes running"),
      el("div", { class: "tile" }, el("b", { id: "total-connections" }, sum("connections")), "connections"),
      el("div", { class: "tile" }, el("b", {}, sum("sessions")), "sessions"),
      el("div", { class: "tile" }, el("b", {}, rate.toFixed(1)), "delivered / s"));
    nodes.replaceChildren(table(["Node", "Status", "Connections", "Sessions", "Delivered/s", "Version",
      "Config", "Uptime"], rows));
  });
}

function clients(params) {
  const search = el("input", { id: "search", placeholder: "client id prefix", value: params.get("q") || "" });
  const state = el("select", { id: "connected" }, el("option", { value: "" }, "all"),
    el("option", { value: "true" }, "connected"), el("option", { value: "false" }, "offline"));
  state.value = params.get("connected") || "";
  const page = Number(params.get("page") || 1);
  const out = el("div", { id: "clients" });
  const go = (p) => {
    const q = new URLSearchParams({ q: search.value, connected: state.value, page: p });
    location.hash = `#/clients?${q}`;
  };
  const form = el("form", { on: { submit: (ev) => { ev.preventDefault(); go(1); } } },
    el("label", {}, "Client id", search), el("label", {}, "State", state),
    el("button", { id: "find", type: "submit" }, "Search"));
  main.replaceChildren(el("h1", {}, "Clients"), form, out);
  every(3, async () => {
    const q = new URLSearchParams({ page, limit: 50 });
    if (search.value) q.set("clientid", search.value);
    if (state.value) q.set("connected", state.value);
    const { data, meta } = await call("GET", `/clients?${q}`);
    const rows = data.map((c) => el("tr", { "data-clientid": c.clientid },
      el("td", {}, el("a", { href: `#/clients/${encodeURIComponent(c.clientid)}` }, c.clientid)),
      el("td", { class: c.connected ? "on" : "off" }, c.connected ? "connected" : "offline"),
      el("td", {}, c.node || ""), el("td", {}, c.zone), el("td", {}, c.username || ""), el("td", {}, c.peerhost || ""),
      el("td", {}, c.subscriptions_cnt), el("td", {}, c.inflight_cnt), el("td", {}, c.mqueue_len)));
    const pages = Math.max(1, Math.ceil(meta.count / meta.limit));
    out.replaceChildren(table(["Client id", "State", "Node", "Zone", "Username", "Address", "Subs", "Inflight",
      "Queue"], rows), el("p", {}, `${meta.count} clients, page ${meta.page} of ${pages} `,
      page > 1 ? el("button", { on: { click: () => go(page - 1) } }, "Previous") : "",
      page < pages ? el("button", { on: { click: () => go(page + 1) } }, "Next") : ""));
  });
}

function deliveries(list) {
  return table(["Topic", "QoS", "Packet id", "Bytes"], list.map((d) =>
    el("tr", {}, el("td", {}, d.topic), el("td", {}, d.qos), el("td", {}, d.packet_id ?? ""), el("td", {}, d.payload_size))));
}

function client(id) {
  const out = el("div");
  const kick = (discard) => async () => {
    await call("DELETE", `/clients/${encodeURIComponent(id)}${discard ? "?session=discard" : ""}`);
    showError("");
  };
  const ban = async () => {
    await call("POST", "/banned", { as: "clientid", who: id, reason: "banned from the console", duration: 3600 });
  };
  main.replaceChildren(el("h1", {}, `Client ${id}`), el("form", { on: { submit: (e) => e.preventDefault() } },
    el("button", { id: "kick", type: "button", on: { click: () => kick(false)().catch((e) => showError(e.message)) } }, "Kick"),
    el("button", { id: "kick-discard", type: "button", class: "danger", on: { click: () => kick(true)().catch((e) => showError(e.message)) } }, "Kick and end its session"),
    el("button", { id: "ban", type: "button", class: "danger", on: { click: () => ban().catch((e) => showError(e.message)) } }, "Ban for an hour")), out);
  every(2, async () => {
    let c;
    try { c = await call("GET", `/clients/${encodeURIComponent(id)}`); }
    catch (e) { out.replaceChildren(el("p", { id: "state", class: "off" }, e.message)); return; }
    const facts = [["State", el("span", { id: "state", class: c.connected ? "on" : "off" }, c.connected ? "connected" : "offline")],
      ["Node", c.node || ""], ["Zone", c.zone], ["Username", c.username || ""], ["Address", c.peerhost || ""],
      ["MQTT", c.proto_ver ?? ""], ["Keep alive", c.keepalive ?? ""], ["Connected at", when(c.connected_at)],
      ["Session expiry", `${c.expiry_interval} s`], ["Inflight", c.inflight_cnt], ["Queued", c.mqueue_len],
      ["Awaiting PUBREL", c.awaiting_rel_cnt]];
    out.replaceChildren(table(["", ""], facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))),
      el("h2", {}, "Subscriptions"), table(["Filter", "QoS", "No local", "Retain as published"],
        c.subscriptions.map((s) => el("tr", {}, el("td", {}, s.topic), el("td", {}, s.qos), el("td", {}, s.no_local),
          el("td", {}, s.retain_as_published)))),
      el("h2", {}, "In flight"), deliveries(c.inflight), el("h2", {}, "Queued"), deliveries(c.mqueue));
  });
}

function topics() {
  const topic = el("input", { id: "topic", placeholder: "a/topic/name", required: true });
  const out = el("div");
  main.replaceChildren(el("h1", {}, "Who receives a topic"), el("form", { on: { submit: async (ev) => {
    ev.preventDefault();
    const { data } = await call("GET", `/subscriptions?${new URLSearchParams({ topic: topic.value })}`).catch((e) => { showError(e.message); return { data: [] }; });
    out.replaceChildren(table(["Client id", "QoS", "Shared", "No local"], data.map((s) => el("tr", {},
      el("td", {}, el("a", { href: `#/clients/${encodeURIComponent(s.clientid)}` }, s.clientid)), el("td", {}, s.qos),
      el("td", {}, s.shared), el("td", {}, s.no_local)))));
  } } }, el("label", {}, "Topic", topic), el("button", { type: "submit" }, "Find")), out);
}

function retained() {
  const filter = el("input", { id: "filter", value: "#" });
  const out = el("div");
  const load = async () => {
    const { data, meta } = await call("GET", `/retained?${new URLSearchParams({ topic: filter.value, limit: 200 })}`);
    out.replaceChildren(el("p", {}, `${meta.count} retained`), table(["Topic", "QoS", "Bytes", "Payload", "Published", ""],
      data.map((m) => el("tr", {}, el("td", {}, m.topic), el("td", {}, m.qos), el("td", {}, m.payload_size),
        el("td", {}, preview(m.payload)), el("td", {}, when(m.published_at)),
        el("td", {}, el("button", { class: "danger", on: { click: async () => {
          await call("DELETE", `/retained/${m.topic.split("/").map(encodeURIComponent).join("/")}`); load(); } } }, "Clear"))))));
  };
  main.replaceChildren(el("h1", {}, "Retained messages"), el("form", { on: { submit: (ev) => { ev.preventDefault(); load().catch((e) => showError(e.message)); } } },
    el("label", {}, "Topic filter", filter), el("button", { type: "submit" }, "List")), out);
  load().catch((e) => showError(e.message));
}

function preview(b64) {
  try { const s = atob(b64); return s.length > 60 ? `${s.slice(0, 60)}...` : s; } catch { return "(binary)"; }
}

function publish() {
  const topic = el("input", { id: "pub-topic", required: true });
  const payload = el("textarea", { id: "pub-payload", rows: 3, cols: 50 });
  const qos = el("select", { id: "pub-qos" }, [0, 1, 2].map((q) => el("option", { value: q }, q)));
  const retain = el("input", { id: "pub-retain", type: "checkbox" });
  const out = el("p", { id: "pub-result" });
  main.replaceChildren(el("h1", {}, "Publish"), el("form", { on: { submit: async (ev) => {
    ev.preventDefault();
    const r = await call("POST", "/publish", { topic: topic.value, payload: payload.value, qos: Number(qos.value),
      retain: retain.checked }).catch((e) => { showError(e.message); return null; });
    if (r) out.textContent = `published: routed to ${r.matched} sessions`;
  } } }, el("label", {}, "Topic", topic), el("label", {}, "Payload", payload), el("label", {}, "QoS", qos),
  el("label", {}, "Retain", retain), el("button", { type: "submit" }, "Publish")), out);
}

function zones() {
  const out = el("div");
  main.replaceChildren(el("h1", {}, "Zones, as each node applied them"), out);
  call("GET", "/zones").then(({ data }) => out.replaceChildren(...data.map((n) => el("section", {},
    el("h2", {}, `${n.node} (config ${n.config_hash.slice(0, 12)})`),
    ...Object.entries(n.zones).map(([name, z]) => el("details", {}, el("summary", {}, name),
      el("pre", {}, JSON.stringify(z, null, 2)))))))).catch((e) => showError(e.message));
}

function bridges() {
  const out = el("div");
  main.replaceChildren(el("h1", {}, "Bridges"), out);
  every(3, async () => {
    const { data } = await call("GET", "/bridges");
    out.replaceChildren(data.length ? table(["Bridge", "Node", "Leader", "Connected", "Queue", "Forwarded", "Last error"],
      data.map((b) => el("tr", {}, el("td", {}, b.bridge), el("td", {}, b.node), el("td", {}, b.leader),
        el("td", { class: b.connected ? "on" : "off" }, b.connected), el("td", {}, b.queue), el("td", {}, b.forwarded),
        el("td", {}, b.last_error || "")))) : el("p", {}, "No bridges."));
  });
}

function banned() {
  const kind = el("select", { id: "ban-as" }, ["clientid", "username", "peerhost"].map((k) => el("option", { value: k }, k)));
  const who = el("input", { id: "ban-who", required: true });
  const reason = el("input", { id: "ban-reason" });
  const minutes = el("input", { id: "ban-minutes", type: "number", min: 1, value: 60 });
  const out = el("div");
  const load = async () => {
    const { data } = await call("GET", "/banned");
    out.replaceChildren(table(["As", "Who", "Reason", "By", "Until", ""], data.map((b) => el("tr", {}, el("td", {}, b.as),
      el("td", {}, b.who), el("td", {}, b.reason), el("td", {}, b.by), el("td", {}, b.until ? when(b.until) : "never"),
      el("td", {}, el("button", { on: { click: async () => {
        await call("DELETE", `/banned/${b.as}/${encodeURIComponent(b.who)}`); load(); } } }, "Lift"))))));
  };
  main.replaceChildren(el("h1", {}, "Banned"), el("form", { on: { submit: async (ev) => {
    ev.preventDefault();
    await call("POST", "/banned", { as: kind.value, who: who.value, reason: reason.value, duration: Number(minutes.value) * 60 })
      .catch((e) => showError(e.message));
    load();
  } } }, el("label", {}, "As", kind), el("label", {}, "Who", who), el("label", {}, "Reason", reason),
  el("label", {}, "Minutes", minutes), el("button", { type: "submit" }, "Ban")), out);
  load().catch((e) => showError(e.message));
}

function traces() {
  const name = el("input", { id: "trace-name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9_.-]*" });
  const kind = el("select", { id: "trace-kind" }, el("option", { value: "clientid" }, "client id"), el("option", { value: "topic" }, "topic filter"));
  const target = el("input", { id: "trace-target", required: true });
  const seconds = el("input", { id: "trace-seconds", type: "number", min: 1, value: 300 });
  const list = el("div");
  const view = el("pre", { id: "trace-lines" });
  let watching = null;
  const download = async (n) => {
    const r = await fetch(`${API}/traces/${encodeURIComponent(n)}`, { headers: { Authorization: `Bearer ${key()}` } });
    const a = el("a", { href: URL.createObjectURL(await r.blob()), download: `${n}.jsonl` });
    a.click();
  };
  main.replaceChildren(el("h1", {}, "Traces"), el("form", { on: { submit: async (ev) => {
    ev.preventDefault();
    await call("POST", "/traces", { name: name.value, [kind.value]: target.value, duration: Number(seconds.value) })
      .catch((e) => showError(e.message));
    watching = name.value;
  } } }, el("label", {}, "Name", name), el("label", {}, "Of", kind), el("label", {}, "Client id or filter", target),
  el("label", {}, "Seconds", seconds), el("button", { type: "submit" }, "Start")), list, el("h2", {}, "Records"), view);
  every(2, async () => {
    const { data } = await call("GET", "/traces");
    list.replaceChildren(table(["Name", "Of", "Status", "Records", "Until", ""], data.map((t) => el("tr", {},
      el("td", {}, t.name), el("td", {}, `${t.kind} ${t.filter}`), el("td", { class: t.status === "running" ? "on" : "off" }, t.status),
      el("td", {}, t.records), el("td", {}, when(t.end)), el("td", {},
        el("button", { type: "button", on: { click: () => { watching = t.name; } } }, "Watch"),
        el("button", { type: "button", on: { click: () => download(t.name) } }, "Download"),
        el("button", { type: "button", class: "danger", on: { click: () => call("DELETE", `/traces/${encodeURIComponent(t.name)}`) } }, "Delete"))))));
    if (watching) {
      const text = await call("GET", `/traces/${encodeURIComponent(watching)}`);
      view.textContent = String(text).split("\n").slice(-200).join("\n");
    }
  });
}

// -- routing -------------------------------------------------------------------------------------
const views = { overview, clients, topics, retained, publish, zones, bridges, banned, traces };

function route() {
  clearInterval(timer);
  timer = null;
  const [path, query] = location.hash.slice(2).split("?");
  const params = new URLSearchParams(query || "");
  if (path === "signout") { sessionStorage.removeItem("fleetmq-api-key"); location.hash = "#/signin"; return; }
  if (!key() || path === "signin") { signin(); return; }
  document.getElementById("nav").hidden = false;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.hash === `#/${path.split("/")[0]}`);
  if (path.startsWith("clients/")) { client(decodeURIComponent(path.slice("clients/".length))); return; }
  (views[path] || overview)(params);
}

window.addEventListener("hashchange", route);
route();
