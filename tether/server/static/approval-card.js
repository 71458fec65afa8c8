// @ts-nocheck
/**
 * approval-card.js — the card for one interrupt: each action with its description and
 * (server-masked) args, the decisions its review config allows, one-click Approve, Reject with
 * a reason, Edit args as JSON with the server's field errors inline, Respond; for several
 * actions a choice per action plus Approve all / Reject all, all submitted together. A
 * countdown to `expires_at` in the card's head (it stays in view while a panel is open); once
 * expired (by the clock, the server's `resumed`, or a 410) it says so and offers nothing to click.
 *
 * A question (`ask_user`: `respond` is its only decision) is not an approval: the card says the
 * agent asks something, shows no risk badge, and focuses the answer box. Keyboard: Enter sends
 * a reason or an answer (Shift+Enter: new line), Ctrl+Enter the edited arguments, Esc backs out
 * of an open panel. Esc never cancels the request (nor the run: see app.js).
 */

import { TetherError } from './tether-client.js';
import { AllowChoice, allowedOutcome } from './allow-choice.js';
import { argsList, button, clock, duration, h, pretty, sourceText, uid, waitedText } from './dom.js';

const DECISION_LABELS = { approve: 'Approve', allow: 'Approve and allow…', reject: 'Reject', edit: 'Edit args', respond: 'Respond' };
const DECIDED_LABELS = { approve: 'approved', reject: 'rejected', edit: 'approved with edits', respond: 'answered', expired: 'expired' };

const isQuestion = (allowed) => allowed.length === 1 && allowed[0] === 'respond';

export class ApprovalCard {
  /**
   * @param {object} o
   * @param {string} o.interruptId
   * @param {object[]} o.actions   action_requests: {call_id, action, args, description, risk}
   * @param {object[]} o.configs   review_configs: {allowed_decisions}
   * @param {string} o.expiresAt
   * @param {number} o.createdAt   ms (local clock)
   * @param {string} o.threadId
   * @param {import('./tether-client.js').TetherClient} o.api  sends the decisions
   */
  constructor({ interruptId, actions, configs, expiresAt, createdAt, threadId, api }) {
    this.api = api;
    this.interruptId = interruptId;
    this.actions = actions;
    this.configs = configs.map((c) => (c && c.allowed_decisions) || ['approve', 'reject', 'edit']);
    /** What a standing approval given with each approval may cover (none: no "Approve and allow…"). */
    this.allowArgs = configs.map((c) => (c && c.allowed_decisions && c.allowed_decisions.includes('approve') && c.allow_args) || []);
    this.threadId = threadId;
    this.deadline = Date.parse(expiresAt);
    this.createdAt = createdAt;
    this.multi = actions.length > 1;
    this.questions = this.configs.every(isQuestion);
    this.state = 'pending';
    this.choices = actions.map(() => null);
    this.rows = [];
    const titleId = `approval-${interruptId}`;
    this.errorEl = h('div', { class: 'card-error', role: 'alert', hidden: true });
    this.countdownEl = h('span', { class: 'countdown' });
    this.waitedEl = h('span', { class: 'waited' });
    this.footerEl = h('div', { class: 'approval-footer' });
    this.el = h('section', {
      class: `approval${this.questions ? ' question' : ''}`, role: 'group', 'aria-labelledby': titleId, tabindex: '-1',
      dataset: { interruptId, state: 'pending', expiresAt },
    },
    h('div', { class: 'approval-head' },
      this.titleEl = h('h2', { id: titleId, class: 'approval-title' }),
      h('div', { class: 'approval-timer' }, this.countdownEl, ' · ', this.waitedEl)),
    actions.map((action, i) => this._row(action, i)),
    this.errorEl,
    this.footerEl);
    this._renderFooter();
    this._renderTitle();
    this._tick();
    this.timer = setInterval(() => this._tick(), 500);
  }

