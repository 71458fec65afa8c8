"""The store's API keys: create, list, revoke, and authenticate a request's bearer token.

A key is ``tk_`` followed by 43 URL-safe characters (256 random bits). Only its SHA-256 is
stored: a leaked database does not leak usable keys, and a key is shown once, when created. A
fast hash is enough here (unlike passwords, the key has 256 bits of entropy: nothing to brute
force). Authentication looks the hash up by its unique index and compares it again in constant
time.

Every request reads the key's row, so a revocation (or an expiry) takes effect on the next
request in every process that shares the database; nothing is cached. ``last_used_at`` is
written at most once a minute per key, so a busy client does not turn every read into a write.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from .._ids import new_id, utcnow
from ..errors import FieldError, InvalidRequest
from ._engine import StoreBase
from ._records import ROLES, AuditEntry, KeyRecord, Principal, key_record
from ._tables import api_keys, audit

__all__ = ["KeyStore", "KEY_PREFIX", "looks_like_key", "RESERVED_NAMES"]

#: What every key starts with, so a leaked one is recognisable (secret scanners, logs).
KEY_PREFIX = "tk_"
_KEY_RE = re.compile(r"tk_[A-Za-z0-9_-]{43}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
#: Names Tether itself uses as actors: ``local`` (open mode) and ``system`` (expiry).
RESERVED_NAMES = frozenset({"local", "system"})
#: How stale ``last_used_at`` may get before a request refreshes it.
_LAST_USED_GRANULARITY = timedelta(minutes=1)


def looks_like_key(token: str) -> bool:
    """True when ``token`` has the shape of a Tether key (checked before any database read)."""
    return _KEY_RE.fullmatch(token) is not None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name) or name in RESERVED_NAMES:
        raise InvalidRequest(
            f"invalid principal name {name!r}: 1-64 letters, digits and _.@-, starting with a letter or digit, and not {sorted(RESERVED_NAMES)}",
            code="invalid_name",
            fields=[FieldError(("name",), "invalid principal name", "invalid_name")],
        )


def _check_roles(roles: Sequence[str]) -> tuple[str, ...]:
    unknown = [r for r in roles if r not in ROLES]
    if not roles or unknown:
        raise InvalidRequest(
            f"roles must be one or more of {list(ROLES)}",
            code="invalid_roles",
            fields=[FieldError(("roles",), f"one or more of {list(ROLES)}", "invalid_roles")],
        )
    return tuple(r for r in ROLES if r in roles)  # canonical order, no duplicates


class KeyStore(StoreBase):
    """API key operations of :class:`~tether.store.Store`."""

    async def create_key(self, *, name: str, roles: Sequence[str], expires_at: datetime | None = None, actor: str) -> tuple[KeyRecord, str]:
        """Create a key for the principal ``name`` with ``roles``; returns the record and the key.

        The key is returned this once and never stored. Audited as ``key_created`` by ``actor``.
        """
        _check_name(name)
        canonical = _check_roles(roles)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        now = utcnow()
        record = KeyRecord(
            id=new_id("key"), name=name, roles=canonical, prefix=key[:11], created_at=now, last_used_at=None, expires_at=expires_at, revoked_at=None
        )
        async with self._writing() as conn:
            await conn.execute(
                api_keys.insert().values(
                    id=record.id,
                    name=name,
                    roles=list(canonical),
                    prefix=record.prefix,
                    key_hash=_hash(key),
                    created_at=now,
                    expires_at=expires_at,
                )
            )
            entry = AuditEntry(action="key_created", actor=actor, outcome="created", details=_key_details(record))
            await conn.execute(audit.insert(), [entry.values()])
        return record, key

    async def list_keys(self) -> list[KeyRecord]:
        """Every key (revoked and expired ones too), oldest first; never the key itself."""
        async with self._reading() as conn:
            rows = await conn.execute(api_keys.select().order_by(api_keys.c.created_at, api_keys.c.id))
            return [key_record(row) for row in rows]

    async def revoke_keys(self, name_or_prefix: str, *, actor: str) -> list[KeyRecord]:
        """Revoke every usable key of the principal ``name_or_prefix``, or the key with that
        prefix (``tk_`` + 8 characters); returns what was revoked. Audited as ``key_revoked``."""
        now = utcnow()
        match = api_keys.c.prefix == name_or_prefix if name_or_prefix.startswith(KEY_PREFIX) else api_keys.c.name == name_or_prefix
        async with self._writing() as conn:
            rows = (await conn.execute(api_keys.select().where(match, api_keys.c.revoked_at.is_(None)))).all()
            if not rows:
                return []
            await conn.execute(api_keys.update().where(api_keys.c.id.in_([r.id for r in rows])).values(revoked_at=now))
            revoked = [key_record(r) for r in rows]
            entries = [AuditEntry(action="key_revoked", actor=actor, outcome="revoked", details=_key_details(k)).values() for k in revoked]
            await conn.execute(audit.insert(), entries)
        return revoked

    async def authenticate(self, key: str) -> Principal | None:
        """The principal of a usable key, or None (malformed, unknown, expired or revoked)."""
        if not looks_like_key(key):
            return None
        digest = _hash(key)
        async with self._reading() as conn:
            row = (await conn.execute(api_keys.select().where(api_keys.c.key_hash == digest))).first()
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            return None
        record = key_record(row)
        now = utcnow()
        if not record.usable(now):
            return None
        if record.last_used_at is None or now - record.last_used_at > _LAST_USED_GRANULARITY:
            async with self._writing() as conn:
                await conn.execute(api_keys.update().where(api_keys.c.id == record.id).values(last_used_at=now))
        return record.principal


def _key_details(record: KeyRecord) -> dict[str, object]:
    return {
        "name": record.name,
        "roles": list(record.roles),
        "prefix": record.prefix,
        "expires_at": record.expires_at.isoformat() if record.expires_at else None,
    }
