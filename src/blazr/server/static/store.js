// store.js — what the chat page keeps in this browser's localStorage: the conversations (each a list of
// messages with the answers' stats), which one is open, the settings (model, system prompt, sampling)
// and the API key. Nothing is sent anywhere but to the server the page came from.

const KEYS = {
  conversations: "blazr.chat.conversations",
  current: "blazr.chat.current",
  settings: "blazr.chat.settings",
  apiKey: "blazr.chat.apiKey",
};

export const DEFAULT_SETTINGS = { model: "", system: "", temperature: 0.7, topP: 0.95, maxTokens: 512 };

function read(key, fallback) {
  try {
    const raw = localStorage.getItem(key);
    return raw === null ? fallback : JSON.parse(raw);
  } catch {
    return fallback;
  }
}

function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
  } catch {
    // storage full or disabled: the page keeps working for this visit
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(KEYS.settings, {}) };
}

export function saveSettings(settings) {
  write(KEYS.settings, settings);
}

export function loadKey() {
  return read(KEYS.apiKey, "");
}

export function saveKey(key) {
  write(KEYS.apiKey, key);
}

function newId() {
  return `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
}

export function newConversation() {
  return { id: newId(), title: "New chat", messages: [], updated: Date.now() };
}

// The conversations, newest first, and the id of the open one.
export function loadConversations() {
  const list = read(KEYS.conversations, []);
  return Array.isArray(list) ? list : [];
}

export function saveConversations(list) {
  write(KEYS.conversations, list);
}

export function loadCurrentId() {
  return read(KEYS.current, null);
}

export function saveCurrentId(id) {
  write(KEYS.current, id);
}
