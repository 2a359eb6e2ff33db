// The operators' page. It reads the daemon's own JSON endpoints (the ones `smoosh status`,
// `smoosh explain` and the metrics read) every POLL_MS while it is visible, and acts through
// its POST endpoints, each after asking. No library, no build step, nothing from the network
// but this daemon. Everything a key or an error says is put in the page as text, never as HTML.

const POLL_MS = 2000;
const MAX_POLL_MS = 30000;
const PAGE_ROWS = 25;
const TOKEN_KEY = "smoosh-token";
const RESULTS = ["ok", "failed", "busy", "gone", "interrupted", "replaced", "blocked"];
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  paused: false,
  timer: null,
  polling: false,
  again: false,
  failures: 0,
  skewS: 0, // the daemon's clock minus this browser's, in seconds
  channels: [],
  queueChannel: null,
  queueOffset: 0,
  historyResult: "",
  historyOffset: 0,
  drawn: {}, // what each part last drew, to leave it alone while nothing changed
};

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- building the page

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "className") node.className = value;
    else if (name.startsWith("data-") || name.startsWith("aria-") || name === "role" || name === "title"
             || name === "scope" || name === "type" || name === "colspan") node.setAttribute(name, value === true ? "" : value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function unchanged(part, data) {
  const text = JSON.stringify(data);
  if (state.drawn[part] === text) return true;
  state.drawn[part] = text;
  return false;
}

// Replace a table's rows, keeping the keyboard focus on the same control when it is redrawn.
function replaceRows(tbody, rows) {
  const active = document.activeElement;
  const focus = active && tbody.contains(active) ? active.getAttribute("data-focus") : null;
  tbody.replaceChildren(...rows);
  if (focus) {
    for (const candidate of tbody.querySelectorAll("[data-focus]")) {
      if (candidate.getAttribute("data-focus") === focus) { candidate.focus(); break; }
    }
  }
}

function announce(text) {
  const live = $("announce");
  live.textContent = "";
  // A fresh text node after a tick, so a screen reader says the same words again.
  setTimeout(() => { live.textContent = text; }, 50);
}

function setNotice(id, text) {
  const box = $("notices");
  let notice = box.querySelector(`[data-notice="${id}"]`);
  if (!text) { if (notice) notice.remove(); return; }
  if (!notice) { notice = el("div", { className: "notice", "data-notice": id }); box.append(notice); }
  if (notice.textContent !== text) notice.textContent = text;
}

// ---------------------------------------------------------------- formats

function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = Number(n);
  let i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  if (i === 0) return `${Math.round(value).toLocaleString()} bytes`;
  return `${value.toFixed(value < 10 ? 2 : value < 100 ? 1 : 0)} ${units[i]}`;
}

function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function fmtTime(unix) {
  if (unix === null || unix === undefined) return "—";
  const d = new Date(unix * 1000);
  const today = new Date();
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return d.toDateString() === today.toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

function fmtPriority(p) {
  if (p === "infinity") return "∞";
  if (typeof p !== "number") return String(p);
  return Math.abs(p) >= 1e6 ? fmtBytes(p) : p.toLocaleString(undefined, { maximumFractionDigits: 2 });
}

function nowS() { return Date.now() / 1000 + state.skewS; }

function plural(n, one, many) { return `${n.toLocaleString()} ${n === 1 ? one : many}`; }

// ---------------------------------------------------------------- talking to the daemon

function token() {
  try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
}

async function getJSON(path) {
  const res = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store", credentials: "omit" });
  let body = null;
  try { body = await res.json(); } catch (e) { body = null; }
  if (!res.ok) throw new Error((body && body.error) || `${path} answered ${res.status}`);
  return body;
}

// A change, as the CLI sends it: JSON, with the token when one was given. The browser adds
// Origin; the daemon takes it only from its own page (docs: security, "The operators' page").
async function post(path, body, retried) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  let res;
  try {
    res = await fetch(path, { method: "POST", headers, body: JSON.stringify(body), cache: "no-store", credentials: "omit" });
  } catch (e) {
    return { ok: false, status: 0, body: { error: `cannot reach the daemon (${e.message})` } };
  }
  let data = {};
  try { data = await res.json(); } catch (e) { data = {}; }
  if (res.status === 401 && !retried) {
    const why = t ? "The daemon refused that token. Type it again." : "This daemon takes changes only with its token.";
    if (await askToken(why)) return post(path, body, true);
  }
  return { ok: res.ok, status: res.status, body: data };
}

