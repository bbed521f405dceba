// app.js — blazr's chat page: conversations, the composer, streamed answers, stop / regenerate / edit,
// the model picker, the settings and the API-key prompt. Calls go through api.js, state is kept by
// store.js, answers are rendered by markdown.js. Each answer shows its time to first token (measured
// in the browser, around the fetch), its decode speed and its prompt / cached tokens, also as data-*
// attributes on its `.stats` element; `window.blazrChat` exposes the last answer's stats and the renderer.

import { AuthError, listModels, streamChat } from "./api.js";
import { escapeHtml, renderMarkdown } from "./markdown.js";
import * as store from "./store.js";

const $ = (sel) => document.querySelector(sel);
const els = {
  app: $("#app"), messages: $("#messages"), prompt: $("#prompt"), composer: $("#composer"),
  send: $("#send"), stop: $("#stop"), regenerate: $("#regenerate"), model: $("#model"),
  system: $("#system-prompt"), temperature: $("#temperature"), topP: $("#top-p"),
  maxTokens: $("#max-tokens"), conversations: $("#conversations"), newChat: $("#new-chat"),
  title: $("#title"), status: $("#status"), toggle: $("#toggle-sidebar"), close: $("#close-sidebar"), setKey: $("#set-key"),
  keyDialog: $("#key-dialog"), keyForm: $("#key-form"), keyInput: $("#api-key"), keyError: $("#key-error"),
};

const state = {
  conversations: store.loadConversations(),
  current: null,
  settings: store.loadSettings(),
  key: store.loadKey(),
  models: [],
  controller: null,
  lastStats: null,
};
window.blazrChat = { renderMarkdown, get lastStats() { return state.lastStats; } };

// ------------------------------------------------------------------------------------------ API key

// Open the key dialog; resolves once a key is saved, rejects if the dialog is dismissed. Calls made while
// it is open (the model list and a message both refused) share the one dialog.
let pendingKey = null;
function askKey(reason) {
  pendingKey ||= new Promise((resolve, reject) => {
    els.keyError.hidden = !reason;
    els.keyError.textContent = reason || "";
    els.keyInput.value = state.key || "";
    const onClose = () => {
      els.keyDialog.removeEventListener("close", onClose);
      if (els.keyDialog.returnValue === "save" && els.keyInput.value.trim()) {
        state.key = els.keyInput.value.trim();
        store.saveKey(state.key);
        resolve();
      } else {
        reject(new Error("no API key given"));
      }
    };
    els.keyDialog.returnValue = "";
    els.keyDialog.addEventListener("close", onClose);
    els.keyDialog.showModal();
    els.keyInput.focus();
  }).finally(() => {
    pendingKey = null;
  });
  return pendingKey;
}

// Run `call` (which reads state.key); on a 401 ask for the key and try again.
async function withKey(call) {
  for (;;) {
    try {
      return await call();
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      await askKey(state.key ? `The key was refused: ${err.message}` : null);
    }
  }
}

// ------------------------------------------------------------------------------------------ models

// A model's label in the picker: its name, and its state on a multi-model server unless loaded.
function modelLabel(m) {
  return m.state && m.state !== "loaded" ? `${m.id} (${m.state})` : m.id;
}

async function loadModels() {
  let listed;
  try {
    listed = await withKey(() => listModels(state.key));
  } catch (err) {
    setStatus(`Could not list the models: ${err.message}`);
    return;
  }
  state.models = listed.map((m) => m.id);
  els.model.replaceChildren(...listed.map((m) => new Option(modelLabel(m), m.id)));
  if (!state.models.includes(state.settings.model)) state.settings.model = state.models[0] || "";
  els.model.value = state.settings.model;
  store.saveSettings(state.settings);
  els.app.dataset.ready = "true";
}

// Re-read the models' states (they load, sleep and wake) when the picker is opened.
async function refreshModelStates() {
  try {
    const listed = await listModels(state.key);
    for (const m of listed) {
      const option = [...els.model.options].find((o) => o.value === m.id);
      if (option) option.textContent = modelLabel(m);
    }
  } catch {
    // the picker keeps its labels
  }
}