  _renderTitle() {
    const n = this.actions.length;
    const pending = this.questions
      ? (this.multi ? `The agent asks you ${n} questions` : 'The agent asks you a question')
      : (this.multi ? `The agent needs your decision on ${n} actions` : 'The agent asks for approval of an action');
    this.titleEl.textContent = {
      pending,
      submitting: this.questions ? 'Sending your answer…' : 'Sending your decision…',
      submitted: this.questions ? 'Answer sent' : 'Decision sent',
      resolved: this.questions ? 'Answered' : 'Decided',
      expired: this.questions ? 'Question expired' : 'Approval request expired',
      cancelled: this.questions ? 'Question closed' : 'Approval request closed',
    }[this.state];
  }

  /** Align the countdown with the server's own view (`expires_in_s`, `waited_s` read at `atMs`). */
  calibrate(expiresInS, waitedS, atMs) {
    if (typeof expiresInS === 'number') this.deadline = atMs + expiresInS * 1000;
    if (typeof waitedS === 'number') this.createdAt = atMs - waitedS * 1000;
    this._tick();
  }

  /** What a control of action `i` is called for a screen reader: unique within the card. */
  _nameFor(label, i) {
    if (!this.multi) return null;
    const action = this.actions[i];
    return `${label}: action ${i + 1} of ${this.actions.length} (${action.description || action.action})`;
  }

  _row(action, i) {
    const allowed = this.configs[i];
    const row = { index: i, allowed };
    row.errorEl = h('div', { class: 'field-errors', id: uid('action-error'), role: 'alert', hidden: true });
    row.panel = h('div', { class: 'panel', hidden: true });
    row.choiceButtons = {};
    const controls = h('div', { class: 'decision-buttons', role: 'group', 'aria-label': this._nameFor('Decision', i) || `Decision for ${action.action}` });
    for (const decision of ['approve', 'allow', 'reject', 'edit', 'respond']) {
      if (decision === 'allow' ? !this.allowArgs[i].length : !allowed.includes(decision)) continue;
      const props = { 'aria-label': this._nameFor(DECISION_LABELS[decision], i) };
      if (this.multi) props['aria-pressed'] = 'false';
      const b = button(DECISION_LABELS[decision], () => this._choose(i, decision),
        `btn ${decision === 'approve' ? 'approve primary' : decision} choice-${decision}`, props);
      row.choiceButtons[decision] = b;
      controls.append(b);
    }
    row.controls = controls;
    row.outcomeEl = h('div', { class: 'action-outcome', hidden: true });
    const question = isQuestion(allowed);
    row.el = h('div', { class: 'action', dataset: { index: i, callId: action.call_id, action: action.action } },
      h('div', { class: 'action-head' },
        h('span', { class: 'tool-name', text: action.action }),
        action.risk && !question ? h('span', { class: `risk risk-${action.risk}`, text: action.risk }) : null,
        action.source ? h('span', { class: 'tool-source', text: sourceText(action) }) : null),
      action.description ? h('p', { class: 'description', text: action.description }) : null,
      question ? null : argsList(action.args, { 'aria-label': 'Arguments' }),
      controls, row.panel, row.errorEl, row.outcomeEl);
    this.rows.push(row);
    // A tool that allows only `respond` (ask the user) shows its answer box at once.
    if (question && !this.multi) {
      controls.hidden = true;
      this._choose(i, 'respond', { focus: false });
    }
    return row.el;
  }

