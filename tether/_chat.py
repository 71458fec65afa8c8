"""``tether chat``: a terminal client that streams a thread and asks you to review tool calls.

It is a thin layer over :class:`~tether.client.AsyncClient`. While a run streams, Ctrl-C asks
the server for a *soft* cancel (a running tool finishes, nothing new starts); a second Ctrl-C
asks for a *hard* one. A review offers *approve and allow* where the call permits a standing
approval (this run or this thread, the same or any arguments, 15 min, 1 h or 8 h);
``/allowances`` lists the thread's, ``/revoke N`` ends one. Closing the terminal is only a disconnect: the run goes on and
``tether chat --thread ID`` catches up from the log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from .client import APIError, AsyncClient

__all__ = ["run_chat"]


def _moment(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _remaining(expires_at: str) -> str:
    seconds = max(0, int((_moment(expires_at) - datetime.now(UTC)).total_seconds()))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _clock(ts: str) -> str:
    """A wire timestamp as local wall-clock time, ``14:02``."""
    return _moment(ts).astimezone().strftime("%H:%M")


#: The lifetimes a standing approval may be given here, in seconds.
_TTLS = {"15m": 900, "1h": 3600, "8h": 8 * 3600}


def _describe_allowance(allowance: dict[str, Any]) -> str:
    """``refund, same arguments, this thread, until 15:02`` (and its state, when not active)."""
    args = "same arguments" if allowance["args"] == "same" else "any arguments"
    scope = "this run" if allowance["scope"] == "run" else "this thread"
    until = f"until {_clock(allowance['expires_at'])}"
    state = "" if allowance["status"] == "active" else f" ({allowance['status']})"
    return f"{allowance['tool']}, {args}, {scope}, {until}, by {allowance['created_by']}{state}"


class _Chat:
    def __init__(self, client: AsyncClient, thread_id: str, ask: Callable[[str], str]) -> None:
        self.client = client
        self.thread_id = thread_id
        self.ask = ask
        self._stops = 0
        self._run_id: str | None = None
        self._me: str | None = None
        #: The thread's allowances as last listed (``/revoke N`` picks from them).
        self._listed: list[dict[str, Any]] = []

    def _on_interrupt_key(self) -> None:
        if self._run_id is None:
            raise KeyboardInterrupt
        self._stops += 1
        mode = "soft" if self._stops == 1 else "hard"
        click.secho(f"\n[stopping ({mode})…]", fg="yellow", err=True)
        asyncio.get_running_loop().create_task(self._cancel(self._run_id, mode))

    async def _cancel(self, run_id: str, mode: str) -> None:
        try:
            await self.client.cancel(run_id, mode=mode, reason="Ctrl-C in tether chat")
        except APIError as exc:
            click.secho(f"[cancel: {exc.message}]", fg="red", err=True)

    async def follow(self, run_id: str, after_seq: int = 0) -> None:
        """Stream a run to its end, stopping for reviews."""
        self._run_id, self._stops = run_id, 0
        loop = asyncio.get_running_loop()
        last = after_seq
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_interrupt_key)
        except (NotImplementedError, RuntimeError):
            pass
        try:
            while True:
                interrupt: dict[str, Any] | None = None
                async for event in self.client.follow(run_id, after_seq=last):
                    last = event.seq
                    self._show(event.type, event.data)
                    if event.type == "tool_call" and event.data.get("allowed_by"):
                        await self._show_allowed(event.data["allowed_by"])
                    if event.type == "interrupt":
                        interrupt = event.data
                        break
                if interrupt is None:
                    return
                await self._review(run_id, interrupt)
        finally:
            self._run_id = None
            try:
                loop.remove_signal_handler(signal.SIGINT)
            except (NotImplementedError, RuntimeError):
                pass

    def _show(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "token":
            click.echo(data["text"], nl=False)
        elif kind == "thinking":
            click.secho(data["text"], dim=True, nl=False)
        elif kind == "tool_call":
            gate = " — needs your approval" if data["gated"] else ""
            click.secho(f"\n┌ tool {data['name']}({json.dumps(data['args'], ensure_ascii=False)}) [{data['risk']}]{gate}", fg="cyan")
        elif kind == "tool_result":
            body = data.get("result") if data["status"] in ("ok", "responded") else data.get("error") or data.get("reason")
            click.secho(f"└ {data['name']}: {data['status']} {json.dumps(body, ensure_ascii=False)}", fg="cyan")
        elif kind == "user_message":
            click.secho(f"\n[you, during the run] {data['content']}", fg="green")
        elif kind == "resumed":
            click.secho(f"[resumed: {data['resolution']}]", fg="cyan")
        elif kind == "done":
            click.echo("")
        elif kind == "error":
            click.secho(f"\n[failed: {data['code']}: {data['message']}]", fg="red")
        elif kind == "cancelled":
            click.secho(f"\n[stopped ({data['mode']})]", fg="yellow")

    async def _show_allowed(self, allowance_id: str) -> None:
        """Say under which standing approval a call runs without asking."""
        if self._me is None:
            self._me = (await self.client.me())["name"]
        allowance = next((a for a in await self.client.allowances(self.thread_id) if a["id"] == allowance_id), None)
        if allowance is None:
            click.secho("│ runs without asking: a standing approval covers it", fg="cyan")
            return
        whose = "your" if allowance["created_by"] == self._me else f"{allowance['created_by']}'s"
        click.secho(f"│ allowed by {whose} approval at {_clock(allowance['created_at'])}, until {_clock(allowance['expires_at'])}", fg="cyan")

    async def _ask_allow(self, permitted: list[str]) -> dict[str, Any]:
        """What a standing approval covers, asked for in words."""
        while (scope := (await asyncio.to_thread(self.ask, "  allow for [r]un / [t]hread> ")).strip().lower()) not in ("r", "run", "t", "thread"):
            click.secho("  r (the rest of this run) or t (this thread, later runs too)", fg="red")
        args = permitted[0]
        if len(permitted) > 1:
            while (args := (await asyncio.to_thread(self.ask, "  with the [s]ame / [a]ny arguments> ")).strip().lower()) not in ("s", "same", "a", "any"):
                click.secho("  s (only these arguments) or a (any arguments)", fg="red")
        while (ttl := (await asyncio.to_thread(self.ask, f"  for {' / '.join(_TTLS)}> ")).strip().lower()) not in _TTLS:
            click.secho(f"  one of {', '.join(_TTLS)}", fg="red")
        return {"scope": "run" if scope.startswith("r") else "thread", "args": "same" if args.startswith("s") else "any", "ttl_s": _TTLS[ttl]}

    async def _review(self, run_id: str, interrupt: dict[str, Any]) -> None:
        decisions: list[dict[str, Any]] = []
        click.secho(f"\n⏸  Review needed — expires in {_remaining(interrupt['expires_at'])}", fg="magenta", bold=True)
        for request, config in zip(interrupt["action_requests"], interrupt["review_configs"], strict=True):
            allowed = list(config["allowed_decisions"])
            permitted = config.get("allow_args") or []
            if permitted and "approve" in allowed:
                allowed.insert(allowed.index("approve") + 1, "allow")
            click.secho(f"  {request['description']}", bold=True)
            click.echo(f"  {request['action']} {json.dumps(request['args'], ensure_ascii=False)}")
            keys = {"approve": "a", "allow": "l", "reject": "r", "edit": "e", "respond": "s"}
            names = {"allow": "approve and a[l]low…"}
            menu = "/".join(names.get(d) or f"[{keys[d]}]{d[1:] if keys[d] == d[0] else ' ' + d}" for d in allowed)
            while True:
                answer = (await asyncio.to_thread(self.ask, f"  {menu} (expires in {_remaining(interrupt['expires_at'])})> ")).strip().lower()
                choice = next((d for d in allowed if answer in (d, keys[d])), None)
                if choice == "approve":
                    decisions.append({"decision": "approve"})
                elif choice == "allow":
                    decisions.append({"decision": "approve", "allow": await self._ask_allow(permitted)})
                elif choice == "reject":
                    reason = await asyncio.to_thread(self.ask, "  reason (optional)> ")
                    decisions.append({"decision": "reject", "reason": reason.strip() or None})
                elif choice == "edit":
                    raw = await asyncio.to_thread(self.ask, "  new args as JSON> ")
                    try:
                        decisions.append({"decision": "edit", "args": json.loads(raw)})
                    except ValueError:
                        click.secho("  not JSON, try again", fg="red")
                        continue
                elif choice == "respond":
                    decisions.append({"decision": "respond", "message": await asyncio.to_thread(self.ask, "  your answer> ")})
                else:
                    continue
                break
        try:
            await self.client.resume(self.thread_id, interrupt["interrupt_id"], decisions)
        except APIError as exc:
            click.secho(f"  [{exc.status} {exc.code}] {exc.message}", fg="red")
            if exc.status in (403, 422):
                await self._review(run_id, interrupt)

    async def show_path(self) -> list[dict[str, Any]]:
        """Print the active path, numbered, with "2 of 3" markers where there are branches."""
        path = [m for m in await self.client.messages(self.thread_id) if m["role"] in ("user", "assistant") and (m["content"] or m["role"] == "user")]
        for number, message in enumerate(path, 1):
            who = "you" if message["role"] == "user" else "agent"
            marks = []
            if len(message["sibling_ids"]) > 1:
                marks.append(f"{message['sibling_index'] + 1} of {len(message['sibling_ids'])}")
            if message["status"] != "complete":
                marks.append(message["status"])
            if message.get("edited_by_user"):
                marks.append("edited")
            suffix = f"  ({', '.join(marks)})" if marks else ""
            click.echo(f"[{number}] {who}> {message['content']}{suffix}")
        return path

    async def command(self, text: str) -> None:
        """Run a slash command: /edit N text, /regenerate, /branch N next|prev, /history."""
        name, _, rest = text.partition(" ")
        path = [m for m in await self.client.messages(self.thread_id) if m["role"] in ("user", "assistant") and (m["content"] or m["role"] == "user")]

        def pick(arg: str) -> dict[str, Any]:
            index = int(arg) - 1
            if not 0 <= index < len(path):
                raise ValueError(f"no message [{arg}]; /history shows the numbers")
            return path[index]

        try:
            if name == "/history":
                await self.show_path()
            elif name == "/allowances":
                self._listed = await self.client.allowances(self.thread_id)
                if not self._listed:
                    click.echo("no standing approvals in this thread")
                for shown, allowance in enumerate(self._listed, 1):
                    click.echo(f"[{shown}] {_describe_allowance(allowance)}")
            elif name == "/revoke":
                listed = self._listed or await self.client.allowances(self.thread_id)
                index = int(rest.strip() or "0") - 1
                if not 0 <= index < len(listed):
                    raise ValueError("no such standing approval; /allowances shows the numbers")
                await self.client.revoke_allowance(listed[index]["id"])
                click.echo(f"revoked: {listed[index]['tool']} is asked about again")
            elif name == "/edit":
                number, _, new_text = rest.partition(" ")
                target = pick(number)
                if not new_text.strip():
                    raise ValueError("usage: /edit N new text")
                if target["role"] == "user":  # fork: a sibling of the user message, answered anew
                    run = await self.client.fork(self.thread_id, target["parent_id"], new_text.strip())
                    click.echo("agent> ", nl=False)
                    await self.follow(run["id"])
                else:  # the agent's answer, corrected by hand
                    await self.client.edit_message(target["id"], new_text.strip())
                    await self.show_path()
            elif name == "/regenerate":
                last_user = next(m for m in reversed(path) if m["role"] == "user")
                run = await self.client.regenerate(self.thread_id, last_user["id"])
                click.echo("agent> ", nl=False)
                await self.follow(run["id"])
            elif name == "/branch":
                number, _, direction = rest.partition(" ")
                target = pick(number)
                step = -1 if direction.strip() in ("prev", "<", "-") else 1
                siblings = target["sibling_ids"]
                new_index = (target["sibling_index"] + step) % len(siblings)
                await self.client.set_active_leaf(self.thread_id, siblings[new_index])
                await self.show_path()
            else:
                click.echo("commands: /history, /edit N text, /regenerate, /branch N next|prev, /allowances, /revoke N, /quit")
        except ValueError as exc:
            click.secho(str(exc), fg="red")
        except StopIteration:
            click.secho("nothing to regenerate yet", fg="red")
        except APIError as exc:
            click.secho(f"[{exc.status} {exc.code}] {exc.message}", fg="red")

    async def loop(self) -> None:
        thread = await self.client.get_thread(self.thread_id)
        await self.show_path()
        if thread.get("active_run_id"):
            click.secho("[catching up with the running run]", dim=True)
            await self.follow(thread["active_run_id"])
        while True:
            try:
                text = await asyncio.to_thread(self.ask, "you> ")
            except (EOFError, KeyboardInterrupt):
                click.echo("")
                return
            text = text.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                return
            if text.startswith("/"):
                await self.command(text)
                continue
            try:
                run = await self.client.start_run(self.thread_id, text)
            except APIError as exc:
                click.secho(f"[{exc.status} {exc.code}] {exc.message}", fg="red")
                continue
            click.echo("agent> ", nl=False)
            await self.follow(run["id"])


async def run_chat(url: str, thread_id: str | None, ask: Callable[[str], str] = input) -> None:
    """Chat with the agent served at ``url`` (a new thread unless ``thread_id`` is given)."""
    async with AsyncClient(url) as client:
        if thread_id is None:
            thread_id = (await client.create_thread({"client": "tether chat"}))["id"]
        click.secho(
            f"thread {thread_id} — Ctrl-C stops a run (twice: at once); /history, /edit N text, /regenerate, /branch N next|prev, /allowances, /revoke N, /quit",
            dim=True,
            err=True,
        )
        await _Chat(client, thread_id, ask).loop()


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(run_chat(sys.argv[1], None))