// ---------------------------------------------------------------- dialogs

// Back to the control that opened a dialog, or to its redrawn twin when a reading replaced it meanwhile.
function refocus(before, focusKey) {
  if (before && before.isConnected) { before.focus(); return; }
  if (!focusKey) return;
  for (const candidate of document.querySelectorAll("[data-focus]")) {
    if (candidate.getAttribute("data-focus") === focusKey) { candidate.focus(); return; }
  }
}

function ask(text, okLabel, danger) {
  const dialog = $("confirm");
  const ok = $("confirm-ok");
  const cancel = $("confirm-cancel");
  const before = document.activeElement;
  const focusKey = before ? before.getAttribute("data-focus") : null;
  $("confirm-text").textContent = text;
  ok.textContent = okLabel;
  ok.className = danger ? "danger" : "";
  return new Promise((resolve) => {
    const done = (answer) => {
      ok.onclick = cancel.onclick = dialog.oncancel = null;
      if (dialog.open) dialog.close();
      refocus(before, focusKey);
      resolve(answer);
    };
    ok.onclick = () => done(true);
    cancel.onclick = () => done(false);
    dialog.oncancel = (event) => { event.preventDefault(); done(false); };
    dialog.showModal();
    cancel.focus(); // the safe answer first: Enter on a stray key press changes nothing
  });
}

function askToken(why) {
  const dialog = $("token");
  const input = $("token-input");
  const before = document.activeElement;
  const focusKey = before ? before.getAttribute("data-focus") : null;
  $("token-why").textContent = why || "This daemon takes changes only with its token (token in its config). "
    + "It is kept in this tab only, and sent only to this daemon.";
  input.value = "";
  return new Promise((resolve) => {
    const done = (answer) => {
      $("token-form").onsubmit = $("token-cancel").onclick = $("token-forget").onclick = dialog.oncancel = null;
      if (dialog.open) dialog.close();
      refocus(before, focusKey);
      resolve(answer);
    };
    const save = () => {
      const value = input.value.trim();
      if (!value) { input.focus(); return; }
      try { sessionStorage.setItem(TOKEN_KEY, value); } catch (e) { /* a private window may refuse: sent once */ }
      announce("The token is kept in this tab.");
      done(true);
    };
    $("token-form").onsubmit = (event) => { event.preventDefault(); save(); };
    $("token-cancel").onclick = () => done(false);
    $("token-forget").onclick = () => {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* nothing kept */ }
      announce("The token is forgotten.");
      done(false);
    };
    dialog.oncancel = (event) => { event.preventDefault(); done(false); };
    dialog.showModal();
    input.focus();
  });
}

// ---------------------------------------------------------------- the operator's actions

const ACTIONS = {
  suspend: {
    label: "Suspend",
    text: (what) => `Suspend ${what}? Nothing new starts there, and running compactions hold (a VACUUM is `
      + "interrupted) until it is resumed.",
  },
  resume: { label: "Resume", text: (what) => `Resume ${what}? Its waiting databases start at once.` },
  flush: {
    label: "Flush",
    text: (what) => `Flush ${what}? Its waiting databases leave the queue (running compactions go on); `
      + "each comes back when it changes or is enqueued again.",
  },
};

async function act(action, channel) {
  const spec = ACTIONS[action];
  const what = channel ? `channel ${channel}` : "every channel";
  if (!await ask(spec.text(what), spec.label, action !== "resume")) return;
  const answer = await post(`/${action}`, channel ? { channel } : {});
  if (answer.ok) {
    const dropped = action === "flush" ? ` (${plural(answer.body.dropped || 0, "database", "databases")} dropped)` : "";
    announce(`${spec.label}: done for ${what}${dropped}.`);
    setNotice("action", null);
  } else {
    setNotice("action", `${spec.label} ${what} failed: ${answer.body.error || answer.status}`);
  }
  pollSoon();
}

