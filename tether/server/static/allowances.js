// @ts-nocheck
/**
 * allowances.js — a thread's standing approvals on the page: the chip in the header (how many
 * are active; hidden when none), the dialog it opens (what each covers, who gave it and when,
 * when it ends, and Revoke), and the line on a tool card that ran under one ("Allowed by your
 * approval at 14:02, until 15:02").
 */

import { coverage, scopeWords } from './allow-choice.js';
import { button, h, hm, spinner } from './dom.js';
import { $, api, app } from './state.js';

/** Updates the chip when the next active allowance ends. */
let timer = null;

const active = (a) => a.status === 'active' && Date.parse(a.expires_at) > Date.now();
const whose = (a) => (app.me && a.created_by === app.me.name ? 'your' : `${a.created_by}’s`);

/** "Allowed by your approval at 14:02, until 15:02": the line on a tool card that ran under one. */
export function allowedLine(allowance) {
  if (!allowance) return '✓ Ran without asking: a standing approval covers it';
  return `✓ Allowed by ${whose(allowance)} approval at ${hm(Date.parse(allowance.created_at))}, until ${hm(Date.parse(allowance.expires_at))}`;
}

/** The arguments of the approved call, when it is on the path shown (masked as everywhere). */
function argsOf(callId) {
  for (const message of app.path || []) for (const call of message.tool_calls || []) if (call.id === callId) return call.args;
  return null;
}

/** Read the thread's allowances; the chip (and the open dialog) follow. */
export async function loadAllowances(threadId) {
  if (!threadId) {
    app.allowances = new Map();
    showChip();
    return app.allowances;
  }
  const items = await api.listAllowances(threadId);
  if (threadId !== app.threadId) return new Map(items.map((a) => [a.id, a]));
  app.allowances = new Map(items.map((a) => [a.id, a]));
  showChip();
  if ($('allowances').open) render();
  return app.allowances;
}

/** The header chip: how many allowances are active; hidden when none. Updated when one ends. */
function showChip() {
  const chip = $('allowances-btn');
  const live = [...(app.allowances || new Map()).values()].filter(active);
  chip.hidden = !live.length;
  // On a phone only the number shows; "allowed" is still read out.
  chip.replaceChildren(h('span', { 'aria-hidden': 'true', text: '✓ ' }), `${live.length}`, h('span', { class: 'chip-word', text: ' allowed' }));
  chip.title = 'Standing approvals in this thread: calls they cover run without asking';
  clearTimeout(timer);
  const next = Math.min(...live.map((a) => Date.parse(a.expires_at)));
  if (Number.isFinite(next)) timer = setTimeout(() => { showChip(); if ($('allowances').open) render(); }, Math.max(0, next - Date.now()) + 50);
}

/** A tool card that ran under allowance `allowanceId` says so (read again if it is new). */
export async function markAllowed(card, allowanceId) {
  let allowance = app.allowances && app.allowances.get(allowanceId);
  if (!allowance) allowance = (await loadAllowances(app.threadId).catch(() => new Map())).get(allowanceId);
  card.setDecision({ decision: 'allowed', line: allowedLine(allowance) });
}

function item(a) {
  const live = active(a);
  const state = a.status === 'revoked' ? `revoked by ${a.revoked_by} at ${hm(Date.parse(a.revoked_at))}`
    : live ? `until ${hm(Date.parse(a.expires_at))}` : `ended at ${hm(Date.parse(a.expires_at))}`;
  const what = coverage(a.tool, a.args, a.args === 'same' ? argsOf(a.call_id) : null);
  return h('li', { class: 'allowance', dataset: { id: a.id, status: live ? 'active' : a.status === 'revoked' ? 'revoked' : 'expired' } },
    h('div', { class: 'allowance-what' },
      h('span', { class: 'allowance-covers', text: `${what.charAt(0).toUpperCase()}${what.slice(1)}, ${scopeWords(a.scope)}` }),
      h('span', { class: 'allowance-meta', text: `Given by ${a.created_by === (app.me && app.me.name) ? 'you' : a.created_by} at ${hm(Date.parse(a.created_at))} · ${state}` })),
    live ? button('Revoke', () => revoke(a), 'btn small danger outline revoke', { 'aria-label': `Revoke: ${what}` }) : null);
}

function render() {
  const all = [...(app.allowances || new Map()).values()];
  const live = all.filter(active);
  const past = all.filter((a) => !active(a));
  const body = $('allowances-body');
  const parts = [live.length
    ? h('ul', { class: 'allowance-list', 'aria-label': 'Active' }, live.map(item))
    : h('p', { class: 'hint', text: 'None active: every gated call is asked about.' })];
  if (past.length) parts.push(h('h3', { class: 'allowance-past', text: 'Ended' }), h('ul', { class: 'allowance-list', 'aria-label': 'Ended' }, past.map(item)));
  body.replaceChildren(...parts);
}

async function revoke(allowance) {
  const status = $('allowances-status');
  status.textContent = '';
  try {
    await api.revokeAllowance(allowance.id);
    status.textContent = `Revoked: ${allowance.tool} is asked about again.`;
  } catch (error) {
    status.textContent = `Not revoked: ${error.message}`;
  }
  await loadAllowances(app.threadId).catch(() => {});
  $('allowances-close').focus(); // the Revoke button is gone: focus stays in the dialog
}

async function open() {
  $('allowances-status').textContent = '';
  $('allowances-body').replaceChildren(h('p', {}, spinner(), ' Loading…'));
  if (!$('allowances').open) $('allowances').showModal();
  try {
    await loadAllowances(app.threadId);
    render();
  } catch (error) {
    $('allowances-body').replaceChildren(h('p', { class: 'card-error', text: `Could not read them: ${error.message}` }));
  }
}

/** Wire the header chip and its dialog. */
export function wireAllowances() {
  app.allowances = new Map();
  $('allowances-btn').addEventListener('click', open);
  $('allowances-close').addEventListener('click', () => $('allowances').close());
}
