// @ts-nocheck
/**
 * timeline-view.js — the Timeline dialog of one run: its event log (every JSON page) and its
 * audit entries are read, `run-timeline.js` turns them into segments, and this draws them — one
 * row per segment, a bar on a shared time axis beside words that say the same (the rows are a
 * list, which is what screen readers read; the bars and the axis are hidden from them).
 */

import { h, spinner } from './dom.js';
import { axisTicks, buildTimeline, describeSegment, formatMs, summarize } from './run-timeline.js';
import { $, api } from './state.js';

const PAGE = 1000;

/** Every event of a run, in seq order (JSON pages of the event log). */
async function allEvents(runId) {
  const events = [];
  for (;;) {
    const page = await api.events(runId, { afterSeq: events.length ? events[events.length - 1].seq : 0, limit: PAGE });
    events.push(...page);
    if (page.length < PAGE) return events;
  }
}

/** Position a bar (or a zero-length mark) on the axis of `total` ms. */
function placeBar(bar, segment, total) {
  const left = (segment.start_ms / total) * 100;
  const width = ((segment.duration_ms || 0) / total) * 100;
  bar.style.left = `${Math.min(left, 100)}%`;
  bar.style.width = `${Math.max(0, Math.min(width, 100 - left))}%`;
  if (!segment.duration_ms) bar.classList.add('tl-mark');
}

function row(segment, total) {
  const { label, detail } = describeSegment(segment);
  const bar = h('span', { class: 'tl-bar' });
  placeBar(bar, segment, total);
  return h('li', { class: 'tl-row', dataset: { kind: segment.kind, open: segment.open ? 'true' : null, status: segment.status || segment.outcome || segment.resolution } },
    h('div', { class: 'tl-text' },
      h('span', { class: 'tl-label', text: label }),
      h('span', { class: 'tl-sep', text: ': ' }),
      h('span', { class: 'tl-detail', text: detail }),
      h('span', { class: 'tl-at', text: ` (at ${formatMs(segment.start_ms)})` })),
    h('div', { class: 'tl-track', 'aria-hidden': 'true' }, bar));
}

function axis(total) {
  return h('div', { class: 'tl-axis', 'aria-hidden': 'true' },
    h('span', { class: 'tl-axis-pad' }),
    h('div', { class: 'tl-ticks' }, axisTicks(total).map((tick) => {
      const el = h('span', { class: 'tl-tick', text: tick.label });
      el.style.left = `${(tick.ms / total) * 100}%`;
      return el;
    })));
}

/** Draw `timeline` into `body`. */
export function drawTimeline(body, timeline) {
  const total = Math.max(timeline.duration_ms, 1);
  const parts = [h('p', { class: 'tl-summary', id: 'timeline-summary', text: summarize(timeline) })];
  if (timeline.error) parts.push(h('p', { class: 'card-error', text: `The run failed: ${timeline.error.message} (${timeline.error.code})` }));
  parts.push(h('div', { class: 'tl-chart' },
    axis(total),
    h('ol', { class: 'tl-list', 'aria-label': 'Where the time went, in order' }, timeline.segments.map((s) => row(s, total)))));
  body.replaceChildren(...parts);
}

let shown = null;

/** Open the Timeline dialog of run `runId` (read again on Refresh while the run goes on). */
export async function openTimeline(runId) {
  const dialog = $('timeline');
  const body = $('timeline-body');
  const refresh = $('timeline-refresh');
  shown = runId;
  dialog.dataset.runId = runId;
  delete dialog.dataset.ready;
  refresh.hidden = true;
  body.replaceChildren(h('p', {}, spinner(), ' Reading the run’s event log…'));
  if (!dialog.open) dialog.showModal();
  let timeline;
  try {
    const [events, audit] = await Promise.all([allEvents(runId), api.audit({ runId }).catch(() => [])]);
    timeline = buildTimeline(events, audit);
  } catch (error) {
    if (shown === runId) body.replaceChildren(h('p', { class: 'card-error', text: `Could not read the run’s timeline: ${error.message}` }));
    return;
  }
  if (shown !== runId) return;
  drawTimeline(body, timeline);
  refresh.hidden = ['completed', 'failed', 'cancelled'].includes(timeline.status);
  dialog.dataset.status = timeline.status;
  dialog.dataset.ready = 'true';
  window.tetherUI.timeline = timeline; // diagnostics (tests compare it with the server's)
}

/** Wire the dialog's Close and Refresh. */
export function wireTimeline() {
  $('timeline-close').addEventListener('click', () => $('timeline').close());
  $('timeline-refresh').addEventListener('click', () => shown && openTimeline(shown));
  $('timeline').addEventListener('close', () => { shown = null; });
}
