"""Bounds on what one caller, and the process as a whole, may ask of the server.

Every limit has a default that a single user of the product never reaches; each one that is
reached answers with its own code (``docs/api.md``, "Limits"):

- the request body is capped *before* it is parsed (:class:`BodyLimit`, 413 ``payload_too_large``);
- requests and run starts per caller are token buckets (429 ``rate_limited`` with
  ``Retry-After``);
- active runs per caller are counted in the store, so across processes (429
  ``too_many_active_runs``);
- open event streams are counted per caller and per process (429 ``too_many_streams``,
  503 ``stream_capacity``);
- steering messages waiting in a run are capped by the runtime (429 ``too_many_queued_messages``).

A *caller* is what :func:`~._deps.caller_of` says: the principal once requests carry one, else
the client address. Rate limits and stream counts live in this process's memory: with several
processes behind a balancer each enforces its own share.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import LimitExceeded, Overloaded, PayloadTooLarge
from ._errors import error_response

__all__ = ["RUN_ADMISSION", "Limits", "TokenBuckets", "StreamSlots", "BodyLimit"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's limits (``create_app(limits=…)``; the ``tether serve`` options set them)."""

    #: The largest request body, in bytes, read before parsing (413 beyond it).
    max_body_bytes: int = 1024 * 1024
    #: Requests to ``/v1`` per caller per minute (a bucket: bursts up to this many).
    requests_per_minute: int = 6000
    #: Run starts per caller per minute (a bucket: bursts up to this many).
    run_starts_per_minute: int = 600
    #: Runs of one caller that are queued, running or being cancelled at once (waiting for a
    #: human does not count: such a run holds nothing).
    max_active_runs_per_caller: int = 50
    #: Event streams one caller may have open in this process.
    max_streams_per_caller: int = 1000
    #: Event streams this process serves at once.
    max_streams: int = 10_000
    #: Steering messages a run holds for its next model call.
    max_queued_messages: int = 100
    #: Events, in bytes of JSON, a stream that does not keep up may have waiting before it is
    #: ended (with a comment saying so; the client resumes from its ``Last-Event-ID``).
    stream_buffer_bytes: int = 1024 * 1024
    #: The longest a standing approval (an approval's ``allow``) may hold, in seconds (422 beyond).
    max_allowance_ttl_s: int = 24 * 3600

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be positive")


class TokenBuckets:
    """One token bucket per key: ``per_minute`` tokens, refilled evenly over a minute.

    Keys not seen for a while are forgotten (at most ``max_keys`` are kept; a forgotten key
    starts again with a full bucket), so a stream of new client addresses cannot grow memory.
    """

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        """Take a token for ``key``: 0.0 if there was one, else the seconds until there is."""
        now = self._clock()
        tokens, then = self._buckets.pop(key, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - then) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens, now)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return wait


#: Run starts under way at once in one process (their reads and the transaction that creates
#: the run). More wait their turn before touching the database, so that a crowd of new runs
#: (hundreds of requests in the same moment) does not queue the writes and connections of the
#: runs already under way behind all of its own: those keep streaming while the crowd is let in.
#: A start is now one or two round trips (PostgreSQL) or a few statements inline (SQLite), so
#: 32 at once let a crowd of 500 in faster than 8 did, on both backends, with the gaps of the
#: runs already streaming unchanged (``docs/benchmarks.md``, fifteenth stage).
RUN_ADMISSION = 32


def check_rate(buckets: TokenBuckets, key: str, what: str) -> None:
    """Raise 429 ``rate_limited`` when ``key`` has no token left in ``buckets``."""
    wait = buckets.take(key)
    if wait > 0:
        raise LimitExceeded(
            f"too many {what}: at most {int(buckets.capacity)} per minute; try again in {wait:.1f} s",
            code="rate_limited",
            retry_after_s=wait,
            details={"limit_per_minute": int(buckets.capacity)},
        )


class StreamSlots:
    """Counts open event streams per caller and in total; a slot is taken before a stream starts."""

    def __init__(self, per_caller: int, total: int) -> None:
        self.per_caller = per_caller
        self.total = total
        self._open: dict[str, int] = {}
        self.count = 0

    def acquire(self, caller: str) -> Callable[[], None]:
        """Take a slot for ``caller`` (or raise); returns the function that gives it back, once."""
        if self.count >= self.total:
            raise Overloaded(
                f"this server process already serves {self.count} event streams; try again later or another process",
                code="stream_capacity",
                retry_after_s=5.0,
            )
        if self._open.get(caller, 0) >= self.per_caller:
            raise LimitExceeded(
                f"you already have {self.per_caller} event streams open here; close one first",
                code="too_many_streams",
                retry_after_s=5.0,
                details={"limit": self.per_caller},
            )
        self._open[caller] = self._open.get(caller, 0) + 1
        self.count += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.count -= 1
            left = self._open[caller] - 1
            if left:
                self._open[caller] = left
            else:
                del self._open[caller]

        return release


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` before anything parses it.

    A ``Content-Length`` over the cap is refused before anything parses the body; a body sent
    in chunks is counted as it arrives and refused as soon as it passes the cap. Either way the
    answer is 413 ``payload_too_large`` and the route never runs, so nothing is stored. The rest
    of the body, up to :data:`DRAIN_BYTES`, is read and thrown away before the answer, so that
    the client reads the 413 rather than a reset connection.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, chunked = _body_framing(scope)
        if declared is not None and declared > self.max_bytes:
            if declared <= self.max_bytes + DRAIN_BYTES:
                await _drain(receive)
            await self._refuse(scope, receive, send)
            return
        if not chunked:
            # The body is what Content-Length says (the HTTP parser holds it to that), or there
            # is none: nothing left to count. Most requests take this path, and streams' sends
            # then go out unwrapped.
            await self.app(scope, receive, send)
            return
        received = 0
        too_large = False
        more_body = True

        async def counting_receive() -> Message:
            nonlocal received, too_large, more_body
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more_body = message.get("more_body", False)
                if received > self.max_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # Once the body passed the cap, whatever the application answers (it sees the read
            # fail, and may call it a malformed body) is replaced by the 413 below.
            if not too_large:
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large:
            if more_body:
                await _drain(receive)
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = PayloadTooLarge(f"the request body is larger than {self.max_bytes} bytes", details={"max_body_bytes": self.max_bytes})
        response = error_response(413, error.code, error.message, error.details)
        response.headers["Connection"] = "close"  # the rest of the body is not read
        await response(scope, receive, send)


#: How much more of a refused body is read and thrown away before the 413 is sent. A server
#: that closes a connection with a request's bytes still unread makes the kernel reset it, and
#: a client still sending its body then sees the reset instead of the answer; past this much,
#: the connection is closed all the same.
DRAIN_BYTES = 1024 * 1024


async def _drain(receive: Receive) -> None:
    """Read and throw away the rest of a refused request body, at most :data:`DRAIN_BYTES`."""
    left = DRAIN_BYTES
    while left > 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        left -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class _BodyTooLarge(Exception):
    """Raised into the application when the body passes the cap while it is being read."""


def _body_framing(scope: Scope) -> tuple[int | None, bool]:
    """The request's ``Content-Length`` (None if absent or unreadable) and whether its body
    comes in chunks (``Transfer-Encoding``), whose size only counting can tell."""
    length: int | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                chunked = True  # unreadable: count what arrives
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked
