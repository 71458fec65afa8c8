// @ts-nocheck
/**
 * app.js — the Tether web UI (the page at "/"): threads, the chat, the composer, the page
 * chrome. Plain ES modules, no build step:
 *
 * - `tether-client.js`: the browser client (HTTP API + `RunStream`, the run state machine);
 * - `transcript.js`: stored messages → the chat (bubbles, tool cards, branch switchers, editors);
 * - `live-run.js`: a run followed live, its events → the chat (tokens batched per frame);
 * - `approval-card.js`: the review card of an interrupt;
 * - `approvals.js`: the Approvals view (every pending request you may decide, across threads);
 * - `dom.js`: element builder and batched text writes.
 *
 * The chat shows a thread's *active path* from stored messages. While a run is active, the part
 * after the run's input message comes from the run's *events* instead (a `LiveRun`); a reload
 * replays the run from seq 1 and ends up in the same place, approval card and all. When the
 * run ends, the thread is read again and rendered from messages, and what was streamed is
 * compared with what the server stored (`window.tetherUI.runs[runId]`). The connection
 * indicator is the `RunStream` state: a lost network is "reconnecting", never "stopped"; only
 * the server's `cancelled` event is "stopped".
 *
 * Signing in: the page asks `GET /v1/me` first. In `open` mode that answers at once (`local`).
 * In `keys` mode it is a 401 until the person pastes a key; the key is then kept in
 * `sessionStorage` (this tab), or in `localStorage` with "remember me", and sent as a bearer
 * header on every request, the event streams included. Signing out forgets it and reloads.
 */

import { TetherClient, TetherError } from './tether-client.js';
import { ApprovalsView } from './approvals.js';
import { button, clock, h, spinner } from './dom.js';
import { LiveRun, compareWithServer } from './live-run.js';
import { renderMessages } from './transcript.js';

/** Where the API key is kept: this tab only (`sessionStorage`), or with "remember me" the browser. */
const KEY_NAME = 'tether.apiKey';
const storedKey = () => sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME);
const api = new TetherClient({ apiKey: storedKey() });

const $ = (id) => document.getElementById(id);
const els = {};

// -- state -----------------------------------------------------------------------------------

const app = {
  threadId: null,
  thread: null,
  path: [],
  /** @type {LiveRun|null} */
  live: null,
  loadSeq: 0,
  sending: false,
  settings: { approval_threshold: 'destructive', approval_ttl_s: null },
  /** Reasoning by message id: streamed in this page, or read back from the runs' event logs. */
  thinking: new Map(),
  /** Runs whose event log was read back (reasoning, errors); a finished run's log never changes. */
  readRuns: new Set(),
  /** How each reviewed tool call was decided, by call id (from the thread's audit log). */
  decisions: new Map(),
  /** The `error` of each failed run on the path, by run id. */
  runErrors: new Map(),
  /** What to focus after the next render (a CSS selector), when focus would otherwise be lost. */
  focusAfterRender: null,
};

/** Diagnostics for tests and curious humans: per run, what was streamed and how. */
const diagnostics = { app, runs: {}, lastRunId: null };
window.tetherUI = diagnostics;

const CONN_LABELS = {
  idle: 'ready',
  streaming: 'live',
  recovering: 'reconnecting…',
  interrupted: 'waiting for you',
  cancelling: 'stopping…',
  cancelled: 'stopped',
  completed: 'done',
  failed: 'failed',
};

function setConn(state) {
  els.conn.dataset.state = state;
  els.conn.textContent = CONN_LABELS[state] || state;
}

function showStatus(text, busy = true) {
  if (!text) {
    els.statusLine.hidden = true;
    els.statusLine.replaceChildren();
    return;
  }
  els.statusLine.hidden = false;
  els.statusLine.replaceChildren(busy ? spinner() : '', h('span', { text }));
}

function showError(error, prefix = '', kind = 'error') {
  const message = error instanceof TetherError
    ? (error.status === 0 ? 'Could not reach the server. Check your connection and try again.' : error.message)
    : String(error && error.message ? error.message : error);
  els.banner.hidden = false;
  els.banner.dataset.kind = kind;
  els.banner.replaceChildren(
    h('span', { text: prefix + message }),
    button('Dismiss', () => { els.banner.hidden = true; }, 'btn small'),
  );
  console.warn('tether ui:', prefix, error);
}

