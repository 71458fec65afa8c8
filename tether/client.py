"""``tether.client``: an async Python client for a Tether server.

:meth:`AsyncClient.follow` is the part that matters: it follows a run's events over SSE and,
when the connection drops, reconnects with ``Last-Event-ID`` = the last seq it yielded, with
backoff, so the caller sees every event exactly once and in order, ending with the terminal
event. Dropping the connection is only a transport matter: it never cancels the run. Stopping
a run is the explicit :meth:`AsyncClient.cancel`.

``api_key`` (default: ``$TETHER_API_KEY``) is sent as ``Authorization: Bearer …`` on every
request, the event streams included; it never goes into a URL.
Reconnecting is bounded: ``max_retries`` attempts in a row that bring no new event, or
``retry_deadline_s`` seconds without one, and :meth:`~AsyncClient.follow` gives up with
:class:`~tether.errors.ServerUnreachable` (the run itself goes on; follow it again later). A
server that answers 429 or 503 is retried after its ``Retry-After``, within the same budget;
any other error answer is raised at once as :class:`~tether.errors.APIError`. A request that
cannot reach the server raises :class:`~tether.errors.ServerUnreachable`, never a bare
transport error.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from types import TracebackType
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from .errors import APIError, ServerUnreachable, TetherError
from .events import Envelope

__all__ = ["AsyncClient", "Client", "APIError", "ServerUnreachable"]

#: Answers worth retrying a stream on: the server is overloaded or briefly failing.
_RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        code, message, details = error["code"], error["message"], error.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "http_error", response.text[:500], None
    raise APIError(response.status_code, code, message, details)


class AsyncClient:
    """Talks to a Tether server over HTTP."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_backoff: float = 5.0,
        max_retries: int = 10,
        retry_deadline_s: float = 60.0,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get("TETHER_API_KEY") or None
        if max_retries < 0 or retry_deadline_s <= 0:
            raise ValueError("max_retries must be >= 0 and retry_deadline_s positive")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)
        self._max_backoff = max_backoff
        #: Reconnects in a row without a new event before :meth:`follow` gives up.
        self.max_retries = max_retries
        #: Seconds without a new event (while reconnecting) before :meth:`follow` gives up.
        self.retry_deadline_s = retry_deadline_s
        #: How many times :meth:`stream` reconnected, over this client's life.
        self.reconnects = 0

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def _json(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await self._http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {url}: cannot reach {self._http.base_url}: {exc!r}") from exc
        _raise_for(response)
        body: dict[str, Any] = response.json()
        return body

    async def _no_content(self, method: str, url: str) -> None:
        try:
            response = await self._http.request(method, url)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"{method} {url}: cannot reach {self._http.base_url}: {exc!r}") from exc
        _raise_for(response)

    async def _items(self, url: str, **kwargs: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self._json("GET", url, **kwargs))["items"]
        return items

    # -- identity --------------------------------------------------------------------------

    async def me(self) -> dict[str, Any]:
        """Who the server takes this client for: ``{"name", "roles", "auth"}``."""
        return await self._json("GET", "/v1/me")

    # -- threads ---------------------------------------------------------------------------

    async def create_thread(self, metadata: dict[str, Any] | None = None, *, title: str | None = None) -> dict[str, Any]:
        """Create a thread (without a ``title``, it takes one from its first message)."""
        body: dict[str, Any] = {"metadata": metadata or {}}
        if title is not None:
            body["title"] = title
        return await self._json("POST", "/v1/threads", json=body)

    async def rename_thread(self, thread_id: str, title: str) -> dict[str, Any]:
        """Give a thread a new title; returns the thread."""
        return await self._json("PATCH", f"/v1/threads/{thread_id}", json={"title": title})

    async def get_thread(self, thread_id: str) -> dict[str, Any]:
        """Read a thread (with ``active_run_id``)."""
        return await self._json("GET", f"/v1/threads/{thread_id}")

    async def list_threads(self) -> list[dict[str, Any]]:
        """The caller's threads, newest first."""
        return await self._items("/v1/threads")

    async def messages(self, thread_id: str, *, view: str = "path", page_size: int = 1000) -> list[dict[str, Any]]:
        """The thread's whole active path (``view="path"``) or whole tree (``"tree"``), oldest
        first, read page by page (the API pages it; a path page goes back from the leaf)."""
        pages: list[list[dict[str, Any]]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"view": view, "limit": page_size}
            if cursor is not None:
                params["cursor"] = cursor
            body = await self._json("GET", f"/v1/threads/{thread_id}/messages", params=params)
            pages.append(body["items"])
            cursor = body.get("next_cursor")
            if cursor is None:
                break
        ordered = reversed(pages) if view == "path" else iter(pages)
        return [message for page in ordered for message in page]

    # -- runs ------------------------------------------------------------------------------

    async def start_run(self, thread_id: str, content: str, *, parent_id: str | None = None, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a run; returns the run (status ``queued`` or later)."""
        body: dict[str, Any] = {"input": {"content": content}}
        if parent_id is not None:
            body["parent_id"] = parent_id
        if config:
            body["config"] = config
        return await self._json("POST", f"/v1/threads/{thread_id}/runs", json=body)

    async def get_run(self, run_id: str) -> dict[str, Any]:
        """Read a run."""
        return await self._json("GET", f"/v1/runs/{run_id}")

    async def cancel(self, run_id: str, mode: str = "soft", reason: str | None = None) -> dict[str, Any]:
        """Explicitly cancel a run (``soft``: let a running tool finish; ``hard``: stop it too)."""
        body: dict[str, Any] = {"mode": mode}
        if reason is not None:
            body["reason"] = reason
        return await self._json("POST", f"/v1/runs/{run_id}/cancel", json=body)

    async def events(self, run_id: str, *, after_seq: int = 0, limit: int = 1000) -> list[Envelope]:
        """One JSON page of a run's stored events."""
        page = await self._json("GET", f"/v1/runs/{run_id}/events", params={"after_seq": after_seq, "limit": limit})
        return [Envelope.model_validate(item) for item in page["items"]]

    async def timeline(self, run_id: str) -> dict[str, Any]:
        """Where the run's time went, derived by the server from its event log."""
        return await self._json("GET", f"/v1/runs/{run_id}/timeline")

    async def follow(self, run_id: str, *, after_seq: int = 0) -> AsyncGenerator[Envelope, None]:
        """Yield the run's events with ``seq > after_seq``, in order, each once, through the
        terminal event; reconnects from the last yielded seq whenever the connection drops.

        Gives up with :class:`~tether.errors.ServerUnreachable` after ``max_retries`` reconnects
        in a row, or ``retry_deadline_s`` seconds, without a new event."""
        last = after_seq
        backoff = 0.05
        failures = 0  # attempts in a row that brought no new event
        failing_since = 0.0
        while True:
            cause: str = "the stream ended before the run's terminal event"
            wait = 0.0
            try:
                async with aconnect_sse(
                    self._http,
                    "GET",
                    f"/v1/runs/{run_id}/events",
                    headers={"Last-Event-ID": str(last)},
                    timeout=httpx.Timeout(self._http.timeout.connect, read=60.0),
                ) as source:
                    if not source.response.is_success:
                        await source.response.aread()
                        if source.response.status_code not in _RETRYABLE_STATUSES:
                            _raise_for(source.response)
                        cause = f"the server answered {source.response.status_code}"
                        wait = _retry_after(source.response)
                    else:
                        async for sse in source.aiter_sse():
                            if sse.event in ("", "message") and not sse.data:
                                continue
                            envelope = Envelope.from_json(sse.data)
                            if envelope.seq <= last:
                                continue  # already yielded (never happens with a correct server)
                            if envelope.seq != last + 1:
                                raise TetherError(f"gap in run {run_id}: expected seq {last + 1}, got {envelope.seq}", code="stream_gap")
                            last = envelope.seq
                            backoff = 0.05
                            failures = 0
                            yield envelope
                            if envelope.terminal:
                                return
            except httpx.TransportError as exc:
                cause = f"the connection failed: {exc!r}"  # a dropped connection: reconnect below
            # The stream ended without a terminal event (server restart, proxy cut): catch up,
            # unless the budget is spent.
            failures += 1
            if failures == 1:
                failing_since = time.monotonic()
            delay = max(wait, backoff * (1 + random.random() * 0.2))
            waited = time.monotonic() - failing_since
            if failures > self.max_retries or waited + delay > self.retry_deadline_s:
                raise ServerUnreachable(
                    f"gave up following run {run_id} after {failures} attempts and {waited:.1f} s without a new event "
                    f"(last seq {last}): {cause}; the run is not affected, follow it again later"
                )
            self.reconnects += 1
            await asyncio.sleep(delay)
            backoff = min(backoff * 2, self._max_backoff)

    # -- corrections: fork, regenerate, branches, steer, edit --------------------------------

    async def fork(self, thread_id: str, parent_id: str | None, content: str, *, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a run whose new user message is a child of ``parent_id`` (``None``: a new root).

        To edit message M, pass M's ``parent_id``: the new message becomes M's sibling."""
        body: dict[str, Any] = {"input": {"content": content}, "parent_id": parent_id}
        if config:
            body["config"] = config
        return await self._json("POST", f"/v1/threads/{thread_id}/runs", json=body)

    async def regenerate(self, thread_id: str, user_message_id: str, *, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Start a run that answers ``user_message_id`` again (a sibling answer)."""
        body: dict[str, Any] = {"parent_id": user_message_id}
        if config:
            body["config"] = config
        return await self._json("POST", f"/v1/threads/{thread_id}/runs", json=body)

    async def set_active_leaf(self, thread_id: str, message_id: str) -> dict[str, Any]:
        """Make the branch through ``message_id`` active (its deepest, newest leaf)."""
        return await self._json("PUT", f"/v1/threads/{thread_id}/active_leaf", json={"message_id": message_id})

    async def steer(self, run_id: str, content: str) -> dict[str, Any]:
        """Steer a running run: send it a message."""
        return await self._json("POST", f"/v1/runs/{run_id}/messages", json={"content": content})

    async def edit_message(self, message_id: str, content: str) -> dict[str, Any]:
        """Store an edited version of an assistant message (made active)."""
        return await self._json("PATCH", f"/v1/messages/{message_id}", json={"content": content})

    # -- human review ----------------------------------------------------------------------

    async def wait_for_interrupt(self, run_id: str, *, after_seq: int = 0) -> dict[str, Any] | None:
        """Follow the run until it pauses for review; the pending interrupt, or None if the run
        ended without one."""
        async with aclosing(self.follow(run_id, after_seq=after_seq)) as events:
            async for envelope in events:
                if envelope.type == "interrupt":
                    run = await self.get_run(run_id)
                    pending: dict[str, Any] | None = run.get("pending_interrupt")
                    if pending and pending["id"] == envelope.data["interrupt_id"]:
                        return pending
        return None

    async def resume(self, thread_id: str, interrupt_id: str, decisions: list[dict[str, Any]]) -> dict[str, Any]:
        """Answer every action of an interrupt, in order; returns the resumed run."""
        body = {"interrupt_id": interrupt_id, "decisions": decisions}
        return await self._json("POST", f"/v1/threads/{thread_id}/resume", json=body)

    async def _resume_all(self, interrupt: dict[str, Any], decision: dict[str, Any]) -> dict[str, Any]:
        count = len(interrupt["action_requests"])
        return await self.resume(interrupt["thread_id"], interrupt["id"], [decision] * count)

    async def approve(self, interrupt: dict[str, Any], *, allow: dict[str, Any] | None = None) -> dict[str, Any]:
        """Approve every action of ``interrupt`` (as returned by :meth:`wait_for_interrupt`);
        with ``allow`` (``{"scope": "run" | "thread", "args": "same" | "any", "ttl_s": N}``),
        each approval also gives that standing approval."""
        return await self._resume_all(interrupt, {"decision": "approve", **({"allow": allow} if allow is not None else {})})

    async def reject(self, interrupt: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        """Reject every action of ``interrupt``; the reason goes back to the model."""
        return await self._resume_all(interrupt, {"decision": "reject", "reason": reason})

    async def edit(self, interrupt: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        """Run the (single) action of ``interrupt`` with edited ``args``."""
        return await self._resume_all(interrupt, {"decision": "edit", "args": args})

    async def respond(self, interrupt: dict[str, Any], message: str) -> dict[str, Any]:
        """Answer the (single) action of ``interrupt`` with ``message`` instead of running it."""
        return await self._resume_all(interrupt, {"decision": "respond", "message": message})

    async def inbox(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Pending interrupts this client may decide, soonest expiry first."""
        return await self._items("/v1/interrupts", params={"status": "pending", "limit": limit})

    async def decide_many(
        self, interrupt_ids: list[str], decision: str, *, reason: str | None = None, allow: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Approve or reject (``decision``) every action of each interrupt (an approval with
        ``allow`` also gives that standing approval); one result per interrupt."""
        body: dict[str, Any] = {"interrupt_ids": interrupt_ids, "decision": decision}
        if reason is not None:
            body["reason"] = reason
        if allow is not None:
            body["allow"] = allow
        items: list[dict[str, Any]] = (await self._json("POST", "/v1/interrupts/decide", json=body))["items"]
        return items

    async def allowances(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's standing approvals: active first, then past ones."""
        return await self._items(f"/v1/threads/{thread_id}/allowances")

    async def revoke_allowance(self, allowance_id: str) -> None:
        """Revoke a standing approval (the next call it would have covered asks again)."""
        await self._no_content("DELETE", f"/v1/allowances/{allowance_id}")

    async def audit(self, *, thread_id: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
        """Audit entries of a thread or run (an admin may give neither: every entry)."""
        params = {k: v for k, v in (("thread_id", thread_id), ("run_id", run_id)) if v}
        return await self._items("/v1/audit", params=params)

    async def wait_for_run(self, run_id: str) -> dict[str, Any]:
        """Follow the run to its end and return it."""
        async for _ in self.follow(run_id):
            pass
        return await self.get_run(run_id)


def _retry_after(response: httpx.Response) -> float:
    """The ``Retry-After`` of an answer in seconds (0 when absent or not a number of seconds)."""
    try:
        return max(0.0, float(response.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0


class Client:
    """A synchronous client: :class:`AsyncClient`'s methods, run on a private event loop thread.

    Every method of :class:`AsyncClient` is available with the same arguments and returns its
    result; :meth:`stream` is a plain generator with the same reconnect guarantees::

        with Client("http://127.0.0.1:8000") as client:
            thread = client.create_thread()
            run = client.start_run(thread["id"], "order A100")
            for event in client.follow(run["id"]):
                print(event.type, event.data)
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **options: Any) -> None:
        import threading

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tether-client", daemon=True)
        self._thread.start()
        self._async = self._call(self._make(base_url, options))

    @staticmethod
    async def _make(base_url: str, options: dict[str, Any]) -> AsyncClient:
        return AsyncClient(base_url, **options)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._async, name)
        if not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(method(*args, **kwargs))

    def follow(self, run_id: str, *, after_seq: int = 0) -> Iterator[Envelope]:
        """Like :meth:`AsyncClient.follow`, as a generator."""
        events = self._async.follow(run_id, after_seq=after_seq)
        try:
            while True:
                try:
                    yield self._call(events.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(events.aclose())

    def close(self) -> None:
        """Close the connections and stop the loop thread."""
        try:
            self._call(self._async.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
