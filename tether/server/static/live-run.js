// @ts-nocheck
/**
 * live-run.js — one run followed live: `RunStream` events become transcript parts (tokens
 * batched per animation frame, reasoning, tool cards, approval cards, steering messages). A reload
 * replays the run from seq 1 and rebuilds the same view. `report` records what was streamed,
 * so it can be compared with what the server stored (`compareWithServer`).
 */

import { ApprovalCard } from './approval-card.js';
import { flushText, h, keepScroll, queueText } from './dom.js';
import { ToolCard } from './tool-card.js';
import { AssistantBlock, userBubble } from './transcript.js';

export class LiveRun {
  /**
   * @param {object} run          the run resource
   * @param {object} o
   * @param {import('./tether-client.js').TetherClient} o.api
   * @param {object|null} o.pending the thread's pending_interrupt when read (for the countdown)
   * @param {number} o.readAt       when that was read (ms)
   * @param {object} o.host         the page: `isLive(run)`, `stateChanged(run)`, `finished(run)`,
   *                                `allowed(card, allowanceId)` (a call a standing approval let
   *                                through), `allowancesChanged()` (a decision gave one), and
   *                                `thinking` (a Map of reasoning by message id, kept after the run)
   */
  constructor(run, { api, pending, readAt, host }) {
    this.api = api;
    this.host = host;
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
    /** When this page asked for a stop, and how (`soft` waits for a running tool). */
    this.stopMode = null;
    this.stopAt = null;
    /** The block showing the typing cursor (the one receiving tokens right now), if any. */
    this.typingBlock = null;
    this.report = {
      runId: run.id, streamedText: {}, tokenEvents: 0, eventsAfterTerminal: 0, states: [],
      terminal: null, mismatches: [], duplicates: 0, reconnects: 0,
    };
    this.stream = api.follow(run.id, {
      onEvent: (envelope) => this.onEvent(envelope),
      onState: (state) => this.onState(state),
    });
    this.stream.addEventListener('transporterror', (event) => console.info('tether ui: connection dropped', event.detail));
    this.report.states.push(this.stream.state);
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

  /** Move the typing cursor to `block` (null: nobody is typing — a tool runs, a human decides…). */
  setTyping(block) {
    if (this.typingBlock === block) return;
    this.typingBlock?.typing(false);
    this.typingBlock = block;
    block?.typing(true);
  }

  /** The gated tool cards that wait for a human, and approval cards still open. */
  hasPendingApproval() {
    for (const card of this.approvals.values()) if (card.state === 'pending' || card.state === 'submitting') return true;
    return false;
  }

  /** The tool running now (a soft stop waits for it), or null. */
  runningTool() {
    for (const card of this.cards.values()) if (card.state === 'running') return card.name;
    return null;
  }

  onEvent(envelope) {
    const data = envelope.data;
    if (this.report.terminal) this.report.eventsAfterTerminal += 1;
    if (envelope.type !== 'token') this.setTyping(null);
    switch (envelope.type) {
      case 'status':
        if (data.stage === 'model') this.current = null; // a new model call: a new message
        this.status = data;
        if (this.host.isLive(this)) this.host.stateChanged(this);
        break;
      case 'token': {
        this.report.tokenEvents += 1;
        const text = this.report.streamedText;
        text[data.message_id] = (text[data.message_id] || '') + data.text;
        const block = this.blockFor(data.message_id);
        block.answerStarted();
        this.setTyping(block);
        queueText(block.textNode, data.text);
        break;
      }
      case 'thinking':
        this.host.thinking.set(data.message_id, (this.host.thinking.get(data.message_id) || '') + data.text);
        queueText(this.blockFor(data.message_id).thinkingNode(), data.text);
        break;
      case 'tool_call': {
        const card = new ToolCard({ callId: data.call_id, name: data.name, args: data.args, risk: data.risk, gated: data.gated });
        this.cards.set(data.call_id, card);
        if (data.allowed_by) this.host.allowed?.(card, data.allowed_by);
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
        this.showDecisions(data, envelope.ts);
        if ((data.decisions || []).some((d) => d.allow)) this.host.allowancesChanged?.();
        this.current = null;
        break;
      }
      case 'user_message':
        this.append(userBubble(data.content, { id: data.message_id, steering: true }));
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

  /** Each reviewed call's card says how it was decided; the audit log adds who decided. */
  showDecisions(data, ts) {
    const calls = [];
    if (data.resolution === 'expired') {
      const card = this.approvals.get(data.interrupt_id);
      for (const action of card ? card.actions : []) calls.push([action.call_id, { decision: 'expired', ts }]);
    }
    for (const d of data.decisions || []) {
      const toolCard = this.cards.get(d.call_id);
      const decision = { decision: d.decision, ts, reason: d.reason, message: d.message };
      if (d.decision === 'edit') Object.assign(decision, { original: toolCard ? toolCard.args : null, edited: d.args });
      calls.push([d.call_id, decision]);
      if (toolCard && (d.decision === 'approve' || d.decision === 'edit')) toolCard.setState('running');
    }
    for (const [callId, decision] of calls) this.cards.get(callId)?.setDecision(decision);
    if (data.resolution !== 'decided') return;
    this.api.audit({ runId: this.runId }).then((entries) => {
      for (const [callId, decision] of calls) {
        const entry = entries.filter((e) => e.action === 'decision' && e.call_id === callId).pop();
        if (entry) this.cards.get(callId)?.setDecision({ ...decision, actor: entry.actor, ts: entry.ts });
      }
    }).catch(() => {}); // who decided is a detail: the decision itself is already shown
  }

  openApproval(envelope) {
    const data = envelope.data;
    // A question (`respond` only) is not an approval: its tool card says it waits for an answer.
    data.action_requests.forEach((action, i) => {
      const allowed = (data.review_configs[i] && data.review_configs[i].allowed_decisions) || [];
      if (allowed.length === 1 && allowed[0] === 'respond') this.cards.get(action.call_id)?.setState('asking');
    });
    const card = new ApprovalCard({
      interruptId: data.interrupt_id,
      actions: data.action_requests,
      configs: data.review_configs,
      expiresAt: data.expires_at,
      createdAt: Date.parse(envelope.ts),
      threadId: this.threadId,
      api: this.api,
    });
    this.approvals.set(data.interrupt_id, card);
    this.append(card.el);
    if (card.questions && this.host.isLive(this)) card.focusAnswer();
    // The countdown follows the server's clock: use its expires_in_s, read just now.
    if (this.pending && this.pending.id === data.interrupt_id) {
      card.calibrate(this.pending.expires_in_s, this.pending.waited_s, this.readAt);
    } else {
      const asked = Date.now();
      this.api.getRun(this.runId).then((run) => {
        const p = run.pending_interrupt;
        if (p && p.id === data.interrupt_id) card.calibrate(p.expires_in_s, p.waited_s, (asked + Date.now()) / 2);
      }).catch(() => {});
    }
  }

  /** What the status line should say now: `{text, busy}`, or null for nothing. */
  statusText() {
    if (this.terminal) return null;
    const state = this.stream.state;
    if (state === 'interrupted') return { text: 'Waiting for your decision', busy: false };
    if (state === 'cancelling') {
      const tool = this.runningTool();
      if (this.stopMode === 'hard') return { text: 'Stopping now…', busy: true };
      if (tool && this.stopAt) {
        const s = Math.max(0, Math.floor((Date.now() - this.stopAt) / 1000));
        return { text: `Stopping: waiting for ${tool} to finish (${s} s so far). A soft stop lets a running tool complete; “Stop now” cancels it.`, busy: true };
      }
      return { text: 'Stopping…', busy: true };
    }
    if (state === 'recovering') return { text: 'Connection lost — reconnecting…', busy: true };
    if (this.status && this.status.stage === 'tool') return { text: `Running ${this.status.detail || 'a tool'}…`, busy: true };
    // The model is generating a tool call: `detail` is "calling a tool: <name>" (or without the name).
    const calling = this.status && this.status.stage === 'model' && /^calling a tool(?:: (.+))?$/.exec(this.status.detail || '');
    if (calling) return { text: `Calling ${calling[1] || 'a tool'}…`, busy: true };
    if (this.status && this.status.stage === 'recovering') return { text: 'Recovering the run…', busy: true };
    return { text: 'Agent is working…', busy: true };
  }

  onState(state) {
    this.report.states.push(state);
    if (this.host.isLive(this)) this.host.stateChanged(this);
  }

  finish(envelope) {
    flushText();
    this.report.terminal = envelope.type;
    const data = envelope.data;
    const status = envelope.type === 'done' ? 'complete' : envelope.type === 'error' ? 'failed' : 'cancelled';
    this.setTyping(null);
    for (const block of this.blocks.values()) block.finish(block.messageId === data.partial_message_id || block.messageId === data.message_id ? status : 'complete');
    if (this.current && !this.current.messageId) this.current.finish(status);
    if (envelope.type === 'done' && data.finish_reason) this.blocks.get(data.message_id)?.showCut(data.finish_reason);
    for (const card of this.cards.values()) if (['running', 'waiting', 'asking'].includes(card.state)) card.setState('unfinished');
    for (const card of this.approvals.values()) card.abandon(envelope.type === 'cancelled' ? 'The run was stopped — nothing was executed.' : 'The run ended.');
    if (envelope.type === 'error') {
      this.error = data;
      const block = (data.message_id && this.blocks.get(data.message_id)) || this.current || this.currentBlock();
      block.showError(data, { live: true });
    }
    this.report.duplicates = this.stream.stats.duplicates;
    this.report.reconnects = this.stream.stats.reconnects;
    // The page reads the thread again: the stored messages (ids, versions, edit buttons) take over.
    setTimeout(() => this.host.finished(this), 0);
  }

  dispose() {
    this.stream.close(); // transport only: the run goes on
    for (const card of this.approvals.values()) card.dispose();
  }
}

/** After a run: did what we streamed equal what the server stored? (It must; tests check.) */
export function compareWithServer(live, messages) {
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