/** The page chrome for the live run: indicator, status line, buttons. */
function showLiveState(live) {
  // The thread list says which thread waits for you: read it again when that changes.
  const waiting = live.stream.state === 'interrupted';
  if (live.listedWaiting !== undefined && live.listedWaiting !== waiting) refreshThreadList();
  live.listedWaiting = waiting;
  setConn(live.stream.state);
  const status = live.statusText();
  showStatus(status && status.text, status && status.busy);
  updateControls();
  // A soft stop can wait for a long tool: the status line counts the seconds.
  const ticking = live.stream.state === 'cancelling' && !live.terminal;
  if (ticking && !app.stopTicker) app.stopTicker = setInterval(() => app.live && showLiveState(app.live), 1000);
  if (!ticking && app.stopTicker) {
    clearInterval(app.stopTicker);
    app.stopTicker = null;
  }
}

/** A short note under the message box (why Enter did nothing, what Esc does now…); it goes
 * away when the run's state changes. */
function hint(text) {
  els.hint.textContent = text || '';
  app.hintFor = text ? controlState() : null;
}

function controlState() {
  return app.live && !app.live.terminal ? app.live.stream.state : 'idle';
}

/** What a `LiveRun` may ask of the page. */
const liveHost = {
  thinking: app.thinking,
  isLive: (live) => app.live === live,
  stateChanged: (live) => showLiveState(live),
  finished: (live) => {
    showStatus(null);
    // "The run was not stopped" is moot once the run has ended.
    if (els.banner.dataset.kind === 'stop') clearError();
    // A run followed here was replayed from seq 1: its reasoning and error are known already.
    app.readRuns.add(live.runId);
    if (live.error) app.runErrors.set(live.runId, live.error);
    if (app.live === live) refreshThread();
  },
};

function clearError() {
  els.banner.hidden = true;
}

function runConfig() {
  const config = {};
  if (app.settings.approval_threshold !== 'destructive') config.approval_threshold = app.settings.approval_threshold;
  if (app.settings.approval_ttl_s) config.approval_ttl_s = app.settings.approval_ttl_s;
  return config;
}

// -- loading and rendering a thread ------------------------------------------------------------

/** The empty page: what to try (each example fills the message box). */
function starter() {
  const examples = ['refund 25 on order A100', 'long', 'ask what colour'];
  return h('div', { class: 'empty starter' },
    h('p', { text: app.threadId ? 'No messages on this branch yet.' : 'Start a conversation below. Try one of these:' }),
    app.threadId ? null : h('p', { class: 'examples' }, examples.map((text) => button(text, () => {
      els.input.value = text;
      els.input.focus();
    }, 'btn small example', { 'aria-label': `Write “${text}” in the message box` }))));
}

function renderChat() {
  // The chat is rebuilt: remember whether focus was in it, so it is not lost to <body>.
  const focused = document.activeElement;
  const focusWasInChat = (els.chat.contains(focused) && focused !== els.chat) || (app.chatFocusLost && (focused == null || focused === document.body));
  const fragment = document.createDocumentFragment();
  const live = app.live;
  let history = app.path;
  if (live) {
    const at = history.findIndex((m) => m.id === live.inputMessageId);
    history = at >= 0 ? history.slice(0, at + 1) : history.filter((m) => m.run_id !== live.runId);
  }
  const busy = Boolean(live && !live.terminal);
  if (!history.length && !live) fragment.append(starter());
  renderMessages(history, fragment, {
    busy, actions: messageActions, thinking: app.thinking, decisions: app.decisions, runErrors: app.runErrors,
  });
  if (live) fragment.append(live.el);
  els.chat.replaceChildren(fragment);
  els.chat.scrollTop = els.chat.scrollHeight;
  restoreFocus(focusWasInChat);
}

/**
 * After a render: focus what an action asked for (e.g. the answer just edited), or — when the
 * focused control was in the chat and is gone (an approval card replaced by the stored
 * messages, a closed editor) — the message box, the next thing a person does.
 */
