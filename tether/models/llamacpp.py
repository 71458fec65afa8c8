"""``LlamaCppModel``: a GGUF model run in process by ``llama-cpp-python`` (the ``local`` extra).

No server, no key, no network: the model file is loaded into this process on first use. Made
for small models on a CPU (``--model local`` is SmolLM2-135M-Instruct) and for tests that need a
real model in CI.

**Off the event loop.** Generating a token is a few milliseconds of CPU in C; done on the event
loop it would stall every other run and stream of the server. Each call runs its generation in
a thread of its own, which hands each token's text to the loop (``call_soon_threadsafe``); the
async side only waits on a queue. llama.cpp releases the GIL while it computes.

**Stopping within one token.** Cancelling the run cancels the ``await`` on that queue; the
generator's ``finally`` sets the generation's stop flag and waits (shielded) for its thread.
The thread checks the flag before asking for every next token, so after the cancel it finishes
at most the one token it was computing: :attr:`LlamaCppModel.generations` records, per call,
how many tokens were generated after the stop was asked for (the tests hold it to ≤ 1).

**Tool calls by constrained decoding.** A 135M model asked to "call a tool in JSON" mostly
produces JSON that is not quite right. When tools are offered, sampling is constrained by a
llama.cpp grammar built from one JSON schema: *either* ``{"answer": "<text>"}`` *or*
``{"tool": "<one of the tools>", "arguments": <that tool's parameter schema>}``. Every output is
then one of these, and a call's arguments have the shape the tool asked for (llama.cpp's
grammar ignores numeric bounds such as ``minimum``; Tether still validates the arguments and
tells the model when they fail). The schema and the decoder of its output live in
:mod:`._constrained`. The answer's text is streamed as it is generated, decoded from the JSON
string on the fly; a call is announced (:class:`~tether.models.ToolCallStart`) as soon
as its tool's name is generated, and becomes one :class:`~tether.models.ToolCallRequest` at the
end. Without tools, the model writes free text. The JSON envelope itself is never text.

**Degenerate output is stopped early.** Small models drift into repeating themselves, and a
string argument can then grow until ``max_tokens`` cuts it (seconds of silence, then a call that
cannot be parsed). So: every string of a tool's arguments is bounded in the grammar (its own
``maxLength``, else ``max_string_length``); the generation stops as soon as its last
``repetition_stop`` tokens repeat one short pattern; ``repeat_penalty`` is there too, off by
default (at 1.1 SmolLM2 stopped copying ids and numbers from the user's message). An
output that then is no answer and no complete call (cut by ``max_tokens``, stopped for
repeating, malformed) raises ``model_output_invalid`` (:mod:`tether.models._output`: asked once
more, then the run fails); an answer cut short keeps the text it streamed, as free text does,
and says so: it ends with :class:`~tether.models.AnswerCut` (``length`` or ``repetition``), which
the run records as the answer's ``finish_reason`` instead of a complete answer.

**Errors** of the generating thread reach the run with their codes: a prompt longer than the
context window is ``model_context_exceeded``, a missing model file ``model_config_error``;
anything else llama.cpp raises is ``model_error``.

**One tool round, then words.** Right after a tool's result the grammar allows only an answer
(``answer_after_tool``): a small model shown its call and the result calls the same tool again.

**History.** Messages go through the model's own chat template (from the GGUF file; ChatML when
it has none). Small instruction models know no tool role, so an assistant turn that called
tools is shown as the JSON it produced, and a tool result as a user message naming the tool.

**Usage** is counted here: the prompt's tokens and every token generated, also those of a
cancelled call. One ``Llama`` runs one generation at a time (a lock), so concurrent runs of
one model take turns.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..errors import ModelConfigError, ModelError, TetherError
from . import AnswerCut, ModelDelta, ModelRequest, TextDelta, ToolCallStart, ToolSpec
from ._constrained import ConstrainedOutput, cut_reason, repeating, tool_choice_schema

__all__ = ["LlamaCppModel", "Generation", "tool_choice_schema"]

_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_END = object()


@dataclass
class Generation:
    """What one model call did, counted inside the adapter."""

    #: The prompt as the model's chat template rendered it.
    prompt: str = ""
    prompt_tokens: int = 0
    #: Tokens generated in all.
    generated_tokens: int = 0
    #: True when the consumer stopped the generation before it ended on its own.
    stopped: bool = False
    #: Tokens generated after the stop was asked for (the one being computed, at most).
    tokens_after_stop: int = 0
    #: Why it ended: ``"stop"`` (the model ended it), ``"length"`` (``max_tokens`` or the context
    #: window), ``"repeating"`` (the repetition stop), ``"stopped"`` (the consumer stopped it).
    finish_reason: str = "stop"
    #: With tools: the output tokens it took until a tool call was announced (its name
    #: complete), or None when it announced none.
    call_announced_after: int | None = None
    #: Seconds from the start of the call to the first token, and to the last.
    first_token_s: float | None = None
    total_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _tokens_at_stop: int = field(default=0, repr=False)

    def stop(self) -> None:
        """Ask the generating thread to stop before its next token."""
        if not self._stop.is_set():
            self._tokens_at_stop = self.generated_tokens
            self.stopped = True
            self._stop.set()


class LlamaCppModel:
    """A streaming model running a GGUF file in this process with ``llama-cpp-python``."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        seed: int = 0,
        constrained_tools: bool = True,
        max_string_length: int | None = 256,
        repeat_penalty: float = 1.0,
        repetition_stop: int | None = 32,
        answer_after_tool: bool = True,
    ) -> None:
        try:
            import llama_cpp  # noqa: F401  # fail here, with advice, rather than at the first call
        except ImportError as exc:
            raise ModelConfigError("LlamaCppModel needs llama-cpp-python: pip install 'tether[local]'") from exc
        #: The GGUF file.
        self.model_path = Path(model_path)
        #: Context window in tokens (prompt and answer).
        self.n_ctx = n_ctx
        #: CPU threads for generation and prompt processing (``None``: llama.cpp's defaults). On a
        #: machine shared with other busy processes, 1 is often fastest: llama.cpp's worker
        #: threads wait for each other, and a descheduled one stalls them all.
        self.n_threads = n_threads
        #: The most tokens one call generates (its output cap).
        self.max_tokens = max_tokens
        #: 0 is greedy decoding (the same answer every time).
        self.temperature = temperature
        self.seed = seed
        #: Constrain the output to "answer or call a tool" when tools are offered (see module docs).
        self.constrained_tools = constrained_tools
        #: The longest string argument the grammar allows where a tool's schema gives no
        #: ``maxLength`` (None: unbounded).
        self.max_string_length = max_string_length
        #: llama.cpp's penalty on tokens of the last 64 (1.0: none).
        self.repeat_penalty = repeat_penalty
        #: Stop when this many last tokens repeat one pattern of up to 16 tokens (None: never).
        self.repetition_stop = repetition_stop
        #: Right after a tool's result, allow only an answer in words: a small model otherwise
        #: calls the same tool again and again (one tool round per user message, then words).
        self.answer_after_tool = answer_after_tool
        #: The last calls' :class:`Generation` records, newest last.
        self.generations: deque[Generation] = deque(maxlen=100)
        self._llama: Any = None
        self._template: Any = None
        self._lock = threading.Lock()  # one generation at a time: a Llama is not thread-safe

    def __repr__(self) -> str:
        return f"LlamaCppModel(model_path={str(self.model_path)!r})"

    async def load(self) -> None:
        """Load the model file now (otherwise the first call does), off the event loop."""
        await anyio.to_thread.run_sync(self._load)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Yield the deltas of one model call; closing or cancelling it stops the generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        finished = asyncio.Event()
        generation = Generation()
        self.generations.append(generation)

        def hand_over(item: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def run() -> None:
            try:
                self._generate(request, generation, hand_over)
            except BaseException as exc:  # handed to the consumer, which raises it as a ModelError
                hand_over(exc)
            finally:
                hand_over(_END)
                loop.call_soon_threadsafe(finished.set)

        constrained = bool(request.tools) and self.constrained_tools
        output = ConstrainedOutput() if constrained else None
        ended = False
        fed = 0  # pieces of output read, one per token
        thread = threading.Thread(target=run, name="tether-llamacpp", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    ended = True
                    break
                if isinstance(item, BaseException):
                    raise _model_error(item)
                request.usage.input_tokens = generation.prompt_tokens
                request.usage.output_tokens = generation.generated_tokens
                text: str = item
                if output is None:
                    if text:
                        yield TextDelta(text)
                else:
                    fed += 1
                    for delta in output.feed(text):
                        if isinstance(delta, ToolCallStart):
                            generation.call_announced_after = fed
                        yield delta
            if output is not None:
                for delta in output.finish(generation.finish_reason, self.max_tokens):
                    yield delta
            elif (cut := cut_reason(generation.finish_reason)) is not None:
                yield AnswerCut(cut)  # free text stopped by max_tokens or the repetition stop
        finally:
            if not ended:  # cancelled, closed early, or failed: stop before the next token
                generation.stop()
            with anyio.CancelScope(shield=True):
                await finished.wait()
            request.usage.input_tokens = generation.prompt_tokens
            request.usage.output_tokens = generation.generated_tokens

    # -- in the generation thread -------------------------------------------------------

    def _load(self) -> Any:
        with self._lock:
            return self._load_locked()

    def _load_locked(self) -> Any:
        if self._llama is None:
            import llama_cpp
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            if not self.model_path.is_file():
                raise ModelConfigError(f"no GGUF model file at {str(self.model_path)!r}")
            llama: Any = llama_cpp.Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                seed=self.seed,
                verbose=False,
            )
            # The first evaluation pages the weights in and sets up the compute graph (seconds
            # on a busy machine): done here, so that it is not the first call's time to first token.
            llama.eval(llama.tokenize(b"Hello", add_bos=True))
            llama.reset()
            template = llama.metadata.get("tokenizer.chat_template") or _CHATML
            eos = llama.detokenize([llama.token_eos()], special=True).decode("utf-8", "replace")
            bos = llama.detokenize([llama.token_bos()], special=True).decode("utf-8", "replace") if llama.token_bos() >= 0 else ""
            self._template = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)
            self._llama = llama
        return self._llama

    def _generate(self, request: ModelRequest, generation: Generation, hand_over: Callable[[Any], None]) -> None:
        started = time.perf_counter()
        with self._lock:
            llama = self._load_locked()
            import llama_cpp
            from llama_cpp.llama_grammar import LlamaGrammar

            prompt = self._template(messages=_chat_messages(request)).prompt
            generation.prompt = prompt
            tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
            generation.prompt_tokens = len(tokens)
            if len(tokens) >= self.n_ctx:
                raise ModelError(f"the prompt has {len(tokens)} tokens; the context window holds {self.n_ctx}", code="model_context_exceeded")
            grammar = None
            if request.tools and self.constrained_tools:
                # Right after a tool's result, only an answer (see ``answer_after_tool``).
                offered = [] if self.answer_after_tool and _after_tool_result(request) else request.tools
                schema = tool_choice_schema(offered, max_string_length=self.max_string_length)
                grammar = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
            # llama-cpp-python's own generation loop asks this of the vocabulary (end of turn, EOS).
            is_eog = getattr(llama_cpp, "llama_vocab_is_eog", None) or llama_cpp.llama_token_is_eog
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            budget = min(self.max_tokens, self.n_ctx - len(tokens))
            produced: list[int] = []
            tokens_iter = llama.generate(
                tokens, temp=self.temperature, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=self.repeat_penalty, reset=True, grammar=grammar
            )
            span = self.repetition_stop
            try:
                while True:
                    if generation._stop.is_set():
                        generation.finish_reason = "stopped"
                        break
                    if len(produced) >= budget:
                        generation.finish_reason = "length"
                        break
                    if span is not None and repeating(produced, span):
                        generation.finish_reason = "repeating"
                        break
                    token = next(tokens_iter, None)
                    if token is None or is_eog(llama._model.vocab, token):
                        break
                    produced.append(token)
                    generation.generated_tokens += 1
                    if generation.first_token_s is None:
                        generation.first_token_s = time.perf_counter() - started
                    if generation.stopped:
                        generation.tokens_after_stop = generation.generated_tokens - generation._tokens_at_stop
                    hand_over(decoder.decode(llama.detokenize([token], prev_tokens=tokens + produced[:-1])))
            finally:
                tokens_iter.close()
            tail = decoder.decode(b"", final=True)
            if tail:
                hand_over(tail)
        generation.total_s = time.perf_counter() - started


