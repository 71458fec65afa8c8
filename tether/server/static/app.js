// @ts-nocheck
/**
 * app.js — the Tether web UI (the page at "/"): threads, the chat, the composer, the page
 * chrome. Plain ES modules, no build step:
 *
 * - `tether-client.js`: the browser client (HTTP API + `RunStream`, the run state machine);
 * - `transcript.js`: stored messages → the chat (bubbles, tool cards, branch switchers, editors);
 * - `live-run.js`: a run followed live, its events → the chat (tokens batched per frame);
 * - `approval-card.js`: the review card of an interrupt;
 * - `dom.js`: element builder and batched text writes.
 *
 * The chat shows a thread's *active path* from stored messages. While a run is active, the part
 * after the run's input message comes from the run's *events* instead (a `LiveRun`); a reload
 * replays the run from seq 1 and ends up in the same place, approval card and all. When the
 * run ends, the thread is read again and rendered from messages, and what was streamed is
 * compared with what the server stored (`window.tetherUI.runs[runId]`). The connection
 * indicator is the `RunStream` state: a lost network is "reconnecting", never "stopped"; only
 * the server's `cancelled` event is "stopped".
 */

import { TetherClient, TetherError } from './tether-client.js';
import { button, clock, h, spinner } from './dom.js';
import { LiveRun, compareWithServer } from './live-run.js';
import { renderMessages } from './transcript.js';

const api = new TetherClient();

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
  /** Reasoning streamed in this page, by message id (the server keeps it in the event log only). */
  thinking: new Map(),
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

function showError(error, prefix = '') {
  const message = error instanceof TetherError
    ? (error.status === 0 ? 'Could not reach the server. Check your connection and try again.' : error.message)
    : String(error && error.message ? error.message : error);
  els.banner.hidden = false;
  els.banner.replaceChildren(
    h('span', { text: prefix + message }),
    button('Dismiss', () => { els.banner.hidden = true; }, 'btn small'),
  );
  console.warn('tether ui:', prefix, error);
}

/** The page chrome for the live run: indicator, status line, buttons. */
function showLiveState(live) {
  setConn(live.stream.state);
  const status = live.statusText();
  showStatus(status && status.text, status && status.busy);
  updateControls();
}

/** What a `LiveRun` may ask of the page. */
const liveHost = {
  thinking: app.thinking,
  isLive: (live) => app.live === live,
  stateChanged: (live) => showLiveState(live),
  finished: (live) => {
    showStatus(null);
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

function renderChat() {
  const fragment = document.createDocumentFragment();
  const live = app.live;
  let history = app.path;
  if (live) {
    const at = history.findIndex((m) => m.id === live.inputMessageId);
    history = at >= 0 ? history.slice(0, at + 1) : history.filter((m) => m.run_id !== live.runId);
  }
  const busy = Boolean(live && !live.terminal);
  if (!history.length && !live) {
    fragment.append(h('p', { class: 'empty', text: app.threadId ? 'No messages on this branch yet.' : 'Start a conversation below.' }));
  }
  renderMessages(history, fragment, { busy, actions: messageActions, thinking: app.thinking });
  if (live) fragment.append(live.el);
  els.chat.replaceChildren(fragment);
  els.chat.scrollTop = els.chat.scrollHeight;
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
    if (started && !(app.live && app.live.runId === started.id)) run = started;
    else if (runId && !(app.live && app.live.runId === runId)) run = await api.getRun(runId);
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
  let threads;
  try {
    threads = await api.listThreads();
  } catch (_) {
    return;
  }
  els.threadList.replaceChildren(...threads.map((thread) => h('li', {},
    button([
      h('span', { class: 'thread-name', text: threadTitle(thread) }),
      h('span', { class: 'thread-meta' },
        thread.pending_interrupt ? h('span', { class: 'dot waiting', title: 'waiting for you', text: '●' }) : null,
        thread.active_run_id && !thread.pending_interrupt ? h('span', { class: 'dot running', title: 'running', text: '●' }) : null,
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
  els.stop.hidden = !active;
  els.stopNow.hidden = !active;
  els.stop.textContent = state === 'cancelling' ? 'Stop now' : 'Stop';
  if (active) {
    els.send.textContent = 'Send correction';
    const canSteer = state === 'streaming' || state === 'recovering';
    els.send.disabled = app.sending || !canSteer;
    els.input.placeholder = state === 'interrupted'
      ? 'Decide the request above (or Stop the run) before writing again.'
      : 'Send a correction while the agent works… (Esc stops the run)';
  } else {
    els.send.textContent = 'Send';
    els.send.disabled = app.sending;
    els.input.placeholder = 'Message the agent… (Enter to send, Shift+Enter for a new line)';
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
  await api.editMessage(messageId, text);
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
  try {
    await live.stream.cancel(mode, mode === 'hard' ? 'stopped at once from the web UI' : 'stopped from the web UI');
  } catch (error) {
    live.stopRequested = false;
    showError(error, 'The run was not stopped: ');
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

function closeSidebar() {
  document.body.classList.remove('sidebar-open');
  els.toggleThreads.setAttribute('aria-expanded', 'false');
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

function threadFromUrl() {
  const params = new URLSearchParams(window.location.search);
  const hash = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  return params.get('thread') || hash.get('thread') || null;
}

function init() {
  for (const id of ['chat', 'conn', 'banner', 'input', 'send', 'stop', 'audit', 'sidebar']) els[id] = $(id);
  Object.assign(els, {
    statusLine: $('status-line'), stopNow: $('stop-now'), threadList: $('thread-list'), newThread: $('new-thread'),
    auditBtn: $('audit-btn'), auditBody: $('audit-body'), auditClose: $('audit-close'), threadTitle: $('thread-title'),
    toggleThreads: $('toggle-threads'), composer: $('composer'), setTtl: $('set-ttl'), setThreshold: $('set-threshold'),
  });
  readSettings();
  els.composer.addEventListener('submit', send);
  els.input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (!els.send.disabled) send();
    }
  });
  els.stop.addEventListener('click', () => stop('soft'));
  els.stopNow.addEventListener('click', () => stop('hard'));
  els.newThread.addEventListener('click', () => { openThread(null); els.input.focus(); });
  els.auditBtn.addEventListener('click', openAudit);
  els.auditClose.addEventListener('click', () => els.audit.close());
  els.toggleThreads.addEventListener('click', () => {
    const open = !document.body.classList.contains('sidebar-open');
    document.body.classList.toggle('sidebar-open', open);
    els.toggleThreads.setAttribute('aria-expanded', String(open));
  });
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || event.defaultPrevented || els.audit.open) return;
    if (document.body.classList.contains('sidebar-open')) {
      closeSidebar();
      return;
    }
    if (app.live && !app.live.terminal) {
      event.preventDefault();
      stop('soft');
    }
  });
  window.addEventListener('popstate', () => openThread(threadFromUrl(), { history: 'none' }));
  refreshThreadList();
  openThread(threadFromUrl(), { history: 'replace' });
  document.body.dataset.ready = 'true';
}

init();