function restoreFocus(focusWasInChat) {
  const wanted = app.focusAfterRender;
  app.focusAfterRender = null;
  const target = wanted && els.chat.querySelector(wanted);
  if (target && !target.disabled) {
    target.focus({ preventScroll: true });
    return;
  }
  const focused = document.activeElement;
  const lost = focused == null || focused === document.body || !document.contains(focused);
  if ((wanted || focusWasInChat) && lost) els.input.focus({ preventScroll: true });
}

/**
 * What the chat shows besides the messages, read once per thread load: decisions from the
 * audit log, and from each finished run's event log its reasoning and, if it failed, its error.
 */
async function readExtras(threadId, messages, liveRunId) {
  const runIds = [...new Set(messages.filter((m) => m.run_id && m.role === 'assistant').map((m) => m.run_id))]
    .filter((id) => id !== liveRunId && !app.readRuns.has(id));
  const [audit] = await Promise.all([
    api.audit({ threadId }).catch(() => null), // who decided is a detail: the chat works without it
    ...runIds.map((runId) => readRunLog(runId).catch(() => {})),
  ]);
  if (!audit) return;
  for (const entry of audit) {
    if (!entry.call_id) continue;
    if (entry.action === 'decision') {
      const d = entry.details || {};
      app.decisions.set(entry.call_id, {
        decision: entry.decision, actor: entry.actor, ts: entry.ts, reason: entry.reason,
        original: d.original_args, edited: d.edited_args,
      });
    } else if (entry.action === 'expired') {
      app.decisions.set(entry.call_id, { decision: 'expired', actor: entry.actor, ts: entry.ts });
    }
  }
}

/** A finished run's reasoning (the `thinking` events) and error, from its event log. */
async function readRunLog(runId) {
  const thinking = new Map();
  let afterSeq = 0;
  for (;;) {
    const page = await api.events(runId, { afterSeq, limit: 1000 });
    for (const e of page) {
      if (e.type === 'thinking') thinking.set(e.data.message_id, (thinking.get(e.data.message_id) || '') + e.data.text);
      if (e.type === 'error') app.runErrors.set(runId, e.data);
    }
    if (page.length < 1000) break;
    afterSeq = page[page.length - 1].seq;
  }
  for (const [id, text] of thinking) app.thinking.set(id, text);
  app.readRuns.add(runId);
}

/**
 * Read the thread and render it. `started` is a run this page just started: it is followed
 * even if it already ended (a fast run may be over before the thread is read).
 */
async function refreshThread(started = null) {
  const threadId = app.threadId;
  if (!threadId) return;
  const seq = ++app.loadSeq;
  let thread;
  let page;
  let run = null;
  let readAt;
  try {
    [thread, page] = await Promise.all([api.getThread(threadId), api.messages(threadId, 'path')]);
    readAt = Date.now();
    const runId = thread.active_run_id;
    const extras = readExtras(threadId, page.items, (started && started.id) || runId);
    if (started && !(app.live && app.live.runId === started.id)) run = started;
    else if (runId && !(app.live && app.live.runId === runId)) run = await api.getRun(runId);
    await extras;
  } catch (error) {
    if (seq === app.loadSeq) showError(error, 'Could not load the thread: ');
    return;
  }
  if (seq !== app.loadSeq || threadId !== app.threadId) return;
  app.thread = thread;
  app.path = page.items;
  els.threadTitle.textContent = threadTitle(thread);
  els.auditBtn.disabled = false;
  if (run) {
    closeLive();
    app.live = new LiveRun(run, { api, pending: thread.pending_interrupt, readAt, host: liveHost });
    diagnostics.runs[run.id] = app.live.report;
    diagnostics.lastRunId = run.id;
    showLiveState(app.live);
  } else if (!thread.active_run_id && app.live && app.live.terminal) {
    const finished = app.live;
    app.live = null;
    finished.dispose();
    compareWithServer(finished, app.path);
    refreshThreadList();
  }
  renderChat();
  updateControls();
}

function closeLive() {
  if (app.live) {
    app.live.dispose();
    app.live = null;
  }
}