async function enqueue(event) {
  event.preventDefault();
  const key = $("enqueue-key").value.trim();
  const force = $("enqueue-force").checked;
  const out = $("enqueue-result");
  if (!key) { out.textContent = "Type the path of a database."; $("enqueue-key").focus(); return; }
  const how = force ? " with force (its thresholds, staleness and crash backoff skipped)" : "";
  if (!await ask(`Enqueue ${key}${how}?`, "Enqueue", force)) return;
  out.textContent = "Asking the daemon…";
  const answer = await post("/enqueue?wait=1", { keys: [key], force });
  if (!answer.ok) { out.textContent = `Not enqueued: ${answer.body.error || answer.status}`; return; }
  const verdict = (answer.body.results || [])[0] || {};
  if (verdict.outcome === "queued") {
    out.textContent = `Queued in ${verdict.channel} at priority ${fmtPriority(verdict.priority)}.`;
  } else if (verdict.outcome === "not_queued") {
    out.textContent = `Not queued: ${verdict.reason}.`;
  } else {
    out.textContent = `Rejected: ${verdict.reason || "no reason given"}.`;
  }
  pollSoon();
}

// ---------------------------------------------------------------- the status table

function channelState(ch) {
  if (ch.suspended) return ["suspended", "state-stopped"];
  if (ch.held) return ["held by a cluster hold", "state-stopped"];
  if (ch.paused) return ["start-up pause", "state-waiting"];
  if (!ch.in_window) return ["outside its window", "state-waiting"];
  if ((ch.active || 0) + (ch.starting || 0) > 0) return ["compacting", "state-ok"];
  if (ch.waiting && ch.waiting.size > 0) return ["waiting for a slot", "state-waiting"];
  return ["idle", "state-ok"];
}

function channelHolds(ch) {
  const holds = [];
  if (ch.suspended) holds.push("suspended here");
  if (ch.held) {
    const by = ch.held.by ? ` by ${ch.held.by}` : "";
    const at = ch.held.at ? ` since ${fmtTime(ch.held.at)}` : "";
    holds.push(`cluster hold${by}${at}`);
  }
  if (ch.holding && !ch.suspended && !ch.held) holds.push("strict window closed");
  return holds.length ? holds.join("; ") : "none";
}

function drawStatus(status) {
  $("node").textContent = status.node ? `on ${status.node}` : "";
  document.title = status.node ? `smoosh — ${status.node}` : "smoosh";
  $("updated").textContent = `Updated ${fmtTime(nowS())}; every ${POLL_MS / 1000} s while this page is shown.`;
  setNotice("config", status.config_error ? `The config file's last edit was not applied: ${status.config_error}` : null);
  const restart = status.restart_required || [];
  setNotice("restart", restart.length ? `Restart the daemon to apply: ${restart.join(", ")}.` : null);
  const store = status.store || {};
  setNotice("store", store.state && store.state !== "ok"
    ? `The job store is ${store.state}${store.since ? ` since ${fmtTime(store.since)}` : ""}: ${store.error || "no compaction starts"}.`
    : null);
  setNotice("dry", status.dry_run ? "Dry run: this daemon ranks databases and compacts none." : null);

  const channels = status.channels || {};
  const names = Object.keys(channels);
  const controller = status.controller || {};
  const scan = status.scan || {};
  const parts = [`Reclaimable in all: ${fmtBytes(status.reclaimable_bytes)}.`];
  if (controller.max_jobs !== undefined) parts.push(`Compactions at once: ${controller.slots} of at most ${controller.max_jobs}.`);
  if (scan.scans_completed === 0) parts.push(`Scanning the watched directories: ${plural(scan.databases_found || 0, "database", "databases")} found so far.`);
  $("totals").textContent = parts.join(" ");

  if (unchanged("channels", channels)) return;
  const rows = names.map((name) => {
    const ch = channels[name];
    const [text, cls] = channelState(ch);
    const running = (ch.active || 0) + (ch.starting || 0);
    const toggle = ch.suspended ? "resume" : "suspend";
    const waiting = ch.waiting || { size: 0 };
    return el("tr", { "data-channel": name },
      el("th", { scope: "row" }, name),
      el("td", {}, el("span", { className: `badge ${cls}`, text })),
      el("td", {}, ch.window || "always"),
      el("td", {}, channelHolds(ch)),
      el("td", { className: "num", title: waiting.size ? `priorities ${fmtPriority(waiting.min)} to ${fmtPriority(waiting.max)}` : null },
        (waiting.size || 0).toLocaleString()),
      el("td", { className: "num" }, ch.starting ? `${running} (${ch.starting} starting)` : String(running)),
      el("td", { className: "num" }, (ch.deferred || 0).toLocaleString()),
      el("td", { className: "num" }, fmtBytes(ch.reclaimable_bytes)),
      el("td", { className: "actions-cell" },
        el("button", { type: "button", className: "small", "data-action": toggle, "data-channel": name,
                       "data-focus": `toggle:${name}`, "aria-label": `${ACTIONS[toggle].label} ${name}` }, ACTIONS[toggle].label),
        el("button", { type: "button", className: "small", "data-action": "flush", "data-channel": name,
                       "data-focus": `flush:${name}`, "aria-label": `Flush ${name}` }, "Flush"),
        el("button", { type: "button", className: "small", "data-show-queue": name, "data-focus": `queue:${name}`,
                       "aria-label": `Show the queue of ${name}` }, "Queue")));
  });
  replaceRows($("channels").tBodies[0], rows);
  drawChannelChoice(names, channels);
}

