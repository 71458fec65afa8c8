"""The server's views turn store records into exactly the JSON the API documents, field by field
and in order (the store and the runtime return records and know nothing of HTTP)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tether.review import ActionRequest, ParkedCall, ParkedTurn, ReviewConfig
from tether.server._views import audit_entry_view, interrupt_view, message_view, queued_message_view, run_view, thread_view
from tether.store import AuditEntry, InterruptRecord, MessageRecord, RunRecord, RunStatus, ThreadRecord

T0 = datetime(2026, 11, 30, 20, 0, 0, 123456, tzinfo=UTC)
T0_TEXT = "2026-11-30T20:00:00.123456Z"


def test_a_thread_view_has_the_documented_fields_in_order() -> None:
    thread = ThreadRecord(id="thr_1", owner="alice", metadata={"k": 1}, active_leaf_id="msg_2", created_at=T0, title="Refunds")
    assert thread_view(thread, active_run_id="run_1", pending_interrupt={"id": "int_1"}) == {
        "id": "thr_1",
        "owner": "alice",
        "title": "Refunds",
        "metadata": {"k": 1},
        "active_leaf_id": "msg_2",
        "active_run_id": "run_1",
        "pending_interrupt": {"id": "int_1"},
        "created_at": T0_TEXT,
    }
    assert list(thread_view(thread, active_run_id=None)) == [
        "id",
        "owner",
        "title",
        "metadata",
        "active_leaf_id",
        "active_run_id",
        "pending_interrupt",
        "created_at",
    ]


def test_a_run_view_shows_its_status_as_the_stored_string_and_its_cancel_request() -> None:
    run = RunRecord(
        id="run_1",
        thread_id="thr_1",
        status=RunStatus.CANCELLING,
        config={"max_steps": 3},
        input_message_id="msg_1",
        created_at=T0,
        started_at=T0,
        ended_at=None,
        error=None,
        cancel_mode="soft",
        cancel_reason="stop",
        cancel_actor="alice",
    )
    view = run_view(run)
    assert view == {
        "id": "run_1",
        "thread_id": "thr_1",
        "status": "cancelling",
        "config": {"max_steps": 3},
        "input_message_id": "msg_1",
        "created_at": T0_TEXT,
        "started_at": T0_TEXT,
        "ended_at": None,
        "error": None,
        "requested_by": None,
        "usage": {"input_tokens": 0, "output_tokens": 0, "calls": []},
        "cancel": {"mode": "soft", "reason": "stop", "actor": "alice"},
        "pending_interrupt": None,
    }
    assert type(view["status"]) is str
    assert (
        run_view(
            RunRecord(
                id="run_2",
                thread_id="thr_1",
                status=RunStatus.QUEUED,
                config={},
                input_message_id=None,
                created_at=T0,
                started_at=None,
                ended_at=None,
                error=None,
                cancel_mode=None,
                cancel_reason=None,
                cancel_actor=None,
            )
        )["cancel"]
        is None
    )


def test_a_message_view_places_the_message_among_its_siblings() -> None:
    message = MessageRecord(
        id="msg_2", thread_id="thr_1", parent_id="msg_0", run_id=None, role="assistant", content="hi", created_at=T0, edited_from_id="msg_1"
    )
    view = message_view(message, sibling_ids=["msg_1", "msg_2"])
    assert view == {
        "id": "msg_2",
        "thread_id": "thr_1",
        "parent_id": "msg_0",
        "run_id": None,
        "role": "assistant",
        "content": "hi",
        "tool_calls": None,
        "tool_call_id": None,
        "name": None,
        "status": "complete",
        "finish_reason": None,
        "created_at": T0_TEXT,
        "edited_by_user": True,
        "edited_from_id": "msg_1",
        "sibling_ids": ["msg_1", "msg_2"],
        "sibling_index": 1,
    }
    assert message_view(message)["sibling_ids"] == ["msg_2"]


def test_a_queued_steering_message_view_names_its_run_and_thread() -> None:
    run = RunRecord(
        id="run_1",
        thread_id="thr_1",
        status=RunStatus.RUNNING,
        config={},
        input_message_id="msg_1",
        created_at=T0,
        started_at=T0,
        ended_at=None,
        error=None,
        cancel_mode=None,
        cancel_reason=None,
        cancel_actor=None,
    )
    assert queued_message_view("msg_9", run, "shorter") == {
        "id": "msg_9",
        "run_id": "run_1",
        "thread_id": "thr_1",
        "role": "user",
        "content": "shorter",
        "status": "queued",
    }


def test_an_interrupt_view_hides_the_parked_turn_and_counts_the_wait() -> None:
    interrupt = InterruptRecord(
        id="int_1",
        run_id="run_1",
        thread_id="thr_1",
        status="pending",
        action_requests=[ActionRequest(call_id="c", action="refund", args={}, description="Refund", risk="destructive")],
        review_configs=[ReviewConfig(allowed_decisions=["approve"])],
        turn=ParkedTurn(calls=(ParkedCall(id="c", name="refund", args={"card": "secret"}, gated=True),)),
        decisions=None,
        resolved_by=None,
        created_at=T0,
        expires_at=T0 + timedelta(minutes=10),
        resolved_at=None,
    )
    view = interrupt_view(interrupt, now=T0 + timedelta(seconds=4))
    assert view == {
        "id": "int_1",
        "run_id": "run_1",
        "thread_id": "thr_1",
        "requested_by": None,
        "status": "pending",
        "action_requests": [{"call_id": "c", "action": "refund", "args": {}, "description": "Refund", "risk": "destructive"}],
        "review_configs": [{"allowed_decisions": ["approve"]}],
        "decisions": None,
        "resolved_by": None,
        "created_at": T0_TEXT,
        "expires_at": "2026-11-30T20:10:00.123456Z",
        "resolved_at": None,
        "waited_s": 4.0,
        "expires_in_s": 596.0,
    }


def test_an_audit_entry_view_has_every_field_of_the_audit_log() -> None:
    entry = AuditEntry(
        action="decision",
        actor="bob",
        thread_id="thr_1",
        run_id="run_1",
        interrupt_id="int_1",
        call_id="call_1",
        tool="refund",
        args_digest="sha256:ab",
        decision="approve",
        reason=None,
        outcome="accepted",
        details=None,
        id="aud_1",
        ts=T0,
    )
    assert audit_entry_view(entry) == {
        "id": "aud_1",
        "ts": T0_TEXT,
        "actor": "bob",
        "action": "decision",
        "thread_id": "thr_1",
        "run_id": "run_1",
        "interrupt_id": "int_1",
        "call_id": "call_1",
        "tool": "refund",
        "args_digest": "sha256:ab",
        "decision": "approve",
        "reason": None,
        "outcome": "accepted",
        "details": None,
    }
