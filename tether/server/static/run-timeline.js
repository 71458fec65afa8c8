// @ts-nocheck
/**
 * run-timeline.js — where a run's time went, from its event log: pure functions, no DOM.
 *
 * `buildTimeline(events, auditEntries, now)` folds a run's events (every envelope, in seq order,
 * as `GET /v1/runs/{id}/events` pages them) into segments: queued, each model call (with its time
 * to the first token), each tool (its tier, whether it ran), each wait for a person (who decided,
 * how long), steering messages, a takeover after a crash, and a cancel — from its request (the
 * run's `cancel` audit entries: a request is no event) to the `cancelled` event. Every envelope
 * carries `ts`, so no tracing backend is needed.
 *
 * The rules are those of the server's `GET /v1/runs/{id}/timeline` (`tether/server/_timeline.py`),
 * which answers the same JSON for clients that would rather not derive it; the UI tests check that
 * both agree on the same run. Times are milliseconds from `run_started`, exact to the microsecond;
 * `first_token_ms` counts from the start of its model call. A segment still under way is `open`
 * and runs to `now`.
 *
 * `describeSegment`, `summarize`, `formatMs` and `axisTicks` turn a timeline into words and a
 * time axis for the drawing (`timeline-view.js`).
 */

const TERMINAL = { done: 'completed', error: 'failed', cancelled: 'cancelled' };
const RETRY_PREFIXES = ['retrying', 'asking the model again'];

/**
 * Microseconds since the epoch of a wire timestamp (`2026-11-30T20:00:00.123456Z`).
 * @param {string} ts @returns {number}
 */
export function tsMicros(ts) {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(?:Z|\+00:00)$/.exec(ts);
  if (!m) return Date.parse(ts) * 1000;
  const seconds = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]) / 1000;
  return seconds * 1e6 + Number((m[7] || '').padEnd(6, '0'));
}

/**
 * The timeline of a run.
 * @param {Array<{type: string, ts: string, data: any}>} events  every event of the run, in seq order
 * @param {Array<{action: string, ts: string, actor: string, details: any}>} [auditEntries]  the run's audit entries
 * @param {number} [now]  microseconds since the epoch: where what is still under way ends (default: this clock)
 */
