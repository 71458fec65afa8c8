// @ts-nocheck
/**
 * composer.js — the message box and its buttons: Send (a new run, or steering the live one),
 * Stop (soft, then hard), and Enter/Shift+Enter.
 */

import { explainBlockedSend, hint, showLiveState } from './controls.js';
import { showError } from './page-status.js';
import { runConfig } from './settings.js';
import { api, app, els } from './state.js';
import { openThread, refreshThread, withSending } from './thread.js';
import { refreshThreadList } from './thread-list.js';

export async function send(event) {
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
      // The server titles the thread after its first message (card-like numbers masked).
      const thread = await api.createThread();
      await openThread(thread.id);
    }
    const run = await api.startRun(app.threadId, { content: text, config: runConfig() });
    els.input.value = '';
    await refreshThread(run);
    refreshThreadList();
  });
}

/** Stop the run: soft first; a second Stop (or Stop now) is hard. Only the server says "stopped". */
export async function stop(mode = 'soft') {
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

/** Wire the message box and the Stop buttons. */
export function wireComposer() {
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
}