function drawChannelChoice(names, channels) {
  const select = $("queue-channel");
  if (state.queueChannel === null || !names.includes(state.queueChannel)) {
    state.queueChannel = names.find((n) => channels[n].waiting && channels[n].waiting.size > 0) || names[0] || null;
    state.queueOffset = 0;
  }
  if (names.join("\n") !== state.channels.join("\n")) {
    state.channels = names;
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  if (state.queueChannel !== null) select.value = state.queueChannel;
}

// ---------------------------------------------------------------- running compactions

// From /status when the daemon reports each run there (its age and last progress), else from
// /jobs: a running key's progress, its age from its latest "started" event.
function runningRows(status, jobs) {
  const rows = [];
  let fromStatus = false;
  for (const [name, ch] of Object.entries(status.channels || {})) {
    if (!Array.isArray(ch.runs)) continue;
    fromStatus = true;
    for (const run of ch.runs) {
      rows.push({ key: run.key, channel: name, progress: run.progress, ageS: run.age_s,
                  sinceProgressS: run.since_progress_s, state: run.state });
    }
  }
  if (fromStatus) return rows;
  for (const job of (jobs && jobs.jobs) || []) {
    const started = (job.history || []).find((e) => e.event === "started");
    rows.push({ key: job.key, channel: job.channel, progress: job.progress,
                ageS: started ? Math.max(0, nowS() - started.at) : null, sinceProgressS: null, state: job.state });
  }
  return rows;
}

function expectedEnd(row) {
  if (!(row.progress > 0) || row.ageS === null || row.ageS === undefined) return "—";
  if (row.progress >= 1) return "finishing";
  const left = row.ageS / row.progress - row.ageS;
  return `in ${fmtDuration(left)} (${fmtTime(nowS() + left)})`;
}

function drawRunning(rows) {
  $("running-none").hidden = rows.length > 0;
  $("running").hidden = rows.length === 0;
  const tbody = $("running").tBodies[0];
  replaceRows(tbody, rows.map((row) => {
    const pct = Math.round((row.progress || 0) * 100);
    const stalled = row.sinceProgressS !== null && row.sinceProgressS !== undefined && row.sinceProgressS >= 60
      ? ` (no progress for ${fmtDuration(row.sinceProgressS)})` : "";
    return el("tr", { "data-key": row.key },
      el("td", { className: "key" }, row.key),
      el("td", {}, row.channel || "—"),
      el("td", {}, el("div", { className: "progress" },
        el("progress", { max: 1, value: Math.min(1, row.progress || 0), "aria-label": `Progress of ${row.key}` }),
        el("span", { className: "num" }, `${pct}%${stalled}`))),
      el("td", { className: "num" }, fmtDuration(row.ageS)),
      el("td", {}, expectedEnd(row)));
  }));
}

// ---------------------------------------------------------------- the queue and explain

// A page past the end (the list shrank under it): back to the last page there is.
function lastPage(offset, total) {
  return total > 0 && offset >= total ? Math.floor((total - 1) / PAGE_ROWS) * PAGE_ROWS : null;
}

function drawQueue(page) {
  if (!page) return;
  const back = lastPage(page.offset, page.total);
  if (back !== null) { state.queueOffset = back; pollSoon(); return; }
  $("queue").closest("section").querySelector(".pager").hidden = page.total === 0;
  const start = page.total ? page.offset + 1 : 0;
  const end = page.offset + page.keys.length;
  $("queue-summary").textContent = page.total
    ? `${plural(page.total, "database waits", "databases wait")} in ${page.channel}.`
    : `Nothing waits in ${page.channel}.`;
  $("queue-range").textContent = page.total ? `${start.toLocaleString()}–${end.toLocaleString()} of ${page.total.toLocaleString()}` : "";
  $("queue-prev").disabled = page.offset === 0;
  $("queue-next").disabled = page.next_offset === null;
  $("queue").hidden = page.keys.length === 0;
  if (unchanged("queue", page)) return;
  replaceRows($("queue").tBodies[0], page.keys.map((row) => {
    let waits = "in the queue";
    if (row.forced) waits = "forced: starts first";
    else if (row.place === "benched") waits = "set aside by rotation";
    else if (row.place === "deferred") waits = `until ${fmtTime(row.not_before)} (backing off)`;
    return el("tr", { "data-key": row.key },
      el("td", { className: "num" }, row.position.toLocaleString()),
      el("td", { className: "key" }, row.key),
      el("td", { className: "num" }, fmtPriority(row.priority)),
      el("td", {}, waits),
      el("td", {}, el("button", { type: "button", className: "small", "data-explain": row.key, "data-focus": `why:${row.key}`,
                                  "aria-label": `Why does ${row.key} wait?` }, "Why?")));
  }));
}

async function explain(key) {
  const panel = $("explain");
  const body = $("explain-body");
  panel.hidden = false;
  $("explain-h").textContent = `Why: ${key}`;
  body.replaceChildren(el("p", { className: "muted" }, "Asking the daemon…"));
  let answer;
  try {
    answer = await getJSON(`/explain?key=${encodeURIComponent(key)}`);
  } catch (e) {
    body.replaceChildren(el("p", {}, `The daemon could not explain it: ${e.message}`));
    return;
  }
  const facts = el("dl", {},
    el("dt", {}, "State"), el("dd", {}, answer.state || "—"),
    el("dt", {}, "Channel"), el("dd", {}, answer.channel || "—"),
    el("dt", {}, "Reason"), el("dd", {}, answer.reason || "—"));
  const rows = Object.entries(answer.channels || {}).map(([name, ch]) => el("tr", {},
    el("th", { scope: "row" }, name),
    el("td", {}, ch.state || "—"),
    el("td", { className: "num" }, ch.priority === null || ch.priority === undefined ? "—" : fmtPriority(ch.priority)),
    el("td", { className: "num" }, ch.position ? ch.position.toLocaleString() : "—"),
    el("td", {}, ch.reason || "—")));
  const table = el("div", { className: "scroll" }, el("table", {},
    el("caption", { className: "visually-hidden" }, "What each channel makes of it"),
    el("thead", {}, el("tr", {}, ...["Channel", "State", "Priority", "Position", "Reason"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows)));
  const raw = el("details", {}, el("summary", {}, "Everything explain says"),
    el("pre", { className: "key" }, JSON.stringify(answer, null, 2)));
  body.replaceChildren(facts, table, raw);
  $("explain-h").setAttribute("tabindex", "-1");
  $("explain-h").focus();
}

// ---------------------------------------------------------------- history

function drawHistory(page, retry) {
  const back = page ? lastPage(page.offset, page.total) : null;
  if (back !== null) { state.historyOffset = back; pollSoon(); page = null; }
  if (page) {
    $("history-prev").closest(".pager").hidden = page.total === 0;
    $("history-none").hidden = page.total > 0 || state.historyResult !== "";
    $("history-none").textContent = "No compaction has finished yet.";
    if (page.total === 0 && state.historyResult !== "") {
      $("history-none").hidden = false;
      $("history-none").textContent = "No compaction ended that way.";
    }
    $("history").hidden = page.total === 0;
    const start = page.total ? page.offset + 1 : 0;
    $("history-range").textContent = page.total
      ? `${start.toLocaleString()}–${(page.offset + page.history.length).toLocaleString()} of ${page.total.toLocaleString()}` : "";
    $("history-prev").disabled = page.offset === 0;
    $("history-next").disabled = page.next_offset === null;
    if (!unchanged("history", page)) {
      replaceRows($("history").tBodies[0], page.history.map((row) => {
        const notes = [];
        if (row.error) notes.push(row.error.length > 240 ? `${row.error.slice(0, 240)}…` : row.error);
        if (row.retry_at) notes.push(`retried at ${fmtTime(row.retry_at)}`);
        return el("tr", { "data-key": row.key, "data-result": row.result },
          el("td", { title: new Date(row.at * 1000).toString() }, fmtTime(row.at)),
          el("td", { className: "key" }, row.key),
          el("td", {}, row.channel || "—"),
          el("td", {}, el("span", { className: `badge r-${row.result}` }, row.result)),
          el("td", { className: "num" }, row.result === "ok" ? fmtBytes(row.reclaimed_bytes) : "—"),
          el("td", { className: "num" }, fmtDuration(row.duration_s)),
          el("td", { title: row.error || null }, notes.join("; ") || "—"));
      }));
    }
  }
  if (retry) {
    $("retry-none").hidden = retry.total > 0;
    $("retry").hidden = retry.total === 0;
    if (!unchanged("retry", retry)) {
      replaceRows($("retry").tBodies[0], retry.jobs.map((job) => el("tr", { "data-key": job.key },
        el("td", { className: "key" }, job.key),
        el("td", {}, job.channel || "—"),
        el("td", {}, job.state),
        el("td", { className: "num" }, (job.error_count || 0).toLocaleString()),
        el("td", {}, job.last_error || "—"),
        el("td", {}, job.retry_at ? fmtTime(job.retry_at) : "—"))));
    }
  }
}

// ---------------------------------------------------------------- charts (SVG)

const CHART = { w: 420, h: 200, left: 70, right: 8, top: 14, bottom: 26 };

function niceCeil(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
  return 10 * step;
}

function niceBytesCeil(value) {
  if (!(value > 0)) return 1024;
  let unit = 1;
  while (value / unit >= 1024) unit *= 1024;
  return niceCeil(value / unit) * unit;
}

function frame(label, maxLabel, buckets) {
  const { w, h, left, right, top, bottom } = CHART;
  const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": label, focusable: "false" });
  root.append(svg("title", {}, label));
  root.append(svg("line", { class: "axis", x1: left, y1: h - bottom, x2: w - right, y2: h - bottom }));
  root.append(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: h - bottom }));
  root.append(svg("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, maxLabel));
  root.append(svg("text", { x: left - 6, y: h - bottom, "text-anchor": "end" }, "0"));
  const minutes = buckets.length;
  root.append(svg("text", { x: left, y: h - 6 }, `${minutes} min ago`));
  root.append(svg("text", { x: w - right, y: h - 6, "text-anchor": "end" }, "now"));
  return root;
}

function slot(i, n) {
  const { w, left, right } = CHART;
  const width = (w - left - right) / n;
  return { x: left + i * width + 0.5, width: Math.max(1, width - 1) };
}

function yOf(value, max) {
  const { h, top, bottom } = CHART;
  return h - bottom - (value / max) * (h - top - bottom);
}

function drawReclaimed(series) {
  const buckets = series.buckets;
  const total = buckets.reduce((sum, b) => sum + b.reclaimed_bytes, 0);
  const max = niceBytesCeil(Math.max(...buckets.map((b) => b.reclaimed_bytes)));
  const root = frame(`Bytes reclaimed per minute over the last hour: ${fmtBytes(total)} in all.`, fmtBytes(max), buckets);
  buckets.forEach((b, i) => {
    if (!b.reclaimed_bytes) return;
    const { x, width } = slot(i, buckets.length);
    const y = yOf(b.reclaimed_bytes, max);
    root.append(svg("rect", { class: "bar r-ok", x, y, width, height: CHART.h - CHART.bottom - y },
      svg("title", {}, `${fmtTime(b.at)}: ${fmtBytes(b.reclaimed_bytes)} reclaimed`)));
  });
  $("chart-reclaimed").querySelector(".chart-body").replaceChildren(root);
}

function drawCompactions(series) {
  const buckets = series.buckets;
  const sums = {};
  for (const b of buckets) for (const r of RESULTS) sums[r] = (sums[r] || 0) + (b.compactions[r] || 0);
  const perMinute = buckets.map((b) => RESULTS.reduce((s, r) => s + (b.compactions[r] || 0), 0));
  const all = perMinute.reduce((s, n) => s + n, 0);
  const max = niceCeil(Math.max(...perMinute));
  const said = RESULTS.filter((r) => sums[r]).map((r) => `${sums[r]} ${r}`).join(", ");
  const root = frame(`Compactions per minute over the last hour, by result: ${all ? said : "none"}.`, String(max), buckets);
  buckets.forEach((b, i) => {
    const { x, width } = slot(i, buckets.length);
    let base = 0;
    for (const r of RESULTS) {
      const n = b.compactions[r] || 0;
      if (!n) continue;
      const y0 = yOf(base, max);
      const y1 = yOf(base + n, max);
      root.append(svg("rect", { class: `bar r-${r}`, x, y: y1, width, height: Math.max(1, y0 - y1) },
        svg("title", {}, `${fmtTime(b.at)}: ${n} ${r}`)));
      base += n;
    }
  });
  $("chart-compactions").querySelector(".chart-body").replaceChildren(root);
  const shown = RESULTS.filter((r) => sums[r]);
  $("chart-compactions").querySelector(".legend").replaceChildren(...(shown.length ? shown : ["ok", "failed"]).map(
    (r) => el("li", { className: `r-${r}` }, `${r} ${sums[r] || 0}`)));
}

function drawReclaimable(series) {
  const buckets = series.buckets;
  const points = buckets.map((b, i) => [i, b.reclaimable_bytes]).filter(([, v]) => v !== null && v !== undefined);
  const last = points.length ? points[points.length - 1][1] : null;
  const max = niceBytesCeil(Math.max(0, ...points.map(([, v]) => v)));
  const label = last === null ? "The fleet's reclaimable bytes over the last hour: not summed yet."
    : `The fleet's reclaimable bytes over the last hour: ${fmtBytes(last)} now.`;
  const root = frame(label, fmtBytes(max), buckets);
  if (points.length) {
    const xy = points.map(([i, v]) => { const { x, width } = slot(i, buckets.length); return [x + width / 2, yOf(v, max)]; });
    const line = xy.map(([x, y], k) => `${k ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
    const floor = yOf(0, max).toFixed(1);
    root.append(svg("path", { class: "area", d: `${line} L${xy[xy.length - 1][0].toFixed(1)},${floor} L${xy[0][0].toFixed(1)},${floor} Z` }));
    root.append(svg("path", { class: "line", d: line }));
    const [x, y] = xy[xy.length - 1];
    root.append(svg("circle", { class: "dot", cx: x, cy: y, r: 3.5 }, svg("title", {}, `now: ${fmtBytes(last)}`)));
  }
  $("chart-reclaimable").querySelector(".chart-body").replaceChildren(root);
}

function drawCharts(series) {
  state.skewS = series.now - Date.now() / 1000;
  if (unchanged("series", series.buckets)) return;
  drawReclaimed(series);
  drawCompactions(series);
  drawReclaimable(series);
}

// ---------------------------------------------------------------- polling

function queuePath() {
  if (state.queueChannel === null) return null;
  return `/queue?channel=${encodeURIComponent(state.queueChannel)}&offset=${state.queueOffset}&limit=${PAGE_ROWS}`;
}

function historyPath() {
  const result = state.historyResult ? `&result=${encodeURIComponent(state.historyResult)}` : "";
  return `/history?offset=${state.historyOffset}&limit=${PAGE_ROWS}${result}`;
}

async function poll() {
  if (state.polling) { state.again = true; return; }
  state.polling = true;
  clearTimeout(state.timer);
  try {
    const status = await getJSON("/status");
    drawStatus(status);
    const fromStatus = Object.values(status.channels || {}).some((ch) => Array.isArray(ch.runs));
    const queue = queuePath();
    const [series, history, retry, jobs, page] = await Promise.all([
      getJSON("/series"),
      getJSON(historyPath()),
      getJSON("/jobs?state=crashing,starved&limit=20"),
      fromStatus ? null : getJSON("/jobs?state=running&limit=100"),
      queue === null ? null : getJSON(queue),
    ]);
    drawCharts(series);
    drawRunning(runningRows(status, jobs));
    drawQueue(page);
    drawHistory(history, retry);
    state.failures = 0;
    setNotice("reach", null);
    document.body.setAttribute("data-polled", String(Number(document.body.getAttribute("data-polled") || 0) + 1));
  } catch (e) {
    state.failures += 1;
    setNotice("reach", `Cannot read the daemon (${e.message}); trying again.`);
  } finally {
    state.polling = false;
    if (state.again) { state.again = false; setTimeout(poll, 0); } else schedule();
  }
}

function schedule() {
  clearTimeout(state.timer);
  if (state.paused || document.hidden) return; // a hidden or paused page asks nothing
  const delay = Math.min(MAX_POLL_MS, POLL_MS * 2 ** Math.min(state.failures, 4));
  state.timer = setTimeout(poll, delay);
}

function pollSoon() { setTimeout(poll, 0); }

// ---------------------------------------------------------------- wiring

function wire() {
  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target.closest("button") : null;
    if (!target) return;
    if (target.hasAttribute("data-action")) {
      act(target.getAttribute("data-action"), target.getAttribute("data-channel") || null);
    } else if (target.hasAttribute("data-show-queue")) {
      state.queueChannel = target.getAttribute("data-show-queue");
      state.queueOffset = 0;
      $("queue-channel").value = state.queueChannel;
      $("queue-h").setAttribute("tabindex", "-1");
      $("queue-h").focus();
      pollSoon();
    } else if (target.hasAttribute("data-explain")) {
      explain(target.getAttribute("data-explain"));
    }
  });
  $("queue-channel").addEventListener("change", (event) => {
    state.queueChannel = event.target.value;
    state.queueOffset = 0;
    pollSoon();
  });
  $("queue-prev").addEventListener("click", () => { state.queueOffset = Math.max(0, state.queueOffset - PAGE_ROWS); pollSoon(); });
  $("queue-next").addEventListener("click", () => { state.queueOffset += PAGE_ROWS; pollSoon(); });
  $("history-result").addEventListener("change", (event) => {
    state.historyResult = event.target.value;
    state.historyOffset = 0;
    pollSoon();
  });
  $("history-prev").addEventListener("click", () => { state.historyOffset = Math.max(0, state.historyOffset - PAGE_ROWS); pollSoon(); });
  $("history-next").addEventListener("click", () => { state.historyOffset += PAGE_ROWS; pollSoon(); });
  $("explain-close").addEventListener("click", () => { $("explain").hidden = true; $("queue-h").focus(); });
  $("enqueue").addEventListener("submit", enqueue);
  $("token-open").addEventListener("click", () => { askToken(null); });
  $("pause").addEventListener("click", () => {
    state.paused = !state.paused;
    $("pause").setAttribute("aria-pressed", String(state.paused));
    $("pause").textContent = state.paused ? "Resume updates" : "Pause updates";
    announce(state.paused ? "Updates paused." : "Updates resumed.");
    if (state.paused) clearTimeout(state.timer); else pollSoon();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) clearTimeout(state.timer); else if (!state.paused) pollSoon();
  });
}

wire();
poll();