export function buildTimeline(events, auditEntries = [], now = Date.now() * 1000) {
  /** @type {any[]} */
  const segments = [];
  let t0 = null;
  let order = 0;
  let queued = null;
  let model = null;
  let models = 0;
  /** @type {Map<string, any>} */
  const calls = new Map();
  const released = new Set();
  let human = null;
  let end = null;
  let runId = null;

  const segment = (kind, start, fields = {}) => {
    order += 1;
    const s = { kind, _start: start, _end: null, _order: order, ...fields };
    segments.push(s);
    return s;
  };
  const closeModel = (at, outcome = null) => {
    if (!model) return;
    model._end = at;
    model.outcome = outcome || (model.tool_calls ? 'tool_calls' : 'answer');
    model = null;
  };

  for (const event of events) {
    const at = tsMicros(event.ts);
    const data = event.data || {};
    const type = event.type;
    if (runId === null) runId = event.run_id ?? null;
    if (t0 === null) t0 = at;
    if (type === 'run_started') {
      queued = segment('queued', at);
      continue;
    }
    if (queued) {
      queued._end = at;
      queued = null;
    }
    if (type === 'status') {
      const { stage, detail } = data;
      if (stage === 'model') {
        if (model && detail != null) {
          if (RETRY_PREFIXES.some((p) => String(detail).startsWith(p))) model.retries += 1;
          continue;
        }
        closeModel(at);
        models += 1;
        model = segment('model', at, {
          index: models, message_id: null, first_token_ms: null, tool_calls: 0, retries: 0, outcome: null, _first: null,
        });
      } else if (stage === 'tool') {
        closeModel(at);
        const names = new Set(String(detail || '').split(',').map((n) => n.trim()).filter(Boolean));
        for (const call of calls.values()) {
          const eligible = !call.gated || released.has(call.call_id);
          if (call._start === null && call._end === null && eligible && (!names.size || names.has(call.name))) {
            call._start = at;
            call.ran = true;
          }
        }
      } else if (stage === 'recovering') {
        closeModel(at, 'interrupted');
        segment('recovering', at)._end = at;
      }
    } else if (type === 'token' || type === 'thinking' || type === 'tool_call') {
      if (model) {
        if (model._first === null) model._first = at;
        if (model.message_id === null) model.message_id = data.message_id ?? null;
        if (type === 'tool_call') model.tool_calls += 1;
      }
      if (type === 'tool_call') {
        const callId = String(data.call_id);
        order += 1;
        const call = {
          kind: 'tool', call_id: callId, name: data.name ?? null, tier: data.risk ?? null, gated: Boolean(data.gated),
          allowed_by: data.allowed_by ?? null, status: null, ran: false, _start: null, _end: null, _order: order,
        };
        calls.set(callId, call);
        segments.push(call);
      }
    } else if (type === 'tool_result') {
      closeModel(at);
      const callId = String(data.call_id);
      let found = calls.get(callId);
      if (!found) { // a result without its call (cut off by a crash): shown as it came
        order += 1;
        found = { kind: 'tool', call_id: callId, name: data.name ?? null, tier: null, gated: false, allowed_by: null, _start: null, _order: order };
        calls.set(callId, found);
        segments.push(found);
      }
      found.status = data.status ?? null;
      found.ran = found._start !== null;
      if (found._start === null) found._start = at;
      found._end = at;
    } else if (type === 'interrupt') {
      closeModel(at);
      const actions = (data.action_requests || []).filter((a) => a && typeof a === 'object')
        .map((a) => ({ call_id: a.call_id ?? null, name: a.action ?? null, decision: null }));
      human = segment('human', at, { interrupt_id: data.interrupt_id ?? null, actor: null, resolution: 'pending', actions });
    } else if (type === 'resumed') {
      const decisions = new Map((data.decisions || []).filter((d) => d && typeof d === 'object').map((d) => [d.call_id ?? null, d.decision ?? null]));
      for (const [callId, decision] of decisions) if (decision === 'approve' || decision === 'edit') released.add(String(callId));
      if (human && human.interrupt_id === (data.interrupt_id ?? null)) {
        human._end = at;
        human.actor = data.actor ?? null;
        human.resolution = data.resolution ?? null;
        for (const action of human.actions) action.decision = decisions.has(action.call_id) ? decisions.get(action.call_id) : null;
        human = null;
      }
    } else if (type === 'user_message') {
      segment('steering', at, { message_id: data.message_id ?? null })._end = at;
    } else if (type in TERMINAL) {
      closeModel(at, { done: null, error: 'failed', cancelled: 'cancelled' }[type]);
      if (human) {
        human._end = at;
        human.resolution = type === 'cancelled' ? 'cancelled' : 'ended';
        human = null;
      }
      for (const call of calls.values()) if (call._start !== null && call._end === null) call._end = at;
      end = { type, at, data };
    }
  }

  if (t0 === null) return { run_id: runId, status: 'queued', started_at: null, ended_at: null, duration_ms: 0, error: null, segments: [] };
  const asked = auditEntries.filter((e) => e && e.action === 'cancel' && e.ts)
    .map((e) => ({ at: tsMicros(e.ts), mode: (e.details && typeof e.details === 'object' && e.details.mode) ?? null, actor: e.actor }))
    .sort((a, b) => a.at - b.at);
  const stop = end ? end.at : Math.max(now, t0);
  const cancelled = Boolean(end && end.type === 'cancelled');
  if (asked.length) {
    const first = asked[0];
    segment('cancel', first.at, {
      mode: cancelled ? end.data.mode ?? null : asked[asked.length - 1].mode,
      actor: cancelled ? end.data.actor ?? null : first.actor,
      reason: cancelled ? end.data.reason ?? null : null,
      landed: cancelled,
      requests: asked.map((r) => ({ at_ms: Math.max(0, r.at - t0) / 1000, mode: r.mode, actor: r.actor })),
      _end: cancelled ? end.at : null,
    });
  } else if (cancelled) { // when it was asked for is not known
    segment('cancel', end.at, { mode: end.data.mode ?? null, actor: end.data.actor ?? null, reason: end.data.reason ?? null, landed: true, requests: [] })._end = end.at;
  }
  let status;
  if (end) status = TERMINAL[end.type];
  else if (queued) status = 'queued';
  else if (human) status = 'waiting_human';
  else if (asked.length) status = 'cancelling';
  else status = 'running';

  const startOf = (s) => (s._start !== null ? s._start : stop);
  const items = [...segments].sort((a, b) => (startOf(a) - startOf(b)) || (a._order - b._order)).map((s) => {
    const start = startOf(s);
    const open = s._end === null;
    const finish = open ? stop : s._end;
    /** @type {any} */
    const item = {};
    for (const [k, v] of Object.entries(s)) if (!k.startsWith('_')) item[k] = v;
    item.start_ms = Math.max(0, start - t0) / 1000;
    item.duration_ms = Math.max(0, finish - start) / 1000;
    item.open = open;
    if (s.kind === 'model') {
      item.first_token_ms = s._first !== null ? Math.max(0, s._first - start) / 1000 : null;
      if (open) item.outcome = 'running';
    }
    if (s.kind === 'cancel' && !s.requests.length) item.duration_ms = null;
    return item;
  });
  const error = end && end.type === 'error' ? end.data : null;
  return {
    run_id: runId,
    status,
    started_at: wireTs(t0),
    ended_at: end ? wireTs(end.at) : null,
    duration_ms: Math.max(0, stop - t0) / 1000,
    error: error ? { code: error.code ?? null, message: error.message ?? null } : null,
    segments: items,
  };
}

/** @param {number} micros @returns {string} the wire form of a time (UTC, microseconds, `Z`) */
function wireTs(micros) {
  const ms = Math.floor(micros / 1000);
  return `${new Date(ms).toISOString().slice(0, 19)}.${String(micros % 1e6).padStart(6, '0')}Z`;
}

// -- words -------------------------------------------------------------------------------------

/** A duration for people: `0 ms`, `<1 ms`, `120 ms`, `1.4 s`, `12 s`, `2 min 05 s`. @param {number} ms */
export function formatMs(ms) {
  if (ms == null || !Number.isFinite(ms)) return '?';
  if (ms > 0 && ms < 0.5) return '<1 ms';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 60_000) return `${Math.round(ms / 1000)} s`;
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
}

const TOOL_OUTCOMES = {
  ok: 'ran', error: 'failed', rejected: 'rejected — not run', expired: 'expired — not run', responded: 'answered by a person',
  cancelled: 'cancelled', unknown: 'outcome unknown',
};
const DECISIONS = { approve: 'approved', reject: 'rejected', edit: 'edited and approved', respond: 'answered', expired: 'let expire' };
const MODEL_OUTCOMES = {
  answer: 'answered', tool_calls: 'asked for tools', cancelled: 'stopped by the cancel', failed: 'failed',
  interrupted: 'cut off by a restart', running: 'still running',
};

/**
 * A segment in words: `label` (what it is) and `detail` (how long, who, what came of it), the
 * same words the list read by screen readers says.
 * @param {any} s @returns {{label: string, detail: string}}
 */
