// @ts-check
/**
 * tether-client.js — a browser client for a Tether server (plain ES module, no build step).
 *
 * Two things live here:
 *
 * - `TetherClient`: thin `fetch` wrappers for the HTTP API (threads, runs, review, audit).
 *   Every error response becomes a `TetherError` carrying the server's `status`, `code`,
 *   `message` and `details`.
 * - `RunStream`: follows one run's events over SSE with `fetch` + `ReadableStream`. It orders
 *   and de-duplicates by `(run_id, seq)`, reconnects from the last seq it delivered (header
 *   `Last-Event-ID`) with backoff whenever the connection drops, and exposes the front-end
 *   state machine
 *
 *       streaming → recovering → streaming | interrupted | cancelling → cancelled | completed | failed
 *
 *   Why these states and not one "stopped": a dropped connection (`recovering`), a run waiting
 *   for a human (`interrupted`) and an explicit stop (`cancelling` → `cancelled`) are three
 *   different things. Aborting the fetch only ever stops *this browser's* transport
 *   (`close()`); stopping the run is the explicit business command `cancel(mode)`, which the
 *   server confirms with a durable `cancelled` event.
 *
 * This file is the entry; the parts live beside it and are re-exported here: `tether-error.js`
 * (`TetherError`), `tether-sse.js` (`parseSSE`), `tether-run-stream.js` (`RunStream`,
 * `TERMINAL_TYPES`). Import from this file; copy all four to use the client elsewhere.
 *
 * Documented in docs/browser-client.md. No dependencies; works in any modern browser.
 */

import { RunStream } from './tether-run-stream.js';
import { TetherError, enc, errorOf } from './tether-error.js';

export { RunStream, TERMINAL_TYPES } from './tether-run-stream.js';
export { TetherError } from './tether-error.js';
export { parseSSE } from './tether-sse.js';

/** @typedef {import('./tether-run-stream.js').Envelope} Envelope */
/** @typedef {import('./tether-run-stream.js').RunState} RunState */
/** @typedef {import('./tether-run-stream.js').RunStreamOptions} RunStreamOptions */

/** Talks to a Tether server. Same origin by default. */
export class TetherClient {
  /**
   * @param {object} [options]
   * @param {string} [options.baseUrl='']   e.g. "https://agents.example.com" ('' = same origin)
   * @param {string|null} [options.apiKey]  an API key (`tk_…`), sent as `Authorization: Bearer …`
   *   on every request, event streams included (never in a URL)
   * @param {Record<string, string>} [options.headers]  sent with every request
   * @param {typeof fetch} [options.fetch]
   */
  constructor({ baseUrl = '', apiKey = null, headers = {}, fetch: fetchImpl } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.headers = { ...headers };
    this._fetch = fetchImpl || globalThis.fetch.bind(globalThis);
    this.setApiKey(apiKey);
  }

  /** Use `apiKey` from now on (`null`: none, e.g. after signing out). @param {string|null} apiKey */
  setApiKey(apiKey) {
    if (apiKey) this.headers.Authorization = `Bearer ${apiKey}`;
    else delete this.headers.Authorization;
  }

  /** Who the server takes this client for. @returns {Promise<{name: string, roles: string[], auth: 'open'|'keys'}>} */
  me() { return this.request('GET', '/v1/me'); }

