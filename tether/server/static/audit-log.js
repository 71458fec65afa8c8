// @ts-nocheck
/**
 * audit-log.js — the Audit log dialog: the thread's decisions, expiries, cancels and gated
 * executions, as a table.
 */

import { clock, h, spinner } from './dom.js';
import { api, app, els } from './state.js';

export async function openAudit() {
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

/** Wire the Audit log button and the dialog's Close. */
export function wireAuditLog() {
  els.auditBtn.addEventListener('click', openAudit);
  els.auditClose.addEventListener('click', () => els.audit.close());
}
