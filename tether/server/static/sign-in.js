// @ts-nocheck
/**
 * sign-in.js — who is signed in. The page asks `GET /v1/me` first. In `open` mode that answers
 * at once (`local`). In `keys` mode it is a 401 until the person pastes a key; the key is then
 * kept in `sessionStorage` (this tab), or in `localStorage` with "remember me", and sent as a
 * bearer header on every request, the event streams included. Signing out forgets it and reloads.
 */

import { TetherError } from './tether-client.js';
import { $, KEY_NAME, api, app, closeLive, els, storedKey } from './state.js';

/** Who is signed in: ask the server, and ask the person for a key while it answers 401. */
export async function authenticate() {
  for (;;) {
    try {
      app.me = await api.me();
      break;
    } catch (error) {
      if (!(error instanceof TetherError) || error.status !== 401) throw error;
      await askForKey(storedKey() ? 'That key was not accepted (unknown, expired or revoked).' : '');
    }
  }
  const { name, roles, auth } = app.me;
  els.who.hidden = false;
  els.who.textContent = `${name} · ${roles.join(', ')}`;
  els.who.title = auth === 'keys' ? `Signed in as ${name}` : 'Open mode: no key needed on this machine';
  els.signOut.hidden = auth !== 'keys';
  els.approvalsBtn.hidden = false;
}

/** Show the sign-in dialog until the person submits a key the server accepts. */
export function askForKey(message) {
  forgetKey();
  const dialog = $('signin');
  const error = $('signin-error');
  error.textContent = message;
  return new Promise((resolve) => {
    const form = $('signin-form');
    form.onsubmit = async (event) => {
      event.preventDefault();
      const key = $('signin-key').value.trim();
      api.setApiKey(key);
      try {
        await api.me();
      } catch (exc) {
        api.setApiKey(null);
        error.textContent = exc instanceof TetherError && exc.status === 401
          ? 'That key was not accepted (unknown, expired or revoked).'
          : `Could not sign in: ${exc.message}`;
        return;
      }
      ($('signin-remember').checked ? localStorage : sessionStorage).setItem(KEY_NAME, key);
      $('signin-key').value = '';
      dialog.close();
      resolve();
    };
    dialog.oncancel = (event) => event.preventDefault(); // nothing works without a key
    if (!dialog.open) dialog.showModal();
    $('signin-key').focus();
  });
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

export function signOut() {
  closeLive();
  forgetKey();
  api.setApiKey(null);
  window.location.assign('/');
}
