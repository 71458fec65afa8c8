// @ts-check
/**
 * tether-run-stream.js — part of the browser client (`tether-client.js` re-exports what is
 * public): `RunStream`, one run followed over SSE, and the front-end state machine.
 */

import { TetherError, enc, errorOf } from './tether-error.js';
import { parseSSE } from './tether-sse.js';

/**
 * One entry of a run's event log, exactly as the server stores and sends it.
 * @typedef {object} Envelope
 * @property {string} run_id
 * @property {number} seq      run-local, 1, 2, 3, … without gaps
 * @property {string} type     run_started | token | thinking | tool_call | tool_result | interrupt |
 *                             resumed | user_message | status | done | error | cancelled
 * @property {string} ts       UTC timestamp, e.g. "2026-11-30T20:00:00.123456Z"
 * @property {Record<string, any>} data
 */

/**
 * The front-end state of a followed run.
 * - `streaming`: connected, the run is working (or queued).
 * - `recovering`: the connection dropped; reconnecting from the last seq. The run goes on.
 * - `interrupted`: the run waits for a human decision (an `interrupt` event; "waiting_user").
 * - `cancelling`: a cancel was accepted; waiting for the server's `cancelled` event.
 * - `cancelled` | `completed` | `failed`: terminal (the run's `cancelled`, `done` or `error`
 *   event, or — `failed` only — the run cannot be followed at all, e.g. 404).
 * @typedef {'streaming'|'recovering'|'interrupted'|'cancelling'|'cancelled'|'completed'|'failed'} RunState
 */

/**
 * @typedef {object} RunStreamOptions
 * @property {number} [afterSeq=0]         deliver events with seq > afterSeq
 * @property {(e: Envelope) => void} [onEvent]
 * @property {(state: RunState, previous: RunState) => void} [onState]
 * @property {number} [minBackoffMs=250]   first reconnect delay (doubles, with jitter)
 * @property {number} [maxBackoffMs=5000]  longest reconnect delay
 * @property {number} [stallTimeoutMs=45000] reconnect when nothing (not even a `: ping`)
 *   arrived for this long: a half-open connection looks alive but delivers nothing
 * @property {boolean} [syncStatus=true]   read the run once at start, so a run that is already
 *   `cancelling` shows as such (no event announces a cancel request)
 */

export const TERMINAL_TYPES = Object.freeze(['done', 'error', 'cancelled']);

/** @type {Record<string, RunState>} */
const TERMINAL_STATE = { done: 'completed', error: 'failed', cancelled: 'cancelled' };

/**
 * Follows one run: delivers each event once, in seq order, through the terminal event,
 * reconnecting as needed. Extends `EventTarget`: listen for `event` (detail: the envelope),
 * `statechange` (detail: `{state, previous}`) and `transporterror` (detail: the error that
 * dropped a connection; informational — it reconnects by itself).
 */
export class RunStream extends EventTarget {
  /** @param {import('./tether-client.js').TetherClient} client @param {string} runId @param {RunStreamOptions} [options] */
  constructor(client, runId, options = {}) {
    super();
    this.client = client;
    this.runId = runId;
    /** Seq of the last event delivered (the `Last-Event-ID` of the next connection). */
    this.lastSeq = options.afterSeq ?? 0;
    this.options = {
      minBackoffMs: 250, maxBackoffMs: 5000, stallTimeoutMs: 45000, syncStatus: true, ...options,
    };
    /** @type {RunState} */
    this.state = 'streaming';
    /** @type {Envelope|null} the terminal event, once seen */
    this.terminalEvent = null;
    /** @type {TetherError|null} why following failed (404 and the like) */
    this.error = null;
    /** Counters for diagnostics: connections opened, reconnects, events dropped as duplicates. */
    this.stats = { connections: 0, reconnects: 0, duplicates: 0, delivered: 0 };
    this._waiting = false; // an interrupt is open
    this._cancelRequested = false; // a cancel was accepted (or the run was already cancelling)
    this._transportDown = false;
    this._closed = false;
    /** @type {AbortController|null} */
    this._abort = null;
    /** @type {Map<number, Envelope>} events that arrived ahead of a missing seq */
    this._ahead = new Map();
    this._lastActivity = Date.now();
    /** @type {(() => void)|null} */
    this._wake = null;
    this._onOffline = () => this._dropTransport('the browser went offline');
    this._onOnline = () => this._wake && this._wake();
    /** @type {Promise<Envelope|null>} resolves with the terminal event (null if following failed or was closed) */
    this.finished = new Promise((resolve) => { this._resolveFinished = resolve; });
  }

