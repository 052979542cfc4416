// torpor dashboard: one plain script, no build step, no dependencies.
//
// Rules this file keeps:
//   - Every value that comes from a sandbox or a user (ids, metadata, file
//     names, command output, failure messages) reaches the page through
//     textContent or as a DOM node; innerHTML is never used.
//   - The API key lives only in the password field until it is posted to
//     /ui/session; afterwards the session cookie (HttpOnly) carries the
//     session, and every non-GET request carries the CSRF token.
//   - All data comes from the native API under /v1, as the CLI reads it.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  const TRANSITIONAL = new Set(["starting", "pausing", "resuming", "hibernating", "restarting", "terminating", "archiving"]);
  const STATES = ["starting", "running", "pausing", "paused", "resuming", "hibernating", "hibernated",
    "restarting", "terminating", "terminated", "failed", "archiving", "archived"];
  const PAGE_SIZE = 100;
  // LIST_PAGE is how many sandboxes each read after the first asks for
  // (the API's most).
  const LIST_PAGE = 1000;

  const st = {
    session: null,
    sandboxes: new Map(), // id -> sandbox, in the API's order (oldest first)
    listGen: 0, // counts list loads: a newer one makes an older one stop
    listPartial: false, // the list's first page is in, the rest is coming
    cursor: 0,
    stream: null, // AbortController of the events stream
    page: 0,
    view: "",
    detailId: "",
    detailEvents: [],
    detailUsage: [],
    pending: new Set(),
    pendingTimer: 0,
    renderQueued: false,
    usage: null,
    tenants: [],
    // tenantOf: sandbox id -> its tenant, from the list and the events,
    // so that an admin's calls on a sandbox name its tenant (scoped).
    tenantOf: new Map(),
    listReady: null, // the first list read of the session (a promise)
    fsPath: "/",
    listLoaded: false,
  };

  // ---------------------------------------------------------------- DOM

  // el builds an element; string children become text nodes, so data can
  // never become markup.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    setProps(e, props);
    append(e, children);
    return e;
  }

  const SVGNS = "http://www.w3.org/2000/svg";
  function sv(tag, attrs, ...children) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    append(e, children);
    return e;
  }

  function setProps(e, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(e.dataset, v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(e, children) {
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function clear(e) {
    e.replaceChildren();
    return e;
  }

  function kv(dl, pairs) {
    clear(dl);
    for (const [k, v] of pairs) {
      if (v === undefined || v === null || v === "") continue;
      dl.append(el("dt", { text: k }), el("dd", {}, v));
    }
  }

  // ---------------------------------------------------------------- formatting

  function ago(t, now = Date.now()) {
    if (!t) return "";
    const s = Math.round((now - Date.parse(t)) / 1000);
    return dur(Math.abs(s)) + (s < 0 ? " from now" : "");
  }

  function dur(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function until(t) {
    const s = Math.round((Date.parse(t) - Date.now()) / 1000);
    return s >= 0 ? "in " + dur(s) : dur(-s) + " ago";
  }

  function when(t) {
    if (!t) return "";
    const d = new Date(t);
    return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function money(x) {
    if (typeof x !== "number") return "";
    return x.toFixed(x >= 1 ? 2 : 4);
  }

  function bytes(n) {
    if (typeof n !== "number") return "";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  }

  function badge(state) {
    return el("span", { class: "badge " + state + (TRANSITIONAL.has(state) ? " transitional" : ""), text: state });
  }

  // nextEvent is the earliest thing the idle engine has planned.
  function nextEvent(sb) {
    const evs = (sb.upcoming_events || []).slice().sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
    if (evs.length) return evs[0];
    const cands = [["pause", sb.pause_at], ["hibernate", sb.hibernates_at], ["kill", sb.kill_at], ["archive", sb.archives_at]]
      .filter(([, t]) => t).sort((a, b) => Date.parse(a[1]) - Date.parse(b[1]));
    return cands.length ? { action: cands[0][0], at: cands[0][1] } : null;
  }

  const CAUSES = {
    api: "user verb (API)",
    idle: "idle policy",
    platform: "platform hibernation (max paused time)",
    auto_resume: "auto-resume by a request",
    end: "end time reached",
    reconcile: "daemon restart (reconciled)",
    wake_up: "scheduled wake-up",
  };

  function causeText(ev) {
    const a = ev.attrs || {};
    const parts = [];
    if (a.cause) parts.push(CAUSES[a.cause] || a.cause);
    if (a.auto === "true" && a.cause !== "auto_resume") parts.push("auto-resume");
    if (a.mode) parts.push("mode " + a.mode);
    if (a.code) parts.push("failure " + a.code);
    if (a.message) parts.push(a.message);
    if (a.error) parts.push(a.error);
    if (a.reason) parts.push(a.reason);
    for (const [k, v] of Object.entries(a)) {
      if (!["cause", "auto", "mode", "code", "message", "error", "reason", "boot"].includes(k)) parts.push(k + "=" + v);
    }
    return parts.join("; ");
  }

  // stateAfter maps an event to the state it leaves the sandbox in (null:
  // no state change).
  function stateAfter(ev) {
    switch (ev.type) {
      case "sandbox.created": return "starting";
      case "sandbox.started": case "sandbox.resumed": case "sandbox.restarted": return "running";
      case "sandbox.paused": return "paused";
      case "sandbox.hibernated": return "hibernated";
      case "sandbox.archived": return "archived";
      case "sandbox.failed": return "failed";
      case "sandbox.terminated": return "terminated";
      case "sandbox.state": return (ev.attrs && ev.attrs.to) || null;
    }
    return null;
  }

  // ---------------------------------------------------------------- API

  class APIError extends Error {
    constructor(status, code, message) {
      super(message || ("HTTP " + status));
      this.status = status;
      this.code = code || "";
    }
  }

  // scoped adds the tenant an admin's session acts as (docs/api.md,
  // "Acting as a tenant"): every tenant's (tenant=*) for the list and the
  // event stream, a sandbox's own tenant for the calls on it. A tenant's
  // session names none: it is its own tenant, and may name no other.
  function scoped(method, path) {
    const s = st.session;
    if (!s || !s.admin) return path;
    const i = path.indexOf("?");
    const p = i < 0 ? path : path.slice(0, i);
    if (i >= 0 && new URLSearchParams(path.slice(i + 1)).has("tenant")) return path;
    let t = "";
    if (method === "GET" && (p === "/v1/sandboxes" || p === "/v1/events")) t = "*";
    else {
      const m = /^\/v1\/sandboxes\/([^/]+)/.exec(p);
      if (m) t = st.tenantOf.get(decodeURIComponent(m[1])) || "";
    }
    if (!t || t === s.tenant) return path;
    return path + (i < 0 ? "?" : "&") + "tenant=" + encodeURIComponent(t);
  }

  async function api(method, path, body, opts = {}) {
    path = scoped(method, path);
    const headers = Object.assign({}, opts.headers || {});
    if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = (st.session && st.session.csrf_token) || "";
    let payload;
    if (body instanceof Blob) {
      payload = body;
      headers["Content-Type"] = "application/octet-stream";
    } else if (body !== undefined) {
      payload = JSON.stringify(body);
      headers["Content-Type"] = "application/json";
    }
    let r;
    for (let attempt = 0, lost = 0; ; attempt++) {
      try {
        r = await fetch(path, { method, headers, body: payload, credentials: "same-origin", signal: opts.signal, cache: "no-store" });
      } catch (err) {
        // The request failed below HTTP (a kept-alive connection that
        // closed as it was sent): send it once more when sending it twice
        // does no harm — a read, or a verb that only moves the sandbox
        // to a state (a second start of a running sandbox is a no-op).
        if (lost++ > 0 || (opts.signal && opts.signal.aborted) || !sendsTwiceSafely(method, path)) throw err;
        await new Promise((res) => setTimeout(res, 250));
        continue;
      }
      // Past the key's request rate (429) nothing was done: wait as the
      // server says (at most 5 s) and send again, a few times.
      if (r.status !== 429 || attempt >= 4) break;
      const wait = Math.min(5, Number(r.headers.get("Retry-After")) || 1);
      await new Promise((res) => setTimeout(res, wait * 1000));
    }
    if (!r.ok) {
      let code = "", msg = "";
      try {
        const j = await r.json();
        code = (j.error && j.error.code) || "";
        msg = (j.error && j.error.message) || "";
      } catch (_) { /* not JSON */ }
      if (r.status === 401 && !opts.quiet401) signedOut("Your session ended: sign in again.");
      throw new APIError(r.status, code, msg);
    }
    if (opts.raw) return r;
    if (r.status === 204) return null;
    return r.json();
  }

  // sendsTwiceSafely tells whether a request may be sent again after the
  // network lost it: reads, and the verbs that only move a sandbox to a
  // state it keeps if it is there already.
  function sendsTwiceSafely(method, path) {
    if (method === "GET" || method === "HEAD") return true;
    return method === "POST" && /^\/v1\/sandboxes\/[^/]+\/(start|resume|pause|hibernate|touch)$/.test(path.split("?")[0]);
  }

  const enc = encodeURIComponent;
  const sbPath = (id) => "/v1/sandboxes/" + enc(id);

  // readSSE reads a server-sent event stream from a fetch response and calls
  // onEvent(name, data, id) for each event.
  async function readSSE(resp, onEvent) {
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n?/g, "\n");
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let name = "message", id = "";
        const data = [];
        for (const line of block.split("\n")) {
          if (line === "" || line.startsWith(":")) continue;
          const c = line.indexOf(":");
          const field = c < 0 ? line : line.slice(0, c);
          let v = c < 0 ? "" : line.slice(c + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "event") name = v;
          else if (field === "data") data.push(v);
          else if (field === "id") id = v;
        }
        if (data.length) onEvent(name, data.join("\n"), id);
      }
    }
  }

  // ---------------------------------------------------------------- session

  async function boot() {
    wireStatic();
    try {
      st.session = await api("GET", "/ui/session", undefined, { quiet401: true });
    } catch (e) {
      showSignIn(e.status === 401 ? "" : e.message);
      return;
    }
    signedIn();
  }

  function showSignIn(msg) {
    for (const v of document.querySelectorAll(".view")) v.hidden = true;
    $("nav").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    $("signin-error").textContent = msg || "";
    $("key").focus();
  }

  async function submitSignIn(ev) {
    ev.preventDefault();
    const input = $("key");
    const key = input.value;
    // The key leaves the field at once: it is kept nowhere in the page.
    input.value = "";
    $("signin-error").textContent = "";
    try {
      st.session = await api("POST", "/ui/session", { key }, { quiet401: true });
    } catch (e) {
      $("signin-error").textContent = e.status === 401 ? "That key is not known." : e.message;
      return;
    }
    signedIn();
  }

  function signedIn() {
    $("signin").hidden = true;
    $("nav").hidden = false;
    $("who").hidden = false;
    const s = st.session;
    $("who-tenant").textContent = s.admin ? "admin · " + s.tenant : s.tenant;
    $("f-tenant-label").hidden = !s.admin;
    tenantColumn(s.admin);
    $("u-tenant-label").hidden = !s.admin;
    $("t-build").hidden = !s.admin;
    st.listLoaded = false;
    if (s.admin) loadTenants();
    route();
  }

  function signedOut(msg) {
    stopStream();
    st.session = null;
    st.listGen++;
    st.sandboxes.clear();
    st.tenantOf.clear();
    st.listReady = null;
    st.listLoaded = false;
    clear($("sb-rows"));
    showSignIn(msg);
  }

  async function signOut() {
    try {
      await api("DELETE", "/ui/session", undefined, { quiet401: true });
    } catch (_) { /* the session is over either way */ }
    signedOut("Signed out.");
  }

  // tenantColumn shows the list's tenant column to an admin, whose list
  // holds every tenant's sandboxes.
  function tenantColumn(on) {
    let th = $("th-tenant");
    if (!th) {
      th = el("th", { id: "th-tenant", text: "Tenant" });
      $("sb-table").tHead.rows[0].cells[0].after(th);
    }
    th.hidden = !on;
  }

  async function loadTenants() {
    try {
      const r = await api("GET", "/v1/tenants");
      st.tenants = r.tenants || [];
    } catch (_) {
      st.tenants = [];
    }
    for (const sel of [$("f-tenant"), $("u-tenant")]) {
      const cur = sel.value;
      clear(sel).append(el("option", { value: "", text: "all" }));
      for (const t of st.tenants) sel.append(el("option", { value: t.name, text: t.name }));
      sel.value = cur;
    }
  }

  // ---------------------------------------------------------------- routing

  function route() {
    if (!st.session) return;
    const h = location.hash.replace(/^#/, "") || "/";
    const parts = h.split("/").filter(Boolean);
    let view = "sandboxes";
    if (parts[0] === "sandbox" && parts[1]) view = "sandbox";
    else if (["usage", "templates", "capacity", "webhooks", "secrets"].includes(parts[0])) view = parts[0];
    st.view = view;
    for (const v of document.querySelectorAll(".view")) v.hidden = v.id !== "view-" + view;
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", a.dataset.view === view || (view === "sandbox" && a.dataset.view === "sandboxes"));
    }
    ensureList();
    if (view === "sandbox") openDetail(decodeURIComponent(parts[1]));
    else st.detailId = "";
    if (view === "sandboxes") scheduleRender();
    if (view === "usage") loadUsage();
    if (view === "templates") loadTemplates();
    if (view === "capacity") loadCapacity();
    if (view === "webhooks") loadWebhooks();
    if (view === "secrets") loadSecrets();
  }

  // ---------------------------------------------------------------- sandboxes list

  // ensureList loads the list once per session and follows the events
  // stream from then on.
  async function ensureList() {
    if (st.listLoaded) return;
    st.listLoaded = true;
    const first = loadList(true);
    st.listReady = first.catch(() => {});
    try {
      await first;
    } catch (e) {
      st.listLoaded = false;
      if (e.status !== 401) {
        $("sb-error").textContent = "Could not load sandboxes: " + e.message + " (trying again)";
        setTimeout(() => { if (st.session) ensureList(); }, 3000);
      }
      return;
    }
    $("sb-error").textContent = "";
    startStream();
  }

  // latestCursor reads the seq of the tenant's newest event (one small
  // read: GET /v1/events?latest=true, which answers the cursor and no
  // events), so that the stream starts after what the list already shows.
  // It is read before the list: an event between the two is replayed (a
  // harmless refresh), never lost.
  async function latestCursor() {
    const r = await api("GET", "/v1/events?latest=true&since=" + st.cursor);
    return r.next;
  }

  // loadList reads the sandbox list by pages: the first page of the table
  // (PAGE_SIZE rows) is read and drawn at once, the rest is read behind it
  // in pages of LIST_PAGE, and the counts and the pager, which need the
  // whole list, show greyed until it is in. progressive is for a list
  // the page does not have yet (the first load, the "all" switch); a
  // reload of a list already shown (many changes at once) reads every
  // page first and swaps the whole list in, so the counts never dip.
  async function loadList(progressive) {
    const gen = ++st.listGen;
    if (progressive) delete document.body.dataset.listComplete;
    const t0 = performance.now();
    st.cursor = await latestCursor();
    const tCursor = performance.now();
    const base = new URLSearchParams();
    if ($("f-all").checked) base.set("all", "true");
    const read = (limit, after) => {
      const q = new URLSearchParams(base);
      q.set("limit", String(limit));
      if (after) q.set("after", after);
      return api("GET", "/v1/sandboxes?" + q);
    };
    const got = new Map();
    const add = (r) => {
      for (const sb of r.sandboxes || []) {
        got.set(sb.id, sb);
        st.tenantOf.set(sb.id, sb.tenant);
      }
    };
    let r = await read(PAGE_SIZE, "");
    if (gen !== st.listGen) return;
    const tList = performance.now();
    add(r);
    if (progressive) {
      st.sandboxes = got;
      st.listPartial = !!r.next;
      renderList();
      // What the page's speed test reads (BENCHMARKS.md): how long the
      // cursor, the first page and its render took, and when the rows
      // were on screen.
      const t1 = performance.now();
      timings({ cursorMs: tCursor - t0, listMs: tList - tCursor, renderMs: t1 - tList, listRenderedMs: t1 - t0, firstRenderAt: t1 });
      document.body.dataset.listReady = "1";
    }
    const tRest = performance.now();
    while (r.next) {
      r = await read(LIST_PAGE, r.next);
      if (gen !== st.listGen) return;
      add(r);
      if (progressive) scheduleRender();
    }
    const tRead = performance.now();
    st.sandboxes = got;
    st.listPartial = false;
    renderList();
    const tAll = performance.now();
    timings({ restMs: tRead - tRest, lastRenderMs: tAll - tRead, wholeListMs: tAll - t0, wholeListAt: tAll });
    document.body.dataset.listReady = "1";
    document.body.dataset.listComplete = "1";
  }

  function timings(t) {
    window.torporTimings = Object.assign(window.torporTimings || {}, t);
  }

  function filters() {
    const meta = $("f-meta").value.trim();
    let mk = "", mv = null;
    if (meta) {
      const i = meta.indexOf("=");
      if (i >= 0) { mk = meta.slice(0, i).trim(); mv = meta.slice(i + 1).trim(); } else mk = meta;
    }
    return {
      state: $("f-state").value, template: $("f-template").value, runtime: $("f-runtime").value,
      tenant: $("f-tenant").value, mk, mv, id: $("f-id").value.trim(),
    };
  }

  function matches(sb, f, skipState) {
    if (!skipState && f.state && sb.state !== f.state) return false;
    if (f.template && sb.template !== f.template) return false;
    if (f.runtime && (sb.runtime && sb.runtime.kind) !== f.runtime) return false;
    if (f.tenant && sb.tenant !== f.tenant) return false;
    if (f.id && !sb.id.startsWith(f.id)) return false;
    if (f.mk) {
      const m = sb.metadata || {};
      if (!(f.mk in m)) return false;
      if (f.mv !== null && m[f.mk] !== f.mv) return false;
    }
    return true;
  }

  function scheduleRender() {
    if (st.renderQueued) return;
    st.renderQueued = true;
    // A frame when the tab shows; a timer when it is hidden (a background
    // tab gets no animation frames), so the list is current when it shows.
    let done = false;
    const run = () => {
      if (done) return;
      done = true;
      st.renderQueued = false;
      renderList();
    };
    requestAnimationFrame(run);
    setTimeout(run, 250);
  }

  function fillSelect(sel, values) {
    const cur = sel.value;
    const have = Array.from(sel.options).map((o) => o.value).slice(1).join("\n");
    const want = Array.from(values).sort();
    if (have === want.join("\n")) return;
    const first = sel.options[0];
    clear(sel).append(first);
    for (const v of want) sel.append(el("option", { value: v, text: v }));
    sel.value = want.includes(cur) ? cur : "";
  }

  function renderList() {
    const f = filters();
    const all = Array.from(st.sandboxes.values());
    // Counts by state follow every filter but the state itself.
    const counts = {};
    const templates = new Set(), runtimes = new Set(), tenants = new Set();
    for (const sb of all) {
      templates.add(sb.template);
      if (sb.runtime && sb.runtime.kind) runtimes.add(sb.runtime.kind);
      tenants.add(sb.tenant);
      if (matches(sb, f, true)) counts[sb.state] = (counts[sb.state] || 0) + 1;
    }
    fillSelect($("f-template"), templates);
    fillSelect($("f-runtime"), runtimes);
    fillSelect($("f-state"), STATES.filter((s) => counts[s] || s === f.state));
    if (st.session && st.session.admin) {
      for (const t of st.tenants) tenants.add(t.name);
      fillSelect($("f-tenant"), tenants);
    }
    renderCounts(counts, f.state);

    const rows = all.filter((sb) => matches(sb, f, false));
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_SIZE));
    if (st.page >= pages) st.page = pages - 1;
    const slice = rows.slice(st.page * PAGE_SIZE, (st.page + 1) * PAGE_SIZE);
    const frag = document.createDocumentFragment();
    const now = Date.now();
    for (const sb of slice) frag.append(row(sb, now));
    $("sb-rows").replaceChildren(frag);
    $("sb-empty").hidden = rows.length > 0;
    $("sb-empty").textContent = st.sandboxes.size ? "No sandboxes match." : "No sandboxes yet.";
    $("pager").hidden = pages <= 1 && !st.listPartial;
    $("pg-info").textContent = "page " + (st.page + 1) + " of " + pages + " · " + rows.length + " sandboxes" + (st.listPartial ? " so far (loading the rest)" : "");
    $("pager").classList.toggle("partial", st.listPartial);
    $("pg-prev").disabled = st.page === 0;
    $("pg-next").disabled = st.page >= pages - 1;
  }

  function renderCounts(counts, active) {
    const box = clear($("counts"));
    // Greyed while the list is still coming in: the numbers are not
    // final yet.
    box.classList.toggle("partial", st.listPartial);
    box.title = st.listPartial ? "counting: the rest of the list is still loading" : "";
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const mk = (state, n, label) => el("button", {
      type: "button", class: active === state ? "on" : "", dataset: { state },
      onclick: () => { $("f-state").value = active === state ? "" : state; st.page = 0; scheduleRender(); },
    }, state ? badge(state) : el("span", { text: label }), el("span", { class: "n", text: String(n) }));
    box.append(mk("", total, "all"));
    for (const s of STATES) if (counts[s]) box.append(mk(s, counts[s]));
  }

  function row(sb, now) {
    const nx = nextEvent(sb);
    const meta = el("td", { class: "meta" });
    for (const [k, v] of Object.entries(sb.metadata || {})) {
      meta.append(el("span", { class: "chip", title: k + "=" + v, text: k + "=" + v }));
    }
    const tr = el("tr", { dataset: { id: sb.id } },
      el("td", { class: "id" }, el("a", { href: "#/sandbox/" + enc(sb.id), text: sb.id })),
      st.session && st.session.admin ? el("td", { class: "tenant", text: sb.tenant }) : null,
      el("td", { text: sb.template }),
      el("td", { text: (sb.runtime && sb.runtime.kind) || "" }),
      el("td", { class: "state" }, badge(sb.state), sb.failure ? el("span", { class: "muted", title: sb.failure.message, text: " " + sb.failure.code }) : null),
      el("td", { class: "since", dataset: { since: sb.state_since }, text: ago(sb.state_since, now) }),
      el("td", { class: "activity", dataset: { since: sb.last_activity_at }, text: sb.last_activity_at ? ago(sb.last_activity_at, now) + " ago" : "" }),
      el("td", { class: "next", title: nx ? nx.at : "", text: nx ? nx.action + " " + until(nx.at) : "" }),
      el("td", { class: "num", text: money(sb.meters && sb.meters.cost) }),
      meta);
    return tr;
  }

  // tick refreshes the relative times of the rows on screen.
  function tick() {
    const now = Date.now();
    if (st.view === "sandboxes") {
      for (const td of $("sb-rows").querySelectorAll("td.since")) td.textContent = ago(td.dataset.since, now);
      for (const td of $("sb-rows").querySelectorAll("td.activity")) {
        if (td.dataset.since) td.textContent = ago(td.dataset.since, now) + " ago";
      }
    }
    if (st.view === "sandbox" && st.detailId) {
      const sb = st.sandboxes.get(st.detailId);
      if (sb) {
        renderTimeline(sb);
        const s = $("d-since");
        if (s) s.textContent = ago(sb.state_since, now);
      }
    }
  }

  // ---------------------------------------------------------------- live events

  function stopStream() {
    if (st.stream) st.stream.abort();
    st.stream = null;
    setLive(false);
  }

  function setLive(on) {
    $("live").textContent = on ? "live" : "offline";
    $("live").classList.toggle("on", on);
  }

  // startStream follows GET /v1/events as server-sent events from the
  // cursor, reconnecting from the last event seen when the connection drops.
  async function startStream() {
    stopStream();
    const ctl = new AbortController();
    st.stream = ctl;
    let backoff = 500;
    while (!ctl.signal.aborted && st.session) {
      try {
        const r = await api("GET", "/v1/events?since=" + st.cursor, undefined, {
          raw: true, signal: ctl.signal, headers: { Accept: "text/event-stream" },
        });
        setLive(true);
        backoff = 500;
        await readSSE(r, (name, data) => {
          let ev;
          try { ev = JSON.parse(data); } catch (_) { return; }
          onEvent(ev);
        });
      } catch (e) {
        if (ctl.signal.aborted || e.status === 401) return;
      }
      setLive(false);
      await new Promise((res) => setTimeout(res, backoff));
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  function onEvent(ev) {
    const tEvent = performance.now();
    if (typeof ev.seq === "number" && ev.seq > st.cursor) st.cursor = ev.seq;
    if (!ev.sandbox_id) return;
    if (ev.tenant) st.tenantOf.set(ev.sandbox_id, ev.tenant);
    // A state-carrying event updates the row at once; the refresh that
    // follows brings the rest (meters, schedule).
    const sb = st.sandboxes.get(ev.sandbox_id);
    const to = stateAfter(ev);
    if (sb && to && to !== "starting") {
      sb.state = to;
      sb.state_since = ev.time;
      if (st.view === "sandboxes") {
        // The row on screen turns at once; the whole list (counts,
        // filters) follows at the next frame.
        const tr = $("sb-rows").querySelector(`tr[data-id="${CSS.escape(sb.id)}"]`);
        if (tr) {
          tr.replaceWith(row(sb, Date.now()));
          timings({ lastEventAt: tEvent, lastRowAt: performance.now() });
        }
        scheduleRender();
      }
    }
    if (st.detailId === ev.sandbox_id) {
      if (!st.detailEvents.some((e) => e.seq === ev.seq)) st.detailEvents.push(ev);
      if (sb && !st.busy) renderDetail();
    }
    refreshSoon(ev.sandbox_id);
  }

  function refreshSoon(id) {
    st.pending.add(id);
    if (st.pendingTimer) return;
    st.pendingTimer = setTimeout(flushPending, 25);
  }

  async function flushPending() {
    st.pendingTimer = 0;
    const ids = Array.from(st.pending);
    st.pending.clear();
    if (ids.length > 10 || st.reloading) {
      // Many changes at once: one list read is cheaper than many gets
      // (and keeps within the key's request rate). One read at a time;
      // changes that come during it get one more.
      if (st.reloading) {
        st.reloadAgain = true;
        return;
      }
      st.reloading = true;
      try {
        do {
          st.reloadAgain = false;
          await loadList();
        } while (st.reloadAgain && st.session);
      } catch (_) { /* the stream goes on; the next change reads again */ }
      st.reloading = false;
      if (st.detailId) renderDetail();
      return;
    }
    await Promise.all(ids.map(async (id) => {
      try {
        const sb = await api("GET", sbPath(id));
        if (!matchesTenantScope(sb)) return;
        if (sb.state === "terminated" && !$("f-all").checked && st.detailId !== id) st.sandboxes.delete(id);
        else st.sandboxes.set(id, sb);
      } catch (e) {
        if (e.status === 404) st.sandboxes.delete(id);
      }
    }));
    if (st.view === "sandboxes") scheduleRender();
    if (st.detailId && ids.includes(st.detailId)) {
      renderDetail();
      refreshDetailUsage(st.detailId);
    }
  }

  // refreshDetailUsage reads the sandbox's ledger again for its meter chart.
  async function refreshDetailUsage(id) {
    try {
      const u = await api("GET", "/v1/usage?rows=true&sandbox=" + enc(id));
      if (st.detailId !== id) return;
      st.detailUsage = u.rows || [];
      renderMeterChart();
    } catch (_) { /* the chart keeps what it had */ }
  }

  function matchesTenantScope(sb) {
    return !!sb && (st.session.admin || sb.tenant === st.session.tenant);
  }

  // ---------------------------------------------------------------- a sandbox's page

  async function openDetail(id) {
    const fresh = st.detailId !== id;
    st.detailId = id;
    $("d-id").textContent = id;
    $("d-error").textContent = "";
    if (fresh) {
      st.detailEvents = [];
      st.detailUsage = [];
      clear($("exec-out"));
      $("exec-cmd").value = "";
      $("exec-status").textContent = "";
      delete $("exec-status").dataset.exit;
      clear($("fs-rows"));
      st.fsPath = "/";
      $("fs-path").value = "/";
    }
    try {
      // An admin reads a sandbox as its tenant (scoped): one opened by
      // its link before the list came waits for the list to know it.
      if (st.session.admin && !st.tenantOf.has(id) && st.listReady) await st.listReady;
      if (st.detailId !== id) return;
      const [sb, evs, usage] = await Promise.all([
        api("GET", sbPath(id)),
        sandboxEvents(id),
        api("GET", "/v1/usage?rows=true&sandbox=" + enc(id)).catch(() => null),
      ]);
      if (st.detailId !== id) return;
      st.sandboxes.set(id, sb);
      st.detailEvents = evs;
      st.detailUsage = (usage && usage.rows) || [];
      renderDetail();
      document.body.dataset.detailReady = id;
      if (sb.state === "running" && fresh) listFiles();
    } catch (e) {
      $("d-error").textContent = e.status === 404 ? "No such sandbox." : e.message;
    }
  }

  async function sandboxEvents(id) {
    let since = 0;
    const out = [];
    for (;;) {
      const r = await api("GET", sbPath(id) + "/events?limit=10000&since=" + since);
      out.push(...(r.events || []));
      since = r.next;
      if (!r.events || r.events.length < 10000) return out;
    }
  }

  function renderDetail() {
    const sb = st.sandboxes.get(st.detailId);
    if (!sb) return;
    const b = $("d-badge");
    b.className = "badge " + sb.state + (TRANSITIONAL.has(sb.state) ? " transitional" : "");
    b.textContent = sb.state;
    b.dataset.state = sb.state;
    renderActions(sb);
    const failure = sb.failure ? el("span", {}, sb.failure.code + ": " + sb.failure.message) : null;
    const meta = el("span");
    for (const [k, v] of Object.entries(sb.metadata || {})) meta.append(el("span", { class: "chip", text: k + "=" + v }));
    kv($("d-details"), [
      ["tenant", sb.tenant], ["template", sb.template], ["runtime", (sb.runtime && sb.runtime.kind) || ""],
      ["state", el("span", {}, sb.state + " for ", el("span", { id: "d-since", text: ago(sb.state_since) }))],
      ["failure", failure], ["created", when(sb.created_at)], ["last activity", when(sb.last_activity_at)],
      ["resources", sb.resources ? `${sb.resources.vcpus} vCPU, ${sb.resources.memory_mib} MiB, disk ${sb.resources.disk_mib} MiB` : ""],
      ["pause modes", (sb.pause_modes || []).join(", ")], ["paused by", sb.pause_mode || ""],
      ["snapshot", sb.snapshot ? bytes(sb.snapshot.size_bytes) : ""], ["boots", String(sb.boots)],
      ["address", sb.address || ""], ["internet", sb.allow_internet ? "allowed" : "no"],
      ["node", sb.node ? sb.node + " (epoch " + sb.node_epoch + ")" : (sb.durability === "remote" ? "none: in the object store, any node may start it" : "")],
      ["durability", sb.durability === "remote" ? "remote (in the object store too)" : sb.durability === "node" ? "node (on its node only)" : ""],
      ["metadata", meta.childNodes.length ? meta : ""],
    ]);
    const m = sb.meters || {};
    kv($("d-meters"), [
      ["running", dur(m.running_s || 0)], ["frozen", dur(m.frozen_s || 0)],
      ["snapshot-paused", dur(m.snapshot_paused_s || 0)], ["hibernated", dur(m.hibernated_s || 0)],
      ["billed", dur(m.billed_s || 0)], ["cost", money(m.cost || 0)],
      ["pauses", `${m.pauses || 0} (auto ${m.auto_paused || 0})`], ["resumes", `${m.resumes || 0} (auto ${m.auto_resumed || 0})`],
      ["hibernations", `${m.hibernations || 0} (auto ${m.auto_hibernated || 0})`],
    ]);
    renderMeterChart();
    renderPolicy(sb);
    renderHooks(sb);
    renderPorts(sb);
    renderGPU(sb);
    renderWakeups(sb);
    renderTimeline(sb);
  }

  function renderActions(sb) {
    const s = sb.state;
    const modes = sb.pause_modes || [];
    const allowed = {
      pause: s === "running", hibernate: s === "running" || s === "paused",
      start: s === "paused" || s === "hibernated" || s === "archived" || s === "failed", restart: s === "running",
      touch: s !== "terminated" && s !== "failed", delete: s !== "terminated",
    };
    for (const btn of $("d-actions").querySelectorAll("button")) {
      const act = btn.dataset.act;
      let ok = allowed[act] && !st.busy;
      if (act === "pause" && !modes.includes(btn.dataset.mode)) {
        btn.hidden = true;
        ok = false;
      } else btn.hidden = false;
      btn.disabled = !ok;
    }
  }

  const PROGRESS = { pause: "pausing", hibernate: "hibernating", start: "resuming", restart: "restarting", delete: "terminating", touch: "touching" };

  async function act(btn) {
    const id = st.detailId;
    const sb = st.sandboxes.get(id);
    if (!sb) return;
    const verb = btn.dataset.act;
    if (verb === "delete" && !(await confirmDelete(id))) return;
    st.busy = true;
    renderActions(sb);
    const prog = $("d-progress");
    prog.hidden = false;
    prog.textContent = PROGRESS[verb] + "…";
    if (verb !== "touch") {
      const b = $("d-badge");
      b.className = "badge transitional";
      b.textContent = PROGRESS[verb];
      b.dataset.state = PROGRESS[verb];
    }
    $("d-error").textContent = "";
    try {
      let res;
      if (verb === "delete") res = await api("DELETE", sbPath(id));
      else if (verb === "pause") res = await api("POST", sbPath(id) + "/pause", { mode: btn.dataset.mode });
      else res = await api("POST", sbPath(id) + "/" + verb, {});
      if (res && res.id) st.sandboxes.set(id, res);
      prog.textContent = verb === "touch" ? "touched" : "→ " + (res ? res.state : "");
    } catch (e) {
      $("d-error").textContent = verb + " failed: " + e.message;
      prog.textContent = "";
    } finally {
      st.busy = false;
      renderDetail();
      setTimeout(() => { if (!st.busy) prog.hidden = true; }, 4000);
    }
  }

  function confirmDelete(id) {
    const dlg = $("confirm");
    $("confirm-text").textContent = "Delete sandbox " + id + "? Its processes, disk and snapshots are removed; this cannot be undone.";
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
      dlg.returnValue = "";
      dlg.showModal();
    });
  }

  // renderTimeline draws the sandbox's states over its life as an SVG band,
  // one segment per state with a mark at each transition, and lists the
  // transitions with their causes.
  function renderTimeline(sb) {
    const box = $("d-timeline");
    const evs = st.detailEvents.slice().sort((a, b) => a.seq - b.seq);
    const t0 = Date.parse(sb.created_at);
    const tEnd = sb.state === "terminated" && sb.terminated_at ? Date.parse(sb.terminated_at) : Date.now();
    const span = Math.max(1000, tEnd - t0);
    const segs = [];
    let cur = "starting", from = t0;
    const marks = [];
    for (const ev of evs) {
      const to = stateAfter(ev);
      const t = Date.parse(ev.time);
      if (!to || ev.type === "sandbox.created") continue;
      if (t > from) segs.push({ state: cur, from, to: t });
      cur = to;
      from = t;
      marks.push({ t, ev, to });
    }
    // A state the page knows of that no event carries yet (a transitional
    // state while a verb runs) still shows.
    const live = sb.state;
    if (live !== cur && TRANSITIONAL.has(live)) {
      const t = Math.max(from, Date.parse(sb.state_since));
      if (t > from) segs.push({ state: cur, from, to: t });
      cur = live;
      from = t;
    }
    segs.push({ state: cur, from, to: tEnd });

    const W = 1000, H = 64, top = 8, band = 26;
    const x = (t) => ((t - t0) / span) * W;
    const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "state timeline", class: "tl" });
    for (const s of segs) {
      const cls = TRANSITIONAL.has(s.state) ? "seg-transitional" : "seg-" + s.state;
      svg.append(sv("rect", { x: x(s.from).toFixed(1), y: top, width: Math.max(1, x(s.to) - x(s.from)).toFixed(1), height: band, class: cls, "data-state": s.state },
        sv("title", {}, `${s.state}: ${when(new Date(s.from).toISOString())} – ${when(new Date(s.to).toISOString())} (${dur((s.to - s.from) / 1000)})`)));
    }
    for (const m of marks) {
      const mx = x(m.t).toFixed(1);
      svg.append(sv("line", { x1: mx, x2: mx, y1: top - 4, y2: top + band + 4, class: "mark" },
        sv("title", {}, `${when(m.ev.time)} → ${m.to}: ${causeText(m.ev)}`)));
    }
    svg.append(sv("line", { x1: 0, x2: W, y1: top + band + 8, y2: top + band + 8, class: "axis" }));
    svg.append(sv("text", { x: 0, y: H - 4 }, when(sb.created_at)));
    svg.append(sv("text", { x: W, y: H - 4, "text-anchor": "end" }, sb.state === "terminated" ? when(sb.terminated_at) : "now"));
    box.replaceChildren(svg);

    const legend = el("div", { class: "legend" });
    for (const s of ["running", "paused", "hibernated", "failed"]) legend.append(el("span", {}, el("i", { class: s }), s));
    box.append(legend);

    const list = $("d-transitions");
    if (list.childElementCount !== marks.length + 1) {
      const frag = document.createDocumentFragment();
      frag.append(el("li", { text: when(sb.created_at) + " created" }));
      for (const m of marks) {
        frag.append(el("li", { dataset: { to: m.to, type: m.ev.type } },
          when(m.ev.time) + " → ", badge(m.to), " ", el("span", { class: "cause", text: causeText(m.ev) })));
      }
      list.replaceChildren(frag);
    }
  }

  // renderMeterChart plots the sandbox's cumulative seconds in each metered
  // state and its cost over time, from its usage ledger rows.
  function renderMeterChart() {
    const box = $("d-meterchart");
    const rows = st.detailUsage.slice().sort((a, b) => Date.parse(a.start) - Date.parse(b.start));
    if (!rows.length) {
      box.replaceChildren(el("p", { class: "muted", text: "No metered usage yet." }));
      return;
    }
    const kinds = { running: "bar-running", frozen: "bar-frozen", snapshot_paused: "bar-snapshot", hibernated: "bar-hibernated" };
    const t0 = Date.parse(rows[0].start);
    const t1 = Math.max(t0 + 1000, ...rows.map((r) => Date.parse(r.end)));
    const acc = { running: 0, frozen: 0, snapshot_paused: 0, hibernated: 0, cost: 0 };
    const pts = { running: [[t0, 0]], frozen: [[t0, 0]], snapshot_paused: [[t0, 0]], hibernated: [[t0, 0]], cost: [[t0, 0]] };
    for (const r of rows) {
      if (r.kind in acc) acc[r.kind] += r.seconds || 0;
      acc.cost += r.cost || 0;
      const t = Date.parse(r.end);
      for (const k of Object.keys(pts)) pts[k].push([t, acc[k]]);
    }
    const maxS = Math.max(1, acc.running, acc.frozen, acc.snapshot_paused, acc.hibernated);
    const maxC = Math.max(1e-9, acc.cost);
    const W = 400, H = 140, P = 24;
    const x = (t) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P);
    const y = (v, max) => H - P - (v / max) * (H - 2 * P);
    const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "meters over time" });
    svg.append(sv("line", { x1: P, x2: W - P, y1: H - P, y2: H - P, class: "axis" }));
    svg.append(sv("line", { x1: P, x2: P, y1: P, y2: H - P, class: "axis" }));
    for (const [k, cls] of Object.entries(kinds)) {
      if (!acc[k]) continue;
      const d = pts[k].map(([t, v]) => `${x(t).toFixed(1)},${y(v, maxS).toFixed(1)}`).join(" ");
      svg.append(sv("polyline", { points: d, fill: "none", "stroke-width": 2, class: cls.replace("bar-", "stroke-") }));
    }
    const dc = pts.cost.map(([t, v]) => `${x(t).toFixed(1)},${y(v, maxC).toFixed(1)}`).join(" ");
    svg.append(sv("polyline", { points: dc, class: "line-cost" }));
    svg.append(sv("text", { x: P, y: P - 8 }, "seconds (max " + dur(maxS) + ")"));
    svg.append(sv("text", { x: W - P, y: P - 8, "text-anchor": "end" }, "cost " + money(acc.cost)));
    const legend = el("div", { class: "legend" },
      el("span", {}, el("i", { class: "running" }), "running"), el("span", {}, el("i", { class: "frozen" }), "frozen"),
      el("span", {}, el("i", { class: "snapshot" }), "snapshot"), el("span", {}, el("i", { class: "hibernated" }), "hibernated"),
      el("span", {}, el("i", { class: "cost" }), "cost"));
    box.replaceChildren(svg, legend);
  }

  function renderPolicy(sb) {
    const l = sb.lifecycle || {};
    const p = sb.lifecycle_policy || {};
    const secs = (v) => (v === undefined || v === null ? "" : dur(v));
    kv($("d-policy"), [
      ["timeout", secs(sb.timeout)], ["on timeout", l.on_timeout || ""],
      ["auto-resume", l.auto_resume === false ? "off" : "on"], ["pause mode", l.pause_mode || ""],
      ["pause after idle", secs(p.pause_after_idle_seconds)],
      ["hibernate after paused", secs(p.hibernate_after_paused_seconds)],
      ["connection idle", secs(p.connection_idle_seconds)],
      ["archive after hibernated", secs(p.archive_after_hibernated_seconds)],
      ["end at", sb.end_at ? when(sb.end_at) + " (" + (sb.on_end || "kill") + ")" : ""],
      ["pause at", sb.pause_at ? when(sb.pause_at) : ""], ["hibernates at", sb.hibernates_at ? when(sb.hibernates_at) : ""],
      ["kill at", sb.kill_at ? when(sb.kill_at) : ""],
      ["archives at", sb.archives_at ? when(sb.archives_at) : ""],
      ["restored from archive", sb.restored_from_archive_at ? when(sb.restored_from_archive_at) : ""],
    ]);
    const ul = clear($("d-upcoming"));
    const up = (sb.upcoming_events || []).slice().sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
    if (!up.length) ul.append(el("li", { class: "muted", text: "Nothing scheduled within the hour." }));
    for (const e of up) ul.append(el("li", {}, `${e.action} ${until(e.at)} (${when(e.at)})`, e.cause ? el("span", { class: "muted", text: " · " + (CAUSES[e.cause] || e.cause) }) : null));
  }

  function renderHooks(sb) {
    if (!sb) return;
    const ul = clear($("d-hooks"));
    const last = {};
    for (const ev of st.detailEvents) {
      if (ev.type === "hook.ran" || ev.type === "hook.failed") last[(ev.attrs || {}).index] = ev;
    }
    const hooks = sb.hooks || [];
    if (!hooks.length) ul.append(el("li", { class: "muted", text: "No hooks." }));
    hooks.forEach((h, i) => {
      const ev = last[String(i)];
      let res = el("span", { class: "muted", text: " · not run yet" });
      if (ev) {
        res = ev.type === "hook.ran"
          ? el("span", { class: "muted", text: " · ok " + when(ev.time) })
          : el("span", { class: "error", text: " · failed " + when(ev.time) + ": " + ((ev.attrs || {}).error || "") });
      }
      ul.append(el("li", {}, `on ${h.on}: ${h.type} ${h.path}${h.port ? " :" + h.port : ""}${h.wait ? " (waits)" : ""}`, res));
    });
    if (sb.hook_failure) {
      const f = sb.hook_failure;
      ul.append(el("li", { class: "error", text: `last failure: on ${f.on} #${f.index} at ${when(f.at)}: ${f.message}` }));
    }
  }

  // proxyURL is a port's address through the daemon's proxy, from the
  // session's proxy_url (the daemon's proxy_domain, port and TLS); the
  // default proxy address when the daemon named none.
  function proxyURL(sb, port) {
    const s = st.session || {};
    const tmpl = s.proxy_url && s.proxy_url.includes("{port}") ? s.proxy_url : "http://{port}-{id}.localhost:7071/";
    return tmpl.replaceAll("{port}", String(port)).replaceAll("{id}", sb.id);
  }

  function renderPorts(sb) {
    const ul = clear($("d-ports"));
    const ports = sb.ports || [];
    if (!ports.length) ul.append(el("li", { class: "muted", text: "No ports set; every port is reachable with the traffic token." }));
    for (const p of ports) {
      const u = proxyURL(sb, p.port);
      ul.append(el("li", {}, el("code", { text: String(p.port) }), " ", el("a", { href: u, target: "_blank", rel: "noopener noreferrer", text: u }),
        el("span", { class: "muted", text: p.public ? " · public" : " · needs X-Torpor-Token" })));
    }
  }

  function renderGPU(sb) {
    const a = sb.accel;
    const card = $("d-gpu").closest(".card");
    card.hidden = !a;
    if (!a) return;
    const g = sb.gpu && typeof sb.gpu === "object" ? sb.gpu : {};
    kv($("d-gpu"), [
      ["gpus", String(a.gpus)], ["vram", a.vram_mib + " MiB"], ["suspend", a.suspend_mode || "none"],
      ["idle timeout", a.idle_timeout_s ? dur(a.idle_timeout_s) : ""],
      ...Object.entries(g).filter(([, v]) => typeof v !== "object").map(([k, v]) => [k, String(v)]),
    ]);
  }

  // ---------------------------------------------------------------- files

  async function listFiles(path) {
    if (path !== undefined) st.fsPath = path;
    $("fs-path").value = st.fsPath;
    $("fs-error").textContent = "";
    const id = st.detailId;
    const tbody = $("fs-rows");
    try {
      const r = await api("GET", sbPath(id) + "/files/list?depth=1&path=" + enc(st.fsPath));
      if (id !== st.detailId) return;
      const frag = document.createDocumentFragment();
      const entries = (r.entries || []).slice().sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
      for (const f of entries) {
        const name = f.type === "dir"
          ? el("a", { href: "#", class: "dir", text: f.name + "/", onclick: (e) => { e.preventDefault(); listFiles(f.path); } })
          : el("span", { text: f.name + (f.link_target ? " → " + f.link_target : "") });
        const dl = f.type === "file"
          ? el("a", { href: scoped("GET", sbPath(id) + "/files?path=" + enc(f.path)), download: f.name, class: "download", text: "Download" })
          : null;
        frag.append(el("tr", { dataset: { name: f.name } }, el("td", {}, name), el("td", { class: "num", text: f.type === "file" ? bytes(f.size) : "" }),
          el("td", { text: when(f.mtime) }), el("td", {}, dl)));
      }
      tbody.replaceChildren(frag);
      if (r.truncated) tbody.append(el("tr", {}, el("td", { colspan: 4, class: "muted", text: "More entries than shown." })));
    } catch (e) {
      clear(tbody);
      $("fs-error").textContent = e.message;
    }
  }

  async function upload(input) {
    const file = input.files && input.files[0];
    if (!file) return;
    const dir = st.fsPath.endsWith("/") ? st.fsPath : st.fsPath + "/";
    $("fs-error").textContent = "uploading " + file.name + "…";
    try {
      await api("PUT", sbPath(st.detailId) + "/files?path=" + enc(dir + file.name), file);
      $("fs-error").textContent = "";
      document.body.dataset.uploaded = file.name;
      await listFiles();
    } catch (e) {
      $("fs-error").textContent = "upload failed: " + e.message;
    } finally {
      input.value = "";
    }
  }

  // ---------------------------------------------------------------- exec

  async function runExec(ev) {
    ev.preventDefault();
    const cmd = $("exec-cmd").value.trim();
    if (!cmd) return;
    const out = clear($("exec-out"));
    const status = $("exec-status");
    status.textContent = "running…";
    $("exec-run").disabled = true;
    try {
      const r = await api("POST", sbPath(st.detailId) + "/exec", { cmd: ["sh", "-c", cmd] }, {
        raw: true, headers: { Accept: "text/event-stream" },
      });
      await readSSE(r, (name, data) => {
        let d;
        try { d = JSON.parse(data); } catch (_) { return; }
        if (name === "stdout" || name === "stderr") {
          out.append(name === "stderr" ? el("span", { class: "stderr", text: d.data }) : document.createTextNode(d.data));
          out.scrollTop = out.scrollHeight;
        } else if (name === "exit") {
          status.textContent = "exit " + d.exit_code + (d.timed_out ? " (timed out)" : "");
          status.dataset.exit = String(d.exit_code);
        } else if (name === "error") {
          status.textContent = "error: " + ((d.error && d.error.message) || data);
        }
      });
    } catch (e) {
      status.textContent = "error: " + e.message;
    } finally {
      $("exec-run").disabled = false;
    }
  }

  // ---------------------------------------------------------------- usage

  function isoDay(d) {
    return d.toISOString().slice(0, 10);
  }

  async function loadUsage(ev) {
    if (ev) ev.preventDefault();
    if (!$("u-from").value) $("u-from").value = isoDay(new Date(Date.now() - 29 * 86400000));
    if (!$("u-to").value) $("u-to").value = isoDay(new Date());
    const q = new URLSearchParams({ group_by: "day", from: $("u-from").value });
    const to = new Date(Date.parse($("u-to").value) + 86400000);
    q.set("to", isoDay(to));
    if (st.session.admin && $("u-tenant").value) q.set("tenant", $("u-tenant").value);
    $("u-error").textContent = "";
    try {
      st.usage = await api("GET", "/v1/usage?" + q);
    } catch (e) {
      $("u-error").textContent = e.message;
      return;
    }
    renderUsage();
  }

  function renderUsage() {
    const u = st.usage;
    const t = u.total || {};
    const cur = u.currency || "";
    clear($("u-total")).append(
      el("div", {}, "cost", el("b", { text: money(t.cost || 0) + " " + cur })),
      el("div", {}, "running", el("b", { text: dur(t.running_s || 0) })),
      el("div", {}, "frozen", el("b", { text: dur(t.frozen_s || 0) })),
      el("div", {}, "snapshot-paused", el("b", { text: dur(t.snapshot_paused_s || 0) })),
      el("div", {}, "hibernated", el("b", { text: dur(t.hibernated_s || 0) })));
    const groups = (u.groups || []).slice().sort((a, b) => a.key.localeCompare(b.key));
    const frag = document.createDocumentFragment();
    for (const g of groups) {
      frag.append(el("tr", {}, el("td", { text: g.key }), el("td", { class: "num", text: (g.running_s || 0).toFixed(0) }),
        el("td", { class: "num", text: (g.frozen_s || 0).toFixed(0) }), el("td", { class: "num", text: (g.snapshot_paused_s || 0).toFixed(0) }),
        el("td", { class: "num", text: (g.hibernated_s || 0).toFixed(0) }), el("td", { class: "num", text: money(g.cost || 0) })));
    }
    $("u-rows").replaceChildren(frag);
    renderUsageChart(groups);
  }

  // renderUsageChart draws stacked bars of seconds per state for each day,
  // with the day's cost as a line on its own scale.
  function renderUsageChart(groups) {
    const box = $("u-chart");
    if (!groups.length) {
      box.replaceChildren(el("p", { class: "muted", text: "No usage in this window." }));
      return;
    }
    const W = 1000, H = 260, P = 36;
    const kinds = [["running_s", "bar-running"], ["frozen_s", "bar-frozen"], ["snapshot_paused_s", "bar-snapshot"], ["hibernated_s", "bar-hibernated"]];
    const maxS = Math.max(1, ...groups.map((g) => kinds.reduce((a, [k]) => a + (g[k] || 0), 0)));
    const maxC = Math.max(1e-9, ...groups.map((g) => g.cost || 0));
    // Bars are at most 80 units wide, so a few days do not fill the chart.
    const bw = Math.min(80, (W - 2 * P) / groups.length);
    const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "usage per day" });
    svg.append(sv("line", { x1: P, x2: W - P, y1: H - P, y2: H - P, class: "axis" }));
    const pts = [];
    groups.forEach((g, i) => {
      let y = H - P;
      const x = P + i * bw;
      for (const [k, cls] of kinds) {
        const h = ((g[k] || 0) / maxS) * (H - 2 * P);
        if (h <= 0) continue;
        y -= h;
        svg.append(sv("rect", { x: (x + bw * 0.1).toFixed(1), y: y.toFixed(1), width: (bw * 0.8).toFixed(1), height: h.toFixed(1), class: cls },
          sv("title", {}, `${g.key} ${k.replace(/_s$/, "")}: ${dur(g[k])}`)));
      }
      const cx = (x + bw / 2).toFixed(1), cy = (H - P - ((g.cost || 0) / maxC) * (H - 2 * P)).toFixed(1);
      pts.push(`${cx},${cy}`);
      svg.append(sv("circle", { cx, cy, r: 3, class: "dot-cost" }, sv("title", {}, `${g.key} cost ${money(g.cost || 0)}`)));
      if (groups.length <= 31 && (groups.length <= 10 || i % Math.ceil(groups.length / 10) === 0)) {
        svg.append(sv("text", { x: (x + bw / 2).toFixed(1), y: H - P + 14, "text-anchor": "middle" }, g.key.slice(5)));
      }
    });
    svg.append(sv("polyline", { points: pts.join(" "), class: "line-cost" }));
    svg.append(sv("text", { x: P, y: P - 12 }, "seconds per day (max " + dur(maxS) + ")"));
    svg.append(sv("text", { x: W - P, y: P - 12, "text-anchor": "end" }, "cost (max " + money(maxC) + ")"));
    const legend = el("div", { class: "legend" },
      el("span", {}, el("i", { class: "running" }), "running"), el("span", {}, el("i", { class: "frozen" }), "frozen"),
      el("span", {}, el("i", { class: "snapshot" }), "snapshot-paused"), el("span", {}, el("i", { class: "hibernated" }), "hibernated"),
      el("span", {}, el("i", { class: "cost" }), "cost"));
    box.replaceChildren(svg, legend);
  }

  // csvCell quotes a CSV field, and defuses a leading formula character so
  // a spreadsheet shows it as text.
  function csvCell(v) {
    let s = v === undefined || v === null ? "" : String(v);
    if (/^[=+\-@\t\r]/.test(s) && !/^-?\d/.test(s)) s = "'" + s;
    return /[",\n\r]/.test(s) ? '"' + s.replaceAll('"', '""') + '"' : s;
  }

  function downloadCSV() {
    const u = st.usage;
    if (!u) return;
    const cols = ["day", "running_s", "frozen_s", "snapshot_paused_s", "hibernated_s", "billed_s", "vcpu_s", "memory_gib_s", "disk_gib_s", "snapshot_gib_s", "cost"];
    const lines = [cols.join(",")];
    for (const g of (u.groups || []).slice().sort((a, b) => a.key.localeCompare(b.key))) {
      lines.push([g.key, ...cols.slice(1).map((c) => g[c] || 0)].map(csvCell).join(","));
    }
    const blob = new Blob([lines.join("\n") + "\n"], { type: "text/csv" });
    const a = el("a", { href: URL.createObjectURL(blob), download: `torpor-usage-${$("u-from").value}-${$("u-to").value}.csv` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }

  // ---------------------------------------------------------------- templates

  async function loadTemplates() {
    const tbody = $("t-rows");
    try {
      const r = await api("GET", "/v1/templates");
      const frag = document.createDocumentFragment();
      for (const t of r.templates || []) {
        frag.append(el("tr", {}, el("td", { text: t.name }),
          el("td", { text: t.source ? t.source.kind + (t.source.ref ? " " + t.source.ref : "") : "" }),
          el("td", { class: "num", text: bytes(t.size_bytes) }), el("td", { class: "num", text: String(t.in_use || 0) }),
          el("td", { text: when(t.created_at) })));
      }
      tbody.replaceChildren(frag);
    } catch (e) {
      tbody.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "error", text: e.message })));
    }
  }

  async function buildTemplate(ev) {
    ev.preventDefault();
    const out = clear($("t-progress"));
    const name = $("t-name").value.trim();
    const packages = $("t-packages").value.split(/[\s,]+/).filter(Boolean);
    try {
      const r = await api("POST", "/v1/templates/build", { name, packages }, { raw: true, headers: { Accept: "text/event-stream" } });
      await readSSE(r, (evName, data) => {
        let d = null;
        try { d = JSON.parse(data); } catch (_) { /* shown raw */ }
        if (evName === "progress") out.append((d && d.message) || data, "\n");
        else if (evName === "template") out.append("built " + ((d && d.name) || name) + "\n");
        else if (evName === "error") out.append(el("span", { class: "stderr", text: "error: " + ((d && d.error && d.error.message) || data) + "\n" }));
        out.scrollTop = out.scrollHeight;
      });
    } catch (e) {
      out.append(el("span", { class: "stderr", text: "error: " + e.message }));
    }
    loadTemplates();
  }

  // ---------------------------------------------------------------- capacity

  // parseMetrics reads the capacity gauges from the Prometheus text of
  // GET /metrics.
  function parseMetrics(text) {
    const out = { capacity: {}, used: {} };
    for (const line of text.split("\n")) {
      const m = /^torpor_capacity(_used)?\{resource="([a-z_]+)"\}\s+([0-9.eE+-]+)/.exec(line);
      if (m) out[m[1] ? "used" : "capacity"][m[2]] = Number(m[3]);
    }
    return out;
  }

  async function loadCapacity() {
    const bars = clear($("c-bars"));
    try {
      const r = await fetch("/metrics", { credentials: "same-origin", cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      const m = parseMetrics(await r.text());
      const names = Object.keys(m.capacity);
      if (!names.length) bars.append(el("p", { class: "muted", text: "This node reports no capacity figures." }));
      for (const k of names) {
        const cap = m.capacity[k], used = m.used[k] || 0;
        const span = el("span");
        span.style.width = Math.min(100, cap ? (used / cap) * 100 : 0).toFixed(1) + "%";
        bars.append(el("div", {}, `${k}: ${used} of ${cap} held (${cap ? ((used / cap) * 100).toFixed(0) : 0}%)`),
          el("div", { class: "bar", title: k }, span));
      }
      bars.append(el("p", { class: "muted", text: "Held counts running sandboxes in full and paused ones less the share paused_resource_release_ratio releases; hibernated sandboxes hold nothing." }));
    } catch (e) {
      bars.append(el("p", { class: "muted", text: "Capacity figures are not available: " + e.message }));
    }
    if (st.session.admin) {
      await loadTenants();
      $("c-tenants-h").hidden = false;
      $("c-tenants").hidden = false;
      const frag = document.createDocumentFragment();
      for (const t of st.tenants) {
        const u = t.usage || {}, q = t.quota || {};
        const f = (a, b) => String(a || 0) + (b ? " / " + b : "");
        frag.append(el("tr", {}, el("td", { text: t.name }), el("td", { class: "num", text: f(u.sandboxes, q.max_sandboxes) }),
          el("td", { class: "num", text: f(u.vcpus, q.max_vcpus) }), el("td", { class: "num", text: f(u.memory_mib, q.max_memory_mib) }),
          el("td", { class: "num", text: f(u.disk_mib, q.max_disk_mib) })));
      }
      $("c-rows").replaceChildren(frag);
    }
    if (st.session.admin) await loadNodes();
    try {
      const r = await api("GET", "/v1/runtimes");
      const ul = clear($("c-runtimes"));
      for (const rt of r.runtimes || []) {
        const det = Object.entries(rt.details || {}).map(([k, v]) => k + "=" + v).join(", ");
        ul.append(el("li", { text: `${rt.kind} (${rt.isolation}${rt.default ? ", default" : ""}): pause by ${(rt.pause_modes || []).join(", ") || "nothing"}${det ? "; " + det : ""}` }));
      }
    } catch (_) { /* shown empty */ }
    const leases = Array.from(st.sandboxes.values()).filter((sb) => sb.accel && sb.state !== "terminated");
    $("c-gpu-h").hidden = !leases.length;
    $("c-gpu").hidden = !leases.length;
    const frag = document.createDocumentFragment();
    for (const sb of leases) {
      const g = sb.gpu && typeof sb.gpu === "object" ? sb.gpu : {};
      frag.append(el("tr", {}, el("td", {}, el("a", { href: "#/sandbox/" + enc(sb.id), text: sb.id })), el("td", { class: "num", text: String(sb.accel.gpus) }),
        el("td", { class: "num", text: String(sb.accel.vram_mib) }), el("td", { text: sb.accel.suspend_mode || "none" }),
        el("td", { text: g.state || sb.state })));
    }
    $("c-gpu-rows").replaceChildren(frag);
  }

  // loadNodes shows an admin the fleet's nodes (GET /v1/nodes): each
  // one's state, what it lends and what its sandboxes hold, and how many
  // it holds in each state. A server that is no node of a fleet has none,
  // and the table stays hidden.
  async function loadNodes() {
    $("c-nodes-error").textContent = "";
    let nodes = [];
    try {
      nodes = (await api("GET", "/v1/nodes")).nodes || [];
    } catch (e) {
      $("c-nodes-error").textContent = "Nodes are not available: " + e.message;
    }
    $("c-nodes-h").hidden = !nodes.length;
    $("c-nodes").hidden = !nodes.length;
    const frag = document.createDocumentFragment();
    for (const n of nodes) frag.append(nodeRow(n));
    $("c-nodes-rows").replaceChildren(frag);
  }

  // nodeRow is one node: its name (marked when it is the node the page
  // talks to), state badge, CPU and memory bars and sandbox counts.
  function nodeRow(n) {
    const cap = n.capacity || {}, used = n.used || {}, counts = n.sandboxes || {};
    const labels = el("span");
    for (const [k, v] of Object.entries(n.labels || {})) labels.append(el("span", { class: "chip", text: v ? k + "=" + v : k }));
    return el("tr", { "data-node": n.name },
      el("td", { class: "mono", text: n.name + (n.self ? " (this node)" : "") }),
      el("td", {}, el("span", { class: "badge " + n.state, text: n.state })),
      el("td", { class: "mono", text: n.address || "—" }),
      el("td", {}, usageBar(used.vcpus || 0, cap.vcpus || 0, (v) => String(Math.round(v * 100) / 100), "vCPU")),
      el("td", {}, usageBar(used.memory_mib || 0, cap.memory_mib || 0, (v) => String(Math.round(v)), "MiB")),
      el("td", { class: "num", text: String(counts.running || 0) }),
      el("td", { class: "num", text: String(counts.paused || 0) }),
      el("td", { class: "num", text: String(counts.hibernated || 0) }),
      el("td", {}, labels),
      el("td", { title: n.heartbeat_at ? when(n.heartbeat_at) : "", text: n.heartbeat_at ? dur((Date.now() - Date.parse(n.heartbeat_at)) / 1000) + " ago" : "—" }));
  }

  // usageBar is "used / capacity unit" over a bar of the share held; a
  // capacity of 0 lends without a bound, and shows no bar.
  function usageBar(used, cap, fmt, unit) {
    const text = el("div", { text: fmt(used) + (cap ? " / " + fmt(cap) : "") + " " + unit });
    if (!cap) return text;
    const share = Math.min(100, (used / cap) * 100);
    const span = el("span");
    span.style.width = share.toFixed(1) + "%";
    return el("div", {}, text, el("div", { class: "bar" + (share >= 90 ? " full" : ""), title: share.toFixed(0) + "% held" }, span));
  }

  // ---------------------------------------------------------------- webhooks

  async function loadWebhooks() {
    const tbody = $("w-rows");
    try {
      const r = await api("GET", "/v1/webhooks");
      const frag = document.createDocumentFragment();
      for (const w of r.webhooks || []) frag.append(webhookRow(w));
      tbody.replaceChildren(frag);
      if (!(r.webhooks || []).length) tbody.append(el("tr", {}, el("td", { colspan: 10, class: "muted", text: "No webhooks." })));
    } catch (e) {
      $("w-error").textContent = e.message;
    }
  }

  // webhookRow is one webhook with its delivery state (counted since the
  // daemon started); a webhook whose last attempt failed is marked
  // "failing". Without a delivery object (an older server) the backlog is
  // estimated from the event cursor.
  function webhookRow(w) {
    const d = w.delivery || {};
    const failing = (d.consecutive_failures || 0) > 0;
    const behind = w.delivery ? String(d.behind) + (d.behind >= 1000 ? "+" : "") : String(Math.max(0, st.cursor - w.cursor));
    const last = d.last_attempt_at ? when(d.last_attempt_at) + " · " + (d.last_status ? String(d.last_status) : d.last_error || "") : "—";
    return el("tr", { "data-id": w.id, class: failing ? "failing" : "" },
      el("td", { class: "mono", text: w.id }), el("td", { text: w.url }), el("td", { text: when(w.created_at) }),
      el("td", { class: "num", text: String(w.cursor) }),
      el("td", { class: "num delivered", text: w.delivery ? String(d.delivered) : "—" }),
      el("td", { class: "num behind", text: behind }),
      el("td", { class: "last", title: d.last_error || "" }, failing && el("span", { class: "badge failed", text: "failing" }), failing && " ", last),
      el("td", { class: "num failures", text: w.delivery ? String(d.consecutive_failures) : "—" }),
      el("td", { class: "retry", text: d.next_retry_at ? until(d.next_retry_at) : "—" }),
      el("td", {}, el("button", { type: "button", class: "danger", text: "Remove", onclick: () => removeWebhook(w.id) })));
  }

  async function addWebhook(ev) {
    ev.preventDefault();
    $("w-error").textContent = "";
    $("w-secret").hidden = true;
    try {
      const w = await api("POST", "/v1/webhooks", { url: $("w-url").value.trim() });
      $("w-url").value = "";
      const box = $("w-secret");
      box.hidden = false;
      box.replaceChildren("Signing secret, shown only now: ", el("code", { text: w.secret }));
      loadWebhooks();
    } catch (e) {
      $("w-error").textContent = e.message;
    }
  }

  async function removeWebhook(id) {
    try {
      await api("DELETE", "/v1/webhooks/" + enc(id));
    } catch (e) {
      $("w-error").textContent = e.message;
    }
    loadWebhooks();
  }

  // ---------------------------------------------------------------- secrets

  // The Secrets page lists the tenant's secrets (names, versions, times:
  // the API answers no value), sets one (a new name, or a rotation) and
  // deletes one. A value typed here leaves the field as it is sent and is
  // kept nowhere in the page.
  async function loadSecrets() {
    const tbody = $("s-rows");
    try {
      const r = await api("GET", "/v1/secrets");
      const secs = r.secrets || [];
      const frag = document.createDocumentFragment();
      for (const sec of secs) frag.append(secretRow(sec));
      tbody.replaceChildren(frag);
      if (!secs.length) tbody.append(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "No secrets." })));
      document.body.dataset.secretsReady = String(Date.now());
    } catch (e) {
      $("s-error").textContent = e.message;
    }
  }

  function secretRow(sec) {
    return el("tr", { "data-name": sec.name },
      el("td", { class: "mono name", text: sec.name }),
      el("td", { class: "num version", text: String(sec.version) }),
      el("td", { class: "updated", title: sec.updated_at, text: when(sec.updated_at) }),
      el("td", { class: "created", title: sec.created_at, text: when(sec.created_at) }),
      el("td", {}, el("button", { type: "button", class: "danger", text: "Delete", onclick: () => deleteSecret(sec.name) })));
  }

  async function setSecret(ev) {
    ev.preventDefault();
    $("s-error").textContent = "";
    $("s-notice").hidden = true;
    const name = $("s-name").value.trim();
    const value = $("s-value").value;
    // The value leaves the field at once, whatever the answer.
    $("s-value").value = "";
    try {
      const sec = await api("PUT", "/v1/secrets/" + enc(name), { value });
      $("s-name").value = "";
      const box = $("s-notice");
      box.hidden = false;
      box.textContent = sec.version === 1 ? "Secret " + sec.name + " created (version 1)." : "Secret " + sec.name + " rotated: version " + sec.version + ".";
    } catch (e) {
      $("s-error").textContent = e.message;
    }
    loadSecrets();
  }

  async function deleteSecret(name) {
    $("s-error").textContent = "";
    $("s-notice").hidden = true;
    const ok = await confirmText("Delete secret " + name + "? Sandboxes that use it keep what they have; their next exec and boot fail until it is set again.");
    if (!ok) return;
    try {
      await api("DELETE", "/v1/secrets/" + enc(name));
    } catch (e) {
      $("s-error").textContent = e.message;
    }
    loadSecrets();
  }

  // confirmText asks in the page's confirmation dialog.
  function confirmText(text) {
    const dlg = $("confirm");
    $("confirm-text").textContent = text;
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
      dlg.returnValue = "";
      dlg.showModal();
    });
  }

  // ---------------------------------------------------------------- wake-ups

  // renderWakeups shows a sandbox's wake-ups from its object (each refresh
  // of the sandbox, after a wake-up's events too, brings them again): when,
  // the command, the next run and the last result.
  function renderWakeups(sb) {
    const tbody = $("wk-rows");
    const wks = sb.wakeups || [];
    const frag = document.createDocumentFragment();
    for (const w of wks) frag.append(wakeupRow(w));
    tbody.replaceChildren(frag);
    if (!wks.length) tbody.append(el("tr", {}, el("td", { colspan: 6, class: "muted", text: "No wake-ups." })));
    $("wk-form").hidden = sb.state === "terminated";
  }

  function wakeupRow(w) {
    const whenText = w.wake_schedule
      ? "cron " + w.wake_schedule + " (" + (w.time_zone || "UTC") + ")"
      : "at " + when(w.wake_at);
    const cmd = (w.cmd || []).length ? (w.cmd[0] === "sh" && w.cmd[1] === "-c" && w.cmd.length === 3 ? w.cmd[2] : w.cmd.join(" ")) : "—";
    let next = "—";
    if (w.retry_at) next = "waiting for " + (w.waiting || "room") + ", retry " + until(w.retry_at);
    else if (w.next_at) next = when(w.next_at) + " (" + until(w.next_at) + ")";
    return el("tr", { "data-id": w.id },
      el("td", { class: "mono", text: w.id }),
      el("td", { class: "when", title: w.wake_at || "", text: whenText }),
      el("td", { class: "mono cmd", text: cmd + (w.timeout_seconds ? " (timeout " + dur(w.timeout_seconds) + ")" : "") }),
      el("td", { class: "next", title: w.next_at || "", text: next }),
      el("td", { class: "result" }, wakeupResult(w)),
      el("td", {}, el("button", { type: "button", class: "danger", text: "Remove", onclick: () => removeWakeup(w.id) })));
  }

  function wakeupResult(w) {
    const r = w.last_result;
    if (!r) return el("span", { class: "muted", text: "not run yet" });
    const head = [r.status];
    if (typeof r.exit_code === "number") head.push("exit " + r.exit_code);
    if (r.timed_out) head.push("timed out");
    if (r.late) head.push("late");
    if (r.woke_from) head.push("woke from " + r.woke_from);
    head.push(ago(r.finished_at || r.started_at) + " ago");
    const out = (r.output || "").slice(-400);
    return el("div", { "data-status": r.status },
      el("span", { class: "badge " + (r.status === "done" && !r.exit_code ? "running" : r.status === "running" ? "starting" : "failed"), text: r.status }), " ",
      el("span", { class: "status", text: head.slice(1).join(" · ") }),
      r.error ? el("div", { class: "error", text: r.error }) : null,
      out ? el("pre", { class: "out small", text: out }) : null,
      w.runs ? el("div", { class: "muted", text: w.runs + (w.runs === 1 ? " run" : " runs") }) : null);
  }

  function wakeupKind() {
    const cron = $("wk-kind").value === "cron";
    $("wk-at").hidden = cron;
    $("wk-cron").hidden = !cron;
    $("wk-tz").hidden = !cron;
  }

  async function addWakeup(ev) {
    ev.preventDefault();
    const id = st.detailId;
    $("wk-error").textContent = "";
    const spec = {};
    if ($("wk-kind").value === "cron") {
      spec.wake_schedule = $("wk-cron").value.trim();
      const tz = $("wk-tz").value.trim();
      if (tz) spec.time_zone = tz;
    } else {
      // datetime-local is the browser's local time, without a zone.
      const t = new Date($("wk-at").value);
      if (!$("wk-at").value || isNaN(t)) {
        $("wk-error").textContent = "Pick a time.";
        return;
      }
      spec.wake_at = t.toISOString();
    }
    const cmd = $("wk-cmd").value.trim();
    if (cmd) spec.cmd = ["sh", "-c", cmd];
    const timeout = Number($("wk-timeout").value);
    if (timeout > 0) spec.timeout_seconds = timeout;
    try {
      await api("POST", sbPath(id) + "/wakeups", spec);
      $("wk-cmd").value = "";
      $("wk-cron").value = "";
      $("wk-timeout").value = "";
    } catch (e) {
      $("wk-error").textContent = "adding the wake-up failed: " + e.message;
    }
    await reloadDetailSandbox(id);
  }

  async function removeWakeup(wk) {
    const id = st.detailId;
    $("wk-error").textContent = "";
    try {
      await api("DELETE", sbPath(id) + "/wakeups/" + enc(wk));
    } catch (e) {
      $("wk-error").textContent = "removing the wake-up failed: " + e.message;
    }
    await reloadDetailSandbox(id);
  }

  // reloadDetailSandbox reads the open sandbox again after a change of
  // its wake-ups (which no event announces).
  async function reloadDetailSandbox(id) {
    try {
      const sb = await api("GET", sbPath(id));
      if (st.detailId !== id) return;
      st.sandboxes.set(id, sb);
      renderDetail();
    } catch (e) {
      $("wk-error").textContent = e.message;
    }
  }

  function wireSecretsAndWakeups() {
    $("s-form").addEventListener("submit", setSecret);
    $("wk-form").addEventListener("submit", addWakeup);
    $("wk-kind").addEventListener("change", wakeupKind);
    try {
      $("wk-tz").value = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    } catch (_) { /* UTC then */ }
  }

  // ---------------------------------------------------------------- wiring

  function wireStatic() {
    $("signin-form").addEventListener("submit", submitSignIn);
    $("signout").addEventListener("click", signOut);
    window.addEventListener("hashchange", route);
    for (const id of ["f-state", "f-template", "f-runtime", "f-tenant"]) {
      $(id).addEventListener("change", () => { st.page = 0; scheduleRender(); });
    }
    for (const id of ["f-meta", "f-id"]) $(id).addEventListener("input", () => { st.page = 0; scheduleRender(); });
    $("f-all").addEventListener("change", () => { loadList(true).catch(() => {}); });
    $("filters").addEventListener("submit", (e) => e.preventDefault());
    $("pg-prev").addEventListener("click", () => { st.page--; renderList(); });
    $("pg-next").addEventListener("click", () => { st.page++; renderList(); });
    $("d-actions").addEventListener("click", (e) => {
      const b = e.target.closest("button");
      if (b && !b.disabled) act(b);
    });
    $("fs-go").addEventListener("click", () => listFiles($("fs-path").value.trim() || "/"));
    $("fs-path").addEventListener("keydown", (e) => { if (e.key === "Enter") listFiles($("fs-path").value.trim() || "/"); });
    $("fs-up").addEventListener("click", () => {
      const p = st.fsPath.replace(/\/+$/, "");
      listFiles(p.slice(0, p.lastIndexOf("/")) || "/");
    });
    $("fs-upload").addEventListener("change", (e) => upload(e.target));
    $("exec-form").addEventListener("submit", runExec);
    $("u-form").addEventListener("submit", loadUsage);
    $("u-csv").addEventListener("click", downloadCSV);
    $("t-build-form").addEventListener("submit", buildTemplate);
    $("w-form").addEventListener("submit", addWebhook);
    wireSecretsAndWakeups();
    setInterval(tick, 1000);
  }

  boot();
})();
