"""Model output that is neither an answer nor a tool call: never shown, never run, asked for again once.

**Why.** A model stopped by its token limit in the middle of a tool call leaves arguments that
are cut off: JSON that does not parse, or that parses into something the model did not mean. A
small local model may also drift into repeating itself inside a call until the limit cuts it.
Such an output is no answer. Showing it would show the model's wire format (``{"tool":
"ask_user", "arguments": {"question": "a_ques_t_a_ques_t…``) as if it were a reply; running it
would run a call nobody asked for. So an adapter does neither: it raises the error that
:func:`output_invalid` makes (code ``model_output_invalid``), and this module, the one place
where the runtime reads a model call (:func:`stream_checked`), decides what follows. The same
rule for every provider: OpenAI's ``finish_reason: "length"`` and Anthropic's ``stop_reason:
"max_tokens"`` during a tool call, the local model's constrained output cut short, repeating
itself, or malformed.

**Once more, with the reason.** As with a call whose arguments fail validation (the model reads
the error as the call's result), the model is told what went wrong: the second attempt's
request ends with a system message saying why the first reply was discarded. Only while nothing
was streamed: text or thinking already on clients' screens would be followed by a second reply
(the rule of :mod:`._retry`). When the second attempt fails too, or something had streamed, the
call fails with ``model_output_invalid`` and a message a person understands; the runtime ends
the run with that ``error``, keeps any streamed text flagged ``failed``, and stores the fragment
nowhere.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import replace

from ..errors import ModelError
from . import ChatMessage, Model, ModelDelta, ModelRequest, ToolCallStart
from ._retry import OUTPUT_INVALID, OnRetry, RetryPolicy, stream_with_retries

__all__ = ["ATTEMPTS", "OUTPUT_INVALID", "output_invalid", "stream_checked"]

#: Attempts in all at a model call whose output is no answer: the first, and one more.
ATTEMPTS = 2

#: Called before the second attempt with the first one's error (its message is the reason).
OnInvalid = Callable[[ModelError], None]


def output_invalid(reason: str) -> ModelError:
    """The error a model raises for output that is neither an answer nor a call.

    ``reason`` completes "the model's reply was …", for the model and for a person: ``"cut off
    by the output limit (256 tokens) in the middle of a tool call"``.
    """
    return ModelError(reason, code=OUTPUT_INVALID, retryable=False)


def retry_note(reason: str) -> ChatMessage:
    """What the second attempt is told about the first."""
    return ChatMessage(
        "system",
        f"Your previous reply was discarded: it was {reason}. Reply again, briefly: answer in plain words, or call one tool with short arguments.",
    )


async def stream_checked(
    model: Model,
    request: ModelRequest,
    policy: RetryPolicy,
    *,
    on_retry: OnRetry | None = None,
    on_invalid: OnInvalid | None = None,
) -> AsyncGenerator[ModelDelta, None]:
    """``model.stream(request)`` with provider faults retried (:func:`~._retry.stream_with_retries`)
    and an output that is no answer asked for once more (see the module docs).

    Every attempt's tokens are added to ``request.usage``.
    """
    attempt_request = request
    for attempt in range(1, ATTEMPTS + 1):
        streamed = False
        try:
            async with aclosing(stream_with_retries(model, attempt_request, policy, on_retry=on_retry)) as stream:
                async for delta in stream:
                    # A status is no answer: a second attempt after it shows nothing twice.
                    streamed = streamed or not isinstance(delta, ToolCallStart)
                    yield delta
            return
        except ModelError as exc:
            if exc.code != OUTPUT_INVALID:
                raise
            if streamed:
                raise ModelError(
                    f"The model gave no usable reply: it was {exc.message}, after part of it had been shown (kept, flagged failed). "
                    "Nothing was run, and the model was not asked again: a second reply would follow the first.",
                    code=OUTPUT_INVALID,
                ) from exc
            if attempt == ATTEMPTS:
                raise ModelError(
                    f"The model gave no usable reply: it was {exc.message}, also when asked once more. "
                    "Nothing was run. Try a shorter request, or give the model a larger output limit (max_tokens).",
                    code=OUTPUT_INVALID,
                ) from exc
            if on_invalid is not None:
                on_invalid(exc)
            # ``replace`` keeps ``usage``: the second attempt's tokens count on the same call.
            attempt_request = replace(request, messages=[*request.messages, retry_note(exc.message)])