  /** Put the cursor in the answer box of a question, unless the person is typing elsewhere. */
  focusAnswer() {
    const row = this.rows.find((r) => r.field && isQuestion(r.allowed));
    if (!row || this.state !== 'pending') return;
    const active = document.activeElement;
    const typing = active && active !== row.field && /^(TEXTAREA|INPUT)$/.test(active.tagName) && active.value;
    if (!typing) row.field.focus();
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
      if (this.multi) b.setAttribute('aria-pressed', String(d === decision));
      b.classList.toggle('chosen', d === decision);
    }
    row.panel.replaceChildren();
    row.panel.hidden = true;
    // Back out of this choice (Back, or Esc in its field; Esc never cancels the request).
    const reset = () => {
      this.choices[i] = null;
      row.panel.hidden = true;
      row.panel.replaceChildren();
      row.field = null;
      for (const b of Object.values(row.choiceButtons)) {
        b.classList.remove('chosen');
        if (this.multi) b.setAttribute('aria-pressed', 'false');
      }
      this._clearErrors();
      this._renderFooter();
      row.choiceButtons[decision]?.focus();
    };
    // Enter (or Ctrl+Enter where Enter is a new line) confirms; Esc backs out of the panel.
    const keys = (enterSends) => (event) => {
      if (event.key === 'Escape') {
        event.preventDefault(); // the page's Esc handler leaves prevented events alone
        if (row.allowed.length > 1) {
          event.stopPropagation();
          reset();
        }
        return;
      }
      if (event.key !== 'Enter' || event.isComposing) return;
      const send = (event.ctrlKey || event.metaKey) || (enterSends && !event.shiftKey);
      if (!send) return;
      event.preventDefault();
      this._submit();
    };
    const confirm = (label, cls) => (this.multi ? null : button(label, () => this._submit(), `btn ${cls}`));
    const cancel = () => (this.multi || row.allowed.length === 1 ? null : button('Back', reset, 'btn back', { 'aria-label': 'Back to the choices' }));
    const hintId = uid('hint');
    const describedBy = `${hintId} ${row.errorEl.id}`;
    let field = null;
    if (decision === 'reject') {
      field = h('textarea', {
        class: 'reason', rows: 2, placeholder: 'Why? The agent sees this (optional)', 'aria-describedby': describedBy,
        'aria-label': this._nameFor('Reason for rejecting', i) || 'Reason for rejecting', onkeydown: keys(true),
      });
      row.panel.append(field,
        h('div', { class: 'hint', id: hintId, text: this.multi ? 'Ctrl+Enter submits the decisions; Esc goes back.' : 'Enter rejects, Shift+Enter adds a line, Esc goes back.' }),
        h('div', { class: 'panel-actions' }, confirm('Confirm rejection', 'danger confirm-reject'), cancel()));
    } else if (decision === 'edit') {
      field = h('textarea', {
        class: 'args-editor', rows: Math.min(12, pretty(this.actions[i].args).split('\n').length + 1), spellcheck: 'false',
        'aria-label': this._nameFor('Arguments (JSON)', i) || 'Arguments (JSON)', 'aria-describedby': describedBy, onkeydown: keys(false),
      });
      field.value = pretty(this.actions[i].args);
      field.addEventListener('input', () => this._clearErrors());
      row.panel.append(h('div', { class: 'hint', id: hintId, text: `Edit the arguments as JSON. Masked values (****) keep their real value.${this.multi ? '' : ' Ctrl+Enter approves.'}` }),
        field, h('div', { class: 'panel-actions' }, confirm('Approve with these args', 'primary confirm-edit'), cancel()));
    } else if (decision === 'allow') {
      row.allow = new AllowChoice({ action: this.actions[i], permitted: this.allowArgs[i], name: this._nameFor('Approve and allow', i) });
      row.allow.el.addEventListener('keydown', keys(true));
      field = row.allow.first;
      row.panel.append(row.allow.el, h('div', { class: 'panel-actions' }, confirm('Approve and allow', 'primary confirm-allow'), cancel()));
    } else if (decision === 'respond') {
      field = h('textarea', {
        class: 'response', rows: 2, placeholder: 'Your answer', 'aria-describedby': describedBy,
        'aria-label': this._nameFor('Your answer', i) || 'Your answer', onkeydown: keys(!this.multi),
      });
      row.panel.append(field,
        h('div', { class: 'hint', id: hintId, text: this.multi ? 'Ctrl+Enter submits the decisions.' : 'Enter sends, Shift+Enter adds a line.' }),
        h('div', { class: 'panel-actions' }, confirm('Send answer', 'primary confirm-respond'), cancel()));
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
    const chosen = this.choices.filter(Boolean).length;
    const left = this.actions.length - chosen;
    const allCan = (d) => this.configs.every((c) => c.includes(d));
    this.rejectAllReason = this.rejectAllReason || h('input', { type: 'text', class: 'reject-all-reason', placeholder: 'Reason for Reject all (optional)', 'aria-label': 'Reason for rejecting all' });
    this.submitHintId = this.submitHintId || uid('submit-hint');
    // Submit stays clickable: pressed too early, it marks the actions that still need a choice.
    this.footerEl.replaceChildren(...[
      allCan('approve') ? button('Approve all', () => this._all('approve'), 'btn primary approve-all') : null,
      allCan('reject') ? button('Reject all', () => this._all('reject'), 'btn danger reject-all') : null,
      allCan('reject') ? this.rejectAllReason : null,
      h('div', { class: 'submit-row' },
        button('Submit decisions', () => this._submit(), 'btn primary submit', { 'aria-describedby': this.submitHintId }),
        h('span', {
          class: 'submit-hint', id: this.submitHintId, 'aria-live': 'polite',
          text: left ? `${chosen} of ${this.actions.length} decided — choose for each action` : `All ${this.actions.length} decided`,
        })),
    ].filter(Boolean));
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
      else if (choice.decision === 'allow') decisions.push({ decision: 'approve', allow: row.allow.value() });
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
    if (!ok) {
      // Take the person to the first action that needs them.
      const first = this.rows.find((row) => !row.errorEl.hidden);
      (first.field || Object.values(first.choiceButtons)[0])?.focus();
    }
    return ok ? decisions : null;
  }

