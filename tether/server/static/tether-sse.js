// @ts-check
/**
 * tether-sse.js — part of the browser client (`tether-client.js` re-exports `parseSSE`): an SSE
 * byte stream parsed into messages.
 */

/**
 * Parse an SSE byte stream into `{id, event, data, retry}` messages (the WHATWG algorithm:
 * lines end in CRLF, LF or CR; `data` lines join with "\n"; `:` lines are comments).
 * Calls `onActivity` for every chunk, comments included (a `: ping` proves the link is alive).
 * @param {ReadableStream<Uint8Array>} body
 * @param {() => void} onActivity
 * @returns {AsyncGenerator<{id: string|null, event: string, data: string, retry: number|null}>}
 */
export async function* parseSSE(body, onActivity = () => {}) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let data = [];
  let event = '';
  let id = null;
  let retry = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return; // an unfinished message at EOF is dropped, as the spec says
      onActivity();
      buffer += decoder.decode(value, { stream: true });
      let match;
      while ((match = /\r\n|\n|\r/.exec(buffer)) !== null) {
        // A lone CR at the very end may be the first half of CRLF: wait for more.
        if (match[0] === '\r' && match.index === buffer.length - 1) break;
        const line = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        if (line === '') {
          if (data.length) yield { id, event: event || 'message', data: data.join('\n'), retry };
          data = [];
          event = '';
          retry = null;
          continue;
        }
        if (line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? '' : line.slice(colon + 1);
        if (text.startsWith(' ')) text = text.slice(1);
        if (field === 'data') data.push(text);
        else if (field === 'event') event = text;
        else if (field === 'id' && !text.includes('\0')) id = text;
        else if (field === 'retry' && /^\d+$/.test(text)) yield { id, event: 'retry', data: '', retry: Number(text) };
      }
    }
  } finally {
    // Leaving early (terminal event, abort, error) closes the connection too.
    reader.cancel().catch(() => {});
  }
}
