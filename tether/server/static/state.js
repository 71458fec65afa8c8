// @ts-nocheck
/**
 * state.js — the web UI's shared state: the API client, what the page shows (`app`), the page's
 * elements (`els`, looked up once by `bindElements`) and the diagnostics at `window.tetherUI`.
 */

import { TetherClient } from './tether-client.js';

/** Where the API key is kept: this tab only (`sessionStorage`), or with "remember me" the browser. */
export const KEY_NAME = 'tether.apiKey';
export const storedKey = () => sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME);
export const api = new TetherClient({ apiKey: storedKey() });

export const $ = (id) => document.getElementById(id);
export const els = {};

export const app = {
  threadId: null,
  thread: null,
  path: [],
  /** @type {LiveRun|null} */
  live: null,
  loadSeq: 0,
  sending: false,
  settings: { approval_threshold: 'destructive', approval_ttl_s: null },
  /** Reasoning by message id: streamed in this page, or read back from the runs' event logs. */
  thinking: new Map(),
  /** Runs whose event log was read back (reasoning, errors); a finished run's log never changes. */
  readRuns: new Set(),
  /** How each reviewed tool call was decided, by call id (from the thread's audit log). */
  decisions: new Map(),
  /** The thread's standing approvals by id (`allowances.js`). */
  allowances: new Map(),
  /** The `error` of each failed run on the path, by run id. */
  runErrors: new Map(),
  /** What to focus after the next render (a CSS selector), when focus would otherwise be lost. */
  focusAfterRender: null,
};

/** Diagnostics for tests and curious humans: per run, what was streamed and how. */
export const diagnostics = { app, runs: {}, lastRunId: null };
window.tetherUI = diagnostics;

/** Look the page's elements up once (the HTML is `tether/server/_ui.py`'s). */
export function bindElements() {
  for (const id of ['chat', 'conn', 'banner', 'input', 'send', 'stop', 'audit', 'sidebar', 'scrim', 'main']) els[id] = $(id);
  Object.assign(els, {
    statusLine: $('status-line'), stopNow: $('stop-now'), threadList: $('thread-list'), newThread: $('new-thread'),
    auditBtn: $('audit-btn'), auditBody: $('audit-body'), auditClose: $('audit-close'), threadTitle: $('thread-title'),
    toggleThreads: $('toggle-threads'), composer: $('composer'), setTtl: $('set-ttl'), setThreshold: $('set-threshold'),
    hint: $('composer-hint'), who: $('who'), signOut: $('sign-out'), approvalsBtn: $('approvals-btn'),
  });
}

export function closeLive() {
  if (app.live) {
    app.live.dispose();
    app.live = null;
  }
}
