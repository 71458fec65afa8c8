// @ts-nocheck
/**
 * thread-list.js — the sidebar: the thread list (each thread's title and whether it runs or
 * waits for you) and, on narrow screens, the drawer it lives in.
 */

import { button, h } from './dom.js';
import { api, app, els } from './state.js';

/** A thread's title: the server's (given, renamed, or from its first message), else an older
 * client's `metadata.title`, else "Untitled thread" (its first message is still to come). */
export function threadTitle(thread) {
  return thread.title || (thread.metadata && typeof thread.metadata.title === 'string' && thread.metadata.title) || 'Untitled thread';
}

/** Read the threads again and list them (and refresh the Approvals count). */
export async function refreshThreadList() {
  if (app.approvals) app.approvals.refresh();
  let threads;
  try {
    threads = await api.listThreads();
  } catch (_) {
    return;
  }
  // The state is words (a dot alone is a colour and a tooltip: neither reaches everyone).
  const stateOf = (thread) => {
    if (thread.pending_interrupt) return h('span', { class: 'thread-state waiting' }, h('span', { class: 'dot', 'aria-hidden': 'true', text: '●' }), 'waiting for you');
    if (thread.active_run_id) return h('span', { class: 'thread-state running' }, h('span', { class: 'dot', 'aria-hidden': 'true', text: '●' }), 'running');
    return null;
  };
  els.threadList.replaceChildren(...threads.map((thread) => h('li', {},
    button([
      h('span', { class: 'thread-name', text: threadTitle(thread), title: threadTitle(thread) }),
      h('span', { class: 'thread-meta' },
        stateOf(thread),
        new Date(thread.created_at).toLocaleString([], { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' })),
    ], null, 'thread-item', { dataset: { threadId: thread.id } }))));
  markActiveThread();
}

export function markActiveThread() {
  for (const item of els.threadList.querySelectorAll('.thread-item')) {
    if (item.dataset.threadId === app.threadId) item.setAttribute('aria-current', 'page');
    else item.removeAttribute('aria-current');
  }
}


// The thread list is a drawer on narrow screens: while closed it is out of the Tab order
// (inert); while open, the dimmed rest of the page catches taps (they close the drawer and
// reach nothing underneath) and is inert too.
export const narrow = window.matchMedia('(max-width: 760px)');

export function sidebarOpen() {
  return document.body.classList.contains('sidebar-open');
}

export function syncDrawer() {
  const open = sidebarOpen();
  const drawer = narrow.matches;
  els.sidebar.inert = drawer && !open;
  els.main.inert = drawer && open;
  els.scrim.hidden = !(drawer && open);
  els.toggleThreads.setAttribute('aria-expanded', String(open));
}

export function openSidebar() {
  document.body.classList.add('sidebar-open');
  syncDrawer();
  (els.sidebar.querySelector('[aria-current="page"]') || els.newThread).focus();
}

export function closeSidebar({ returnFocus = false } = {}) {
  const wasOpen = sidebarOpen();
  document.body.classList.remove('sidebar-open');
  syncDrawer();
  if (wasOpen && returnFocus) els.toggleThreads.focus();
}

/** Wire the sidebar: a click on a thread opens it (`openThread(id)`); the drawer's toggle and scrim. */
export function wireThreadList(openThread) {
  els.threadList.addEventListener('click', (event) => {
    const item = event.target.closest('.thread-item');
    if (item) openThread(item.dataset.threadId);
  });
  els.toggleThreads.addEventListener('click', () => (sidebarOpen() ? closeSidebar() : openSidebar()));
  els.scrim.addEventListener('click', (event) => {
    event.preventDefault();
    closeSidebar({ returnFocus: true });
  });
  narrow.addEventListener('change', syncDrawer);
  syncDrawer();
}
