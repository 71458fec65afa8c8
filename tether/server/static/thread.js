// @ts-nocheck
/**
 * thread.js — one thread on the page: opening it (and the URL that names it), reading it and
 * what the chat shows besides its messages (decisions from the audit log, reasoning and errors
 * from run event logs), following its active run (a `LiveRun`), and the actions on its stored
 * messages (fork, regenerate, edit an answer, switch branch).
 */

import { TetherError } from './tether-client.js';
import { allowedLine, loadAllowances, markAllowed } from './allowances.js';
import { renderChat } from './chat.js';
import { showLiveState, updateControls } from './controls.js';
import { LiveRun, compareWithServer } from './live-run.js';
import { clearError, setConn, showError, showStatus } from './page-status.js';
import { runConfig } from './settings.js';
import { api, app, closeLive, diagnostics, els } from './state.js';
import { closeSidebar, markActiveThread, refreshThreadList } from './thread-list.js';
import { showThreadTitle } from './thread-rename.js';
import { openTimeline } from './timeline-view.js';

/** What a `LiveRun` may ask of the page. */
const liveHost = {
  thinking: app.thinking,
  isLive: (live) => app.live === live,
  allowed: (card, allowanceId) => { markAllowed(card, allowanceId).catch(() => {}); },
  allowancesChanged: () => { loadAllowances(app.threadId).catch(() => {}); },
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

/**
 * What the chat shows besides the messages, read once per thread load: decisions from the
 * audit log (and the standing approvals calls ran under), and from each finished run's event
 * log its reasoning and, if it failed, its error.
 */
async function readExtras(threadId, messages, liveRunId) {
  const runIds = [...new Set(messages.filter((m) => m.run_id && m.role === 'assistant').map((m) => m.run_id))]
    .filter((id) => id !== liveRunId && !app.readRuns.has(id));
  const [audit] = await Promise.all([
    api.audit({ threadId }).catch(() => null), // who decided is a detail: the chat works without it
    loadAllowances(threadId).catch(() => {}),
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
    } else if (entry.action === 'allowed') {
      app.decisions.set(entry.call_id, { decision: 'allowed', line: allowedLine(app.allowances.get((entry.details || {}).allowance_id)) });
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
export async function refreshThread(started = null) {
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
  showThreadTitle(thread);
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
  renderChat(messageActions);
  updateControls();
}

function threadUrl(threadId) {
  const url = new URL(window.location.href);
  url.hash = '';
  if (threadId) url.searchParams.set('thread', threadId);
  else url.searchParams.delete('thread');
  return url.pathname + url.search;
}

export async function openThread(threadId, { history = 'push' } = {}) {
  if (history === 'push') window.history.pushState({ thread: threadId }, '', threadUrl(threadId));
  else if (history === 'replace') window.history.replaceState({ thread: threadId }, '', threadUrl(threadId));
  if (threadId !== app.threadId) {
    closeLive();
    app.path = [];
    app.decisions = new Map();
    app.allowances = new Map();
    setConn('idle');
    showStatus(null);
    clearError();
  }
  app.threadId = threadId;
  markActiveThread();
  closeSidebar();
  if (!threadId) {
    app.thread = null;
    loadAllowances(null);
    showThreadTitle(null);
    els.auditBtn.disabled = true;
    renderChat(messageActions);
    updateControls();
    return;
  }
  await refreshThread();
}

export function threadFromUrl() {
  const params = new URLSearchParams(window.location.search);
  const hash = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  return params.get('thread') || hash.get('thread') || null;
}

/** The buttons on stored messages (see transcript.js `renderMessages`). */
const messageActions = {
  fork: (message, text) => forkFrom(message, text),
  regenerate: (userMessageId) => regenerate(userMessageId),
  editAnswer: (messageId, text) => editAnswer(messageId, text),
  switchBranch: (messageId) => switchBranch(messageId),
  timeline: (runId) => openTimeline(runId),
};

export async function withSending(action) {
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
