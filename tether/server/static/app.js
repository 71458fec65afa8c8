// @ts-nocheck
/**
 * app.js — the Tether web UI (the page at "/"): it wires the page's parts together and starts
 * it. Plain ES modules, no build step:
 *
 * - `tether-client.js`: the browser client (HTTP API + `RunStream`, the run state machine);
 * - `state.js`: the shared state (the client, `app`, the page's elements, `window.tetherUI`);
 * - `thread.js`: one thread — opening, reading, following its live run, actions on messages;
 * - `chat.js`: the message view (stored messages, then the live run's part; focus after renders);
 * - `thread-list.js`: the sidebar (the thread list, the drawer on narrow screens);
 * - `thread-rename.js`: the thread's title in the header and the Rename dialog;
 * - `composer.js`: the message box, Send and Stop; `settings.js`: the run settings;
 * - `controls.js`: what the page shows of the live run (indicator, status line, buttons, hints);
 * - `page-status.js`: the connection indicator, the status line and the error banner;
 * - `transcript.js`: stored messages → the chat (bubbles, branch switchers, editors);
 * - `tool-card.js`: one tool call (arguments, result, decision);
 * - `live-run.js`: a run followed live, its events → the chat (tokens batched per frame);
 * - `approval-card.js`: the review card of an interrupt; `allow-choice.js`: its "Approve and allow…" (the inbox's too);
 * - `allowances.js`: the thread's standing approvals (the header chip and its dialog, tool cards' line);
 * - `approvals.js`: the Approvals view (every pending request you may decide, across threads; approve, allow or reject several at once);
 * - `audit-log.js`: the Audit log dialog; `sign-in.js`: who is signed in, the API key;
 * - `run-timeline.js`: a run's events → its timeline (pure); `timeline-view.js`: the Timeline dialog;
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

import { wireAllowances } from './allowances.js';
import { ApprovalsView } from './approvals.js';
import { wireAuditLog } from './audit-log.js';
import { stop, wireComposer } from './composer.js';
import { hint } from './controls.js';
import { showError } from './page-status.js';
import { readSettings } from './settings.js';
import { authenticate, signOut } from './sign-in.js';
import { $, api, app, bindElements, els } from './state.js';
import { openThread, refreshThread, threadFromUrl } from './thread.js';
import { closeSidebar, refreshThreadList, sidebarOpen, wireThreadList } from './thread-list.js';
import { wireRename } from './thread-rename.js';
import { wireTimeline } from './timeline-view.js';

/** Esc closes the drawer, else stops a working run (soft). */
function onEscape(event) {
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
}

async function init() {
  bindElements();
  app.approvals = new ApprovalsView(api, {
    dialog: $('approvals'), list: $('approvals-list'), reason: $('approvals-reason'), approve: $('approvals-approve'), allow: $('approvals-allow'), allowPanel: $('approvals-allow-panel'),
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
  wireComposer();
  els.newThread.addEventListener('click', () => { openThread(null); els.input.focus(); });
  wireAuditLog();
  wireRename();
  wireAllowances();
  wireTimeline();
  els.approvalsBtn.addEventListener('click', () => app.approvals.open());
  els.signOut.addEventListener('click', signOut);
  wireThreadList((threadId) => openThread(threadId));
  document.addEventListener('keydown', onEscape);
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