function threadTitle(thread) {
  return (thread.metadata && thread.metadata.title) || `Thread ${thread.id.slice(-6)}`;
}

function threadUrl(threadId) {
  const url = new URL(window.location.href);
  url.hash = '';
  if (threadId) url.searchParams.set('thread', threadId);
  else url.searchParams.delete('thread');
  return url.pathname + url.search;
}

async function openThread(threadId, { history = 'push' } = {}) {
  if (history === 'push') window.history.pushState({ thread: threadId }, '', threadUrl(threadId));
  else if (history === 'replace') window.history.replaceState({ thread: threadId }, '', threadUrl(threadId));
  if (threadId !== app.threadId) {
    closeLive();
    app.path = [];
    app.decisions = new Map();
    setConn('idle');
    showStatus(null);
    clearError();
  }
  app.threadId = threadId;
  markActiveThread();
  closeSidebar();
  if (!threadId) {
    app.thread = null;
    els.threadTitle.textContent = 'New thread';
    els.auditBtn.disabled = true;
    renderChat();
    updateControls();
    return;
  }
  await refreshThread();
}

async function refreshThreadList() {
  if (app.approvals) app.approvals.refresh();
  let threads;
  try {
    threads = await api.listThreads();
  } catch (_) {
    return;
  }
  // The state is words (a dot alone is a colour and a tooltip: neither reaches everyone).
  const stateOf = (thread) => {
    if (thread.pending_interrupt) return h('span', { class: 'thread-state waiting' }, h('span', { class: 'dot', 'aria-hidden': 'true', text: '●' }), 'waiting for you');
    if (thread.active_run_id) return h('span', { class: 'thread-state running' }, h('span', { class: 'dot', 'aria-hidden': 'true', text: '●' }), 'running');
    return null;
  };
  els.threadList.replaceChildren(...threads.map((thread) => h('li', {},
    button([
      h('span', { class: 'thread-name', text: threadTitle(thread) }),
      h('span', { class: 'thread-meta' },
        stateOf(thread),
        new Date(thread.created_at).toLocaleString([], { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' })),
    ], () => openThread(thread.id), 'thread-item', { dataset: { threadId: thread.id } }))));
  markActiveThread();
}

function markActiveThread() {
  for (const item of els.threadList.querySelectorAll('.thread-item')) {
    if (item.dataset.threadId === app.threadId) item.setAttribute('aria-current', 'page');
    else item.removeAttribute('aria-current');
  }
}

// -- actions ---------------------------------------------------------------------------------

/** The buttons on stored messages (see transcript.js `renderMessages`). */
const messageActions = {
  fork: (message, text) => forkFrom(message, text),
  regenerate: (userMessageId) => regenerate(userMessageId),
  editAnswer: (messageId, text) => editAnswer(messageId, text),
  switchBranch: (messageId) => switchBranch(messageId),
};

function updateControls() {
  const live = app.live;
  const active = Boolean(live && !live.terminal);
  const state = live ? live.stream.state : 'idle';
  // While a soft stop is under way, "Stop" has done its part: only "Stop now" is left to press.
  els.stop.hidden = !active || state === 'cancelling';
  els.stopNow.hidden = !active;
  if (active) {
    els.send.replaceChildren('Send', h('span', { class: 'wide-only', text: ' to steer' }));
    const canSteer = state === 'streaming' || state === 'recovering';
    els.send.disabled = app.sending || !canSteer;
    els.input.placeholder = state === 'interrupted'
      ? 'Decide the request above (or Stop the run) before writing again.'
      : 'Steer the agent while it works… (Esc stops the run)';
  } else {
    els.send.replaceChildren('Send');
    els.send.disabled = app.sending;
    els.input.placeholder = 'Message the agent… (Enter to send, Shift+Enter for a new line)';
  }
  if (app.hintFor && app.hintFor !== controlState()) hint(null);
}

/** Enter in the message box while sending is not possible: say why (the text stays). */
function explainBlockedSend() {
  const live = app.live;
  if (live && !live.terminal && live.stream.state === 'interrupted') {
    const card = [...live.approvals.values()].find((c) => c.state === 'pending');
    hint(card && card.questions
      ? 'Not sent: the agent is waiting for your answer to its question above. Answer it (or Stop the run); your message stays here.'
      : 'Not sent: the agent is waiting for your decision above. Decide it (or Stop the run); your message stays here.');
  } else if (live && !live.terminal && live.stream.state === 'cancelling') {
    hint('Not sent: the run is stopping. Send again once it has stopped; your message stays here.');
  }
}

async function withSending(action) {
  if (app.sending) return;
  app.sending = true;
  updateControls();
  clearError();
  try {
    await action();
  } catch (error) {
    if (error instanceof TetherError && error.code === 'thread_busy') {
      // Another tab (or client) is running this thread: show that run instead.
      showError(error, 'Not sent: ');
      els.banner.firstChild.textContent = 'Not sent: this thread is busy with a run started elsewhere. It is shown below; send again when it ends.';
      await refreshThread();
    } else {
      showError(error);
    }
  } finally {
    app.sending = false;
    updateControls();
  }
}

async function send(event) {
  if (event) event.preventDefault();
  const text = els.input.value.trim();
  if (!text) return;
  const live = app.live;
  if (live && !live.terminal) {
    await withSending(async () => {
      await api.steer(live.runId, text);
      els.input.value = '';
    });
    return;
  }
  await withSending(async () => {
    if (!app.threadId) {
      // The title shows in the thread list: no card-like numbers there.
      const masked = text.replace(/\d{12,19}/g, (digits) => `****${digits.slice(-4)}`);
      const title = masked.length > 48 ? `${masked.slice(0, 47)}…` : masked;
      const thread = await api.createThread({ title });
      await openThread(thread.id);
    }
    const run = await api.startRun(app.threadId, { content: text, config: runConfig() });
    els.input.value = '';
    await refreshThread(run);
    refreshThreadList();
  });
}

async function forkFrom(message, text) {
  await refreshThread(await api.startRun(app.threadId, { content: text, parentId: message.parent_id, config: runConfig() }));
}

async function regenerate(userMessageId) {
  await withSending(async () => {
    await refreshThread(await api.startRun(app.threadId, { parentId: userMessageId, config: runConfig() }));
  });
}

async function editAnswer(messageId, text) {
  const edited = await api.editMessage(messageId, text);
  // The saved version replaces the editor: its Edit button takes the focus.
  if (edited && edited.id) app.focusAfterRender = `.msg[data-id="${edited.id}"] .edit-answer`;
  await refreshThread();
}

async function switchBranch(messageId) {
  if (!messageId) return;
  await withSending(async () => {
    await api.setActiveLeaf(app.threadId, messageId);
    await refreshThread();
  });
}

/** Stop the run: soft first; a second Stop (or Stop now) is hard. Only the server says "stopped". */
async function stop(mode = 'soft') {
  const live = app.live;
  if (!live || live.terminal) return;
  if (mode === 'soft' && live.stopRequested) mode = 'hard';
  live.stopRequested = true;
  live.stopMode = mode;
  live.stopAt = live.stopAt || Date.now();
  if (live.stream.state === 'cancelling') showLiveState(live);
  try {
    await live.stream.cancel(mode, mode === 'hard' ? 'stopped at once from the web UI' : 'stopped from the web UI');
  } catch (error) {
    live.stopRequested = false;
    live.stopMode = null;
    live.stopAt = null;
    showError(error, 'The run was not stopped: ', 'stop');
  }
}

async function openAudit() {
  if (!app.threadId) return;
  els.auditBody.replaceChildren(h('p', {}, spinner(), ' Loading…'));
  if (!els.audit.open) els.audit.showModal();
  let entries;
  try {
    entries = await api.audit({ threadId: app.threadId });
  } catch (error) {
    els.auditBody.replaceChildren(h('p', { class: 'card-error', text: `Could not load the audit log: ${error.message}` }));
    return;
  }
  if (!entries.length) {
    els.auditBody.replaceChildren(h('p', { text: 'No decisions, expiries, cancels or gated executions on this thread yet.' }));
    return;
  }
  const columns = ['time', 'actor', 'action', 'tool', 'decision', 'reason', 'outcome'];
  els.auditBody.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { class: 'audit-table' },
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', text: c })))),
    h('tbody', {}, entries.map((e) => h('tr', { dataset: { action: e.action, decision: e.decision } },
      h('td', { text: clock(Date.parse(e.ts)) }),
      h('td', { text: e.actor || '' }),
      h('td', { text: e.action || '' }),
      h('td', { text: e.tool || '' }),
      h('td', { text: e.decision || '' }),
      h('td', { text: e.reason || '' }),
      h('td', { text: e.outcome || '' })))))));
}

