"""The demo agent: a tiny shop with one tool of every risk tier, and a record of what it did.

``transfer`` shows a tier computed per call: a transfer of at most 20 is ``reversible`` (the shop
can take it back), a larger one ``destructive``.

Every tool that changes something writes one row per real execution into the shop's own
append-only table ``demo_effects`` (sensitive arguments masked). ``GET /v1/demo/effects`` lists
them: it is how a person, and a test, sees what the agent actually did — counting executions,
not responses.

The model defaults to :class:`~tether.models.scripted.ScriptedModel` (no keys needed); its
keyword rules make these tools usable from a chat box.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from typing import Annotated, Any

import anyio
import sqlalchemy as sa
from fastapi import APIRouter, Query, Request
from pydantic import Field

from .._ids import utcnow
from ..agent import Agent
from ..errors import Forbidden
from ..events import format_ts
from ..models import Model
from ..models.scripted import ScriptedModel
from ..server import principal_of
from ..store import Store
from ..tools import Risk, Sensitive, ToolContext, mask_value, tool

__all__ = ["build_demo_agent", "DemoShop", "demo_effects", "transfer_tier", "SMALL_TRANSFER"]

#: The largest transfer the shop can take back (``reversible``); above it, ``destructive``.
SMALL_TRANSFER = 20.0


def transfer_tier(args: dict[str, Any]) -> Risk:
    """The tier of one ``transfer``: reversible up to :data:`SMALL_TRANSFER`, else destructive."""
    return "reversible" if args["amount"] <= SMALL_TRANSFER else "destructive"


_metadata = sa.MetaData()
demo_effects = sa.Table(
    "demo_effects",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("tool", sa.String(64), nullable=False),
    sa.Column("args", sa.JSON, nullable=False),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
)


class DemoShop:
    """The shop's state: where its tools record their effects."""

    def __init__(self) -> None:
        self.store: Store | None = None

    async def open(self, store: Store) -> None:
        """Bind to the server's store and create the effects table (the demo's own table)."""
        self.store = store
        await store.create_tables(_metadata)

    async def record(self, ctx: ToolContext, tool_name: str, args: dict[str, Any]) -> None:
        """Append one effect row."""
        assert self.store is not None, "the demo shop is not open"
        async with self.store.transaction() as conn:
            await conn.execute(demo_effects.insert().values(call_id=ctx.call_id, run_id=ctx.run_id, tool=tool_name, args=args, ts=utcnow()))

    async def effects(self, *, tool_name: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every effect recorded, oldest first."""
        assert self.store is not None, "the demo shop is not open"
        query = demo_effects.select().order_by(demo_effects.c.id)
        if tool_name:
            query = query.where(demo_effects.c.tool == tool_name)
        if run_id:
            query = query.where(demo_effects.c.run_id == run_id)
        async with self.store.connection() as conn:
            rows = (await conn.execute(query)).all()
        return [{"id": r.id, "call_id": r.call_id, "run_id": r.run_id, "tool": r.tool, "args": r.args, "ts": format_ts(r.ts)} for r in rows]


def build_demo_agent(model: Model | None = None) -> Agent:
    """The demo agent (scripted model unless ``model`` is given)."""
    shop = DemoShop()

    @tool
    async def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order by its id."""
        digest = int(hashlib.sha256(order_id.encode()).hexdigest(), 16)
        return {
            "order_id": order_id,
            "status": ["processing", "shipped", "delivered"][digest % 3],
            "total": round(10 + digest % 9000 / 100, 2),
            "items": ["mug", "t-shirt", "poster", "sticker pack"][: 1 + digest % 4],
        }

    @tool
    async def sleep(seconds: Annotated[float, Field(ge=0, le=3600)], ctx: ToolContext) -> dict[str, Any]:
        """Wait for some seconds (cancellable); records whether it finished."""
        finished = False
        try:
            await asyncio.sleep(seconds)
            finished = True
            return {"slept": seconds}
        finally:
            # Runs on cancellation too; shielded, because a cancelled scope cancels every await.
            with anyio.CancelScope(shield=True):
                await shop.record(ctx, "sleep", {"seconds": seconds, "finished": finished})

    @tool(risk="reversible", describe="Write a note: {text}")
    async def write_note(text: str, ctx: ToolContext) -> dict[str, Any]:
        """Write a note into the shop's notebook."""
        await shop.record(ctx, "write_note", {"text": text})
        return {"saved": True, "text": text}

    @tool(risk="destructive", describe="Refund {amount} on order {order_id}")
    async def refund(order_id: str, amount: Annotated[float, Field(gt=0, le=100_000)], ctx: ToolContext) -> dict[str, Any]:
        """Refund money on an order (irreversible)."""
        await shop.record(ctx, "refund", {"order_id": order_id, "amount": amount})
        return {"refund_id": "rf_" + ctx.call_id[-8:], "order_id": order_id, "amount": amount, "status": "issued"}

    @tool(risk=transfer_tier, describe="Transfer {amount} to {to_account}")
    async def transfer(to_account: str, amount: Annotated[float, Field(gt=0, le=100_000)], ctx: ToolContext) -> dict[str, Any]:
        """Transfer money to an account (up to 20 the shop can take it back; more is irreversible)."""
        await shop.record(ctx, "transfer", {"to_account": to_account, "amount": amount})
        return {"transfer_id": "tr_" + ctx.call_id[-8:], "to_account": to_account, "amount": amount, "status": "sent"}

    @tool(risk="destructive", describe="Send an email to {to}: {subject}")
    async def send_email(to: str, subject: str, body: str, ctx: ToolContext) -> dict[str, Any]:
        """Send an email to a customer (irreversible)."""
        await shop.record(ctx, "send_email", {"to": to, "subject": subject, "body": body})
        return {"sent": True, "to": to}

    @tool(risk="destructive", describe="Charge {amount} to card {card_number}")
    async def charge_card(card_number: Annotated[str, Sensitive], amount: Annotated[float, Field(gt=0, le=100_000)], ctx: ToolContext) -> dict[str, Any]:
        """Charge a payment card (irreversible)."""
        await shop.record(ctx, "charge_card", {"card_number": mask_value(card_number), "amount": amount})
        return {"charged": amount, "card": mask_value(card_number)}

    @tool(risk="destructive", describe="Purge the cache (takes {seconds} s)")
    async def purge_cache(seconds: Annotated[float, Field(ge=0, le=3600)], ctx: ToolContext) -> dict[str, Any]:
        """Purge the shop's cache: slow and irreversible; its effect is recorded only when done.

        The tool that shows what a crash in the middle of a destructive call does: nobody can
        know whether it had its effect, so it is never run again without a human.
        """
        await asyncio.sleep(seconds)
        await shop.record(ctx, "purge_cache", {"seconds": seconds})
        return {"purged": True}

    @tool(allowed_decisions=("respond",), describe="Question for you: {question}")
    async def ask_user(question: str) -> dict[str, Any]:
        """Ask the user a question; the human's answer is the result."""
        return {"answer": None, "note": "no human answered"}

    router = APIRouter()

    @router.get("/v1/demo/effects", tags=["demo"])
    async def list_effects(request: Request, tool: str | None = Query(default=None), run_id: str | None = Query(default=None)) -> dict[str, Any]:
        """What the demo agent actually did: one row per real tool execution (every user's: admins only)."""
        if not principal_of(request).is_admin:
            raise Forbidden("the demo's effects table spans every user: it needs the 'admin' role", code="role_required")
        return {"items": await shop.effects(tool_name=tool, run_id=run_id)}

    chosen = model or ScriptedModel()

    async def start(store: Store) -> None:
        await shop.open(store)
        # A model that loads a file (the local one) loads now, not during the first run.
        load = getattr(chosen, "load", None)
        if load is not None and inspect.iscoroutinefunction(load):
            await load()

    return Agent(
        chosen,
        [get_order, sleep, write_note, refund, transfer, send_email, charge_card, purge_cache, ask_user],
        system_prompt="You are the assistant of a small online shop. Use the tools to help customers.",
        name="demo",
        on_startup=start,
        routes=router.routes,
    )
