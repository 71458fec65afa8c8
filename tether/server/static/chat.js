// @ts-nocheck
/**
 * chat.js — the message view: the thread's active path from stored messages (`transcript.js`),
 * followed by the live run's part (`live-run.js`), and where focus goes after a render.
 */

import { button, h } from './dom.js';
import { app, els } from './state.js';
import { renderMessages, timelineButton } from './transcript.js';

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

/** Render the chat from `app`; `actions` are the buttons on stored messages (`thread.js`). */
export function renderChat(actions) {
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
    busy, actions, thinking: app.thinking, decisions: app.decisions, runErrors: app.runErrors, liveRunId: live ? live.runId : null,
  });
  // The live run's timeline so far (its stored messages, and their button, come when it ends).
  if (live) fragment.append(live.el, h('div', { class: 'actions live-actions' }, timelineButton(live.runId, actions.timeline)));
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