export function describeSegment(s) {
  const took = s.open ? `${formatMs(s.duration_ms)} so far` : formatMs(s.duration_ms);
  switch (s.kind) {
    case 'queued':
      return { label: 'Queued', detail: s.duration_ms < 1 && !s.open ? 'started at once' : `waited ${took} to start` };
    case 'model': {
      const parts = [s.first_token_ms != null ? `first token after ${formatMs(s.first_token_ms)}` : 'no token yet', took];
      if (s.retries) parts.push(`${s.retries} ${s.retries === 1 ? 'retry' : 'retries'}`);
      const calls = s.tool_calls ? ` ${s.tool_calls} ${s.tool_calls === 1 ? 'tool' : 'tools'}` : '';
      parts.push(s.outcome === 'tool_calls' ? `asked for${calls}` : MODEL_OUTCOMES[s.outcome] || s.outcome);
      return { label: `Model call ${s.index}`, detail: parts.join(' · ') };
    }
    case 'tool': {
      const tier = (s.tier || 'unknown tier').replace('_', '-');
      let outcome;
      if (s.open) outcome = s.ran ? `running, ${took}` : 'not started';
      else if (!s.ran) outcome = `${TOOL_OUTCOMES[s.status] || s.status}${s.status === 'cancelled' ? ' before it ran' : ''}`;
      else outcome = `${TOOL_OUTCOMES[s.status] || s.status} in ${took}`;
      const allowed = s.allowed_by ? ' · allowed by a standing approval, not asked' : '';
      return { label: `Tool ${s.name || '?'}`, detail: `${tier}${allowed} · ${outcome}` };
    }
    case 'human': {
      const what = (s.actions || []).map((a) => a.name).filter(Boolean).join(', ') || 'a request';
      if (s.open) return { label: 'Waiting for a person', detail: `${what}: waiting ${took}` };
      if (s.resolution === 'expired') return { label: 'Waiting for a person', detail: `${what}: nobody decided; expired after ${took}` };
      if (s.resolution === 'cancelled') return { label: 'Waiting for a person', detail: `${what}: the run was stopped after ${took}` };
      if (s.resolution === 'ended') return { label: 'Waiting for a person', detail: `${what}: the run ended after ${took}` };
      const decided = [...new Set((s.actions || []).map((a) => DECISIONS[a.decision] || a.decision).filter(Boolean))].join(' and ') || 'decided';
      return { label: 'Waiting for a person', detail: `${s.actor || 'someone'} ${decided} ${what} after ${took}` };
    }
    case 'cancel': {
      const who = `${s.mode || 'a'} stop by ${s.actor || 'someone'}`;
      if (!s.landed) return { label: 'Stop requested', detail: `${who}: not landed yet, ${took}` };
      if (s.duration_ms == null) return { label: 'Stopped', detail: `${who} (when it was asked for is not on record)` };
      const upgraded = (s.requests || []).length > 1 ? ` (${s.requests.map((r) => r.mode).join(' then ')})` : '';
      return { label: 'Stopped', detail: `${who}${upgraded}: landed ${took} after it was asked for` };
    }
    case 'steering':
      return { label: 'Steering message', detail: 'sent into the run' };
    case 'recovering':
      return { label: 'Taken over', detail: 'another process continued the run after a restart' };
    default:
      return { label: s.kind, detail: took };
  }
}

/** The whole run in one line: `Cancelled after 4.2 s: 3 model calls, 2 tools, 1 wait for a person (1.3 s)`. */
export function summarize(timeline) {
  const count = (kind) => timeline.segments.filter((s) => s.kind === kind).length;
  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
  const waited = timeline.segments.filter((s) => s.kind === 'human').reduce((sum, s) => sum + s.duration_ms, 0);
  const status = {
    completed: 'Completed in', failed: 'Failed after', cancelled: 'Stopped after', running: 'Running for',
    waiting_human: 'Waiting for a person, after', cancelling: 'Stopping, after', queued: 'Queued for',
  }[timeline.status] || `${timeline.status}:`;
  const parts = [plural(count('model'), 'model call', 'model calls'), plural(count('tool'), 'tool', 'tools')];
  if (count('human')) parts.push(`${plural(count('human'), 'wait', 'waits')} for a person (${formatMs(waited)})`);
  return `${status} ${formatMs(timeline.duration_ms)}: ${parts.join(', ')}`;
}

/**
 * Where to put the ticks of a time axis of `totalMs`: 4 to 8 round steps.
 * @param {number} totalMs @returns {Array<{ms: number, label: string}>}
 */
export function axisTicks(totalMs) {
  const total = Math.max(totalMs, 1);
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000];
  const step = steps.find((s) => total / s <= 6) || steps[steps.length - 1] * Math.ceil(total / (6 * steps[steps.length - 1]));
  const ticks = [];
  for (let ms = 0; ms <= total + 1e-9; ms += step) ticks.push({ ms, label: formatMs(ms) });
  return ticks;
}
