// @ts-nocheck
/**
 * approvals.js — the Approvals view: every pending request the signed-in principal may decide,
 * across threads (their own runs'; every one for approvers and admins), soonest expiry first,
 * each with a countdown. Open one in its thread, or select several and approve or reject them
 * at once with one reason, or approve them and allow what they asked for a while ("Approve and
 * allow…": one standing approval per approved call, in its own run or thread) —
 * `POST /v1/interrupts/decide`: each is decided on its own, and the view says which ones did not
 * go through and why.
 */

import { AllowChoice, allowedOutcome, permittedByAll } from './allow-choice.js';
import { button, duration, h, oneLine, waitedText } from './dom.js';

export class ApprovalsView {
  /**
   * @param {import('./tether-client.js').TetherClient} api
   * @param {{dialog: HTMLDialogElement, list: HTMLElement, reason: HTMLInputElement,
   *   approve: HTMLButtonElement, allow: HTMLButtonElement, allowPanel: HTMLElement,
   *   reject: HTMLButtonElement, close: HTMLButtonElement, status: HTMLElement, count: HTMLElement}} els
   * @param {{openThread: (threadId: string) => void, decided: () => void}} host
   */
  constructor(api, els, host) {
    this.api = api;
    this.els = els;
    this.host = host;
    /** @type {any[]} */
    this.items = [];
    /** When the items were read, on this page's clock (countdowns run from there). */
    this.readAt = 0;
    this.ticker = null;
    /** The open "Approve and allow…" choice, or null. */
    this.allowChoice = null;
    els.approve.addEventListener('click', () => this.decide('approve'));
    els.allow.addEventListener('click', () => this.openAllow());
    els.reject.addEventListener('click', () => this.decide('reject'));
    els.close.addEventListener('click', () => els.dialog.close());
    els.dialog.addEventListener('close', () => {
      this.stopTicking();
      this.closeAllow();
    });
  }

  async open() {
    this.els.status.textContent = '';
    if (!this.els.dialog.open) this.els.dialog.showModal();
    await this.refresh();
  }

  /** Read the inbox again; also updates the count on the top bar's button. */
  async refresh() {
    try {
      this.items = await this.api.inbox();
    } catch (error) {
      this.els.list.replaceChildren(h('p', { class: 'card-error', text: `Could not load the approvals: ${error.message}` }));
      return;
    }
    this.readAt = Date.now();
    this.els.count.textContent = this.items.length ? String(this.items.length) : '';
    if (this.els.dialog.open) {
      this.render();
      this.startTicking();
    }
  }

  selected() {
    return [...this.els.list.querySelectorAll('input[type=checkbox]:checked')].map((box) => box.value);
  }

  /** The selected interrupts' actions, and what a standing approval of every one of them may cover. */
  selectedActions() {
    const ids = new Set(this.selected());
    const actions = [];
    const allowArgs = [];
    for (const item of this.items.filter((it) => ids.has(it.id))) {
      item.action_requests.forEach((action, i) => {
        const config = (item.review_configs || [])[i] || {};
        actions.push(action);
        allowArgs.push((config.allowed_decisions || []).includes('approve') ? config.allow_args || [] : []);
      });
    }
    return { actions, permitted: permittedByAll(allowArgs) };
  }

  /** "Approve and allow…": what the standing approvals cover, and the button that gives them. */
  openAllow() {
    const { actions, permitted } = this.selectedActions();
    if (!actions.length || !permitted.length) return;
    const count = this.selected().length;
    this.allowChoice = new AllowChoice({ actions, permitted, name: 'Approve the selected and allow' });
    this.els.allowPanel.replaceChildren(this.allowChoice.el, h('div', { class: 'panel-actions' },
      button(`Approve ${count} and allow`, () => this.decide('approve', this.allowChoice.value()), 'btn primary', { id: 'approvals-allow-confirm' }),
      button('Cancel', () => this.closeAllow(true), 'btn')));
    this.els.allowPanel.hidden = false;
    this.els.allow.setAttribute('aria-expanded', 'true');
    this.allowChoice.first.focus();
  }

  closeAllow(refocus = false) {
    if (!this.allowChoice) return;
    this.allowChoice = null;
    this.els.allowPanel.hidden = true;
    this.els.allowPanel.replaceChildren();
    this.els.allow.setAttribute('aria-expanded', 'false');
    if (refocus) this.els.allow.focus();
  }

