// @ts-nocheck
/**
 * tool-card.js — one tool call in the chat: its summary line, arguments, result (or why there
 * is none) and, for a reviewed call, the decision. Used for streamed calls (`live-run.js`) and
 * stored ones (`transcript.js`, with `toolOutcome` reading a stored tool message).
 */

import { argsDiff, clock, h, oneLine, plain, pretty, spinner } from './dom.js';

const TOOL_STATE_LABELS = {
  running: 'running…',
  waiting: 'needs approval',
  asking: 'waiting for your answer',
  ok: 'done',
  error: 'error',
  rejected: 'rejected',
  expired: 'expired',
  responded: 'answered',
  cancelled: 'cancelled',
  unknown: 'outcome unknown',
  unfinished: 'not finished',
};

/**
 * One tool call: a one-line summary (arguments, then the result) that opens onto the full
 * arguments and result, and — for a reviewed call — the decision, who made it and when, with an
 * edit shown as a before → after diff. The decision line stays visible when the card is folded.
 */
export class ToolCard {
  constructor({ callId, name, args, risk, gated }) {
    this.callId = callId;
    this.name = name;
    this.args = args;
    this.stateEl = h('span', { class: 'tool-state' });
    this.summaryEl = h('span', { class: 'tool-summary' });
    this.argsEl = h('pre', { class: 'args', text: pretty(args) });
    this.resultLabel = h('div', { class: 'label', hidden: true, text: 'Result' });
    this.resultEl = h('pre', { class: 'result', hidden: true });
    this.blocksEl = h('div', { class: 'result-blocks', hidden: true });
    this.decisionEl = h('div', { class: 'tool-decision', hidden: true });
    this.details = h('details', { class: 'tool-details' },
      h('summary', {},
        h('span', { class: 'tool-icon', 'aria-hidden': 'true' }, '⚙'),
        h('span', { class: 'tool-name', text: name }),
        risk && risk !== 'read_only' ? h('span', { class: `risk risk-${risk}`, text: risk }) : null,
        this.summaryEl,
        this.stateEl),
      h('div', { class: 'tool-body' },
        h('div', { class: 'label', text: 'Arguments' }),
        this.argsEl,
        this.resultLabel, this.resultEl, this.blocksEl));
    this.el = h('div', { class: 'tool-card', dataset: { callId, tool: name } }, this.details, this.decisionEl);
    this.summaryEl.textContent = oneLine(args);
    this.setState(gated ? 'waiting' : 'running');
  }

  setState(state) {
    this.state = state;
    this.el.dataset.status = state;
    const busy = state === 'running';
    this.stateEl.replaceChildren(busy ? spinner() : '', TOOL_STATE_LABELS[state] || state);
  }

  /** The arguments the tool ran with (a reviewer's edit replaces the model's). */
  setArgs(args) {
    this.args = args;
    this.argsEl.textContent = pretty(args);
    if (!this.resultText) this.summaryEl.textContent = oneLine(args);
  }

  /** A `tool_result` event's data, or the outcome parsed from a stored tool message. */
  setResult({ status, result, error, reason }) {
    this.setState(status);
    let text;
    if (status === 'ok') text = pretty(result);
    else if (status === 'responded') text = pretty(result);
    else text = error || reason || (result != null ? pretty(result) : '');
    if (text) {
      this.resultText = text;
      this.resultLabel.hidden = false;
      this.resultLabel.textContent = status === 'ok' ? 'Result' : status === 'responded' ? 'Answer' : 'Why';
      const blocks = status === 'ok' ? contentBlocks(result) : null;
      this.resultEl.hidden = Boolean(blocks);
      this.resultEl.textContent = blocks ? '' : text;
      this.blocksEl.hidden = !blocks;
      this.blocksEl.replaceChildren(...(blocks ? blocks.map(renderBlock) : []));
      if (blocks && result.structuredContent !== undefined) this.blocksEl.append(h('pre', { class: 'result', text: pretty(result.structuredContent) }));
      const short = blocks ? blocks.map(blockSummary).join(', ')
        : status === 'ok' ? oneLine(result) : status === 'responded' ? `“${plain(result)}”` : text;
      this.summaryEl.textContent = status === 'responded' ? short : `${oneLine(this.args)} → ${short}`;
    }
  }

