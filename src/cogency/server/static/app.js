// The Cogency web page: plain DOM, no build step. Everything from the server is shown with
// textContent (never parsed as HTML), so an answer or a tool's output cannot inject markup.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem("cogency.key") || "",
  conversation: sessionStorage.getItem("cogency.conversation") || null,
  busy: false,
};

function line(text, cls) {
  const div = document.createElement("div");
  div.className = cls;
  div.textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function clip(text, limit) {
  text = String(text);
  return text.length > limit ? text.slice(0, limit) + "…" : text;
}

function setStatus(text) { $("status").textContent = text; }

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: { "Authorization": "Bearer " + state.key, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

// POST with stream: true and hand each Server-Sent Event's JSON to onEvent.
async function stream(path, body, onEvent) {
  const response = await api("POST", path, { ...body, stream: true });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const record = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = record.split("\n").filter((l) => l.startsWith("data: "))
        .map((l) => l.slice(6)).join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}

function show(event, pending) {
  switch (event.type) {
    case "start":
      setConversation(event.conversation_id);
      break;
    case "reason": {
      const w = event.workspace || {};
      const thought = w.approach || w.understanding || w.objective || "";
      if (thought) line("thinking: " + clip(thought, 300), "step reason");
      break;
    }
    case "action":
      line("→ " + event.name + " " + clip(JSON.stringify(event.args), 200), "step action");
      break;
    case "result":
      line((event.ok ? "✓ " : "✗ ") + event.name + ": " + clip(event.output, 300),
        "step result");
      break;
    case "approval":
      pending.push(event);
      break;
    case "response":
      line(event.text, "msg assistant");
      break;
    case "error":
      line((event.fatal ? "error: " : "note: ") + event.message, "step error");
      break;
    case "end":
      setStatus(event.stop_reason === "completed" ? "" : "stopped: " + event.stop_reason);
      break;
  }
}

// Text shown as the command line shows it (cli.visible with keep=""): control and format
// characters (bidi overrides, zero-width), lone surrogates and line separators as escapes,
// so a call cannot hide or reorder what it does.
const HIDDEN = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]/gu;
const NAMED = { "\r": "\\r", "\n": "\\n", "\t": "\\t" };

function visible(text) {
  return String(text).replace(HIDDEN, (ch) => {
    if (NAMED[ch]) return NAMED[ch];
    const code = ch.codePointAt(0);
    const hex = (width) => code.toString(16).padStart(width, "0");
    return code < 0x100 ? "\\x" + hex(2) : code < 0x10000 ? "\\u" + hex(4) : "\\U" + hex(8);
  });
}

// Calls waiting for a person: one box each, showing the whole call (escaped, in a box that
// scrolls, never cut); Approve works once the call has been scrolled through to its end.
// The decisions go back together.
function askApprovals(pending) {
  const decisions = {};
  for (const call of pending) {
    const box = document.createElement("div");
    box.className = "approval";
    const text = visible(call.name) + "(" + visible(JSON.stringify(call.args)) + ")";
    const what = document.createElement("div");
    what.textContent = "The agent wants to run (" + text.length + " characters):";
    const shown = document.createElement("pre");
    shown.className = "call";
    shown.tabIndex = 0;
    shown.textContent = text;
    const hint = document.createElement("div");
    hint.className = "hint";
    box.append(what, shown, hint);
    const buttons = [];
    for (const [label, allow] of [["Approve", true], ["Deny", false]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = label;
      button.className = allow ? "approve" : "deny";
      button.addEventListener("click", () => {
        if (button.disabled) return;
        decisions[call.id] = allow;
        box.textContent = (allow ? "approved: " : "denied: ") + visible(call.name);
        if (Object.keys(decisions).length === pending.length) {
          follow("/api/tasks/" + encodeURIComponent(call.task_id) + "/approvals",
            { decisions });
        }
      });
      box.appendChild(button);
      buttons.push(button);
    }
    const approve = buttons[0];
    const seenAll = () => shown.scrollTop + shown.clientHeight >= shown.scrollHeight - 2;
    const check = () => {
      approve.disabled = !seenAll();
      hint.textContent = approve.disabled
        ? "Scroll to the end of the call to approve it." : "";
    };
    shown.addEventListener("scroll", check);
    $("log").appendChild(box);
    check();
  }
  setStatus("waiting for your decision");
}

async function follow(path, body) {
  state.busy = true;
  $("send").disabled = true;
  const pending = [];
  try {
    await stream(path, body, (event) => show(event, pending));
    if (pending.length) askApprovals(pending);
  } catch (error) {
    line("error: " + error.message, "step error");
  } finally {
    state.busy = false;
    $("send").disabled = false;
    listConversations();
  }
}

function setConversation(id) {
  state.conversation = id;
  if (id) sessionStorage.setItem("cogency.conversation", id);
  else sessionStorage.removeItem("cogency.conversation");
}

// A stored message as the chat shows it: the user's and the agent's words as messages, the
// agent's tool calls and their results as steps (JSON the loop stored; shown as text only).
function showStored(message) {
  if (message.role === "user") return line(message.content, "msg user");
  let data = null;
  if (message.content.startsWith("{")) {
    try { data = JSON.parse(message.content); } catch (e) { data = null; }
  }
  if (message.role === "tool" && data && typeof data.name === "string") {
    const output = data.ok ? data.output : data.error;
    return line((data.ok ? "✓ " : "✗ ") + data.name + ": " + clip(output || "", 300),
      "step result");
  }
  if (message.role === "assistant" && data && Array.isArray(data.actions) &&
      Object.keys(data).length === 1) {
    for (const call of data.actions) {
      line("→ " + call.name + " " + clip(JSON.stringify(call.args), 200), "step action");
    }
    return null;
  }
  return line(message.content, message.role === "assistant" ? "msg assistant" : "step");
}

// Open a conversation: its newest messages in the log, and the next question continues it.
async function openConversation(id) {
  const messages = await (await api("GET", "/api/conversations/" + encodeURIComponent(id) +
    "/messages?limit=200")).json();
  $("log").textContent = "";
  for (const message of messages) showStored(message);
  setConversation(id);
  setStatus("");
  markCurrent();
}

function markCurrent() {
  for (const button of $("conversations").querySelectorAll("button")) {
    button.classList.toggle("current", button.dataset.id === state.conversation);
  }
}

async function listConversations() {
  if (!state.key) return;
  let items;
  try {
    items = await (await api("GET", "/api/conversations")).json();
  } catch (error) {
    return;  // the key check says what is wrong
  }
  const list = $("conversations");
  list.textContent = "";
  if (!items.length) {
    const none = document.createElement("li");
    none.textContent = "none yet";
    list.appendChild(none);
  }
  for (const item of items) {
    const entry = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.id = item.conversation_id;
    const when = item.updated_at ? new Date(item.updated_at).toLocaleString() : "";
    button.textContent = when + " · " + item.messages + " messages · " +
      item.conversation_id.slice(0, 8);
    button.title = item.conversation_id;
    button.addEventListener("click", () => {
      if (state.busy) return;
      openConversation(item.conversation_id).catch((error) => {
        setStatus("error: " + error.message);
      });
    });
    entry.appendChild(button);
    list.appendChild(entry);
  }
  markCurrent();
}

// "Use key" asks the server who the key is: a wrong or revoked key is said at once.
async function checkKey() {
  if (!state.key) {
    $("who").textContent = "enter a key to start";
    $("who").className = "";
    return false;
  }
  try {
    const me = await (await api("GET", "/api/profile")).json();
    $("who").textContent = "signed in as " + me.user_id;
    $("who").className = "";
    return true;
  } catch (error) {
    $("who").textContent = "key not accepted: " + error.message;
    $("who").className = "bad";
    $("conversations").textContent = "";
    return false;
  }
}

async function start() {
  if (!(await checkKey())) return;
  await listConversations();
  if (state.conversation) {
    try {
      await openConversation(state.conversation);
    } catch (error) {
      setConversation(null);  // forgotten or gone: start afresh
    }
  }
}

$("key").value = state.key;
start();

$("key-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  state.key = $("key").value.trim();
  const ok = await checkKey();
  if (ok) {
    sessionStorage.setItem("cogency.key", state.key);
    await listConversations();
  } else {
    sessionStorage.removeItem("cogency.key");
  }
});

$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const query = $("query").value.trim();
  if (!query || state.busy) return;
  $("query").value = "";
  line(query, "msg user");
  const body = { query };
  if (state.conversation) body.conversation_id = state.conversation;
  follow("/api/runs", body);
});