  /**
   * One JSON request. Throws `TetherError` for an error status or an unreachable server.
   * @param {string} method @param {string} path @param {any} [body]
   * @returns {Promise<any>}
   */
  async request(method, path, body) {
    /** @type {RequestInit} */
    const init = { method, headers: { Accept: 'application/json', ...this.headers }, cache: 'no-store' };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      /** @type {Record<string, string>} */ (init.headers)['Content-Type'] = 'application/json';
    }
    let response;
    try {
      response = await this._fetch(this.baseUrl + path, init);
    } catch (exc) {
      throw new TetherError(0, 'network_error', 'could not reach the server', { cause: String(exc) });
    }
    if (!response.ok) throw await errorOf(response);
    return response.status === 204 ? null : response.json();
  }

  // -- threads ---------------------------------------------------------------------------

  /**
   * A new thread. Without a `title` it takes one from its first message.
   * @param {Record<string, any>} [metadata] @param {{title?: string}} [options]
   */
  createThread(metadata = {}, { title } = {}) {
    return this.request('POST', '/v1/threads', title === undefined ? { metadata } : { metadata, title });
  }
  /** Give a thread a new title (1–200 characters once on one line); its owner only. */
  renameThread(threadId, title) { return this.request('PATCH', `/v1/threads/${enc(threadId)}`, { title }); }
  /** @returns {Promise<any[]>} newest first */
  async listThreads() { return (await this.request('GET', '/v1/threads')).items; }
  /** @param {string} threadId  the thread, with `active_run_id` and `pending_interrupt` */
  getThread(threadId) { return this.request('GET', `/v1/threads/${enc(threadId)}`); }
  /**
   * @param {string} threadId @param {'path'|'tree'} [view='path']
   * @returns {Promise<{items: any[], active_leaf_id: string|null}>}
   */
  messages(threadId, view = 'path') { return this.request('GET', `/v1/threads/${enc(threadId)}/messages?view=${view}`); }
  /** Switch branch: the active leaf becomes the newest leaf under `messageId`. */
  setActiveLeaf(threadId, messageId) {
    return this.request('PUT', `/v1/threads/${enc(threadId)}/active_leaf`, { message_id: messageId });
  }
  /** Store an edited version of an assistant message (becomes the active sibling). */
  editMessage(messageId, content) { return this.request('PATCH', `/v1/messages/${enc(messageId)}`, { content }); }

  // -- runs ------------------------------------------------------------------------------

  /**
   * Start a run. `parentId`: leave `undefined` for the active leaf, `null` for a new root
   * (editing the first message), a message id to fork. No `content` with a user message as
   * `parentId` regenerates its answer.
   * @param {string} threadId
   * @param {{content?: string, parentId?: string|null, config?: Record<string, any>}} [options]
   */
  startRun(threadId, { content, parentId, config } = {}) {
    /** @type {Record<string, any>} */
    const body = {};
    if (content !== undefined) body.input = { content };
    if (parentId !== undefined) body.parent_id = parentId;
    if (config && Object.keys(config).length) body.config = config;
    return this.request('POST', `/v1/threads/${enc(threadId)}/runs`, body);
  }
  /** @param {string} runId */
  getRun(runId) { return this.request('GET', `/v1/runs/${enc(runId)}`); }
  /**
   * Explicitly cancel a run. `soft` lets a running tool finish; `hard` stops it too.
   * @param {string} runId @param {'soft'|'hard'} [mode='soft'] @param {string} [reason]
   */
  cancel(runId, mode = 'soft', reason) {
    return this.request('POST', `/v1/runs/${enc(runId)}/cancel`, reason ? { mode, reason } : { mode });
  }
  /** Steer a running run: send it a message. */
  steer(runId, content) { return this.request('POST', `/v1/runs/${enc(runId)}/messages`, { content }); }
  /** One JSON page of stored events. @returns {Promise<Envelope[]>} */
  async events(runId, { afterSeq = 0, limit = 1000 } = {}) {
    return (await this.request('GET', `/v1/runs/${enc(runId)}/events?after_seq=${afterSeq}&limit=${limit}`)).items;
  }
  /** Where the run's time went, derived by the server from its event log (`run-timeline.js` derives the same). */
  timeline(runId) { return this.request('GET', `/v1/runs/${enc(runId)}/timeline`); }

  /**
   * Follow a run's events; see `RunStream`. Starts at once.
   * @param {string} runId @param {RunStreamOptions} [options]
   */
  follow(runId, options = {}) { return new RunStream(this, runId, options).start(); }

  // -- human review ----------------------------------------------------------------------

  /**
   * Decide every action of an interrupt, in order: `{decision: 'approve', allow?}`,
   * `{decision: 'reject', reason?}`, `{decision: 'edit', args}`, `{decision: 'respond', message}`.
   * @param {string} threadId @param {string} interruptId @param {Array<Record<string, any>>} decisions
   */
  resume(threadId, interruptId, decisions) {
    return this.request('POST', `/v1/threads/${enc(threadId)}/resume`, { interrupt_id: interruptId, decisions });
  }
  /** A thread's standing approvals: the active ones first, then the ended ones. @returns {Promise<any[]>} */
  async listAllowances(threadId) { return (await this.request('GET', `/v1/threads/${enc(threadId)}/allowances`)).items; }
  /** Revoke a standing approval: the calls it covered are asked about again (in every process). */
  revokeAllowance(allowanceId) { return this.request('DELETE', `/v1/allowances/${enc(allowanceId)}`); }
  /** The approvals inbox: pending interrupts this caller may decide, soonest expiry first. @returns {Promise<any[]>} */
  async inbox({ limit = 100 } = {}) { return (await this.request('GET', `/v1/interrupts?status=pending&limit=${limit}`)).items; }
  /**
   * Approve or reject every action of several interrupts; one result per id
   * (`{interrupt_id, status, run, error}`), each decided on its own.
   * @param {string[]} interruptIds @param {'approve'|'reject'} decision @param {string} [reason]
   * @param {{scope: string, args: string, ttl_s: number}} [allow] with `approve`: a standing approval with each
   * @returns {Promise<any[]>}
   */
  async decideMany(interruptIds, decision, reason, allow) {
    /** @type {Record<string, any>} */
    const body = { interrupt_ids: interruptIds, decision };
    if (reason) body.reason = reason;
    if (allow) body.allow = allow;
    return (await this.request('POST', '/v1/interrupts/decide', body)).items;
  }
  /** @param {{threadId?: string, runId?: string}} filter @returns {Promise<any[]>} */
  async audit({ threadId, runId } = {}) {
    const query = new URLSearchParams();
    if (threadId) query.set('thread_id', threadId);
    if (runId) query.set('run_id', runId);
    return (await this.request('GET', `/v1/audit?${query}`)).items;
  }
}