  /**
   * How a human (or the clock) decided this call: `{decision, actor?, ts?, reason?, message?,
   * original?, edited?}`, decision one of approve, edit, reject, respond, expired; or `allowed`
   * with its `line`: a standing approval let it run without asking.
   */
  setDecision(d) {
    this.decision = d;
    const who = d.actor && d.decision !== 'expired' ? ` by ${d.actor}` : '';
    const when = d.ts ? clock(Date.parse(d.ts)) : '';
    const at = when ? ` · ${when}` : '';
    let line;
    let diff = null;
    if (d.decision === 'approve') line = `✓ Approved${who}${at}`;
    else if (d.decision === 'edit') {
      line = `✓ Approved with edits${who}${at}`;
      const changes = argsDiff(d.original, d.edited);
      if (changes.length) {
        diff = h('ul', { class: 'diff', 'aria-label': 'What the reviewer changed' }, changes.map((c) => h('li', {},
          h('span', { class: 'diff-key', text: `${c.key}: ` }),
          h('del', {}, h('span', { class: 'sr-only', text: 'was ' }), c.before === undefined ? '(none)' : plain(c.before)),
          h('span', { 'aria-hidden': 'true', text: ' → ' }),
          h('ins', {}, h('span', { class: 'sr-only', text: 'now ' }), c.after === undefined ? '(removed)' : plain(c.after)))));
      }
      if (d.edited) this.setArgs(d.edited);
    } else if (d.decision === 'reject') line = `✗ Rejected${who}${at}${d.reason ? ` — “${d.reason}”` : ''}`;
    else if (d.decision === 'respond') line = `↩ Answered${who}${at}${d.message ? ` — “${d.message}”` : ''}`;
    else if (d.decision === 'expired') line = `✗ Expired${when ? ` at ${when}` : ''} — not executed: nobody decided in time`;
    else if (d.decision === 'allowed') line = d.line; // ran under a standing approval (allowances.js)
    else line = `${d.decision}${who}${at}`;
    this.decisionEl.hidden = false;
    this.decisionEl.dataset.decision = d.decision;
    this.decisionEl.replaceChildren(h('span', { class: 'decision-line', text: line }), ...(diff ? [diff] : []));
  }
}

// -- an MCP tool's content: text, images, audio, resources ---------------------------------------

const BLOCK_TYPES = ['text', 'image', 'audio', 'resource', 'resource_link'];
const SAFE_IMAGE = /^image\/(png|jpeg|gif|webp)$/;
const SAFE_AUDIO = /^audio\/(mpeg|mp3|wav|ogg|webm|aac|flac)$/;
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** The content blocks of a result in MCP's shape (`{content: [{type, …}, …]}`), else null. */
export function contentBlocks(result) {
  if (!result || typeof result !== 'object' || Array.isArray(result) || !Array.isArray(result.content)) return null;
  const blocks = result.content;
  if (!blocks.length || !blocks.every((b) => b && typeof b === 'object' && BLOCK_TYPES.includes(b.type))) return null;
  return blocks;
}

function blockSummary(block) {
  if (block.type === 'text') return block.text.length > 60 ? `${block.text.slice(0, 60)}…` : block.text;
  if (block.type === 'resource_link') return `link: ${block.name || block.uri}`;
  if (block.type === 'resource') return `resource: ${(block.resource && block.resource.uri) || ''}`;
  return `${block.type} (${block.mimeType || 'unknown type'})`;
}

/** One block as people read it: an image as an image, audio playable, a resource to unfold, a link. */
function renderBlock(block) {
  if (block.type === 'text') return h('pre', { class: 'result block-text', text: block.text });
  if (block.type === 'image' || block.type === 'audio') {
    const safe = block.type === 'image' ? SAFE_IMAGE : SAFE_AUDIO;
    if (typeof block.data === 'string' && safe.test(block.mimeType || '') && BASE64.test(block.data)) {
      const src = `data:${block.mimeType};base64,${block.data}`;
      return block.type === 'image'
        ? h('figure', { class: 'block-image' }, h('img', { src, alt: `Image returned by the tool (${block.mimeType})` }))
        : h('audio', { class: 'block-audio', controls: true, src, 'aria-label': `Audio returned by the tool (${block.mimeType})` });
    }
    return h('p', { class: 'block-note', text: block.text || `${block.type} (${block.mimeType || 'unknown type'}) not shown` });
  }
  if (block.type === 'resource') {
    const r = block.resource || {};
    const body = typeof r.text === 'string' ? h('pre', { class: 'result', text: r.text })
      : h('p', { class: 'block-note', text: `${r.mimeType || 'binary'} content, not shown` });
    return h('details', { class: 'block-resource' }, h('summary', { text: `Resource ${r.uri || ''}${r.mimeType ? ` (${r.mimeType})` : ''}` }), body);
  }
  const uri = String(block.uri || '');
  const label = block.name || block.title || uri;
  return /^https?:\/\//i.test(uri)
    ? h('p', { class: 'block-link' }, h('a', { href: uri, target: '_blank', rel: 'noopener noreferrer', text: label }), block.description ? ` — ${block.description}` : '')
    : h('p', { class: 'block-link', text: `${label} (${uri})` });
}

/** The outcome of a stored tool message (content: result JSON, reviewer text, or {status, error|reason}). */
export function toolOutcome(message) {
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

// -- messages --------------------------------------------------------------------------------
