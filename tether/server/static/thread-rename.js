// @ts-nocheck
/**
 * thread-rename.js — the thread's title in the header, and the Rename dialog that changes it
 * (`PATCH /v1/threads/{id}`; the server's field error shows under the box).
 */

import { TetherError } from './tether-client.js';
import { $, api, app, els } from './state.js';
import { refreshThreadList, threadTitle } from './thread-list.js';

/** The header for `thread` (null: a new thread, not created yet). */
export function showThreadTitle(thread) {
  const title = thread ? threadTitle(thread) : 'New thread';
  els.threadTitle.textContent = title;
  els.threadTitle.title = title; // the whole title, where the header cuts it
  $('rename-btn').hidden = !thread;
}

function fieldError(error) {
  if (error instanceof TetherError && Array.isArray(error.details) && error.details.length) {
    return error.details.map((d) => String(d.msg || '').replace(/^Value error, /, '')).join('; ');
  }
  return error.message || String(error);
}

function openRename() {
  if (!app.thread) return;
  const input = $('rename-input');
  input.value = app.thread.title || '';
  input.removeAttribute('aria-invalid');
  $('rename-error').textContent = '';
  $('rename').showModal();
  input.select();
}

async function saveRename(event) {
  event.preventDefault();
  const input = $('rename-input');
  const error = $('rename-error');
  const save = $('rename-save');
  const title = input.value.trim();
  if (!title) {
    input.setAttribute('aria-invalid', 'true');
    error.textContent = 'Write a title first.';
    return;
  }
  const threadId = app.threadId;
  save.disabled = true;
  try {
    const thread = await api.renameThread(threadId, title);
    if (app.threadId === threadId && app.thread) {
      app.thread = { ...app.thread, title: thread.title };
      showThreadTitle(app.thread);
    }
    $('rename').close();
    refreshThreadList();
  } catch (exc) {
    input.setAttribute('aria-invalid', 'true');
    error.textContent = `Not renamed: ${fieldError(exc)}`;
  } finally {
    save.disabled = false;
  }
}

/** Wire the header's Rename button and its dialog. */
export function wireRename() {
  $('rename-btn').addEventListener('click', openRename);
  $('rename-form').addEventListener('submit', saveRename);
  $('rename-cancel').addEventListener('click', () => $('rename').close());
  $('rename-input').addEventListener('input', () => {
    $('rename-input').removeAttribute('aria-invalid');
    $('rename-error').textContent = '';
  });
  // The dialog gives focus back to what opened it (the Rename button) when it closes.
}
