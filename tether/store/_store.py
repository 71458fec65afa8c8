"""``Store``: the sum of the store's parts, one per concern."""

from __future__ import annotations

from ._allowances import AllowanceStore
from ._idempotency import IdempotencyStore
from ._interrupts import ReviewStore
from ._keys import KeyStore
from ._leases import LeaseStore
from ._lookup import LookupStore
from ._runs import RunStore
from ._tree import TreeStore

__all__ = ["Store"]


class Store(TreeStore, RunStore, LeaseStore, ReviewStore, AllowanceStore, KeyStore, IdempotencyStore, LookupStore):
    """Async access to Tether's tables. Open with :meth:`open`, close with :meth:`aclose`.

    Its operations live one concern per module (``_tree``, ``_runs``, ``_leases``, ``_events``, ``_interrupts``, ``_allowances``, ``_keys``, ``_idempotency``, ``_lookup``,
    on the connections of ``_engine``); they all share this one engine and write lock.
    """
