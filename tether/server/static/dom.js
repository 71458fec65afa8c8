// @ts-nocheck
/**
 * dom.js — the small DOM toolkit of the web UI: element builder, formatting, and batched text
 * writes (streamed tokens reach the DOM at most once per animation frame).
 */

/** Create an element: h('div', {class: 'x', onclick: fn, dataset: {a: 1}}, child, 'text'). */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key === 'dataset') for (const [k, v] of Object.entries(value)) { if (v != null) el.dataset[k] = String(v); }
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** A keyboard-operable button (a real <button type=button>). */
export function button(label, onClick, cls = 'btn', props = {}) {
  return h('button', { type: 'button', class: cls, onclick: onClick, ...props }, label);
}

export function pretty(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch (_) {
    return String(value);
  }
}

export function spinner() {
  return h('span', { class: 'spinner', 'aria-hidden': 'true' });
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/** A moment as hours and minutes in the reader's own format ("14:02", "2:02 PM"). */
export function hm(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
}

export function duration(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

/** How long a request has waited, for people: "asked just now", "asked 40 s ago", "asked 3 min ago". */
export function waitedText(seconds) {
  if (seconds < 10) return 'asked just now';
  return seconds < 60 ? `asked ${Math.floor(seconds)} s ago` : `asked ${Math.floor(seconds / 60)} min ago`;
}

/** A value as people read it in one line: strings bare, everything else as JSON. */
export function plain(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value);
  } catch (_) {
    return String(value);
  }
}

/** `key: value, key: value` of an object on one line (a tool card's summary). */
export function oneLine(value) {
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    return Object.entries(value).map(([k, v]) => `${k}: ${plain(v)}`).join(', ');
  }
  return value == null ? '' : plain(value);
}

/** Where an MCP tool's tier came from, in words: "MCP server shop · tier from its annotations". */
const RISK_SOURCES = {
  annotation: 'tier from its annotations',
  'spec default': 'no annotations, so gated by default',
  'untrusted server': 'untrusted server, so gated',
  author: 'tier set by the agent',
};

export function sourceText(action) {
  const server = action.source.startsWith('mcp:') ? `MCP server ${action.source.slice(4)}` : action.source;
  const why = RISK_SOURCES[action.risk_source];
  return why ? `${server} · ${why}` : server;
}

/** Arguments as a key/value list (shorter than JSON, and what a reviewer reads). */
export function argsList(args, props = {}) {
  if (!args || typeof args !== 'object' || Array.isArray(args)) return h('pre', { class: 'args', ...props, text: pretty(args) });
  return h('dl', { class: 'args args-list', ...props },
    Object.entries(args).map(([k, v]) => h('div', {}, h('dt', { text: k }), h('dd', { text: plain(v) }))));
}

/** Which keys an edit changed: [{key, before, after}] (JSON-equal values are unchanged). */
export function argsDiff(before, after) {
  const keys = [...new Set([...Object.keys(before || {}), ...Object.keys(after || {})])];
  const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
  return keys.filter((k) => !same((before || {})[k], (after || {})[k]))
    .map((k) => ({ key: k, before: (before || {})[k], after: (after || {})[k] }));
}

/** An id unique in the page (for aria-describedby and friends). */
let lastId = 0;
export function uid(prefix = 'el') {
  lastId += 1;
  return `${prefix}-${lastId}`;
}

/** Keep the chat pinned to the bottom while it grows, unless the reader scrolled up. */
export function keepScroll(mutate) {
  const chat = document.getElementById('chat');
  if (!chat) {
    mutate();
    return;
  }
  const pinned = chat.scrollHeight - chat.scrollTop - chat.clientHeight < 80;
  mutate();
  if (pinned) chat.scrollTop = chat.scrollHeight;
}
// -- token batching: at most one DOM write per animation frame ----------------------------------

const pendingText = new Map(); // Text node → string to append
let frameRequested = false;

export function queueText(node, text) {
  pendingText.set(node, (pendingText.get(node) || '') + text);
  if (frameRequested) return;
  frameRequested = true;
  // rAF does not fire in a hidden tab; a timer keeps the text (and memory) moving there.
  if (document.hidden) setTimeout(flushText, 100);
  else requestAnimationFrame(flushText);
}

export function flushText() {
  frameRequested = false;
  if (!pendingText.size) return;
  keepScroll(() => {
    for (const [node, text] of pendingText) node.appendData(text);
    pendingText.clear();
  });
}