def _model_error(exc: BaseException) -> ModelError:
    """What the consumer raises for an exception of the generating thread: a ``ModelError`` as
    it is (``model_context_exceeded`` stays that), another of Tether's errors with its code
    (``model_config_error``: no model file), anything else as ``model_error``."""
    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, TetherError):
        error = ModelError(exc.message, code=exc.code)
    else:
        error = ModelError(f"local model failed: {type(exc).__name__}: {exc}", retryable=False)
    error.__cause__ = exc
    return error


def _after_tool_result(request: ModelRequest) -> bool:
    """True when the history ends with a tool's result (steering or retry notes aside)."""
    for message in reversed(request.messages):
        if message.role != "system":
            return message.role == "tool"
    return False


def _chat_messages(request: ModelRequest) -> list[dict[str, str]]:
    """The history as plain chat messages a small model's template understands."""
    messages: list[dict[str, str]] = []
    # The leading system messages become one, with the tools; a later one (the note of a retry,
    # :mod:`._output`) stays where it is, so the prompt before it is the one llama.cpp has
    # evaluated already.
    leading = 0
    while leading < len(request.messages) and request.messages[leading].role == "system":
        leading += 1
    system = "\n\n".join(m.content for m in request.messages[:leading] if m.content)
    if request.tools:
        system = (system + "\n\n" if system else "") + _tool_instructions(request.tools)
    if system:
        messages.append({"role": "system", "content": system})
    for message in request.messages[leading:]:
        if message.role == "system":
            if message.content:
                messages.append({"role": "system", "content": message.content})
        elif message.role == "tool":
            messages.append({"role": "user", "content": f"Result of the tool {message.name or 'call'}: {message.content}"})
        elif message.role == "assistant":
            if message.tool_calls:
                call = message.tool_calls[0]  # this adapter asks for one call per turn
                messages.append({"role": "assistant", "content": json.dumps({"tool": call.name, "arguments": call.args}, ensure_ascii=False)})
            elif request.tools and message.content:
                messages.append({"role": "assistant", "content": json.dumps({"answer": message.content}, ensure_ascii=False)})
            elif message.content:
                messages.append({"role": "assistant", "content": message.content})
        else:
            messages.append({"role": "user", "content": message.content})
    return messages


def _tool_instructions(tools: list[ToolSpec]) -> str:
    """The system prompt's part about tools and the reply's JSON form.

    Names and argument names only: the grammar holds the model to the full schemas, and every
    prompt token costs time on a CPU.
    """
    # Worded as benchmarks/local_models.py measured best for SmolLM2-135M (docs/models.md).
    lines = [f"- {_signature(t)}: {t.description}" for t in tools]
    return (
        "Tools:\n" + "\n".join(lines) + '\nIf the user asks you to do one of these things, call that tool: reply {"tool": "<name>", "arguments": {…}}. '
        'Otherwise answer in words: reply {"answer": "<your answer>"}. Never call a tool the user did not ask for.'
    )


def _signature(tool: ToolSpec) -> str:
    """``get_order(order_id: string)``: a tool as a short line of the prompt."""
    properties = tool.parameters.get("properties") or {}
    args = ", ".join(f"{name}: {spec.get('type', 'any') if isinstance(spec, dict) else 'any'}" for name, spec in properties.items())
    return f"{tool.name}({args})"
