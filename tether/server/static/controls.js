// @ts-nocheck
/**
 * controls.js — what the page shows of the live run besides the chat: the connection
 * indicator, the status line (a soft stop counts its seconds), the Send/Stop buttons, the
 * message box's placeholder and the short hints under it.
 */

import { h } from './dom.js';
import { setConn, showStatus } from './page-status.js';
import { app, els } from './state.js';
import { refreshThreadList } from './thread-list.js';

/** The page chrome for the live run: indicator, status line, buttons. */
export function showLiveState(live) {
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
export function hint(text) {
  els.hint.textContent = text || '';
  app.hintFor = text ? controlState() : null;
}

export function controlState() {
  return app.live && !app.live.terminal ? app.live.stream.state : 'idle';
}

export function updateControls() {
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
export function explainBlockedSend() {
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
