// @ts-nocheck
/**
 * settings.js — the run settings under the message box (approval threshold and window): read
 * from the URL and the form, sent as each new run's `config`.
 */

import { app, els } from './state.js';

/** The `config` of a new run: only what differs from the server's defaults. */
export function runConfig() {
  const config = {};
  if (app.settings.approval_threshold !== 'destructive') config.approval_threshold = app.settings.approval_threshold;
  if (app.settings.approval_ttl_s) config.approval_ttl_s = app.settings.approval_ttl_s;
  return config;
}

/** The settings from the URL (`?approval_ttl_s=…&approval_threshold=…`), then from the form. */
export function readSettings() {
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