  async _submit(decisions) {
    if (this.state !== 'pending') return;
    this._clearErrors();
    decisions = decisions || this._collect();
    if (!decisions) return;
    this._setState('submitting');
    try {
      await this.api.resume(this.threadId, this.interruptId, decisions);
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
    // Sending disables the controls (and a decision removes them): keep keyboard focus on the
    // card rather than losing it to <body>, and give it back to the control if sending failed.
    const focused = document.activeElement;
    const hadFocus = this.el.contains(focused);
    if (hadFocus && focused !== this.el) this.focusBefore = focused;
    this.state = state;
    this.el.dataset.state = state;
    const active = state === 'pending';
    for (const b of this.el.querySelectorAll('button, textarea, input')) b.disabled = !active;
    if (state === 'submitting') this.el.setAttribute('aria-busy', 'true');
    else this.el.removeAttribute('aria-busy');
    if (state !== 'pending' && state !== 'submitting') this._finish();
    this._renderFooter();
    this._renderTitle();
    if (!hadFocus) return;
    if (active && this.focusBefore && this.el.contains(this.focusBefore)) this.focusBefore.focus();
    else if (!active) this.el.focus({ preventScroll: true });
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
      if (d.decision === 'edit') text = '✓ approved with edits (see the tool card)';
      if (d.decision === 'approve' && d.allow) text = `✓ approved — ${allowedOutcome(d.allow)}`;
      row.outcomeEl.textContent = text;
    });
  }

  expire() {
    if (this.state === 'expired') return;
    this.deadline = Math.min(this.deadline, Date.now());
    this._setState('expired');
    this.errorEl.hidden = false;
    this.errorEl.dataset.kind = 'info';
    this.errorEl.textContent = `This request expired at ${clock(this.deadline)} — nothing was executed. The agent continues without it.`;
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
      this.waitedEl.textContent = 'not executed';
    } else {
      this.countdownEl.textContent = this.state === 'submitted' ? 'decision sent' : this.state;
      this.waitedEl.textContent = `waited ${Math.max(0, Math.round((now - this.createdAt) / 1000))} s`;
    }
  }

  dispose() {
    clearInterval(this.timer);
  }
}
