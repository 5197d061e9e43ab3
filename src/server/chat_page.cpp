// The chat page served at "/": plain HTML and JavaScript, embedded in the binary, no build
// step. It keeps the conversation in the page and streams each reply from
// /v1/chat/completions (server-sent events read with fetch and a stream reader).
#include "server/server.hpp"

namespace ember::server {

const char* const kChatPageHtml = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Ember chat</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; display: flex; flex-direction: column; height: 100vh; background: #f6f6f4; }
  header { padding: 0.6em 1em; background: #2b2b2b; color: #eee; }
  header small { color: #aaa; margin-left: 0.6em; }
  #log { flex: 1; overflow-y: auto; padding: 1em; }
  .msg { max-width: 46em; margin: 0.4em 0; padding: 0.6em 0.8em; border-radius: 8px; white-space: pre-wrap; }
  .user { background: #dbe9ff; margin-left: auto; }
  .assistant { background: #fff; border: 1px solid #ddd; }
  .error { border-color: #c33; color: #a00; }
  form { display: flex; gap: 0.5em; padding: 0.8em 1em; border-top: 1px solid #ccc; background: #fff; }
  textarea { flex: 1; font: inherit; padding: 0.4em; resize: vertical; }
  button { font: inherit; padding: 0 1.2em; }
  #settings { font-size: 0.8em; padding: 0 1em 0.4em; background: #fff; display: flex; gap: 1em; }
  #settings input { width: 5em; }
  #status { font-size: 0.8em; color: #777; padding: 0 1em 0.4em; background: #fff; }
</style>
</head>
<body>
<header>Ember chat<small id="model"></small></header>
<main id="log"></main>
<form id="form">
  <textarea id="input" rows="2" placeholder="Type a message; Enter sends, Shift+Enter is a new line" autofocus></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<div id="settings">
  <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" step="1" value="512"></label>
  <button id="clear" type="button">New chat</button>
</div>
<div id="status">ready</div>
<script>
"use strict";
const log = document.getElementById("log");
const input = document.getElementById("input");
const form = document.getElementById("form");
const sendBtn = document.getElementById("send");
const stopBtn = document.getElementById("stop");
const statusEl = document.getElementById("status");
const history = [];
let controller = null;

fetch("/v1/models").then(r => r.json()).then(j => {
  document.getElementById("model").textContent = j.data[0].id + " (context " + j.data[0].meta.n_ctx + " tokens)";
}).catch(() => {});

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

async function sendMessage(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  sendBtn.disabled = true;
  stopBtn.disabled = false;
  statusEl.textContent = "generating";
  controller = new AbortController();
  let reply = "";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        messages: history,
        stream: true,
        temperature: Number(document.getElementById("temperature").value),
        max_tokens: Number(document.getElementById("max_tokens").value),
      }),
      signal: controller.signal,
    });
    if (!resp.ok) {
      const j = await resp.json().catch(() => null);
      throw new Error(j && j.error ? j.error.message : "HTTP " + resp.status);
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;  // ":" lines are keep-alive comments
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          const c = j.choices && j.choices[0];
          if (c && c.delta && c.delta.content) {
            reply += c.delta.content;
            out.textContent = reply;
            log.scrollTop = log.scrollHeight;
          }
        }
      }
    }
    history.push({ role: "assistant", content: reply });
    statusEl.textContent = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      history.push({ role: "assistant", content: reply });
      statusEl.textContent = "stopped";
    } else {
      out.textContent = reply + (reply ? "\n" : "") + "[error: " + e.message + "]";
      out.classList.add("error");
      history.pop();
      statusEl.textContent = "error";
    }
  }
  controller = null;
  sendBtn.disabled = false;
  stopBtn.disabled = true;
  input.focus();
}

form.addEventListener("submit", e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || sendBtn.disabled) return;
  input.value = "";
  sendMessage(text);
});
input.addEventListener("keydown", e => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    form.requestSubmit();
  }
});
stopBtn.addEventListener("click", () => { if (controller) controller.abort(); });
document.getElementById("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  log.textContent = "";
  statusEl.textContent = "ready";
});
</script>
</body>
</html>
)HTML";

}  // namespace ember::server
