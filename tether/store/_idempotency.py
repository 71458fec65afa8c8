"""The store's ``Idempotency-Key`` records: claim a key, hold it under a short lease while the
request runs, keep its answer, release it; and what the request created, recorded in the very
transaction that created it.

A key in flight is held by one request (``holder``) until ``lease_expires_at``, which that
request renews while it runs. A request whose process died holds it no longer once the lease
lapses: the next request with the key takes it over. If the dead request had created a run or a
thread, its id is on the key (written by the transaction that created it, or not at all), so the
request that takes the key over answers with that run instead of starting a second one. The
create itself is conditional on still holding the key: of two requests that both believe they
hold it (a stall longer than the lease), one creates and the other's create rolls back.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .._ids import new_id, utcnow
from ..errors import Conflict
from ._engine import StoreBase, Writing
from ._tables import idempotency_keys

__all__ = ["IdempotencyStore", "KeyIdent", "KeyClaim", "SeenKey", "Creates", "creating_under", "record_created", "KEY_RETENTION"]

#: How long a key and its answer are kept.
KEY_RETENTION = timedelta(hours=24)

#: What a keyed request creates, recorded on its key: a thread, a run.
Creates = Literal["thread", "run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyIdent:
    """A key as scoped: the principal, the route and the key itself."""

    principal: str
    route: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyClaim:
    """This request holds the key."""

    ident: KeyIdent
    #: This request's token on the key's row (its lease and writes are conditional on it).
    holder: str
    #: Set when the key was taken over from a request that died after creating something:
    #: that run or thread's id, to answer with instead of creating another.
    resource: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SeenKey:
    """A key another request holds or answered."""

    body_hash: str
    #: ``in_flight`` (another request holds it, its lease is live) or ``done``.
    state: str
    status_code: int | None
    content_type: str | None
    response: str | None
    lease_expires_at: datetime | None


@dataclass(slots=True)
class _Creating:
    claim: KeyClaim
    creates: Creates
    recorded: bool = False


#: The key under which the current request creates things (set around a keyed request).
_creating: contextvars.ContextVar[_Creating | None] = contextvars.ContextVar("tether_idempotency_creating", default=None)


@contextlib.contextmanager
def creating_under(claim: KeyClaim, creates: Creates | None) -> Iterator[None]:
    """Within this block, the first ``creates`` (a thread, a run) the store creates is recorded
    on ``claim``'s key in its own transaction, or refused (409) if the key is no longer held."""
    if creates is None:
        yield
        return
    token = _creating.set(_Creating(claim, creates))
    try:
        yield
    finally:
        _creating.reset(token)


def records(creates: Creates) -> bool:
    """Whether a create of this kind now is to be recorded on a key (the store then takes the
    path whose transaction can hold that write)."""
    creating = _creating.get()
    return creating is not None and creating.creates == creates and not creating.recorded


async def record_created(conn: Writing, creates: Creates, resource_id: str) -> None:
    """In the transaction creating ``resource_id``: record it on the key the request holds.
    :class:`~tether.errors.Conflict` ``idempotency_key_in_use`` (rolling the create back) when
    the key was taken over meanwhile."""
    creating = _creating.get()
    if creating is None or creating.creates != creates or creating.recorded:
        return
    t, claim = idempotency_keys, creating.claim
    held = await conn.execute(t.update().where(*_ident(claim.ident), t.c.holder == claim.holder, t.c.state == "in_flight").values(resource=resource_id))
    if held.rowcount != 1:
        raise Conflict("another request with this Idempotency-Key took it over; retry to get its answer", code="idempotency_key_in_use")
    creating.recorded = True


def _ident(ident: KeyIdent) -> list[Any]:
    t = idempotency_keys
    return [t.c.principal == ident.principal, t.c.route == ident.route, t.c.key == ident.key]


def _record(row: Any) -> SeenKey:
    return SeenKey(
        body_hash=row.body_hash,
        state=row.state,
        status_code=row.status_code,
        content_type=row.content_type,
        response=row.response,
        lease_expires_at=row.lease_expires_at,
    )


