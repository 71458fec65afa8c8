"""The event vocabulary and its encodings (pure functions, no server)."""

from __future__ import annotations

import json
from datetime import UTC

from hypothesis import given
from hypothesis import strategies as st

from tether.events import EVENT_TYPES, TERMINAL_TYPES, DeltaEncoder, Envelope, Thinking, Token, format_ts, now_ts
from tether.sse import PING, encode_event, encode_retry


@given(text=st.text(), message_id=st.text(min_size=1, max_size=40), seq=st.integers(min_value=1, max_value=2**31 - 1))
def test_the_delta_fast_path_encodes_exactly_like_the_typed_event(text: str, message_id: str, seq: int) -> None:
    ts = now_ts()
    for cls in (Token, Thinking):
        typed = Envelope.encode("run_x", seq, cls(message_id=message_id, text=text), ts)
        fast = Envelope.encode_delta("run_x", seq, cls.type, message_id, text, ts)
        assert fast == typed
        assert Envelope.from_json(fast).data == {"message_id": message_id, "text": text}


@given(
    run_id=st.text(min_size=1, max_size=40),
    deltas=st.lists(st.tuples(st.sampled_from([Token, Thinking]), st.sampled_from(["msg_a", "msg_b", 'm"\\\u2028']), st.text()), min_size=1, max_size=8),
)
def test_a_runs_delta_encoder_encodes_exactly_like_the_typed_event_as_messages_change(
    run_id: str, deltas: list[tuple[type[Token] | type[Thinking], str, str]]
) -> None:
    encoder = DeltaEncoder(run_id)
    ts = now_ts()
    for seq, (cls, message_id, text) in enumerate(deltas, start=1):
        assert encoder.encode(seq, cls.type, message_id, text, ts) == Envelope.encode(run_id, seq, cls(message_id=message_id, text=text), ts)


@given(text=st.text())
def test_an_envelope_encodes_as_one_sse_event_whose_id_is_its_seq(text: str) -> None:
    envelope = Envelope.encode("run_x", 7, Token(message_id="m", text=text), now_ts())
    frame = encode_event(7, "token", envelope)
    lines = frame.split("\n")
    assert lines[:2] == ["id: 7", "event: token"]
    assert lines[2] == "data: " + envelope and lines[3:] == ["", ""]
    assert json.loads(lines[2][len("data: ") :])["data"]["text"] == text


def test_the_stream_preamble_and_keepalive_are_sse_fields_and_comments() -> None:
    assert encode_retry(1500) == "retry: 1500\n\n"
    assert PING == ": ping\n\n"


def test_now_ts_has_the_wire_format_of_format_ts() -> None:
    from datetime import datetime

    before = format_ts(datetime.now(UTC))
    value = now_ts()
    after = format_ts(datetime.now(UTC))
    assert len(value) == len(before) == 27 and value.endswith("Z")
    assert before <= value <= after


def test_exactly_done_error_and_cancelled_are_terminal() -> None:
    assert TERMINAL_TYPES == {"done", "error", "cancelled"}
    assert set(EVENT_TYPES) == {
        "run_started",
        "token",
        "thinking",
        "tool_call",
        "tool_result",
        "interrupt",
        "resumed",
        "user_message",
        "status",
        "done",
        "error",
        "cancelled",
    }