  /** Start following (idempotent). @returns {this} */
  start() {
    if (this._started) return this;
    this._started = true;
    if (typeof window !== 'undefined') {
      window.addEventListener('offline', this._onOffline);
      window.addEventListener('online', this._onOnline);
    }
    this._watchdog = setInterval(() => {
      if (Date.now() - this._lastActivity > this.options.stallTimeoutMs) this._dropTransport('stalled');
    }, Math.min(5000, this.options.stallTimeoutMs));
    if (this.options.syncStatus) this._syncStatus();
    this._loop();
    return this;
  }

  /** True once the run reached `cancelled`, `completed` or `failed`. */
  get terminal() { return this.state === 'cancelled' || this.state === 'completed' || this.state === 'failed'; }

  /**
   * Explicitly stop the run (`POST /v1/runs/{id}/cancel`). The state shows `cancelling` at
   * once and becomes `cancelled` only with the server's `cancelled` event. Calling it again
   * with `hard` upgrades a soft cancel. Throws `TetherError` (and the state goes back) when
   * the request fails — e.g. offline: then the run is *not* being stopped.
   * @param {'soft'|'hard'} [mode='soft'] @param {string} [reason]
   */
  async cancel(mode = 'soft', reason) {
    if (this.terminal) return null;
    const before = this._cancelRequested;
    this._cancelRequested = true;
    this._emitState();
    try {
      return await this.client.cancel(this.runId, mode, reason);
    } catch (exc) {
      if (exc instanceof TetherError && exc.code === 'run_not_active') return null; // it just ended: the terminal event is on its way
      this._cancelRequested = before;
      this._emitState();
      throw exc;
    }
  }

  /** Stop following: a transport action only, the run is not affected. */
  close() {
    if (this._closed) return;
    this._closed = true;
    this._teardown();
    if (this._abort) this._abort.abort();
    if (this._wake) this._wake();
    this._resolveFinished(this.terminalEvent);
  }

  // -- internals -------------------------------------------------------------------------

  _teardown() {
    clearInterval(this._watchdog);
    if (typeof window !== 'undefined') {
      window.removeEventListener('offline', this._onOffline);
      window.removeEventListener('online', this._onOnline);
    }
  }

  async _syncStatus() {
    try {
      const run = await this.client.getRun(this.runId);
      if (run.status === 'cancelling' && !this.terminal) {
        this._cancelRequested = true;
        this._emitState();
      }
    } catch (_) {
      /* the stream itself reports what matters */
    }
  }

  /** @param {string} why */
  _dropTransport(why) {
    if (this._closed || this.terminal || !this._abort) return;
    this._abort.abort(new DOMException(why, 'AbortError'));
  }

  /** @returns {RunState} */
  _derivedState() {
    if (this.terminalEvent) return TERMINAL_STATE[this.terminalEvent.type];
    if (this.error) return 'failed';
    if (this._transportDown) return 'recovering';
    if (this._cancelRequested) return 'cancelling';
    if (this._waiting) return 'interrupted';
    return 'streaming';
  }

  _emitState() {
    const next = this._derivedState();
    if (next === this.state) return;
    const previous = this.state;
    this.state = next;
    if (this.options.onState) this.options.onState(next, previous);
    this.dispatchEvent(new CustomEvent('statechange', { detail: { state: next, previous } }));
  }

