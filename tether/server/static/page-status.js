// @ts-nocheck
/**
 * page-status.js — what the page says about itself: the connection indicator (the live run's
 * `RunStream` state), the status line under the chat, and the error banner.
 */

import { TetherError } from './tether-client.js';
import { button, h, spinner } from './dom.js';
import { els } from './state.js';

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

export function setConn(state) {
  els.conn.dataset.state = state;
  els.conn.textContent = CONN_LABELS[state] || state;
}

export function showStatus(text, busy = true) {
  if (!text) {
    els.statusLine.hidden = true;
    els.statusLine.replaceChildren();
    return;
  }
  els.statusLine.hidden = false;
  els.statusLine.replaceChildren(busy ? spinner() : '', h('span', { text }));
}

export function showError(error, prefix = '', kind = 'error') {
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

export function clearError() {
  els.banner.hidden = true;
}
