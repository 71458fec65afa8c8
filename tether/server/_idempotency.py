"""``Idempotency-Key`` on the routes that start or decide something.

An ASGI middleware (inside authentication, so a key belongs to its principal): the first request
with a key claims it (a row ``in_flight``, inserted under the table's primary key, so of many
racing requests across processes exactly one wins) under a short lease it renews while it runs;
its answer, if a 2xx, is stored and replayed to every retry with the same key and body for 24 h.
A retry while the first is still being handled gets 409 ``idempotency_key_in_use``, the same key
with another body 422 ``idempotency_key_reused``, a malformed key 400 ``invalid_idempotency_key``.
An answer that is not a 2xx (validation, auth, limits, conflicts) is not kept: the key can be
used again.

A request whose process died holds its key only until the lease lapses (``LEASE_S``): a retry
then takes the key over. The thread or run the dead request created, if any, was recorded on
the key in the transaction that created it (``tether.store.creating_under``), so the retry
answers with that one (as the first request would have) instead of creating a second.

A streamed start (``Accept: text/event-stream``) is kept as its run id: a retry streams that same
run's events from the beginning (as ``GET /v1/runs/{id}/events`` would), never a second run.

The key is a quoted sf-string (the IETF draft) or the bare token most clients send
(``Idempotency-Key: 3f2a…``); both forms of one key are the same key. Keys past their 24 h are
purged by :func:`purge_keys_forever`, off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..store import KeyClaim, KeyIdent, SeenKey, creating_under
from ._auth import _SCOPE_KEY
from ._errors import error_response

if TYPE_CHECKING:
    from ..store import Store
    from ..store._idempotency import Creates

__all__ = ["Idempotency", "LEASE_S", "PURGE_EVERY_S", "parse_key", "purge_keys_forever"]

log = logging.getLogger("tether.server")

#: How long a request holds its key without renewing it; it renews every third of this while it
#: runs, so only a request whose process died (or stalled this long) loses it.
LEASE_S = 5.0
#: How often keys past their retention are purged (and once at start).
PURGE_EVERY_S = 600.0
#: Keys deleted per transaction by the purge.
PURGE_BATCH = 500
#: The routes that honour a key, and what each creates (recorded on the key).
_ROUTES: tuple[tuple[re.Pattern[str], Creates | None], ...] = (
    (re.compile(r"^/v1/threads$"), "thread"),
    (re.compile(r"^/v1/threads/[^/]+/runs$"), "run"),
    (re.compile(r"^/v1/threads/[^/]+/resume$"), None),
    (re.compile(r"^/v1/interrupts/decide$"), None),
)
#: An sf-string (RFC 8941): printable ASCII in double quotes, ``\\`` and ``\"`` escaped.
_SF_STRING = re.compile(r'^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$')
#: A bare key: visible ASCII but the quote and the backslash (a UUID, Stripe's convention).
_BARE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")
_MAX_KEY = 255
_STREAM = "text/event-stream"


def parse_key(value: str) -> str | None:
    """The key of an ``Idempotency-Key`` header value (``"k"`` or a bare ``k``), or None when malformed."""
    value = value.strip()
    match = _SF_STRING.match(value)
    if match is not None:
        key = re.sub(r"\\(.)", r"\1", match.group(1))
    elif _BARE.match(value):
        key = value
    else:
        return None
    return key if 0 < len(key) <= _MAX_KEY else None


def _route_of(path: str) -> tuple[bool, Creates | None]:
    for pattern, creates in _ROUTES:
        if pattern.match(path):
            return True, creates
    return False, None


class Idempotency:
    """ASGI middleware: replay the stored answer of a request whose key was seen before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        keyed, creates = _route_of(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else (False, None)
        raw = next((v for k, v in scope["headers"] if k == b"idempotency-key"), None) if keyed else None
        if raw is None:
            await self.app(scope, receive, send)
            return
        key = parse_key(raw.decode("latin-1"))
        if key is None:
            await error_response(400, "invalid_idempotency_key", 'Idempotency-Key must be 1 to 255 printable characters, bare or as a quoted string ("…")')(
                scope, receive, send
            )
            return
        body = bytearray()
        while True:  # the body cap (an outer middleware) bounds this
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        principal = getattr(scope.get(_SCOPE_KEY), "name", "") or ""
        ident = KeyIdent(principal=principal, route=scope["path"][:300], key=key)
        digest = hashlib.sha256(body).hexdigest()
        store: Store = scope["app"].state.store
        claim = await store.claim_idempotency_key(ident, digest, lease_s=LEASE_S)
        if isinstance(claim, SeenKey):
            await _answer_seen(claim, digest, scope, receive, send, self.app)
            return
        renewing = asyncio.create_task(_renew(store, claim), name="idempotency lease")
        try:
            if claim.resource is not None and creates is not None:
                # Its first request died after creating this: answer with it, as that one would have.
                await _answer_created(store, claim, creates, scope, receive, send, self.app)
            else:
                with creating_under(claim, creates):
                    await self._first(scope, receive, send, bytes(body), store, claim)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing

    async def _first(self, scope: Scope, receive: Receive, send: Send, body: bytes, store: Store, claim: KeyClaim) -> None:
        sent = False

        async def replay_body() -> Message:
            nonlocal sent
            if sent:  # then the client's own messages (a disconnect)
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        state: dict[str, Any] = {"status": 500, "headers": {}, "stored": False}
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = int(message["status"])
                state["headers"] = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
                if 200 <= state["status"] < 300 and state["headers"].get("content-type", "").startswith(_STREAM):
                    # A streamed start: the run exists once its stream begins; keep its id, not the stream.
                    await _keep_stream(store, claim, state["status"], state["headers"].get("x-run-id"))
                    state["stored"] = True
            elif message["type"] == "http.response.body" and not state["stored"]:
                chunks.append(message.get("body", b""))
                if not message.get("more_body") and 200 <= state["status"] < 300:
                    # Stored before the client has the answer: its next retry finds it.
                    await _keep(store, claim, state["status"], state["headers"], b"".join(chunks))
                    state["stored"] = True
                elif not message.get("more_body"):
                    # Not kept (refused, failed): released before the client has the answer.
                    await store.release_idempotency_key(claim)
                    state["stored"] = True  # nothing left to release
            await send(message)

        try:
            await self.app(scope, replay_body, capture)
        finally:
            if not state["stored"]:
                await store.release_idempotency_key(claim)


async def _renew(store: Store, claim: KeyClaim) -> None:
    """Keep the claim's lease alive while its request runs."""
    while True:
        await asyncio.sleep(LEASE_S / 3)
        try:
            if not await store.renew_idempotency_key(claim, lease_s=LEASE_S):
                return  # answered, released, or taken over
        except Exception as exc:  # the database is away: the next round tries again
            log.warning("renewing an Idempotency-Key's lease failed (%s: %s)", type(exc).__name__, exc)


async def _keep(store: Store, claim: KeyClaim, status: int, headers: dict[str, str], body: bytes) -> None:
    kept = {k: headers[k] for k in ("location", "x-run-id") if k in headers}
    text = json.dumps({"headers": kept, "body": body.decode("utf-8", "replace")})
    await store.keep_idempotent_answer(claim, status_code=status, content_type=headers.get("content-type", "application/json"), response=text)


async def _keep_stream(store: Store, claim: KeyClaim, status: int, run_id: str | None) -> None:
    await store.keep_idempotent_answer(claim, status_code=status, content_type=_STREAM, response=json.dumps({"run_id": run_id}))


async def _replay_stream(run_id: str, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
    """The run's stream from its first event (the route checks the caller may read it)."""
    path = f"/v1/runs/{run_id}/events"
    replay = {**scope, "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"after_seq=0"}
    await app(replay, receive, send)


async def _answer_created(store: Store, claim: KeyClaim, creates: Creates, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
    """Answer a retry whose first request created ``claim.resource`` and died before answering:
    the thread (201) or run (202, or its stream) as it is now, kept as the key's answer."""
    resource = claim.resource or ""
    wants_stream = any(k == b"accept" and _STREAM.encode() in v for k, v in scope["headers"])
    if creates == "run" and wants_stream:
        await _keep_stream(store, claim, 200, resource)
        await _replay_stream(resource, scope, receive, send, app)
        return
    path = f"/v1/threads/{resource}" if creates == "thread" else f"/v1/runs/{resource}"
    status, body = await _get(app, scope, path)
    if status != 200:  # not readable (cannot happen to its own creator): say so, keep nothing
        await store.release_idempotency_key(claim)
        await _send(send, status, "application/json", body, {})
        return
    extra = {} if creates == "thread" else {"location": f"/v1/runs/{resource}", "x-run-id": resource}
    created = 201 if creates == "thread" else 202
    await _keep(store, claim, created, {"content-type": "application/json", **extra}, body)
    await _send(send, created, "application/json", body, {"idempotent-replayed": "true", **extra})


async def _get(app: ASGIApp, scope: Scope, path: str) -> tuple[int, bytes]:
    """GET ``path`` through the application as the caller; its status and body."""
    answer: dict[str, Any] = {"status": 500, "body": bytearray()}

    async def nothing() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def collect(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = int(message["status"])
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    request = {**scope, "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b""}
    await app(request, nothing, collect)
    return answer["status"], bytes(answer["body"])


async def _send(send: Send, status: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
    raw = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _answer_seen(row: SeenKey, digest: str, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
    if row.body_hash != digest:
        await error_response(422, "idempotency_key_reused", "this Idempotency-Key was used with a different request body")(scope, receive, send)
        return
    if row.state != "done":
        await error_response(409, "idempotency_key_in_use", "a request with this Idempotency-Key is still being handled; retry later")(scope, receive, send)
        return
    content_type = row.content_type or "application/json"
    if content_type.startswith(_STREAM):
        await _replay_stream(json.loads(row.response or "{}").get("run_id") or "", scope, receive, send, app)
        return
    kept = json.loads(row.response or "{}")
    headers = {"idempotent-replayed": "true", **{str(k): str(v) for k, v in kept.get("headers", {}).items()}}
    await _send(send, int(row.status_code or 200), content_type, str(kept.get("body", "")).encode(), headers)


async def purge_keys_forever(store: Store, *, every_s: float = PURGE_EVERY_S) -> None:
    """Delete keys past their retention, ``PURGE_BATCH`` per transaction: at start, then every ``every_s``."""
    while True:
        try:
            purged = 0
            while (batch := await store.purge_idempotency_keys(limit=PURGE_BATCH)) > 0:
                purged += batch
                if batch < PURGE_BATCH:
                    break
                await asyncio.sleep(0.05)  # let requests' writes through between batches
            if purged:
                log.info("purged %d Idempotency-Keys past their retention", purged)
        except Exception as exc:  # the database is away: the next round does it
            log.warning("purging old Idempotency-Keys failed (%s: %s)", type(exc).__name__, exc)
        await asyncio.sleep(every_s)