// ------------------------------------------------------------------------------------------ settings

function bindSettings() {
  const s = state.settings;
  els.system.value = s.system;
  els.temperature.value = s.temperature;
  els.topP.value = s.topP;
  els.maxTokens.value = s.maxTokens;
  const save = () => {
    s.model = els.model.value;
    s.system = els.system.value;
    s.temperature = Number(els.temperature.value);
    s.topP = Number(els.topP.value);
    s.maxTokens = Math.max(1, Math.round(Number(els.maxTokens.value) || 1));
    store.saveSettings(s);
  };
  for (const el of [els.model, els.system, els.temperature, els.topP, els.maxTokens]) {
    el.addEventListener("change", save);
    el.addEventListener("input", save);
  }
}

// ------------------------------------------------------------------------------------------ conversations

function persist() {
  const c = state.current;
  if (c.messages.length && !state.conversations.includes(c)) state.conversations.unshift(c);
  c.updated = Date.now();
  store.saveConversations(state.conversations);
  store.saveCurrentId(c.id);
  renderConversations();
}

function openConversation(conversation) {
  if (state.controller) return;
  state.current = conversation;
  store.saveCurrentId(conversation.id);
  renderConversations();
  renderMessages();
  els.app.classList.remove("sidebar-open");
  els.toggle.setAttribute("aria-expanded", "false");
}

function deleteConversation(id) {
  if (state.controller) return;
  state.conversations = state.conversations.filter((c) => c.id !== id);
  store.saveConversations(state.conversations);
  if (state.current.id === id) openConversation(state.conversations[0] || store.newConversation());
  else renderConversations();
}

function renderConversations() {
  els.conversations.replaceChildren(
    ...state.conversations.map((c) => {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      if (c === state.current) li.setAttribute("aria-current", "true");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "conv-open";
      open.textContent = c.title;
      open.addEventListener("click", () => openConversation(c));
      const del = document.createElement("button");
      del.type = "button";
      del.className = "conv-delete";
      del.setAttribute("aria-label", `Delete conversation: ${c.title}`);
      del.textContent = "×";
      del.addEventListener("click", () => deleteConversation(c.id));
      li.append(open, del);
      return li;
    }),
  );
  els.title.textContent = state.current.title;
}

// ------------------------------------------------------------------------------------------ messages

function formatStats(st) {
  const parts = [];
  if (st.ttftMs != null) parts.push(`TTFT ${Math.round(st.ttftMs)} ms`);
  if (st.tokPerS != null) parts.push(`${st.tokPerS.toFixed(1)} tok/s`);
  parts.push(`${st.numTokens} tokens`);
  if (st.promptTokens != null) parts.push(`prompt ${st.promptTokens} (${st.cachedTokens ?? 0} cached)`);
  if (st.finishReason) parts.push(st.finishReason);
  return parts.join(" · ");
}