$("new-chat").addEventListener("click", () => {
  setConversation(null);
  $("log").textContent = "";
  setStatus("new conversation");
  markCurrent();
});

// -- the profile: each entry with "why?" (its sources), edit and remove; history; export ----

function entryName(entry) {
  return entry.key ? entry.field + "." + entry.key : entry.field;
}

function day(text) { return String(text || "").slice(0, 10); }

function button(label, cls, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.className = cls;
  b.addEventListener("click", onClick);
  return b;
}

function why(entry) {
  const box = document.createElement("div");
  box.className = "why";
  const lines = [];
  if (!entry.sources.length) {
    lines.push(entry.origin === "user" ? "you set this yourself on " + day(entry.created_at)
      : "learned before sources were kept");
  }
  for (const source of entry.sources) {
    lines.push(day(source.at) + " · task " + (source.task_id || "?") + " · " +
      (source.model || "unknown model"));
    for (const quote of source.quotes || []) {
      lines.push("    " + quote.role + ": \u201c" + clip(quote.content, 300) + "\u201d");
    }
    if (source.quotes && !source.quotes.length) lines.push("    (its messages are no longer stored)");
  }
  if (entry.sources_omitted) lines.push("… and " + entry.sources_omitted + " older sources");
  box.textContent = lines.join("\n");
  return box;
}

