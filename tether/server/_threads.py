"""Thread routes: create, list, read, and the messages of the active path or the whole tree."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from ..store import MessageRecord, Store
from ._deps import access_of, actor_of, store_of
from ._schemas import CreateThread, MessageContent, RenameThread, SetActiveLeaf
from ._views import load_thread_views, message_view, thread_view

router = APIRouter(prefix="/v1/threads", tags=["threads"])


@router.post("", status_code=201)
async def create_thread(request: Request, body: CreateThread | None = None) -> dict[str, Any]:
    """Create a thread, owned by the caller. Without a ``title`` it takes one from its first message."""
    store = store_of(request)
    body = body or CreateThread()
    thread = await store.create_thread(owner=actor_of(request), metadata=body.metadata, title=body.title)
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


@router.patch("/{thread_id}")
async def rename_thread(request: Request, thread_id: str, body: RenameThread) -> dict[str, Any]:
    """Rename a thread: its owner only (approvers who may read it get 403 ``not_the_owner``).

    The title is put on one line (runs of whitespace and control characters become one space)
    and trimmed; then it must have 1 to 200 characters, else 422 ``validation_error``.
    """
    access = access_of(request)
    thread = await access.thread(thread_id, to="write")
    renamed = await access.store.rename_thread(thread.id, body.title)
    return (await load_thread_views(access.store, [renamed]))[0]


async def _with_siblings(store: Store, thread_id: str, page: list[MessageRecord]) -> list[dict[str, Any]]:
    siblings = await store.sibling_ids(thread_id, {m.parent_id for m in page})
    return [message_view(m, sibling_ids=siblings.get(m.parent_id) or [m.id]) for m in page]


@router.get("/{thread_id}/messages")
async def list_messages(
    request: Request,
    thread_id: str,
    view: Literal["path", "tree"] = Query(default="path"),
    limit: int = Query(default=100, ge=1, le=1000, description="Page size."),
    cursor: str | None = Query(default=None, min_length=1, max_length=64, description="`next_cursor` of the previous page."),
) -> dict[str, Any]:
    """A page of the active path (root → active leaf) or of the whole message tree, each message
    with its siblings.

    ``path`` pages go from the leaf back to the root: the first page is the newest ``limit``
    messages (oldest first within the page), ``next_cursor`` leads to the ones before them.
    ``tree`` pages go in creation order from the first message. ``next_cursor`` is null on the
    last page.
    """
    access = access_of(request)
    store = access.store
    thread = await access.thread(thread_id)
    if view == "tree":
        page, more = await store.tree_page(thread.id, after_id=cursor, limit=limit)
        next_cursor = page[-1].id if more and page else None
    else:
        page, more = await store.path_page(thread.id, thread.active_leaf_id, before_id=cursor, limit=limit)
        next_cursor = page[0].id if more and page else None
    return {"items": await _with_siblings(store, thread.id, page), "active_leaf_id": thread.active_leaf_id, "next_cursor": next_cursor}


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
    store = access.store
    original = await access.message(message_id, to="write")
    edited = await store.add_edited_version(original.id, body.content)
    siblings = await store.sibling_ids(edited.thread_id, {edited.parent_id})
    return message_view(edited, sibling_ids=siblings[edited.parent_id])