function renderAnswer(el, msg) {
  el.dataset.state = msg.state || "done";
  el.querySelector(".model-name").textContent = msg.model || "";
  const reasoning = el.querySelector(".reasoning");
  reasoning.hidden = !msg.reasoning;
  el.querySelector(".reasoning-text").innerHTML = renderMarkdown(msg.reasoning || "");
  el.querySelector(".content").innerHTML = renderMarkdown(msg.content || "");
  const tools = el.querySelector(".tool-calls");
  tools.replaceChildren(
    ...(msg.toolCalls || []).map((call) => {
      const box = document.createElement("div");
      box.className = "tool-call";
      box.innerHTML = `<span class="tool-label">tool call</span> <code class="tool-name">${escapeHtml(call.name)}</code>` +
        `<pre class="tool-args"><code>${escapeHtml(prettyJson(call.arguments))}</code></pre>`;
      return box;
    }),
  );
  const stats = el.querySelector(".stats");
  const note = el.querySelector(".note");
  note.textContent = msg.state === "stopped" ? "Stopped." : msg.state === "error" ? `Error: ${msg.error}` : "";
  note.hidden = !note.textContent;
  if (msg.stats) {
    const st = msg.stats;
    stats.textContent = formatStats(st);
    stats.dataset.ttftMs = st.ttftMs == null ? "" : st.ttftMs.toFixed(1);
    stats.dataset.tokPerS = st.tokPerS == null ? "" : st.tokPerS.toFixed(2);
    stats.dataset.promptTokens = st.promptTokens ?? "";
    stats.dataset.cachedTokens = st.cachedTokens ?? "";
    stats.dataset.numTokens = st.numTokens;
  }
  stats.hidden = !msg.stats;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

const ANSWER_HTML = `<div class="meta"><span class="model-name"></span></div>
  <details class="reasoning" hidden><summary>Reasoning</summary><div class="reasoning-text"></div></details>
  <div class="content markdown"></div><div class="tool-calls"></div>
  <p class="note" hidden></p><div class="stats" hidden></div>`;

function messageElement(msg, index) {
  const el = document.createElement("article");
  el.className = `msg ${msg.role}`;
  el.dataset.index = index;
  el.dataset.role = msg.role;
  if (msg.role === "assistant") {
    el.innerHTML = ANSWER_HTML;
    renderAnswer(el, msg);
  } else {
    el.innerHTML = `<div class="bubble"><div class="content"></div></div>
      <div class="msg-actions"><button type="button" class="edit" aria-label="Edit message">Edit</button></div>`;
    el.querySelector(".content").textContent = msg.content;
    el.querySelector(".edit").addEventListener("click", () => startEdit(el, index));
  }
  return el;
}

function renderMessages() {
  els.messages.replaceChildren(...state.current.messages.map(messageElement));
  els.messages.scrollTop = els.messages.scrollHeight;
  updateButtons();
}

function startEdit(el, index) {
  if (state.controller) return;
  const bubble = el.querySelector(".bubble");
  bubble.innerHTML = `<textarea class="edit-box" aria-label="Edit message" rows="3"></textarea>
    <div class="actions"><button type="button" class="edit-cancel">Cancel</button>
    <button type="button" class="edit-save">Save &amp; send</button></div>`;
  const box = bubble.querySelector(".edit-box");
  box.value = state.current.messages[index].content;
  box.focus();
  bubble.querySelector(".edit-cancel").addEventListener("click", renderMessages);
  bubble.querySelector(".edit-save").addEventListener("click", () => {
    const text = box.value.trim();
    if (!text) return;
    state.current.messages = [...state.current.messages.slice(0, index), { role: "user", content: text }];
    persist();
    renderMessages();
    answer();
  });
}

// ------------------------------------------------------------------------------------------ streaming

function setStatus(text) {
  els.status.textContent = text;
}

function updateButtons() {
  const busy = Boolean(state.controller);
  els.stop.hidden = !busy;
  els.send.hidden = busy;
  els.send.disabled = busy;
  const msgs = state.current.messages;
  els.regenerate.disabled = busy || !msgs.length;
  els.app.dataset.busy = busy ? "true" : "false";
}

function requestBody() {
  const s = state.settings;
  const history = state.current.messages
    .filter((m) => m.role === "user" || (m.role === "assistant" && m.state !== "error"))
    .map((m) => ({ role: m.role, content: m.content || "" }));
  const messages = s.system.trim() ? [{ role: "system", content: s.system }, ...history] : history;
  return { model: s.model, messages, temperature: s.temperature, top_p: s.topP, max_tokens: s.maxTokens };
}

// Stream an answer to the conversation as it stands (its last message is the user's).
async function answer() {
  const body = requestBody();
  const msg = { role: "assistant", content: "", reasoning: "", toolCalls: [], model: body.model, state: "streaming" };
  state.current.messages.push(msg);
  const el = messageElement(msg, state.current.messages.length - 1);
  els.messages.append(el);
  el.scrollIntoView({ block: "end" });
  const controller = new AbortController();
  state.controller = controller;
  updateButtons();
  setStatus("Streaming…");
  let frame = 0;
  const onUpdate = (a) => {
    Object.assign(msg, { content: a.content, reasoning: a.reasoning, toolCalls: a.toolCalls });
    if (!frame) {
      frame = requestAnimationFrame(() => {
        frame = 0;
        const atBottom = els.messages.scrollHeight - els.messages.scrollTop - els.messages.clientHeight < 80;
        renderAnswer(el, msg);
        if (atBottom) els.messages.scrollTop = els.messages.scrollHeight;
      });
    }
  };
  try {
    const a = await withKey(() => streamChat(body, { key: state.key, signal: controller.signal, onUpdate }));
    Object.assign(msg, { content: a.content, reasoning: a.reasoning, toolCalls: a.toolCalls });
    msg.state = a.stopped ? "stopped" : "done";
    msg.stats = {
      ttftMs: a.ttftMs, tokPerS: a.tokPerS, numTokens: a.numTokens, finishReason: a.finishReason,
      promptTokens: a.usage?.prompt_tokens ?? null,
      cachedTokens: a.usage?.prompt_tokens_details?.cached_tokens ?? null,
    };
    state.lastStats = { ...msg.stats, model: body.model, state: msg.state };
    setStatus(a.stopped ? "Stopped" : "");
  } catch (err) {
    msg.state = "error";
    msg.error = err.message;
    setStatus(`Error: ${err.message}`);
  } finally {
    cancelAnimationFrame(frame);
    state.controller = null;
    renderAnswer(el, msg);
    persist();
    updateButtons();
  }
}

function send(text) {
  if (state.controller || !text.trim()) return;
  const c = state.current;
  c.messages.push({ role: "user", content: text });
  if (c.title === "New chat") c.title = text.trim().replace(/\s+/g, " ").slice(0, 48);
  persist();
  renderMessages();
  answer();
}

function regenerate() {
  if (state.controller) return;
  const msgs = state.current.messages;
  while (msgs.length && msgs[msgs.length - 1].role === "assistant") msgs.pop();
  if (!msgs.length) return;
  persist();
  renderMessages();
  answer();
}

// ------------------------------------------------------------------------------------------ wiring

async function copyCode(button) {
  const code = button.closest(".code-block").querySelector("code").textContent;
  try {
    await navigator.clipboard.writeText(code);
  } catch {
    const area = Object.assign(document.createElement("textarea"), { value: code });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => (button.textContent = "Copy"), 1500);
}

function wire() {
  els.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = els.prompt.value;
    if (!text.trim() || state.controller) return;
    els.prompt.value = "";
    send(text);
  });
  els.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      els.composer.requestSubmit();
    }
  });
  els.stop.addEventListener("click", () => state.controller?.abort());
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller && !els.keyDialog.open) state.controller.abort();
  });
  els.regenerate.addEventListener("click", regenerate);
  els.newChat.addEventListener("click", () => openConversation(store.newConversation()));
  els.setKey.addEventListener("click", () => askKey(null).then(loadModels, () => {}));
  els.toggle.addEventListener("click", () => {
    const open = els.app.classList.toggle("sidebar-open");
    els.toggle.setAttribute("aria-expanded", String(open));
  });
  const closeSidebar = () => {
    els.app.classList.remove("sidebar-open");
    els.toggle.setAttribute("aria-expanded", "false");
  };
  els.close.addEventListener("click", closeSidebar);
  els.messages.addEventListener("click", closeSidebar); // a tap on the chat closes the phone-sized sidebar
  els.messages.addEventListener("click", (e) => {
    const button = e.target.closest(".copy-code");
    if (button) copyCode(button);
  });
}

function start() {
  const currentId = store.loadCurrentId();
  state.current = state.conversations.find((c) => c.id === currentId) || store.newConversation();
  // an answer that was streaming when the page closed is kept as stopped
  for (const c of state.conversations) for (const m of c.messages) if (m.state === "streaming") m.state = "stopped";
  bindSettings();
  wire();
  renderConversations();
  renderMessages();
  loadModels();
  els.model.addEventListener("focus", refreshModelStates);
}

start();