async function showProfile() {
  const list = $("entries");
  try {
    const [profile, entries] = await Promise.all([
      api("GET", "/api/profile").then((r) => r.json()),
      api("GET", "/api/profile/why").then((r) => r.json()),
    ]);
    list.textContent = "";
    $("profile").textContent = entries.length ? "" : "nothing is known of you";
    const learning = profile.learning;
    $("learning").textContent = !learning ? "" :
      learning.pending + " finished task(s) wait to be learned" +
      (learning.attempts ? "; the last attempt failed: " + (learning.last_error || "?") : "");
    for (const entry of entries) {
      const item = document.createElement("li");
      item.className = "entry";
      item.dataset.entry = entry.entry_id;
      const text = document.createElement("span");
      text.className = "entry-text";
      text.textContent = entryName(entry) + ": " + entry.value;
      const how = document.createElement("span");
      how.className = "entry-how";
      how.textContent = entry.origin === "user" ? " (yours)" : " (learned " + day(entry.created_at) + ")";
      item.append(text, how);
      item.append(button("why?", "why-button", () => {
        const open = item.querySelector(".why");
        if (open) open.remove(); else item.appendChild(why(entry));
      }));
      item.append(button("edit", "edit-button", async () => {
        const value = prompt("New value for " + entryName(entry), entry.value);
        if (value === null || !value.trim()) return;
        await change(() => api("POST", "/api/profile/entries", {
          field: entry.field, key: entry.key || null, value, replaces: entry.entry_id,
        }));
      }));
      item.append(button("remove", "remove-button", async () => {
        if (!confirm("Remove " + entryName(entry) + "? It stays in the history.")) return;
        await change(() => api("DELETE", "/api/profile/entries/" + encodeURIComponent(entry.entry_id)));
      }));
      list.appendChild(item);
    }
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
}

async function change(request) {
  try {
    await request();
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
    return;
  }
  await showProfile();
}

$("show-profile").addEventListener("click", showProfile);

$("add-entry").addEventListener("submit", async (e) => {
  e.preventDefault();
  const field = $("entry-field").value;
  const value = $("entry-value").value.trim();
  const key = $("entry-key").value.trim();
  if (!value) return;
  await change(() => api("POST", "/api/profile/entries", { field, value, key: key || null }));
  $("entry-value").value = "";
  $("entry-key").value = "";
});

$("show-history").addEventListener("click", async () => {
  try {
    const old = await (await api("GET", "/api/profile/history")).json();
    $("profile").textContent = old.length ? old.map((entry) =>
      day(entry.superseded_at) + "  " + entryName(entry) + ": " + entry.value + "  (" +
      entry.reason + ")").join("\n") : "no history";
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});

$("export").addEventListener("click", async () => {
  try {
    const text = await (await api("GET", "/api/profile/export")).text();
    const link = document.createElement("a");
    const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
    link.href = url;
    link.download = "cogency-export.json";
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});

$("forget").addEventListener("click", async () => {
  if (!confirm("Forget everything known of you: profile, conversations and tasks?")) return;
  try {
    const receipt = await (await api("DELETE", "/api/profile")).json();
    setConversation(null);
    $("log").textContent = "";
    $("entries").textContent = "";
    $("learning").textContent = "";
    const erased = Object.entries(receipt.erased).map(([kind, n]) => kind.replace("_", " ") + " " + n);
    if (receipt.tool_directory) erased.push("tool files " + receipt.tool_files);
    $("profile").textContent = "forgotten: " + erased.join(", ");
    listConversations();
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});
