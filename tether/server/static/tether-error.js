// @ts-check
/**
 * tether-error.js — part of the browser client (`tether-client.js` re-exports what is public):
 * `TetherError`, how an error response becomes one, and URL-encoding of path parts.
 */

/** An error response from the server, or a transport failure (`status` 0, `code` "network_error"). */
export class TetherError extends Error {
  /**
   * @param {number} status HTTP status (0 when the server could not be reached)
   * @param {string} code   the server's error code, e.g. "invalid_edited_args"
   * @param {string} message
   * @param {any} [details] the server's `details` (for 422: a list of `{loc, msg, type}`)
   */
  constructor(status, code, message, details = null) {
    super(message);
    this.name = 'TetherError';
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** @param {Response} response @returns {Promise<TetherError>} */
export async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    /* not JSON */
  }
  const error = body && typeof body === 'object' ? body.error : null;
  if (error && typeof error.code === 'string') {
    return new TetherError(response.status, error.code, error.message || error.code, error.details ?? null);
  }
  return new TetherError(response.status, 'http_error', `HTTP ${response.status}`);
}

/** @param {string} value */
export function enc(value) { return encodeURIComponent(value); }