  render() {
    const keep = new Set(this.selected());
    if (!this.items.length) {
      this.els.list.replaceChildren(h('p', { class: 'empty', text: 'Nothing waits for a decision.' }));
      this.syncButtons();
      return;
    }
    this.els.list.replaceChildren(h('ul', { class: 'approvals-list' }, this.items.map((item) => {
      const id = `approve-${item.id}`;
      return h('li', { class: 'approval-item', dataset: { interruptId: item.id, threadId: item.thread_id } },
        h('input', { type: 'checkbox', id, value: item.id, checked: keep.has(item.id), onchange: () => this.selectionChanged() }),
        h('label', { for: id, class: 'approval-what' },
          item.action_requests.map((action) => h('span', { class: 'approval-action' },
            h('strong', { text: action.description || action.action }),
            action.four_eyes ? h('span', { class: 'badge', text: 'four eyes' }) : null,
            h('code', { text: oneLine(action.args) })))),
        h('span', { class: 'approval-meta' },
          h('span', { text: `by ${item.requested_by || 'unknown'}` }),
          h('span', { class: 'approval-countdown', dataset: { expiresIn: item.expires_in_s } }),
          h('span', { class: 'approval-waited', dataset: { waited: item.waited_s } })),
        button('Open', () => {
          this.els.dialog.close();
          this.host.openThread(item.thread_id);
        }, 'btn small', { 'aria-label': `Open the thread of ${item.action_requests.map((a) => a.action).join(', ')}` }));
    })));
    this.tick();
    this.syncButtons();
  }

  /** A choice made for another selection would say the wrong thing: close it. */
  selectionChanged() {
    this.closeAllow();
    this.syncButtons();
  }

  syncButtons() {
    const none = this.selected().length === 0;
    this.els.approve.disabled = none;
    this.els.reject.disabled = none;
    const permits = !none && this.selectedActions().permitted.length > 0;
    this.els.allow.disabled = !permits;
    this.els.allow.title = none || permits ? '' : 'Not every selected call permits a standing approval (a call that needs four eyes permits none)';
  }

  /** Countdowns and "asked … ago", from the server's figures and the time since reading them. */
  tick() {
    const since = (Date.now() - this.readAt) / 1000;
    for (const node of this.els.list.querySelectorAll('.approval-countdown')) {
      const left = Number(node.dataset.expiresIn) - since;
      node.textContent = left > 0 ? `expires in ${duration(left)}` : 'expired';
      node.classList.toggle('urgent', left < 60);
    }
    for (const node of this.els.list.querySelectorAll('.approval-waited')) node.textContent = waitedText(Number(node.dataset.waited) + since);
  }

  startTicking() {
    if (!this.ticker) this.ticker = setInterval(() => this.tick(), 1000);
  }

  stopTicking() {
    clearInterval(this.ticker);
    this.ticker = null;
  }

  /** @param {'approve'|'reject'} decision @param {object} [allow] a standing approval with each approval */
  async decide(decision, allow) {
    const ids = this.selected();
    if (!ids.length) return;
    const reason = this.els.reason.value.trim() || undefined;
    this.els.approve.disabled = this.els.reject.disabled = this.els.allow.disabled = true;
    this.closeAllow();
    this.els.status.textContent = `${decision === 'approve' ? 'Approving' : 'Rejecting'} ${ids.length}…`;
    let results;
    try {
      results = await this.api.decideMany(ids, decision, decision === 'reject' ? reason : undefined, allow);
    } catch (error) {
      this.els.status.textContent = `Nothing was decided: ${error.message}`;
      this.syncButtons();
      return;
    }
    const failed = results.filter((r) => r.status !== 200);
    const done = results.length - failed.length;
    const verb = decision === 'approve' ? 'Approved' : 'Rejected';
    const allowed = allow && done ? ` ${allowedOutcome(allow, done > 1)}` : '';
    this.els.status.textContent = failed.length
      ? `${verb} ${done}${allowed}; ${failed.length} not: ${failed.map((r) => r.error.message).join('; ')}`
      : `${verb} ${done}${allowed}.`;
    if (done) this.els.reason.value = '';
    await this.refresh();
    this.host.decided();
  }
}
