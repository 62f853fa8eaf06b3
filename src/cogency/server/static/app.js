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

$("show-profile").addEventListener("click", async () => {
  try {
    const data = await (await api("GET", "/api/profile")).json();
    $("profile").textContent = data.profile ? JSON.stringify(data.profile, null, 2)
      : "nothing is known of you";
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});

$("forget").addEventListener("click", async () => {
  if (!confirm("Forget everything known of you: profile, conversations and tasks?")) return;
  try {
    await api("DELETE", "/api/profile");
    state.conversation = null;
    sessionStorage.removeItem("cogency.conversation");
    $("log").textContent = "";
    $("profile").textContent = "forgotten";
  } catch (error) {
    $("profile").textContent = "error: " + error.message;
  }
});
