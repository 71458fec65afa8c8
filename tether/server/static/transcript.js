// @ts-nocheck
/**
 * transcript.js — how stored messages and streamed parts look: user bubbles, assistant
 * messages (text, folded reasoning, status badge), tool cards, branch switchers, and the
 * inline editor. `renderMessages` renders a thread's active path from stored messages. Tool
 * cards are in `tool-card.js`.
 */

import { button, h, uid } from './dom.js';
import { ToolCard, toolOutcome } from './tool-card.js';

const MESSAGE_BADGES = { cancelled: 'stopped', failed: 'failed', partial: 'incomplete' };
/** Why an answer was cut short (its `finish_reason`), said under it. */
const CUT_NOTES = {
  length: 'Cut short: the answer reached the model’s output limit.',
  repetition: 'Cut short: the model was repeating itself.',
};

export function userBubble(text, { id = null, steering = false } = {}) {
  return h('article', { class: `msg user${steering ? ' steering' : ''}`, dataset: { id, role: 'user' } },
    h('div', { class: 'who', text: steering ? 'You (steering)' : 'You' }),
    h('div', { class: 'text', text }));
}

/** The part of an assistant message being streamed (text, thinking, tool cards). */
export class AssistantBlock {
  constructor(messageId) {
    this.messageId = messageId;
    this.textNode = document.createTextNode('');
    this.textEl = h('div', { class: 'text' }, this.textNode);
    this.cardsEl = h('div', { class: 'cards' });
    this.badgeEl = h('div', { class: 'meta' });
    this.el = h('article', { class: 'msg assistant', dataset: { id: messageId, role: 'assistant', status: 'streaming' } },
      h('div', { class: 'who', text: 'Agent' }), this.textEl, this.cardsEl, this.badgeEl);
  }

  /** The typing cursor: only on the text that is receiving tokens right now. */
  typing(on) {
    if (on) this.el.dataset.typing = 'true';
    else delete this.el.dataset.typing;
  }

  /**
   * Why the run ended badly, under the message (kept after a reload: it is the run's `error`).
   * Announced (role=alert) only when it happens, not each time the chat is drawn again.
   */
  showError(error, { live = false } = {}) {
    this.errorEl?.remove();
    this.errorEl = h('div', { class: 'run-error', role: live ? 'alert' : null, text: `The run failed: ${error.message} (${error.code})` });
    this.textEl.classList.remove('empty');
    this.el.append(this.errorEl);
  }

  /** A small note under an answer the model did not end itself (`finish_reason`). */
  showCut(reason) {
    this.cutEl?.remove();
    if (!reason) return;
    this.cutEl = h('div', { class: 'cut-note', dataset: { reason }, text: CUT_NOTES[reason] || `Cut short (${reason}).` });
    this.textEl.after(this.cutEl);
  }

  setId(id) {
    this.messageId = id;
    this.el.dataset.id = id;
  }

  thinkingNode() {
    if (!this.thinking) {
      this.thinking = document.createTextNode('');
      this.thinkingEl = h('details', { class: 'thinking', open: true },
        h('summary', { text: 'Thinking' }), h('div', { class: 'thinking-text' }, this.thinking));
      this.el.insertBefore(this.thinkingEl, this.textEl);
    }
    return this.thinking;
  }

  /** The answer began: fold the reasoning away (once; the reader may open it again). */
  answerStarted() {
    if (this.answering) return;
    this.answering = true;
    if (this.thinkingEl) this.thinkingEl.open = false;
  }

  finish(status) {
    this.typing(false);
    this.el.dataset.status = status;
    if (this.thinkingEl) this.thinkingEl.open = false;
    const badge = MESSAGE_BADGES[status];
    this.badgeEl.replaceChildren(badge ? h('span', { class: `badge badge-${status}`, text: badge }) : '');
  }
}

function branchSwitcher(message, busy, switchBranch) {
  const ids = message.sibling_ids || [];
  if (ids.length < 2) return null;
  const index = message.sibling_index;
  const go = (delta) => switchBranch(ids[index + delta]);
  return h('span', { class: 'branch', role: 'group', 'aria-label': 'Versions' },
    button('‹', () => go(-1), 'btn tiny prev', { 'aria-label': 'Previous version', disabled: busy || index === 0 }),
    h('span', { class: 'pos', text: `${index + 1}/${ids.length}` }),
    button('›', () => go(1), 'btn tiny next', { 'aria-label': 'Next version', disabled: busy || index >= ids.length - 1 }));
}

/** An inline editor replacing a message's text; `onSave(text)` returns a promise. */
function inlineEditor(article, initial, saveLabel, onSave) {
  const textEl = article.querySelector('.text');
  const actions = article.querySelector('.actions');
  const errorEl = h('div', { class: 'field-errors', id: uid('edit-error'), role: 'alert', hidden: true });
  const area = h('textarea', {
    class: 'msg-editor', rows: Math.min(10, initial.split('\n').length + 1), 'aria-label': 'Edit message', 'aria-describedby': errorEl.id,
  });
  area.value = initial;
  const close = () => {
    editor.remove();
    textEl.hidden = false;
    if (actions) actions.hidden = false;
  };
  const save = async () => {
    const text = area.value.trim();
    if (!text) return;
    saveBtn.disabled = true;
    try {
      await onSave(text);
    } catch (error) {
      saveBtn.disabled = false;
      errorEl.hidden = false;
      errorEl.textContent = error.message;
    }
  };
  area.addEventListener('keydown', (event) => {
    if (event.key === 'Escape') { event.preventDefault(); event.stopPropagation(); close(); }
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) { event.preventDefault(); save(); }
  });
  const saveBtn = button(saveLabel, save, 'btn primary save-edit');
  const editor = h('div', { class: 'editor' }, area, errorEl,
    h('div', { class: 'panel-actions' }, saveBtn, button('Cancel', close, 'btn cancel-edit')));
  textEl.hidden = true;
  if (actions) actions.hidden = true;
  textEl.after(editor);
  area.focus();
}