  /** @param {Envelope} envelope */
  _deliver(envelope) {
    this.lastSeq = envelope.seq;
    this.stats.delivered += 1;
    if (envelope.type === 'interrupt') this._waiting = true;
    else if (envelope.type === 'resumed') this._waiting = false;
    if (TERMINAL_TYPES.includes(envelope.type)) this.terminalEvent = envelope;
    if (this.options.onEvent) this.options.onEvent(envelope);
    this.dispatchEvent(new CustomEvent('event', { detail: envelope }));
    this._emitState();
  }

  /**
   * Accept one envelope: drop duplicates (seq ≤ lastSeq), hold ones that arrive ahead of a
   * missing seq, deliver in order. Returns false when the held set grew too big (reconnect).
   * @param {Envelope} envelope
   */
  _accept(envelope) {
    if (envelope.run_id !== this.runId || !Number.isInteger(envelope.seq)) return true;
    if (envelope.seq <= this.lastSeq || this._ahead.has(envelope.seq)) {
      this.stats.duplicates += 1;
      return true;
    }
    this._ahead.set(envelope.seq, envelope);
    let next;
    while (!this.terminalEvent && (next = this._ahead.get(this.lastSeq + 1))) {
      this._ahead.delete(next.seq);
      this._deliver(next);
    }
    return this._ahead.size < 1000;
  }

  /** @param {number} ms */
  _sleep(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() { clearTimeout(timer); self._wake = null; resolve(undefined); }
      this._wake = done;
    });
  }

  async _loop() {
    let backoff = this.options.minBackoffMs;
    while (!this._closed && !this.terminal) {
      const abort = new AbortController();
      this._abort = abort;
      this._ahead.clear(); // the server replays everything after lastSeq
      let progressed = false;
      try {
        this.stats.connections += 1;
        const response = await this.client._fetch(`${this.client.baseUrl}/v1/runs/${enc(this.runId)}/events`, {
          headers: { ...this.client.headers, Accept: 'text/event-stream', 'Last-Event-ID': String(this.lastSeq) },
          cache: 'no-store',
          signal: abort.signal,
        });
        if (!response.ok) {
          const error = await errorOf(response);
          // A 4xx will not get better by retrying (except timeouts and rate limits).
          if (error.status >= 400 && error.status < 500 && error.status !== 408 && error.status !== 429) {
            this.error = error;
            this._emitState();
            break;
          }
          throw error;
        }
        if (!response.body) throw new TetherError(0, 'no_body', 'the response has no body');
        this._lastActivity = Date.now();
        if (this._transportDown) {
          this._transportDown = false;
          this._emitState();
        }
        for await (const message of parseSSE(response.body, () => { this._lastActivity = Date.now(); })) {
          if (message.event === 'retry' || !message.data) continue;
          /** @type {Envelope} */
          let envelope;
          try {
            envelope = JSON.parse(message.data);
          } catch (_) {
            continue; // not an envelope: ignore it rather than stop following
          }
          const before = this.lastSeq;
          if (!this._accept(envelope)) throw new TetherError(0, 'stream_gap', `missing seq ${this.lastSeq + 1}`);
          if (this.lastSeq > before) {
            progressed = true;
            backoff = this.options.minBackoffMs;
          }
          if (this.terminal) break;
        }
        if (this.terminal) break;
        // The body ended without a terminal event (server restart, proxy cut): catch up.
      } catch (exc) {
        if (this._closed) break;
        this.dispatchEvent(new CustomEvent('transporterror', { detail: exc }));
      } finally {
        if (this._abort === abort) this._abort = null;
      }
      if (this._closed || this.terminal) break;
      this._transportDown = true;
      this._emitState();
      this.stats.reconnects += 1;
      const delay = progressed ? this.options.minBackoffMs : backoff;
      await this._sleep(delay * (1 + Math.random() * 0.2));
      backoff = Math.min(backoff * 2, this.options.maxBackoffMs);
      // While the browser says it is offline, wait for 'online' (or the longest backoff).
      while (!this._closed && typeof navigator !== 'undefined' && navigator.onLine === false) {
        await this._sleep(this.options.maxBackoffMs);
      }
    }
    this._teardown();
    this._resolveFinished(this.terminalEvent);
  }
}
