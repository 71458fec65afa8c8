"""Thread routes: create, list, read, and the messages of the active path or the whole tree."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from ..store import MessageRecord
from ._deps import access_of, actor_of, store_of
from ._schemas import CreateThread, MessageContent, SetActiveLeaf
from ._views import load_thread_views, message_view, thread_view

router = APIRouter(prefix="/v1/threads", tags=["threads"])


@router.post("", status_code=201)
async def create_thread(request: Request, body: CreateThread | None = None) -> dict[str, Any]:
    """Create a thread, owned by the caller."""
    store = store_of(request)
    thread = await store.create_thread(owner=actor_of(request), metadata=(body or CreateThread()).metadata)
    return thread_view(thread, active_run_id=None)


@router.get("")
async def list_threads(request: Request, limit: int = Query(default=100, ge=1, le=1000)) -> dict[str, Any]:
    """The caller's threads, newest first."""
    access = access_of(request)
    return {"items": await load_thread_views(access.store, await access.threads(limit=limit))}


@router.get("/{thread_id}")
async def get_thread(request: Request, thread_id: str) -> dict[str, Any]:
    """One thread, with its active run."""
    access = access_of(request)
    thread = await access.thread(thread_id)
    return (await load_thread_views(access.store, [thread]))[0]


def _with_siblings(messages: list[MessageRecord], selected: list[MessageRecord]) -> list[dict[str, Any]]:
    children: dict[str | None, list[str]] = {}
    for m in messages:  # oldest first, so sibling order is creation order
        children.setdefault(m.parent_id, []).append(m.id)
    return [message_view(m, sibling_ids=children.get(m.parent_id, [m.id])) for m in selected]


@router.get("/{thread_id}/messages")
async def list_messages(request: Request, thread_id: str, view: Literal["path", "tree"] = Query(default="path")) -> dict[str, Any]:
    """The active path (root → active leaf) or the whole message tree, each with its siblings."""
    access = access_of(request)
    thread = await access.thread(thread_id)
    messages = await access.store.thread_messages(thread.id)
    if view == "tree":
        return {"items": _with_siblings(messages, messages), "active_leaf_id": thread.active_leaf_id}
    by_id = {m.id: m for m in messages}
    path: list[MessageRecord] = []
    cursor = thread.active_leaf_id
    while cursor is not None and cursor in by_id:
        path.append(by_id[cursor])
        cursor = by_id[cursor].parent_id
    path.reverse()
    return {"items": _with_siblings(messages, path), "active_leaf_id": thread.active_leaf_id}


@router.put("/{thread_id}/active_leaf")
async def set_active_leaf(request: Request, thread_id: str, body: SetActiveLeaf) -> dict[str, Any]:
    """Switch branches: the active leaf becomes the deepest, newest leaf under ``message_id``.

    409 ``thread_busy`` while a run of the thread is active.
    """
    access = access_of(request)
    thread = await access.thread(thread_id, to="write")
    await access.store.set_active_leaf(thread.id, body.message_id)
    return (await load_thread_views(access.store, [await access.store.get_thread(thread.id)]))[0]


messages_router = APIRouter(prefix="/v1/messages", tags=["threads"])


@messages_router.patch("/{message_id}")
async def edit_message(request: Request, message_id: str, body: MessageContent) -> dict[str, Any]:
    """Store the user's edited version of an assistant message as a new, active sibling."""
    access = access_of(request)
    original = await access.message(message_id, to="write")
    edited = await access.store.add_edited_version(original.id, body.content)
    siblings = [m.id for m in await access.store.thread_messages(edited.thread_id) if m.parent_id == edited.parent_id]
    return message_view(edited, sibling_ids=siblings)