/** The Timeline button of run `runId` (`timeline-view.js` draws it). */
export function timelineButton(runId, openTimeline) {
  return button('Timeline', () => openTimeline(runId), 'btn tiny timeline-btn', { 'aria-label': 'Timeline of this run', dataset: { runId } });
}

/**
 * Render the stored messages of the active path into `into` (tool messages go into the cards
 * of their calls). `actions` = {fork(message, text), regenerate(userMessageId),
 * editAnswer(messageId, text), switchBranch(messageId), timeline(runId)}; each run's last
 * message carries its Timeline button; `thinking` = reasoning by message id;
 * `decisions` = how each reviewed call was decided, by call id (from the audit log);
 * `runErrors` = the `error` of each failed run, by run id; `liveRunId` = the run followed live
 * (its Timeline button is under the live part, not on its input message).
 */
export function renderMessages(messages, into, { busy, actions, thinking = new Map(), decisions = new Map(), runErrors = new Map(), liveRunId = null }) {
  const cards = new Map();
  let lastUserId = null;
  // "Regenerate" goes on the last assistant message of each turn (or on a user message that
  // has no answer at all): the message before the next user message, or the end.
  const turnEnd = new Set();
  let lastAssistant = null;
  const answered = new Set();
  for (const message of messages) {
    if (message.role === 'user') {
      if (lastAssistant) turnEnd.add(lastAssistant);
      lastAssistant = null;
      lastUserId = message.id;
    } else if (message.role === 'assistant') {
      lastAssistant = message.id;
      answered.add(lastUserId);
    }
  }
  if (lastAssistant) turnEnd.add(lastAssistant);
  // Each run's Timeline button goes on its last message shown (a user or an assistant message).
  const lastOfRun = new Map();
  for (const message of messages) if (message.run_id && message.role !== 'tool' && message.run_id !== liveRunId) lastOfRun.set(message.run_id, message.id);
  const timeline = (message) => (actions.timeline && lastOfRun.get(message.run_id) === message.id ? timelineButton(message.run_id, actions.timeline) : null);
  lastUserId = null;
  for (const message of messages) {
    if (message.role === 'user') {
      lastUserId = message.id;
      const article = userBubble(message.content, { id: message.id });
      article.append(h('div', { class: 'actions' },
        button('Edit', () => inlineEditor(article, message.content, 'Send edited message', (text) => actions.fork(message, text)),
          'btn tiny edit-user', { disabled: busy, 'aria-label': 'Edit this message' }),
        answered.has(message.id) || busy ? null : button('Regenerate', () => actions.regenerate(message.id), 'btn tiny regenerate', { disabled: busy, 'aria-label': 'Answer this message again' }),
        timeline(message),
        branchSwitcher(message, busy, actions.switchBranch)));
      into.append(article);
    } else if (message.role === 'assistant') {
      const block = new AssistantBlock(message.id);
      block.textNode.data = message.content || '';
      if (thinking.has(message.id)) block.thinkingNode().data = thinking.get(message.id);
      if (!message.content && !(message.tool_calls || []).length) block.textEl.classList.add('empty');
      for (const call of message.tool_calls || []) {
        const card = new ToolCard({ callId: call.id, name: call.name, args: call.args, risk: call.risk, gated: false });
        card.setState('unfinished');
        const decision = decisions.get(call.id);
        if (decision) card.setDecision(decision);
        cards.set(call.id, card);
        block.cardsEl.append(card.el);
      }
      block.finish(message.status || 'complete');
      if (message.finish_reason) block.showCut(message.finish_reason);
      const error = message.status === 'failed' ? runErrors.get(message.run_id) : null;
      if (error) block.showError(error);
      if (message.edited_by_user) block.badgeEl.append(h('span', { class: 'badge', text: 'edited' }));
      const editable = !(message.tool_calls || []).length;
      block.el.append(h('div', { class: 'actions' },
        editable ? button('Edit', () => inlineEditor(block.el, message.content || '', 'Save', (text) => actions.editAnswer(message.id, text)),
          'btn tiny edit-answer', { disabled: busy, 'aria-label': 'Edit this answer' }) : null,
        lastUserId && turnEnd.has(message.id) ? button('Regenerate', () => actions.regenerate(lastUserId), 'btn tiny regenerate', { disabled: busy, 'aria-label': 'Regenerate this answer' }) : null,
        timeline(message),
        branchSwitcher(message, busy, actions.switchBranch)));
      into.append(block.el);
    } else if (message.role === 'tool') {
      let card = cards.get(message.tool_call_id);
      if (!card) {
        card = new ToolCard({ callId: message.tool_call_id, name: message.name || 'tool', args: {}, gated: false });
        into.append(card.el);
      }
      card.setResult(toolOutcome(message));
    }
  }
}
