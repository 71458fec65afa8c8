// @ts-nocheck
/**
 * app.js — the Tether web UI (the page at "/"). Plain ES module, no build step.
 *
 * How it is put together:
 *
 * - The chat shows a thread's *active path* (GET …/messages?view=path), rendered from stored
 *   messages: user bubbles, assistant answers, a tool card per call (its result from the tool
 *   message), branch switchers and edit buttons.
 * - While a run is active, the part of the path after the run's input message is rendered from
 *   the run's *events* instead, live, by a `LiveRun` fed by `RunStream` (tether-client.js):
 *   tokens (batched per animation frame), thinking, tool cards, approval cards, corrections,
 *   status. A reload replays the run from seq 1 and ends up in the same place, approval card
 *   and all. When the run ends, the thread is read again and rendered from messages; what was
 *   streamed is compared with what the server stored (`window.tetherUI.runs[runId]`).
 * - The connection indicator is the `RunStream` state: a lost network is `recovering`
 *   ("reconnecting"), never "stopped"; only the server's `cancelled` event is "stopped".
 */

import { TetherClient, TetherError } from './tether-client.js';

const api = new TetherClient();

// -- small DOM helpers -----------------------------------------------------------------------

/** Create an element: h('div', {class: 'x', onclick: fn, dataset: {a: 1}}, child, 'text'). */
function h(tag, props, ...children) {
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
function button(label, onClick, cls = 'btn', props = {}) {
  return h('button', { type: 'button', class: cls, onclick: onClick, ...props }, label);
}

function pretty(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch (_) {
    return String(value);
  }
}

function spinner() {
  return h('span', { class: 'spinner', 'aria-hidden': 'true' });
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

function duration(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

function waitedText(seconds) {
  return seconds < 60 ? `waiting for ${Math.max(0, Math.floor(seconds))} s` : `waiting for ${Math.floor(seconds / 60)} min`;
}

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

function clearError() {
  els.banner.hidden = true;
}

function runConfig() {
  const config = {};
  if (app.settings.approval_threshold !== 'destructive') config.approval_threshold = app.settings.approval_threshold;
  if (app.settings.approval_ttl_s) config.approval_ttl_s = app.settings.approval_ttl_s;
  return config;
}

/** Keep the chat pinned to the bottom while it grows, unless the reader scrolled up. */
function keepScroll(mutate) {
  const chat = els.chat;
  const pinned = chat.scrollHeight - chat.scrollTop - chat.clientHeight < 80;
  mutate();
  if (pinned) chat.scrollTop = chat.scrollHeight;
}

// -- token batching: at most one DOM write per animation frame ----------------------------------

const pendingText = new Map(); // Text node → string to append
let frameRequested = false;

function queueText(node, text) {
  pendingText.set(node, (pendingText.get(node) || '') + text);
  if (frameRequested) return;
  frameRequested = true;
  // rAF does not fire in a hidden tab; a timer keeps the text (and memory) moving there.
  if (document.hidden) setTimeout(flushText, 100);
  else requestAnimationFrame(flushText);
}

function flushText() {
  frameRequested = false;
  if (!pendingText.size) return;
  keepScroll(() => {
    for (const [node, text] of pendingText) node.appendData(text);
    pendingText.clear();
  });
}

// -- tool cards ------------------------------------------------------------------------------

const TOOL_STATE_LABELS = {
  running: 'running…',
  waiting: 'needs approval',
  ok: 'done',
  error: 'error',
  rejected: 'rejected',
  expired: 'expired',
  responded: 'answered',
  cancelled: 'cancelled',
  unknown: 'outcome unknown',
  unfinished: 'not finished',
};

class ToolCard {
  constructor({ callId, name, args, risk, gated }) {
    this.callId = callId;
    this.stateEl = h('span', { class: 'tool-state' });
    this.resultLabel = h('div', { class: 'label', hidden: true, text: 'Result' });
    this.resultEl = h('pre', { class: 'result', hidden: true });
    // A gated call's arguments are on its approval card: no need to show them twice.
    this.el = h('details', { class: 'tool-card', open: !gated, dataset: { callId, tool: name } },
      h('summary', {},
        h('span', { class: 'tool-icon', 'aria-hidden': 'true' }, '⚙'),
        h('span', { class: 'tool-name', text: name }),
        risk && risk !== 'read_only' ? h('span', { class: `risk risk-${risk}`, text: risk }) : null,
        this.stateEl),
      h('div', { class: 'tool-body' },
        h('div', { class: 'label', text: 'Arguments' }),
        h('pre', { class: 'args', text: pretty(args) }),
        this.resultLabel, this.resultEl));
    this.setState(gated ? 'waiting' : 'running');
  }

  setState(state) {
    this.state = state;
    this.el.dataset.status = state;
    const busy = state === 'running';
    this.stateEl.replaceChildren(busy ? spinner() : '', TOOL_STATE_LABELS[state] || state);
  }

  /** A `tool_result` event's data, or the outcome parsed from a stored tool message. */
  setResult({ status, result, error, reason }) {
    this.setState(status);
    this.el.open = true;
    let text;
    if (status === 'ok') text = pretty(result);
    else if (status === 'responded') text = pretty(result);
    else text = error || reason || (result != null ? pretty(result) : '');
    if (text) {
      this.resultLabel.hidden = false;
      this.resultLabel.textContent = status === 'ok' ? 'Result' : status === 'responded' ? 'Answer' : 'Why';
      this.resultEl.hidden = false;
      this.resultEl.textContent = text;
    }
  }
}

/** The outcome of a stored tool message (content: result JSON, reviewer text, or {status, error|reason}). */
function toolOutcome(message) {
  let value;
  try {
    value = JSON.parse(message.content);
  } catch (_) {
    return { status: message.status === 'cancelled' ? 'cancelled' : 'responded', result: message.content };
  }
  const failure = ['error', 'rejected', 'expired', 'cancelled', 'unknown'];
  if (value && typeof value === 'object' && !Array.isArray(value) && failure.includes(value.status)
      && Object.keys(value).every((k) => ['status', 'error', 'reason'].includes(k))) {
    return { status: value.status, error: value.error, reason: value.reason };
  }
  return { status: message.status === 'cancelled' ? 'cancelled' : 'ok', result: value };
}

// -- approval cards --------------------------------------------------------------------------

const DECISION_LABELS = { approve: 'Approve', reject: 'Reject', edit: 'Edit args', respond: 'Respond' };
const DECIDED_LABELS = { approve: 'approved', reject: 'rejected', edit: 'approved with edits', respond: 'answered', expired: 'expired' };

class ApprovalCard {
  /**
   * @param {object} o
   * @param {string} o.interruptId
   * @param {object[]} o.actions   action_requests: {call_id, action, args, description, risk}
   * @param {object[]} o.configs   review_configs: {allowed_decisions}
   * @param {string} o.expiresAt
   * @param {number} o.createdAt   ms (local clock)
   * @param {string} o.threadId
   */
  constructor({ interruptId, actions, configs, expiresAt, createdAt, threadId }) {
    this.interruptId = interruptId;
    this.actions = actions;
    this.configs = configs.map((c) => (c && c.allowed_decisions) || ['approve', 'reject', 'edit']);
    this.threadId = threadId;
    this.deadline = Date.parse(expiresAt);
    this.createdAt = createdAt;
    this.multi = actions.length > 1;
    this.state = 'pending';
    this.choices = actions.map(() => null);
    this.rows = [];
    const titleId = `approval-${interruptId}`;
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.countdownEl = h('span', { class: 'countdown' });
    this.waitedEl = h('span', { class: 'waited' });
    this.footerEl = h('div', { class: 'approval-footer' });
    this.el = h('section', {
      class: 'approval', role: 'group', 'aria-labelledby': titleId,
      dataset: { interruptId, state: 'pending', expiresAt },
    },
    h('h3', { id: titleId, class: 'approval-title' },
      this.multi ? `The agent asks for approval of ${actions.length} actions` : 'The agent asks for approval'),
    actions.map((action, i) => this._row(action, i)),
    this.errorEl,
    this.footerEl,
    h('div', { class: 'approval-timer' }, this.countdownEl, ' · ', this.waitedEl));
    this._renderFooter();
    this._tick();
    this.timer = setInterval(() => this._tick(), 500);
  }

  /** Align the countdown with the server's own view (`expires_in_s`, `waited_s` read at `atMs`). */
  calibrate(expiresInS, waitedS, atMs) {
    if (typeof expiresInS === 'number') this.deadline = atMs + expiresInS * 1000;
    if (typeof waitedS === 'number') this.createdAt = atMs - waitedS * 1000;
    this._tick();
  }

  _row(action, i) {
    const allowed = this.configs[i];
    const row = { index: i, allowed };
    row.errorEl = h('div', { class: 'field-errors', role: 'alert', hidden: true });
    row.panel = h('div', { class: 'panel', hidden: true });
    row.choiceButtons = {};
    const controls = h('div', { class: 'decision-buttons', role: this.multi ? 'radiogroup' : null, 'aria-label': this.multi ? `Decision for ${action.action}` : null });
    for (const decision of ['approve', 'reject', 'edit', 'respond']) {
      if (!allowed.includes(decision)) continue;
      const b = button(DECISION_LABELS[decision], () => this._choose(i, decision),
        `btn ${decision === 'approve' ? 'approve primary' : decision} choice-${decision}`,
        this.multi ? { role: 'radio', 'aria-checked': 'false' } : {});
      row.choiceButtons[decision] = b;
      controls.append(b);
    }
    row.controls = controls;
    row.outcomeEl = h('div', { class: 'action-outcome', hidden: true });
    row.el = h('div', { class: 'action', dataset: { index: i, callId: action.call_id, action: action.action } },
      h('div', { class: 'action-head' },
        h('span', { class: 'tool-name', text: action.action }),
        action.risk ? h('span', { class: `risk risk-${action.risk}`, text: action.risk }) : null),
      action.description ? h('p', { class: 'description', text: action.description }) : null,
      h('pre', { class: 'args', 'aria-label': 'Arguments', text: pretty(action.args) }),
      controls, row.panel, row.errorEl, row.outcomeEl);
    this.rows.push(row);
    // A tool that allows only `respond` (ask the user) shows its answer box at once.
    if (allowed.length === 1 && allowed[0] === 'respond' && !this.multi) {
      controls.hidden = true;
      this._choose(i, 'respond', { focus: false });
    }
    return row.el;
  }

  _choose(i, decision, { focus = true } = {}) {
    if (this.state !== 'pending') return;
    const row = this.rows[i];
    this._clearErrors();
    if (!this.multi && decision === 'approve') {
      this.choices[i] = { decision };
      this._submit();
      return;
    }
    this.choices[i] = { decision };
    for (const [d, b] of Object.entries(row.choiceButtons)) {
      if (this.multi) b.setAttribute('aria-checked', String(d === decision));
      b.classList.toggle('chosen', d === decision);
    }
    row.panel.replaceChildren();
    row.panel.hidden = true;
    const closeOnEsc = (event) => {
      if (event.key !== 'Escape') return;
      event.preventDefault();
      event.stopPropagation();
      this.choices[i] = null;
      row.panel.hidden = true;
      row.panel.replaceChildren();
      for (const b of Object.values(row.choiceButtons)) { b.classList.remove('chosen'); if (this.multi) b.setAttribute('aria-checked', 'false'); }
      this._renderFooter();
      (row.choiceButtons[decision] || row.controls).focus?.();
    };
    const confirm = (label, cls) => (this.multi ? null : button(label, () => this._submit(), `btn ${cls}`));
    const cancel = () => (this.multi || (row.allowed.length === 1) ? null : button('Cancel', () => closeOnEsc({ key: 'Escape', preventDefault() {}, stopPropagation() {} }), 'btn'));
    let field = null;
    if (decision === 'reject') {
      field = h('textarea', { class: 'reason', rows: 2, placeholder: 'Why? The agent sees this (optional)', 'aria-label': 'Reason for rejecting', onkeydown: closeOnEsc });
      row.panel.append(field, h('div', { class: 'panel-actions' }, confirm('Reject', 'danger confirm-reject'), cancel()));
    } else if (decision === 'edit') {
      field = h('textarea', { class: 'args-editor', rows: Math.min(12, pretty(this.actions[i].args).split('\n').length + 1), spellcheck: 'false', 'aria-label': 'Arguments (JSON)', onkeydown: closeOnEsc });
      field.value = pretty(this.actions[i].args);
      field.addEventListener('input', () => this._clearErrors());
      row.panel.append(h('div', { class: 'hint', text: 'Edit the arguments as JSON. Masked values (****) keep their real value.' }),
        field, h('div', { class: 'panel-actions' }, confirm('Approve with these args', 'primary confirm-edit'), cancel()));
    } else if (decision === 'respond') {
      field = h('textarea', { class: 'response', rows: 2, placeholder: 'Your answer', 'aria-label': 'Your answer', onkeydown: closeOnEsc });
      row.panel.append(field, h('div', { class: 'panel-actions' }, confirm('Send answer', 'primary confirm-respond'), cancel()));
    }
    row.field = field;
    if (field) {
      row.panel.hidden = false;
      if (focus) field.focus();
    }
    this._renderFooter();
  }

  _renderFooter() {
    if (!this.multi || this.state !== 'pending') {
      this.footerEl.replaceChildren();
      return;
    }
    const allChosen = this.choices.every(Boolean);
    const allCan = (d) => this.configs.every((c) => c.includes(d));
    this.rejectAllReason = this.rejectAllReason || h('input', { type: 'text', class: 'reject-all-reason', placeholder: 'Reason for Reject all (optional)', 'aria-label': 'Reason for rejecting all' });
    this.footerEl.replaceChildren(
      button('Approve all', () => this._all('approve'), 'btn primary approve-all', { disabled: !allCan('approve') }),
      button('Reject all', () => this._all('reject'), 'btn danger reject-all', { disabled: !allCan('reject') }),
      this.rejectAllReason,
      h('span', { class: 'spacer' }),
      button('Submit decisions', () => this._submit(), 'btn primary submit', { disabled: !allChosen }),
    );
  }

  _all(decision) {
    if (this.state !== 'pending') return;
    const reason = decision === 'reject' ? this.rejectAllReason.value.trim() : '';
    this._submit(this.actions.map(() => (reason ? { decision, reason } : { decision })));
  }

  _clearErrors() {
    this.errorEl.hidden = true;
    for (const row of this.rows) {
      row.errorEl.hidden = true;
      row.errorEl.replaceChildren();
      row.field?.removeAttribute('aria-invalid');
    }
  }

  _rowError(i, messages) {
    const row = this.rows[i];
    row.errorEl.hidden = false;
    row.errorEl.replaceChildren(...messages.map((m) => h('div', { class: 'field-error', text: m })));
    row.field?.setAttribute('aria-invalid', 'true');
  }

  /** The decisions as the API wants them, or null (with inline errors) when one is not ready. */
  _collect() {
    const decisions = [];
    let ok = true;
    this.rows.forEach((row, i) => {
      const choice = this.choices[i];
      if (!choice) {
        ok = false;
        this._rowError(i, ['Choose a decision for this action.']);
        return;
      }
      if (choice.decision === 'approve') decisions.push({ decision: 'approve' });
      else if (choice.decision === 'reject') {
        const reason = row.field ? row.field.value.trim() : '';
        decisions.push(reason ? { decision: 'reject', reason } : { decision: 'reject' });
      } else if (choice.decision === 'edit') {
        let args;
        try {
          args = JSON.parse(row.field.value);
        } catch (exc) {
          ok = false;
          this._rowError(i, [`Not valid JSON: ${exc.message}`]);
          return;
        }
        if (!args || typeof args !== 'object' || Array.isArray(args)) {
          ok = false;
          this._rowError(i, ['The arguments must be a JSON object.']);
          return;
        }
        decisions.push({ decision: 'edit', args });
      } else if (choice.decision === 'respond') {
        const message = row.field ? row.field.value.trim() : '';
        if (!message) {
          ok = false;
          this._rowError(i, ['Write an answer first.']);
          return;
        }
        decisions.push({ decision: 'respond', message });
      }
    });
    return ok ? decisions : null;
  }

  async _submit(decisions) {
    if (this.state !== 'pending') return;
    this._clearErrors();
    decisions = decisions || this._collect();
    if (!decisions) return;
    this._setState('submitting');
    try {
      await api.resume(this.threadId, this.interruptId, decisions);
      if (this.state === 'submitting') this._setState('submitted');
    } catch (error) {
      if (this.state !== 'submitting') return;
      this._setState('pending');
      this._showServerError(error);
    }
  }

  _showServerError(error) {
    if (!(error instanceof TetherError)) {
      this._cardError(String(error));
      return;
    }
    if (error.code === 'interrupt_expired') {
      this.expire();
      return;
    }
    if (error.code === 'interrupt_resolved') {
      this._setState('resolved');
      this._cardError(error.details && error.details.status === 'cancelled'
        ? 'The run was stopped; nothing was executed.'
        : 'This request was already decided (in another tab or by someone else).', 'info');
      return;
    }
    if (error.status === 0) {
      this._cardError('Could not reach the server — your decision was not sent. Try again.');
      return;
    }
    // Field errors point at their action: loc = ["body", "decisions", i, "args", field, …].
    const byRow = new Map();
    if (Array.isArray(error.details)) {
      for (const d of error.details) {
        const loc = Array.isArray(d.loc) ? d.loc : [];
        const at = loc.indexOf('decisions');
        const i = at >= 0 ? Number(loc[at + 1]) : NaN;
        if (Number.isInteger(i) && i < this.rows.length) {
          const field = loc.slice(at + 2).filter((p) => p !== 'args').join('.');
          const list = byRow.get(i) || [];
          list.push(field ? `${field}: ${d.msg}` : d.msg);
          byRow.set(i, list);
        }
      }
    }
    if (byRow.size) for (const [i, messages] of byRow) this._rowError(i, messages);
    else this._cardError(error.message);
  }

  _cardError(text, kind = 'error') {
    this.errorEl.hidden = false;
    this.errorEl.dataset.kind = kind;
    this.errorEl.textContent = text;
  }

  _setState(state) {
    this.state = state;
    this.el.dataset.state = state;
    const active = state === 'pending';
    for (const b of this.el.querySelectorAll('button, textarea, input')) b.disabled = !active;
    if (state === 'submitting') this.el.setAttribute('aria-busy', 'true');
    else this.el.removeAttribute('aria-busy');
    if (state !== 'pending' && state !== 'submitting') this._finish();
    this._renderFooter();
  }

  /** Remove everything clickable: the card only reports from now on. */
  _finish() {
    clearInterval(this.timer);
    for (const row of this.rows) {
      row.controls.remove();
      row.panel.remove();
    }
    this.footerEl.replaceChildren();
    this._tick();
  }

  /** The `resumed` event: how each action was decided (or that the window closed). */
  resolve(data) {
    if (data.resolution === 'expired') {
      this.expire();
      return;
    }
    this._setState('resolved');
    const byCall = new Map((data.decisions || []).map((d) => [d.call_id, d]));
    this.rows.forEach((row, i) => {
      const d = byCall.get(this.actions[i].call_id) || data.decisions?.[i];
      if (!d) return;
      row.outcomeEl.hidden = false;
      row.outcomeEl.dataset.decision = d.decision;
      let text = `✓ ${DECIDED_LABELS[d.decision] || d.decision}`;
      if (d.decision === 'reject') text = `✗ rejected${d.reason ? ` — “${d.reason}”` : ''}`;
      if (d.decision === 'respond') text = `answered — “${d.message}”`;
      if (d.decision === 'edit') text = `✓ approved with edits: ${JSON.stringify(d.args)}`;
      row.outcomeEl.textContent = text;
    });
  }

  expire() {
    if (this.state === 'expired') return;
    this.deadline = Math.min(this.deadline, Date.now());
    this._setState('expired');
    this.errorEl.hidden = false;
    this.errorEl.dataset.kind = 'info';
    this.errorEl.textContent = 'This request expired — nothing was executed. The agent continues without it.';
  }

  /** The run ended while this was pending (stopped, or failed). */
  abandon(reason) {
    if (this.state !== 'pending' && this.state !== 'submitting') return;
    this._setState('cancelled');
    this._cardError(reason, 'info');
  }

  _tick() {
    const now = Date.now();
    const left = (this.deadline - now) / 1000;
    if (this.state === 'pending' || this.state === 'submitting') {
      this.countdownEl.textContent = left > 0 ? `expires in ${duration(left)}` : 'expired';
      this.countdownEl.dataset.secondsLeft = String(Math.max(0, Math.ceil(left)));
      this.waitedEl.textContent = waitedText((now - this.createdAt) / 1000);
      this.el.classList.toggle('urgent', left < 30);
      if (left <= 0 && this.state === 'pending') this.expire();
    } else if (this.state === 'expired') {
      this.countdownEl.textContent = `expired at ${clock(this.deadline)}`;
      this.countdownEl.dataset.secondsLeft = '0';
      this.waitedEl.textContent = 'nothing to decide';
    } else {
      this.countdownEl.textContent = this.state === 'submitted' ? 'decision sent' : this.state;
      this.waitedEl.textContent = `waited ${Math.max(0, Math.round((now - this.createdAt) / 1000))} s`;
    }
  }

  dispose() {
    clearInterval(this.timer);
  }
}

// -- messages --------------------------------------------------------------------------------

const MESSAGE_BADGES = { cancelled: 'stopped', failed: 'failed', partial: 'incomplete' };

function userBubble(text, { id = null, correction = false } = {}) {
  return h('article', { class: `msg user${correction ? ' correction' : ''}`, dataset: { id, role: 'user' } },
    h('div', { class: 'who', text: correction ? 'You (correction)' : 'You' }),
    h('div', { class: 'text', text }));
}

/** The part of an assistant message being streamed (text, thinking, tool cards). */
class AssistantBlock {
  constructor(messageId) {
    this.messageId = messageId;
    this.textNode = document.createTextNode('');
    this.textEl = h('div', { class: 'text' }, this.textNode);
    this.cardsEl = h('div', { class: 'cards' });
    this.badgeEl = h('div', { class: 'meta' });
    this.el = h('article', { class: 'msg assistant', dataset: { id: messageId, role: 'assistant', status: 'streaming' } },
      h('div', { class: 'who', text: 'Agent' }), this.textEl, this.cardsEl, this.badgeEl);
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
    this.el.dataset.status = status;
    if (this.thinkingEl) this.thinkingEl.open = false;
    const badge = MESSAGE_BADGES[status];
    this.badgeEl.replaceChildren(badge ? h('span', { class: `badge badge-${status}`, text: badge }) : '');
  }
}

function branchSwitcher(message, busy) {
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
  const area = h('textarea', { class: 'msg-editor', rows: Math.min(10, initial.split('\n').length + 1), 'aria-label': 'Edit message' });
  area.value = initial;
  const errorEl = h('div', { class: 'field-errors', role: 'alert', hidden: true });
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

/** Render the stored messages of the active path (tool messages go into their cards). */
function renderMessages(messages, into, { busy }) {
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
  lastUserId = null;
  for (const message of messages) {
    if (message.role === 'user') {
      lastUserId = message.id;
      const article = userBubble(message.content, { id: message.id });
      article.append(h('div', { class: 'actions' },
        button('Edit', () => inlineEditor(article, message.content, 'Send edited message', (text) => forkFrom(message, text)),
          'btn tiny edit-user', { disabled: busy, 'aria-label': 'Edit this message' }),
        answered.has(message.id) ? null : button('Regenerate', () => regenerate(message.id), 'btn tiny regenerate', { disabled: busy, 'aria-label': 'Answer this message again' }),
        branchSwitcher(message, busy)));
      into.append(article);
    } else if (message.role === 'assistant') {
      const block = new AssistantBlock(message.id);
      block.textNode.data = message.content || '';
      if (app.thinking.has(message.id)) block.thinkingNode().data = app.thinking.get(message.id);
      if (!message.content && !(message.tool_calls || []).length) block.textEl.classList.add('empty');
      for (const call of message.tool_calls || []) {
        const card = new ToolCard({ callId: call.id, name: call.name, args: call.args, risk: call.risk, gated: false });
        card.setState('unfinished');
        cards.set(call.id, card);
        block.cardsEl.append(card.el);
      }
      block.finish(message.status || 'complete');
      if (message.edited_by_user) block.badgeEl.append(h('span', { class: 'badge', text: 'edited' }));
      const editable = !(message.tool_calls || []).length;
      block.el.append(h('div', { class: 'actions' },
        editable ? button('Edit', () => inlineEditor(block.el, message.content || '', 'Save', (text) => editAnswer(message.id, text)),
          'btn tiny edit-answer', { disabled: busy, 'aria-label': 'Edit this answer' }) : null,
        lastUserId && turnEnd.has(message.id) ? button('Regenerate', () => regenerate(lastUserId), 'btn tiny regenerate', { disabled: busy, 'aria-label': 'Regenerate this answer' }) : null,
        branchSwitcher(message, busy)));
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

// -- the live run ----------------------------------------------------------------------------

class LiveRun {
  /**
   * @param {object} run         the run resource
   * @param {object|null} pending the thread's pending_interrupt when read (for the countdown)
   * @param {number} readAt      when that was read (ms)
   */
  constructor(run, pending, readAt) {
    this.runId = run.id;
    this.threadId = run.thread_id;
    this.inputMessageId = run.input_message_id;
    this.pending = pending;
    this.readAt = readAt;
    this.el = h('section', { class: 'live-run', dataset: { runId: run.id } });
    this.blocks = new Map();
    this.current = null;
    this.cards = new Map();
    this.approvals = new Map();
    this.stopRequested = false;
    this.report = {
      runId: run.id, streamedText: {}, tokenEvents: 0, eventsAfterTerminal: 0, states: [],
      terminal: null, mismatches: [], duplicates: 0, reconnects: 0,
    };
    diagnostics.runs[run.id] = this.report;
    diagnostics.lastRunId = run.id;
    this.stream = api.follow(run.id, {
      onEvent: (envelope) => this.onEvent(envelope),
      onState: (state) => this.onState(state),
    });
    this.stream.addEventListener('transporterror', (event) => console.info('tether ui: connection dropped', event.detail));
    this.report.states.push(this.stream.state);
  }

  /** Show this run's state in the page chrome (once it is the page's live run). */
  sync() {
    setConn(this.stream.state);
    this.showStatus();
  }

  get terminal() {
    return this.stream.terminal;
  }

  blockFor(messageId) {
    let block = this.blocks.get(messageId);
    if (block) return block;
    if (this.current && !this.current.messageId) {
      block = this.current;
      block.setId(messageId);
    } else {
      block = new AssistantBlock(messageId);
      this.append(block.el);
      this.current = block;
    }
    this.blocks.set(messageId, block);
    return block;
  }

  currentBlock() {
    if (!this.current) {
      this.current = new AssistantBlock(null);
      this.append(this.current.el);
    }
    return this.current;
  }

  append(el) {
    keepScroll(() => this.el.append(el));
  }

  onEvent(envelope) {
    const data = envelope.data;
    if (this.report.terminal) this.report.eventsAfterTerminal += 1;
    switch (envelope.type) {
      case 'status':
        if (data.stage === 'model') this.current = null; // a new model call: a new message
        this.status = data;
        this.showStatus();
        break;
      case 'token': {
        this.report.tokenEvents += 1;
        const text = this.report.streamedText;
        text[data.message_id] = (text[data.message_id] || '') + data.text;
        const block = this.blockFor(data.message_id);
        block.answerStarted();
        queueText(block.textNode, data.text);
        break;
      }
      case 'thinking':
        app.thinking.set(data.message_id, (app.thinking.get(data.message_id) || '') + data.text);
        queueText(this.blockFor(data.message_id).thinkingNode(), data.text);
        break;
      case 'tool_call': {
        const card = new ToolCard({ callId: data.call_id, name: data.name, args: data.args, risk: data.risk, gated: data.gated });
        this.cards.set(data.call_id, card);
        const block = this.currentBlock();
        keepScroll(() => block.cardsEl.append(card.el));
        break;
      }
      case 'tool_result': {
        const card = this.cards.get(data.call_id);
        if (card) card.setResult(data);
        break;
      }
      case 'interrupt':
        this.openApproval(envelope);
        break;
      case 'resumed': {
        const card = this.approvals.get(data.interrupt_id);
        if (card) card.resolve(data);
        for (const d of data.decisions || []) {
          const toolCard = this.cards.get(d.call_id);
          if (toolCard && (d.decision === 'approve' || d.decision === 'edit')) toolCard.setState('running');
        }
        this.current = null;
        break;
      }
      case 'user_message':
        this.append(userBubble(data.content, { id: data.message_id, correction: true }));
        this.current = null;
        break;
      case 'done':
      case 'error':
      case 'cancelled':
        this.finish(envelope);
        break;
      default:
        break;
    }
  }

  openApproval(envelope) {
    const data = envelope.data;
    const card = new ApprovalCard({
      interruptId: data.interrupt_id,
      actions: data.action_requests,
      configs: data.review_configs,
      expiresAt: data.expires_at,
      createdAt: Date.parse(envelope.ts),
      threadId: this.threadId,
    });
    this.approvals.set(data.interrupt_id, card);
    this.append(card.el);
    // The countdown follows the server's clock: use its expires_in_s, read just now.
    if (this.pending && this.pending.id === data.interrupt_id) {
      card.calibrate(this.pending.expires_in_s, this.pending.waited_s, this.readAt);
    } else {
      const asked = Date.now();
      api.getRun(this.runId).then((run) => {
        const p = run.pending_interrupt;
        if (p && p.id === data.interrupt_id) card.calibrate(p.expires_in_s, p.waited_s, (asked + Date.now()) / 2);
      }).catch(() => {});
    }
  }

  showStatus() {
    if (this.terminal || app.live !== this) return;
    const state = this.stream.state;
    if (state === 'interrupted') showStatus('Waiting for your decision', false);
    else if (state === 'cancelling') showStatus('Stopping…');
    else if (state === 'recovering') showStatus('Connection lost — reconnecting…');
    else if (this.status && this.status.stage === 'tool') showStatus(`Running ${this.status.detail || 'a tool'}…`);
    else if (this.status && this.status.stage === 'recovering') showStatus('Recovering the run…');
    else showStatus('Agent is working…');
  }

  onState(state) {
    this.report.states.push(state);
    if (app.live !== this) return;
    this.sync();
    updateControls();
  }

  finish(envelope) {
    flushText();
    this.report.terminal = envelope.type;
    const data = envelope.data;
    const status = envelope.type === 'done' ? 'complete' : envelope.type === 'error' ? 'failed' : 'cancelled';
    for (const block of this.blocks.values()) block.finish(block.messageId === data.partial_message_id || block.messageId === data.message_id ? status : 'complete');
    if (this.current && !this.current.messageId) this.current.finish(status);
    for (const card of this.cards.values()) if (card.state === 'running' || card.state === 'waiting') card.setState('unfinished');
    for (const card of this.approvals.values()) card.abandon(envelope.type === 'cancelled' ? 'The run was stopped — nothing was executed.' : 'The run ended.');
    if (envelope.type === 'error') this.append(h('div', { class: 'run-error', role: 'alert', text: `The run failed: ${data.message} (${data.code})` }));
    this.report.duplicates = this.stream.stats.duplicates;
    this.report.reconnects = this.stream.stats.reconnects;
    showStatus(null);
    // Read the thread again: the stored messages (with ids, versions, edit buttons) take over.
    setTimeout(() => { if (app.live === this) refreshThread(); }, 0);
  }

  dispose() {
    this.stream.close(); // transport only: the run goes on
    for (const card of this.approvals.values()) card.dispose();
  }
}

/** After a run: did what we streamed equal what the server stored? (It must; tests check.) */
function compareWithServer(live, messages) {
  const byId = new Map(messages.map((m) => [m.id, m]));
  for (const [id, text] of Object.entries(live.report.streamedText)) {
    const message = byId.get(id);
    if (message && (message.content || '') !== text) {
      live.report.mismatches.push({ id, streamed: text, stored: message.content });
      console.error('tether ui: streamed text differs from the stored message', id);
    }
  }
  live.report.compared = true;
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
  renderMessages(history, fragment, { busy });
  if (live) fragment.append(live.el);
  els.chat.replaceChildren(fragment);
  els.chat.scrollTop = els.chat.scrollHeight;
}

async function refreshThread() {
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
    if (runId && !(app.live && app.live.runId === runId)) run = await api.getRun(runId);
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
    app.live = new LiveRun(run, thread.pending_interrupt, readAt);
    app.live.sync();
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
    showError(error);
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
      const title = text.length > 48 ? `${text.slice(0, 47)}…` : text;
      const thread = await api.createThread({ title });
      await openThread(thread.id);
    }
    await api.startRun(app.threadId, { content: text, config: runConfig() });
    els.input.value = '';
    await refreshThread();
    refreshThreadList();
  });
}

async function forkFrom(message, text) {
  await api.startRun(app.threadId, { content: text, parentId: message.parent_id, config: runConfig() });
  await refreshThread();
}

async function regenerate(userMessageId) {
  await withSending(async () => {
    await api.startRun(app.threadId, { parentId: userMessageId, config: runConfig() });
    await refreshThread();
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
