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
      state.conversation = event.conversation_id;
      sessionStorage.setItem("cogency.conversation", state.conversation);
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

// Calls waiting for a person: one box each; the decisions go back together.
function askApprovals(pending) {
  const decisions = {};
  for (const call of pending) {
    const box = document.createElement("div");
    box.className = "approval";
    const what = document.createElement("div");
    what.textContent = "The agent wants to run " + call.name + " " +
      clip(JSON.stringify(call.args), 400);
    box.appendChild(what);
    for (const [label, allow] of [["Approve", true], ["Deny", false]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = label;
      button.className = allow ? "approve" : "deny";
      button.addEventListener("click", () => {
        decisions[call.id] = allow;
        box.textContent = (allow ? "approved: " : "denied: ") + call.name;
        if (Object.keys(decisions).length === pending.length) {
          follow("/api/tasks/" + encodeURIComponent(call.task_id) + "/approvals",
            { decisions });
        }
      });
      box.appendChild(button);
    }
    $("log").appendChild(box);
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
  }
}

$("key").value = state.key;
$("who").textContent = state.key ? "key set" : "enter a key to start";

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  state.key = $("key").value.trim();
  sessionStorage.setItem("cogency.key", state.key);
  $("who").textContent = state.key ? "key set" : "enter a key to start";
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
  state.conversation = null;
  sessionStorage.removeItem("cogency.conversation");
  $("log").textContent = "";
  setStatus("new conversation");
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
    state.conversation = null;
    sessionStorage.removeItem("cogency.conversation");
    $("log").textContent = "";
    $("entries").textContent = "";
    $("learning").textContent = "";
    const erased = Object.entries(receipt.erased).map(([kind, n]) => kind.replace("_", " ") + " " + n);
    $("profile").textContent = "forgotten: " + erased.join(", ");
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});
