// @ts-nocheck
/**
 * allow-choice.js — "Approve and allow…" on an approval card and in the Approvals inbox: the
 * small choice of what a standing approval given with an approval covers — the rest of the run
 * or the thread, the same arguments or any (only where every call permits both), for 15 min, 1 h
 * or 8 h — and, in plain words, what will no longer be asked. The server checks all of it again
 * (`allow_not_permitted`, the ttl cap); this only offers what the review configs permit.
 */

import { h, hm, oneLine, uid } from './dom.js';

/** The lifetimes offered, in seconds. */
export const LIFETIMES = [['15 min', 900], ['1 h', 3600], ['8 h', 8 * 3600]];

/** A group of radio buttons with a legend; `onChange(value)` when one is picked. */
function radios(legend, options, checked, onChange) {
  const name = uid('allow');
  return h('fieldset', { class: 'allow-group' },
    h('legend', { text: legend }),
    options.map(([label, value]) => h('label', { class: 'allow-option' },
      h('input', { type: 'radio', name, value: String(value), checked: value === checked, onchange: () => onChange(value) }),
      ` ${label}`)));
}

/** What a standing approval covers, in words: "refund with these arguments (order_id: A100, …)". */
export function coverage(tool, argsKind, args) {
  if (argsKind === 'any') return `any ${tool} call`;
  const shown = args ? oneLine(args) : '';
  return shown ? `${tool} with these same arguments (${shown})` : `${tool} with the same arguments`;
}

/** What standing approvals given with several approvals at once cover, in words. */
export function coverageOfMany(actions, argsKind) {
  const tools = [...new Set(actions.map((a) => a.action))].join(', ');
  return argsKind === 'any' ? `any call of ${tools}` : `these ${actions.length} calls (${tools}), each with its same arguments`;
}

/** Where it holds, in words (`several`: approvals of several runs at once, each its own). */
export function scopeWords(scope, several = false) {
  if (several) return scope === 'run' ? "for the rest of each one's run" : "in each one's thread, later runs too";
  return scope === 'run' ? 'for the rest of this run' : 'in this thread, later runs too';
}

/** Which `allow.args` every one of several calls permits (their `allow_args` in common). */
export function permittedByAll(allowArgs) {
  if (!allowArgs.length) return [];
  return ['same', 'any'].filter((kind) => allowArgs.every((permitted) => permitted.includes(kind)));
}

/** How an approval that came with `allow` reads once decided (the card's outcome line). */
export function allowedOutcome(allow, several = false) {
  const minutes = Math.round(allow.ttl_s / 60);
  const span = minutes % 60 === 0 ? `${minutes / 60} h` : `${minutes} min`;
  return `and allowed ${allow.args === 'any' ? 'with any arguments' : 'with the same arguments'} ${scopeWords(allow.scope, several)}, for ${span}`;
}

export class AllowChoice {
  /**
   * @param {object} o
   * @param {object} [o.action]     the action request (`action`, `args`)
   * @param {object[]} [o.actions]  instead: the action requests of several approvals at once (the inbox)
   * @param {string[]} o.permitted  what its review config permits (`allow_args`; for several, what all permit)
   * @param {string|null} o.name    the accessible name of the group (several actions: which one)
   */
  constructor({ action, actions, permitted, name }) {
    this.action = action;
    this.actions = actions && actions.length > 1 ? actions : null;
    if (!action && actions) this.action = actions[0];
    this.scope = 'run';
    this.args = permitted.includes('same') ? 'same' : permitted[0];
    this.ttl = LIFETIMES[0][1];
    this.summaryEl = h('p', { class: 'allow-summary', id: uid('allow-summary'), 'aria-live': 'polite' });
    const update = (key) => (value) => {
      this[key] = value;
      this._summarize();
    };
    const several = Boolean(this.actions);
    const scope = radios('Allow', several
      ? [['for the rest of each run', 'run'], ['in each thread (later runs too)', 'thread']]
      : [['for the rest of this run', 'run'], ['in this thread (later runs too)', 'thread']], this.scope, update('scope'));
    const only = several ? 'With their same arguments only (not every selected call permits more).' : 'With these same arguments only (the tool permits no other).';
    const args = permitted.length > 1
      ? radios('With', [[several ? 'their same arguments' : 'these same arguments', 'same'], ['any arguments', 'any']], this.args, update('args'))
      : h('p', { class: 'allow-fixed', text: permitted[0] === 'same' ? only : 'With any arguments.' });
    const ttl = radios('For', LIFETIMES, this.ttl, update('ttl'));
    this.el = h('div', { class: 'allow-choice', role: 'group', 'aria-label': name || 'Approve and allow', 'aria-describedby': this.summaryEl.id },
      scope, args, ttl, this.summaryEl);
    /** The first control (focused when the choice opens). */
    this.first = this.el.querySelector('input');
    this._summarize();
  }

  _summarize() {
    const until = hm(Date.now() + this.ttl * 1000);
    const what = this.actions ? coverageOfMany(this.actions, this.args) : coverage(this.action.action, this.args, this.action.args);
    const revoke = this.actions ? "You can revoke each from its thread's header." : "You can revoke it from the thread's header.";
    this.summaryEl.textContent = `Until ${until}, ${what} will run without asking you, `
      + `${scopeWords(this.scope, Boolean(this.actions))}. Anything else is still asked. ${revoke}`;
  }

  /** The `allow` of the decision. */
  value() {
    return { scope: this.scope, args: this.args, ttl_s: this.ttl };
  }
}