class IdempotencyStore(StoreBase):
    """``Idempotency-Key`` operations of :class:`~tether.store.Store`."""

    async def claim_idempotency_key(self, ident: KeyIdent, body_hash: str, *, lease_s: float) -> KeyClaim | SeenKey:
        """Hold the key for ``lease_s`` (a :class:`KeyClaim`), or the :class:`SeenKey` of the
        request that holds or answered it. A key whose holder's lease lapsed is taken over."""
        t = idempotency_keys
        for _ in range(5):
            now = utcnow()
            holder = new_id("idem")
            lease = now + timedelta(seconds=lease_s)
            try:
                async with self._writing() as conn:
                    row = (await conn.execute(sa.select(t).where(*_ident(ident)))).first()
                    if row is not None and row.expires_at > now:
                        # A row from before leases (migration 0011) counts from its creation.
                        until = row.lease_expires_at or row.created_at + timedelta(seconds=lease_s)
                        if row.state != "in_flight" or until > now or row.body_hash != body_hash:
                            return _record(row)
                        was = t.c.holder.is_(None) if row.holder is None else t.c.holder == row.holder
                        taken = await conn.execute(
                            t.update().where(*_ident(ident), t.c.state == "in_flight", was).values(holder=holder, lease_expires_at=lease)
                        )
                        if taken.rowcount != 1:
                            continue  # another request took it over first: read its row again
                        return KeyClaim(ident=ident, holder=holder, resource=row.resource)
                    if row is not None:  # past its retention
                        await conn.execute(t.delete().where(*_ident(ident)))
                    await conn.execute(
                        t.insert().values(
                            principal=ident.principal,
                            route=ident.route,
                            key=ident.key,
                            body_hash=body_hash,
                            state="in_flight",
                            created_at=now,
                            expires_at=now + KEY_RETENTION,
                            holder=holder,
                            lease_expires_at=lease,
                        )
                    )
                    return KeyClaim(ident=ident, holder=holder)
            except IntegrityError:
                continue  # another request inserted it first: read its row
        async with self._reading() as conn:
            row = (await conn.execute(sa.select(t).where(*_ident(ident)))).first()
        if row is None:
            raise Conflict("this Idempotency-Key is contended; retry later", code="idempotency_key_in_use")
        return _record(row)

    async def renew_idempotency_key(self, claim: KeyClaim, *, lease_s: float) -> bool:
        """Extend the claim's lease; False when the key is answered or was taken over."""
        t = idempotency_keys
        async with self._writing() as conn:
            renewed = await conn.execute(
                t.update()
                .where(*_ident(claim.ident), t.c.holder == claim.holder, t.c.state == "in_flight")
                .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
            )
            return bool(renewed.rowcount == 1)

    async def keep_idempotent_answer(self, claim: KeyClaim, *, status_code: int, content_type: str, response: str) -> bool:
        """Keep the answer of the request holding the key (replayed to every retry for 24 h)."""
        t = idempotency_keys
        async with self._writing() as conn:
            kept = await conn.execute(
                t.update()
                .where(*_ident(claim.ident), t.c.holder == claim.holder, t.c.state == "in_flight")
                .values(state="done", status_code=status_code, content_type=content_type, response=response, lease_expires_at=None)
            )
            return bool(kept.rowcount == 1)

    async def release_idempotency_key(self, claim: KeyClaim) -> None:
        """The request ends without an answer to keep: its key is free again. If it created
        something, the key is kept, its lease ended, so the next request answers with that."""
        t = idempotency_keys
        mine = [*_ident(claim.ident), t.c.holder == claim.holder, t.c.state == "in_flight"]
        async with self._writing() as conn:
            await conn.execute(t.delete().where(*mine, t.c.resource.is_(None)))
            await conn.execute(t.update().where(*mine, t.c.resource.is_not(None)).values(lease_expires_at=utcnow()))

    async def purge_idempotency_keys(self, *, limit: int = 500) -> int:
        """Delete at most ``limit`` keys past their retention; returns how many."""
        t = idempotency_keys
        due = sa.select(t.c.principal, t.c.route, t.c.key).where(t.c.expires_at < utcnow()).limit(limit)
        async with self._writing() as conn:
            purged = await conn.execute(t.delete().where(sa.tuple_(t.c.principal, t.c.route, t.c.key).in_(due)))
            return int(purged.rowcount or 0)