// The thread list is a drawer on narrow screens: while closed it is out of the Tab order
// (inert); while open, the dimmed rest of the page catches taps (they close the drawer and
// reach nothing underneath) and is inert too.
const narrow = window.matchMedia('(max-width: 760px)');

function sidebarOpen() {
  return document.body.classList.contains('sidebar-open');
}

function syncDrawer() {
  const open = sidebarOpen();
  const drawer = narrow.matches;
  els.sidebar.inert = drawer && !open;
  els.main.inert = drawer && open;
  els.scrim.hidden = !(drawer && open);
  els.toggleThreads.setAttribute('aria-expanded', String(open));
}

function openSidebar() {
  document.body.classList.add('sidebar-open');
  syncDrawer();
  (els.sidebar.querySelector('[aria-current="page"]') || els.newThread).focus();
}

function closeSidebar({ returnFocus = false } = {}) {
  const wasOpen = sidebarOpen();
  document.body.classList.remove('sidebar-open');
  syncDrawer();
  if (wasOpen && returnFocus) els.toggleThreads.focus();
}

// -- start -----------------------------------------------------------------------------------

function readSettings() {
  const params = new URLSearchParams(window.location.search);
  const ttl = Number(params.get('approval_ttl_s'));
  if (ttl > 0) app.settings.approval_ttl_s = ttl;
  if (params.get('approval_threshold') === 'reversible') app.settings.approval_threshold = 'reversible';
  els.setTtl.value = app.settings.approval_ttl_s || '';
  els.setThreshold.value = app.settings.approval_threshold;
  els.setTtl.addEventListener('change', () => {
    const value = Number(els.setTtl.value);
    app.settings.approval_ttl_s = value > 0 ? value : null;
  });
  els.setThreshold.addEventListener('change', () => { app.settings.approval_threshold = els.setThreshold.value; });
}

