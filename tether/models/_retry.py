"""Provider faults, handled honestly: retry before the first delta, never after; time out silence.

**Why the line is the first delta.** A model call that failed before it streamed anything (a
429, a 5xx, "overloaded", a dropped connection, a provider that never answered) left nothing
behind: calling again is safe, and usually works after a pause. Once deltas were streamed, they
are in the event log and on clients' screens; a second attempt would stream a *different* answer
after them, and a client would see two answers glued together. So a failure after the first
delta is never retried: the step fails with ``model_stream_broken``, and the runner keeps the
partial answer flagged ``failed`` (the ``error`` event names it).

**How long to wait.** Exponential backoff with jitter (each delay drawn from the upper half of
``base · 2^(attempt-1)``, capped), so that many runs hit by one outage do not come back in step.
When the provider says how long to wait (``Retry-After``), that is the least we wait; if it asks
for longer than the policy's cap, we do not retry at all and report its error, rather than
blocking a run for an unbounded time.

**Silence.** A provider that accepts the request and then sends nothing (or stops sending
mid-stream) would hang a run forever. Every wait for the next delta is bounded by
``idle_timeout_s``; past it the call fails with ``model_timeout`` (retried like other faults when
nothing was streamed yet). The timeout covers only the ``await`` for the next delta, never a
``yield``, so it cannot leak into the consumer.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime

import anyio

from .._idle import IdleTimer
from ..errors import ModelError
from . import Model, ModelDelta, ModelRequest, ToolCallStart, Usage

__all__ = ["OUTPUT_INVALID", "RetryPolicy", "retry_after_seconds", "stream_with_retries"]

#: The code of a model output that is neither an answer nor a call: not a provider fault, so
#: passed on untouched, for :mod:`._output` to handle.
OUTPUT_INVALID = "model_output_invalid"

#: Called before each retry with (the attempt that failed, the delay before the next, its error).
OnRetry = Callable[[int, float, ModelError], None]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a model call is retried and how long a silent provider is waited for."""

    #: Attempts in all (1 means never retry).
    attempts: int = 4
    #: The first backoff; each later one doubles, up to ``max_delay_s``.
    base_delay_s: float = 0.5
    #: The longest wait between attempts, ``Retry-After`` included.
    max_delay_s: float = 30.0
    #: The longest silence allowed before the first delta and between deltas (None: no limit).
    idle_timeout_s: float | None = 60.0

    def delay(self, attempt: int, error: ModelError) -> float | None:
        """Seconds to wait after failed ``attempt`` (1-based), or None when not to retry."""
        if not error.retryable or attempt >= self.attempts:
            return None
        ceiling = min(self.max_delay_s, self.base_delay_s * 2.0 ** (attempt - 1))
        backoff = ceiling * random.uniform(0.5, 1.0)  # jitter, not cryptography
        if error.retry_after is not None:
            if error.retry_after > self.max_delay_s:
                return None  # the provider wants a longer pause than we may wait
            return max(error.retry_after, backoff)
        return backoff


async def stream_with_retries(model: Model, request: ModelRequest, policy: RetryPolicy, *, on_retry: OnRetry | None = None) -> AsyncGenerator[ModelDelta, None]:
    """``model.stream(request)``, retried per ``policy`` while nothing was streamed yet.

    Every attempt's tokens are added to ``request.usage`` (a failed attempt may have consumed
    input tokens), also when the stream is cancelled or closed.
    """
    attempt = 0
    while True:
        attempt += 1
        call = replace(request, usage=Usage())
        streamed = False
        silence = _Silence(policy.idle_timeout_s)
        try:
            async with aclosing(model.stream(call)) as stream:  # type: ignore[type-var]  # Model.stream is an async generator
                while True:
                    silence.waiting()
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        return
                    except asyncio.CancelledError:
                        if silence.caused_cancel():
                            raise ModelError(
                                f"model provider sent nothing for {policy.idle_timeout_s:g} s",
                                retryable=True,
                                code="model_timeout",
                            ) from None
                        raise
                    finally:
                        silence.waiting_over()
                    # A tool call's start is a status, not output: nothing is shown twice after a retry.
                    streamed = streamed or not isinstance(delta, ToolCallStart)
                    yield delta
        except ModelError as exc:
            if exc.code == OUTPUT_INVALID:
                raise
            if streamed:
                raise ModelError(
                    f"model provider failed after streaming had begun ({exc.code}: {exc.message}); the partial answer is kept, "
                    "flagged failed, and the call was not retried (a retry would stream a second answer after it)",
                    retryable=exc.retryable,
                    code="model_stream_broken",
                ) from exc
            delay = policy.delay(attempt, exc)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(attempt, delay, exc)
            await anyio.sleep(delay)
        finally:
            silence.cancel()
            request.usage.add(call.usage)


class _Silence:
    """Cancels the calling task when a wait for the next delta lasts ``seconds`` (never with None).

    Like ``asyncio.timeout`` around each wait, but with one timer per attempt instead of one per
    delta (:class:`~tether._idle.IdleTimer`): a wait only reads the clock. It cancels only while
    the task waits for the provider, never while the consumer holds a delta (the generator is
    then suspended at its ``yield``), and :meth:`caused_cancel` tells its cancellation from
    anyone else's, as ``asyncio.timeout`` does (``uncancel``).
    """

    def __init__(self, seconds: float | None) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._waiting = False
        self._expired = False
        self._timer = IdleTimer(seconds, self._on_idle) if seconds is not None else None

    def waiting(self) -> None:
        self._waiting = True
        if self._timer is not None:
            self._timer.touch()

    def waiting_over(self) -> None:
        self._waiting = False

    def _on_idle(self) -> None:
        if self._waiting and not self._expired:
            self._expired = True
            self.cancel()
            self._task.cancel()

    def caused_cancel(self) -> bool:
        """True when the cancellation being handled is this timer's alone (then it is undone)."""
        return self._expired and self._task.uncancel() <= self._cancelling

    def cancel(self) -> None:
        """Stop the timer, and let go of it: it holds this object's ``_on_idle``, so keeping it
        would leave a reference cycle (and the run's task) for the garbage collector."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """How long a response asks us to wait: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
