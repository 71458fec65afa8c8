"""Server-sent events encoding: pure functions, no web framework.

The server only wires these into a streaming response. Each envelope becomes one SSE event whose
``id`` is the run-local ``seq``, so a browser's ``Last-Event-ID`` (or ``?after_seq``) resumes the
stream exactly after the last event the client saw.
"""

from __future__ import annotations

__all__ = ["encode_event", "encode_retry", "encode_comment", "PING"]


def encode_event(seq: int, event_type: str, envelope_json: str) -> str:
    """Encode one stored envelope (already JSON, one line) as an SSE event."""
    if "\n" in envelope_json or "\r" in envelope_json:
        raise ValueError("envelope JSON must be a single line")
    return f"id: {seq}\nevent: {event_type}\ndata: {envelope_json}\n\n"


def encode_retry(milliseconds: int) -> str:
    """Tell the client how long to wait before reconnecting."""
    return f"retry: {int(milliseconds)}\n\n"


def encode_comment(text: str) -> str:
    """An SSE comment line (ignored by clients; keeps proxies from timing out)."""
    return "".join(f": {line}\n" for line in text.splitlines() or [""]) + "\n"


PING = encode_comment("ping")