// -- signing in ------------------------------------------------------------------------------

/** Who is signed in: ask the server, and ask the person for a key while it answers 401. */
async function authenticate() {
  for (;;) {
    try {
      app.me = await api.me();
      break;
    } catch (error) {
      if (!(error instanceof TetherError) || error.status !== 401) throw error;
      await askForKey(storedKey() ? 'That key was not accepted (unknown, expired or revoked).' : '');
    }
  }
  const { name, roles, auth } = app.me;
  els.who.hidden = false;
  els.who.textContent = `${name} · ${roles.join(', ')}`;
  els.who.title = auth === 'keys' ? `Signed in as ${name}` : 'Open mode: no key needed on this machine';
  els.signOut.hidden = auth !== 'keys';
  els.approvalsBtn.hidden = false;
}

/** Show the sign-in dialog until the person submits a key the server accepts. */
function askForKey(message) {
  forgetKey();
  const dialog = $('signin');
  const error = $('signin-error');
  error.textContent = message;
  return new Promise((resolve) => {
    const form = $('signin-form');
    form.onsubmit = async (event) => {
      event.preventDefault();
      const key = $('signin-key').value.trim();
      api.setApiKey(key);
      try {
        await api.me();
      } catch (exc) {
        api.setApiKey(null);
        error.textContent = exc instanceof TetherError && exc.status === 401
          ? 'That key was not accepted (unknown, expired or revoked).'
          : `Could not sign in: ${exc.message}`;
        return;
      }
      ($('signin-remember').checked ? localStorage : sessionStorage).setItem(KEY_NAME, key);
      $('signin-key').value = '';
      dialog.close();
      resolve();
    };
    dialog.oncancel = (event) => event.preventDefault(); // nothing works without a key
    if (!dialog.open) dialog.showModal();
    $('signin-key').focus();
  });
}

