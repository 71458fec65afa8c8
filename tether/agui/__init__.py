"""AG-UI, the open agent–UI event protocol (1.0), spoken by Tether.

The protocol layer, with no web framework in it (the routes are ``tether.server._agui``):

- :mod:`tether.agui._mapping` — Tether's events as AG-UI events, segment by segment, with the
  SSE ids that make reconnecting gapless (:class:`EventMapper`, :class:`Cursor`);
- :mod:`tether.agui._interrupts` — a Tether interrupt as AG-UI interrupts, and AG-UI resume
  entries as Tether decisions;
- :mod:`tether.agui._history` — the conversation as AG-UI messages, and a client's message
  list matched against the thread's tree.

``docs/ag-ui.md`` has the mapping table and what Tether adds to AG-UI.
"""

from ._history import agui_messages, message_text, parked_messages, path_before_run, plan_run
from ._interrupts import agui_interrupt_id, agui_interrupts, decisions_for, response_schema, tether_interrupt_id
from ._mapping import PROTOCOL_VERSION, Cursor, EventMapper, Frame, Transcript, encode_frame, reasoning_id, speaks_cancelled_outcome, tool_message_id

__all__ = [
    "PROTOCOL_VERSION",
    "EventMapper",
    "Transcript",
    "Frame",
    "Cursor",
    "encode_frame",
    "tool_message_id",
    "reasoning_id",
    "speaks_cancelled_outcome",
    "agui_interrupt_id",
    "tether_interrupt_id",
    "agui_interrupts",
    "response_schema",
    "decisions_for",
    "plan_run",
    "agui_messages",
    "parked_messages",
    "path_before_run",
    "message_text",
]
