"""``Idempotency-Key`` on the routes that start or decide something.

An ASGI middleware (inside authentication, so a key belongs to its principal): the first request
with a key claims it (a row ``in_flight``, inserted under the table's primary key, so of many
racing requests across processes exactly one wins); its answer, if a 2xx, is stored and replayed
to every retry with the same key and body for 24 h. A retry while the first is still being
handled gets 409 ``idempotency_key_in_use``, the same key with another body 422
``idempotency_key_reused``, a malformed key 400 ``invalid_idempotency_key``. An answer that is not
a 2xx (validation, auth, limits, conflicts) is not kept: the key can be used again.

A streamed start (``Accept: text/event-stream``) is kept as its run id: a retry streams that same
run's events from the beginning (as ``GET /v1/runs/{id}/events`` would), never a second run.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._ids import utcnow
from ._auth import _SCOPE_KEY
from ._errors import error_response

__all__ = ["Idempotency", "RETENTION"]

#: How long a key and its answer are kept.
RETENTION = timedelta(hours=24)
#: The routes that honour a key: create a thread, start a run, resume, decide many.
_ROUTES = (
    re.compile(r"^/v1/threads$"),
    re.compile(r"^/v1/threads/[^/]+/runs$"),
    re.compile(r"^/v1/threads/[^/]+/resume$"),
    re.compile(r"^/v1/interrupts/decide$"),
)
#: An sf-string (RFC 8941): printable ASCII in double quotes, ``\\`` and ``\"`` escaped.
_SF_STRING = re.compile(r'^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$')
_MAX_KEY = 255
_STREAM = "text/event-stream"


def parse_key(value: str) -> str | None:
    """The key of an ``Idempotency-Key`` header value, or None when malformed."""
    match = _SF_STRING.match(value.strip())
    if match is None:
        return None
    key = re.sub(r"\\(.)", r"\1", match.group(1))
    return key if 0 < len(key) <= _MAX_KEY else None


class Idempotency:
    """ASGI middleware: replay the stored answer of a request whose key was seen before."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not any(r.match(scope["path"]) for r in _ROUTES):
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == b"idempotency-key"), None)
        if raw is None:
            await self.app(scope, receive, send)
            return
        key = parse_key(raw.decode("latin-1"))
        if key is None:
            await error_response(400, "invalid_idempotency_key", 'Idempotency-Key must be a quoted string ("…") of 1 to 255 characters')(scope, receive, send)
            return
        body = bytearray()
        while True:  # the body cap (an outer middleware) bounds this
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        principal = getattr(scope.get(_SCOPE_KEY), "name", "") or ""
        route = scope["path"][:300]
        digest = hashlib.sha256(body).hexdigest()
        store = scope["app"].state.store
        claim = await _claim(store, principal, route, key, digest)
        if claim is not None:
            await _answer_seen(claim, digest, scope, receive, send, self.app)
            return
        await self._first(scope, receive, send, bytes(body), store, (principal, route, key))

    async def _first(self, scope: Scope, receive: Receive, send: Send, body: bytes, store: Any, ident: tuple[str, str, str]) -> None:
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
                    await _store(store, ident, state["status"], _STREAM, json.dumps({"run_id": state["headers"].get("x-run-id")}))
                    state["stored"] = True
            elif message["type"] == "http.response.body" and not state["stored"]:
                chunks.append(message.get("body", b""))
                if not message.get("more_body") and 200 <= state["status"] < 300:
                    # Stored before the client has the answer: its next retry finds it.
                    headers = state["headers"]
                    kept = {k: headers[k] for k in ("location", "x-run-id") if k in headers}
                    text = json.dumps({"headers": kept, "body": b"".join(chunks).decode("utf-8", "replace")})
                    await _store(store, ident, state["status"], headers.get("content-type", "application/json"), text)
                    state["stored"] = True
                elif not message.get("more_body"):
                    # Not kept (refused, failed): released before the client has the answer.
                    await _release(store, ident)
                    state["stored"] = True  # nothing left to release
            await send(message)

        try:
            await self.app(scope, replay_body, capture)
        finally:
            if not state["stored"]:
                await _release(store, ident)


async def _claim(store: Any, principal: str, route: str, key: str, digest: str) -> Any:
    """Claim the key (None: this request is the first) or the row of the request that holds it."""
    from ..webhooks._tables import idempotency_keys as t

    now = utcnow()
    ident = [t.c.principal == principal, t.c.route == route, t.c.key == key]
    row_values = {
        "principal": principal,
        "route": route,
        "key": key,
        "body_hash": digest,
        "state": "in_flight",
        "created_at": now,
        "expires_at": now + RETENTION,
    }
    for _ in range(3):
        try:
            async with store._writing() as conn:
                row = (await conn.execute(sa.select(t).where(*ident))).first()
                if row is not None and row.expires_at > now:
                    return row
                if row is not None:
                    await conn.execute(t.delete().where(*ident))
                await conn.execute(t.insert().values(**row_values))
                # Now and then, forget keys past their retention.
                if digest.endswith("00"):
                    await conn.execute(t.delete().where(t.c.expires_at < now))
                return None
        except sa.exc.IntegrityError:
            continue  # another process inserted it first: read its row
    async with store._reading() as conn:
        return (await conn.execute(sa.select(t).where(*ident))).first()


async def _store(store: Any, ident: tuple[str, str, str], status: int, content_type: str, text: str) -> None:
    from ..webhooks._tables import idempotency_keys as t

    principal, route, key = ident
    async with store._writing() as conn:
        await conn.execute(
            t.update()
            .where(t.c.principal == principal, t.c.route == route, t.c.key == key)
            .values(state="done", status_code=status, content_type=content_type, response=text)
        )


async def _release(store: Any, ident: tuple[str, str, str]) -> None:
    from ..webhooks._tables import idempotency_keys as t

    principal, route, key = ident
    async with store._writing() as conn:
        await conn.execute(t.delete().where(t.c.principal == principal, t.c.route == route, t.c.key == key, t.c.state == "in_flight"))


async def _answer_seen(row: Any, digest: str, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
    if row.body_hash != digest:
        await error_response(422, "idempotency_key_reused", "this Idempotency-Key was used with a different request body")(scope, receive, send)
        return
    if row.state != "done":
        await error_response(409, "idempotency_key_in_use", "a request with this Idempotency-Key is still being handled; retry later")(scope, receive, send)
        return
    content_type = row.content_type or "application/json"
    if content_type.startswith(_STREAM):
        # The same run's stream from its first event: the route checks the caller may read it.
        run_id = json.loads(row.response or "{}").get("run_id") or ""
        path = f"/v1/runs/{run_id}/events"
        replay = {**scope, "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"after_seq=0"}
        await app(replay, receive, send)
        return
    kept = json.loads(row.response or "{}")
    body = str(kept.get("body", "")).encode()
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), (b"idempotent-replayed", b"true")]
    headers += [(k.encode(), str(v).encode()) for k, v in kept.get("headers", {}).items()]
    await send({"type": "http.response.start", "status": int(row.status_code), "headers": headers})
    await send({"type": "http.response.body", "body": body})