function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

function signOut() {
  closeLive();
  forgetKey();
  api.setApiKey(null);
  window.location.assign('/');
}

function threadFromUrl() {
  const params = new URLSearchParams(window.location.search);
  const hash = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  return params.get('thread') || hash.get('thread') || null;
}

async function init() {
  for (const id of ['chat', 'conn', 'banner', 'input', 'send', 'stop', 'audit', 'sidebar', 'scrim', 'main']) els[id] = $(id);
  Object.assign(els, {
    statusLine: $('status-line'), stopNow: $('stop-now'), threadList: $('thread-list'), newThread: $('new-thread'),
    auditBtn: $('audit-btn'), auditBody: $('audit-body'), auditClose: $('audit-close'), threadTitle: $('thread-title'),
    toggleThreads: $('toggle-threads'), composer: $('composer'), setTtl: $('set-ttl'), setThreshold: $('set-threshold'),
    hint: $('composer-hint'), who: $('who'), signOut: $('sign-out'), approvalsBtn: $('approvals-btn'),
  });
  app.approvals = new ApprovalsView(api, {
    dialog: $('approvals'), list: $('approvals-list'), reason: $('approvals-reason'), approve: $('approvals-approve'),
    reject: $('approvals-reject'), close: $('approvals-close'), status: $('approvals-status'), count: $('approvals-count'),
  }, {
    openThread: (threadId) => openThread(threadId),
    decided: () => { refreshThreadList(); if (app.threadId) refreshThread(); },
  });
  // Focus that leaves the chat for nowhere (a control disabled or removed under it) is lost,
  // and the next render puts it somewhere sensible; focus that moves anywhere else is not.
  // (A click on the page's background also sends focus to nowhere: that is not lost focus.)
  document.addEventListener('pointerdown', () => { app.pointerAt = Date.now(); }, true);
  els.chat.addEventListener('focusout', (event) => {
    if (!event.relatedTarget && !(Date.now() - (app.pointerAt || 0) < 200)) app.chatFocusLost = true;
  });
  document.addEventListener('focusin', () => { app.chatFocusLost = false; });
  readSettings();
  els.composer.addEventListener('submit', send);
  els.input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (!els.send.disabled) send();
      else explainBlockedSend();
    }
  });
  els.input.addEventListener('input', () => { if (els.hint.textContent.startsWith('Not sent')) hint(null); });
  els.stop.addEventListener('click', () => stop('soft'));
  els.stopNow.addEventListener('click', () => stop('hard'));
  els.newThread.addEventListener('click', () => { openThread(null); els.input.focus(); });
  els.auditBtn.addEventListener('click', openAudit);
  els.auditClose.addEventListener('click', () => els.audit.close());
  els.approvalsBtn.addEventListener('click', () => app.approvals.open());
  els.signOut.addEventListener('click', signOut);
  els.toggleThreads.addEventListener('click', () => (sidebarOpen() ? closeSidebar() : openSidebar()));
  els.scrim.addEventListener('click', (event) => {
    event.preventDefault();
    closeSidebar({ returnFocus: true });
  });
  narrow.addEventListener('change', syncDrawer);
  syncDrawer();
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || event.defaultPrevented || document.querySelector('dialog[open]')) return;
    if (sidebarOpen()) {
      closeSidebar({ returnFocus: true });
      return;
    }
    const live = app.live;
    if (!live || live.terminal) return;
    // Esc stops a run that is *working*; it never throws away a request waiting for a human
    // (that takes the Stop button, on purpose).
    if (live.stream.state === 'interrupted' || live.hasPendingApproval()) {
      hint('Esc does not cancel a request that waits for you. Decide it above, or press Stop to cancel the run.');
      return;
    }
    event.preventDefault();
    stop('soft');
  });
  window.addEventListener('popstate', () => openThread(threadFromUrl(), { history: 'none' }));
  try {
    await authenticate();
  } catch (error) {
    showError(error, 'Could not start: ');
    return;
  }
  refreshThreadList();
  openThread(threadFromUrl(), { history: 'replace' });
  document.body.dataset.ready = 'true';
}

init();
