"""A tiny agent: one read-only tool, one destructive tool that waits for a human."""

from typing import Annotated

from pydantic import Field

from tether import Agent, ScriptedModel, tool


@tool
async def lookup_order(order_id: str) -> dict:
    """Look up an order."""
    return {"order_id": order_id, "status": "delivered", "total": 42.0}


@tool(risk="destructive", describe="Refund {amount} on order {order_id}")
async def refund(order_id: str, amount: Annotated[float, Field(gt=0)]) -> dict:
    """Refund money on an order (irreversible: a human approves it first)."""
    return {"order_id": order_id, "refunded": amount}


# ScriptedModel needs no keys; use tether.models.openai.OpenAIModel("gpt-4o-mini") for a real one.
agent = Agent(ScriptedModel(), [lookup_order, refund], system_prompt="You help shop customers.")
