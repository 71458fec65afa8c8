"""The web UI at ``/``, driven like a person would: headless Chromium through Playwright.

Each test runs the demo agent on a real server (real sockets, a real SQLite file) and checks
what the page shows against what the server says through the API: the refund the card
approved is the refund the shop executed, the text on screen is the stored message byte for
byte, a lost network shows "reconnecting" and never "stopped", and a stopped run is
``cancelled`` on the server with nothing streamed after its ``cancelled`` event.

Chromium is Debian's (``/usr/bin/chromium``; ``scripts/test`` installs it): Playwright never
downloads a browser of its own. With ``TETHER_UI_SCREENSHOTS=docs/ui`` the tests also save
screenshots of the main states, in both colour schemes, at 1200×850 and at 390×844 (that is
how the ones in ``docs/ui/`` were made).

Accessibility: the main states (empty, streaming, an approval card, a card of two actions, the
audit dialog, the mobile drawer, "Approve and allow…", the standing approvals dialog) are
checked with axe-core in both colour schemes; a serious or critical violation fails the test.
axe-core comes from the npm registry, installed on first use into ``tests/.node/``
(git-ignored) and injected into the page by the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from .conftest import LiveServer, ServerProcess, install_lock, script, sqlite_url, start_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
#: Generous: a loaded 2-core machine is slow, and every wait is on a condition, not a clock.
TIMEOUT_MS = 20_000
SCREENSHOTS = os.environ.get("TETHER_UI_SCREENSHOTS")
DESKTOP = {"width": 1200, "height": 850}
MOBILE = {"width": 390, "height": 844}
#: The axe-core release the accessibility checks run (npm; installed into tests/.node/).
AXE_CORE = "axe-core@4.14.1"
NODE_DIR = Path(__file__).parent / ".node"

expect.set_options(timeout=TIMEOUT_MS)


# -- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: what the page does does not depend on the store (whose contract tests run on
    every backend), and once is enough for a browser suite's time budget."""
    return sqlite_url(tmp_path)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def fresh_page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh browser context, closed at the end; fails on a JavaScript error."""
    context = browser.new_context(viewport=DESKTOP, color_scheme="light")
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[Page]:
    """A fresh page; closed before the server stops (so no stream holds it up)."""
    with fresh_page(browser) as page:
        yield page


@pytest.fixture
def api(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def wait_until(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT_MS / 1000) -> Any:
    """Poll ``condition`` until it returns something truthy (and return that)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def shot(page: Page, name: str, focus: Locator | None = None, *, desktop: bool = True) -> None:
    """Save screenshots of the current state (``focus`` scrolled into view) when
    TETHER_UI_SCREENSHOTS names a folder: ``name.png`` (light, 1200×850), ``name-dark.png``,
    ``name-mobile.png`` (390×844) and ``name-mobile-dark.png``; the mobile ones only when
    ``desktop`` is false. The page is left as it was (viewport and colour scheme)."""
    if not SCREENSHOTS:
        return
    Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
    before = page.viewport_size
    variants = [("", "light", DESKTOP), ("-dark", "dark", DESKTOP)] if desktop else []
    variants += [("-mobile", "light", MOBILE), ("-mobile-dark", "dark", MOBILE)]
    try:
        for suffix, scheme, size in variants:
            page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
            page.set_viewport_size(size)
            if focus is not None:
                focus.scroll_into_view_if_needed()
            page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}{suffix}.png"), animations="disabled")
    finally:
        page.emulate_media(color_scheme="light")
        if before:
            page.set_viewport_size(before)


@pytest.fixture(scope="session")
def axe_source() -> str:
    """axe-core's ``axe.min.js``, from the npm registry (installed once into tests/.node/)."""
    path = NODE_DIR / "node_modules" / "axe-core" / "axe.min.js"
    with install_lock(NODE_DIR):
        if not path.exists():
            subprocess.run(
                ["npm", "install", "--prefix", str(NODE_DIR), "--no-save", "--no-audit", "--no-fund", "--loglevel=error", AXE_CORE],
                check=True,
                timeout=300,
            )
    return path.read_text()


AXE_RUN_JS = """
async () => {
  const result = await axe.run(document, { resultTypes: ['violations'] });
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 4).map((n) => `${n.target.join(' ')} — ${n.failureSummary}`),
  }));
}
"""


def assert_accessible(page: Page, axe_source: str, state: str) -> None:
    """No serious or critical axe-core violation in ``state``, in the light and the dark scheme."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.add_script_tag(content=axe_source)
    problems = []
    try:
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
            for violation in page.evaluate(AXE_RUN_JS):
                if violation["impact"] in ("serious", "critical"):
                    problems.append({"scheme": scheme, **violation})
    finally:
        page.emulate_media(color_scheme="light")
    assert not problems, f"accessibility violations in the {state} state:\n" + json.dumps(problems, indent=1)


def open_ui(page: Page, server: LiveServer, query: str = "") -> None:
    page.goto(server.url + "/" + query)
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def send(page: Page, text: str) -> None:
    page.locator("#input").fill(text)
    page.locator("#send").click()


def send_and_finish(page: Page, text: str, state: str = "completed") -> None:
    """Send ``text``, wait for the run it starts to end in ``state`` and the page to settle
    (the thread read again and rendered from the stored messages)."""
    before = page.evaluate("window.tetherUI.lastRunId")
    send(page, text)
    page.wait_for_function("prev => window.tetherUI.lastRunId && window.tetherUI.lastRunId !== prev", arg=before)
    expect(conn(page)).to_have_attribute("data-state", state)
    wait_settled(page)


def wait_settled(page: Page) -> dict[str, Any]:
    """Wait until the page read the ended run's thread again; return its run report."""
    page.wait_for_function("() => window.tetherUI.runs[window.tetherUI.lastRunId].compared === true")
    return run_report(page)


def conn(page: Page) -> Any:
    return page.locator("#conn")


def thread_id(page: Page) -> str:
    value = page.evaluate("new URLSearchParams(location.search).get('thread')")
    assert value, "the thread id is not in the URL"
    return str(value)


def run_report(page: Page) -> dict[str, Any]:
    """What the page streamed for its latest run (``window.tetherUI.runs``)."""
    return page.evaluate("window.tetherUI.runs[window.tetherUI.lastRunId]")  # type: ignore[no-any-return]


def path_of(api: httpx.Client, thread: str) -> list[dict[str, Any]]:
    response = api.get(f"/v1/threads/{thread}/messages", params={"view": "path"})
    response.raise_for_status()
    return response.json()["items"]  # type: ignore[no-any-return]


def events_of(api: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    response = api.get(f"/v1/runs/{run_id}/events", params={"limit": 1000})
    response.raise_for_status()
    return response.json()["items"]  # type: ignore[no-any-return]


def effects(api: httpx.Client, tool: str) -> list[dict[str, Any]]:
    return api.get("/v1/demo/effects", params={"tool": tool}).json()["items"]  # type: ignore[no-any-return]


def displayed_path(page: Page) -> list[tuple[str, str]]:
    """(message id, text) of every message bubble on screen, top to bottom."""
    return [
        (str(item["id"]), str(item["text"]))
        for item in page.evaluate("[...document.querySelectorAll('#chat .msg')].map(m => ({id: m.dataset.id, text: m.querySelector('.text').textContent}))")
    ]


def expected_path(api: httpx.Client, thread: str) -> list[tuple[str, str]]:
    """(message id, text) of the active path as the API gives it, tool messages left out."""
    return [(m["id"], m["content"] or "") for m in path_of(api, thread) if m["role"] != "tool"]


# -- human review ----------------------------------------------------------------------------


def test_approving_a_refund_with_one_click_runs_it_and_the_audit_view_lists_the_decision(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, "refund 25 on order A100")

    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    expect(card.locator(".description")).to_have_text("Refund 25 on order A100")  # the number of the args below
    expect(card.locator(".args dd").nth(1)).to_have_text("25")
    expect(conn(page)).to_have_attribute("data-state", "interrupted")
    expect(conn(page)).to_have_text("waiting for you")
    expect(card.locator(".countdown")).to_contain_text("expires in 9:")
    assert effects(api, "refund") == [], "the refund ran before anyone approved it"
    shot(page, "approval-card")

    card.locator(".choice-approve").click()

    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(conn(page)).to_have_text("done")
    tool_card = page.locator(".tool-card[data-tool=refund]")
    expect(tool_card).to_have_attribute("data-status", "ok")
    expect(tool_card.locator(".result")).to_contain_text('"status": "issued"')
    final = page.locator("#chat .msg.assistant").last
    expect(final.locator(".text")).to_contain_text("Here is what happened: refund")
    stored = [m for m in path_of(api, thread_id(page)) if m["role"] == "assistant"][-1]
    expect(final.locator(".text")).to_have_text(stored["content"])
    assert [e["args"] for e in effects(api, "refund")] == [{"order_id": "A100", "amount": 25.0}]
    shot(page, "completed")

    page.locator("#audit-btn").click()
    decision = page.locator(".audit-table tr[data-action=decision]")
    expect(decision).to_have_count(1)
    expect(decision).to_have_attribute("data-decision", "approve")
    expect(decision).to_contain_text("refund")
    expect(page.locator(".audit-table tr[data-action=tool_executed]")).to_have_count(1)
    shot(page, "audit-view")
    page.keyboard.press("Escape")
    expect(page.locator("#audit")).not_to_be_visible()


def test_editing_args_shows_the_servers_field_error_inline_and_a_valid_edit_runs(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, "refund 25 on order A100")
    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")

    card.locator(".choice-edit").click()
    editor = card.locator(".args-editor")
    expect(editor).to_be_focused()
    assert json.loads(editor.input_value()) == {"order_id": "A100", "amount": 25}
    editor.fill('{"order_id": "A100", "amount": -5}')
    card.locator(".confirm-edit").click()

    error = card.locator(".field-errors")
    expect(error).to_have_text("amount: Input should be greater than 0")
    expect(editor).to_have_attribute("aria-invalid", "true")
    expect(card).to_have_attribute("data-state", "pending")
    shot(page, "edit-args-error")

    editor.fill('{"order_id": "A100", "amount": 10')  # not JSON: caught before any request
    card.locator(".confirm-edit").click()
    expect(error).to_contain_text("Not valid JSON")

    editor.fill('{"order_id": "A100", "amount": 10}')
    card.locator(".confirm-edit").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(page.locator(".tool-card[data-tool=refund]")).to_have_attribute("data-status", "ok")
    expect(page.locator(".tool-card[data-tool=refund] .result")).to_contain_text('"amount": 10')
    assert [e["args"] for e in effects(api, "refund")] == [{"order_id": "A100", "amount": 10.0}]


def test_a_card_with_two_actions_submits_one_approval_and_one_rejection_with_its_reason(page: Page, server: LiveServer, api: httpx.Client) -> None:
    page.set_viewport_size({"width": 360, "height": 780})  # the narrowest supported screen
    open_ui(page, server)
    refunds = [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}, {"name": "refund", "args": {"order_id": "A2", "amount": 7}}]
    send(page, script({"thinking": "Both orders qualify.", "text": "Two refunds, then.", "tool_calls": refunds}, {"text": "Handled both."}))

    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    thinking = page.locator("#chat .thinking")
    expect(thinking).to_have_count(1)
    expect(thinking.locator(".thinking-text")).to_have_text("Both orders qualify.")
    expect(thinking).not_to_have_attribute("open", "")  # collapsed once the answer started
    expect(card.locator(".action")).to_have_count(2)
    submit = card.locator(".submit")
    expect(card.locator(".submit-hint")).to_have_text("0 of 2 decided — choose for each action")
    card.locator(".action[data-index='0'] .choice-approve").click()
    card.locator(".action[data-index='1'] .choice-reject").click()
    card.locator(".action[data-index='1'] .reason").fill("wrong order")
    expect(card.locator(".submit-hint")).to_have_text("All 2 decided")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360, "the page scrolls sideways at 360 px"
    shot(page, "multi-action", card)
    submit.click()

    expect(conn(page)).to_have_attribute("data-state", "completed")
    first = page.locator(".tool-card[data-tool=refund]").nth(0)
    second = page.locator(".tool-card[data-tool=refund]").nth(1)
    expect(first).to_have_attribute("data-status", "ok")
    expect(first.locator(".result")).to_contain_text('"order_id": "A1"')
    expect(second).to_have_attribute("data-status", "rejected")
    expect(second.locator(".result")).to_contain_text("wrong order")
    expect(page.locator("#chat .msg.assistant").last.locator(".text")).to_have_text("Handled both. ")
    expect(page.locator("#chat .thinking .thinking-text")).to_have_text("Both orders qualify.")  # kept after the run
    assert [e["args"]["order_id"] for e in effects(api, "refund")] == ["A1"]
    audit = api.get("/v1/audit", params={"thread_id": thread_id(page)}).json()["items"]
    assert [(a["decision"], a["reason"]) for a in audit if a["action"] == "decision"] == [("approve", None), ("reject", "wrong order")]


def test_a_question_for_the_user_offers_only_an_answer_box_and_the_answer_is_the_result(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, "ask what colour")
    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    expect(card.locator(".description")).to_have_text("Question for you: what colour")
    expect(card.locator(".choice-approve")).to_have_count(0)
    answer = card.locator(".response")
    expect(answer).to_be_visible()
    card.locator(".confirm-respond").click()
    expect(card.locator(".field-errors")).to_have_text("Write an answer first.")
    answer.fill("blue")
    card.locator(".confirm-respond").click()

    expect(conn(page)).to_have_attribute("data-state", "completed")
    tool_card = page.locator(".tool-card[data-tool=ask_user]")
    expect(tool_card).to_have_attribute("data-status", "responded")
    expect(tool_card.locator(".result")).to_have_text("blue")
    expect(page.locator("#chat .msg.assistant").last.locator(".text")).to_contain_text("blue")


def test_reload_brings_back_the_pending_card_with_the_same_countdown_and_approving_works(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, "refund 25 on order A100")
    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    expires_at = card.get_attribute("data-expires-at")
    left_before = int(card.locator(".countdown").get_attribute("data-seconds-left") or 0)
    url = page.url

    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    assert page.url == url
    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    assert card.get_attribute("data-expires-at") == expires_at
    left_after = int(card.locator(".countdown").get_attribute("data-seconds-left") or 0)
    assert left_before - 15 <= left_after <= left_before, (left_before, left_after)
    expect(conn(page)).to_have_attribute("data-state", "interrupted")
    expect(page.locator("#chat .msg.user .text")).to_have_text(["refund 25 on order A100"])

    approve = card.locator(".choice-approve")
    approve.focus()
    page.keyboard.press("Enter")  # keyboard-operable
    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(page.locator(".tool-card[data-tool=refund]")).to_have_attribute("data-status", "ok")
    assert len(effects(api, "refund")) == 1


def test_an_unanswered_card_expires_by_itself_and_offers_nothing_to_click(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server, "?approval_ttl_s=2")
    expect(page.locator("#set-ttl")).to_have_value("2")
    refund = {"name": "refund", "args": {"order_id": "A100", "amount": 25}}
    # The wrap-up after expiry streams for a few seconds: time to look at the expired card.
    send(page, script({"tool_calls": [refund]}, {"tokens": 250, "delay_ms": 20}))

    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "expired")
    expect(card).to_contain_text("This request expired")
    expect(card.locator("button, textarea, input")).to_have_count(0)
    shot(page, "approval-expired", card)
    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(page.locator(".tool-card[data-tool=refund]")).to_have_attribute("data-status", "expired")

    run = api.get(f"/v1/runs/{run_report(page)['runId']}").json()
    assert run["status"] == "completed"
    assert run["config"]["approval_ttl_s"] == 2
    assert effects(api, "refund") == []
    audit = api.get("/v1/audit", params={"thread_id": thread_id(page)}).json()["items"]
    assert [a["action"] for a in audit] == ["expired"]


# -- stopping and the network ----------------------------------------------------------------


def test_stop_during_a_long_stream_ends_in_stopped_and_nothing_streams_after_cancelled(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, script({"tokens": 600, "delay_ms": 20}))
    live_text = page.locator(".live-run .msg.assistant .text")
    expect(live_text).to_contain_text("t15 ")
    expect(conn(page)).to_have_attribute("data-state", "streaming")
    expect(conn(page)).to_have_text("live")
    shot(page, "streaming")

    page.locator("#stop").click()

    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    expect(conn(page)).to_have_text("stopped")
    report = wait_settled(page)
    assert report["states"].index("cancelling") < report["states"].index("cancelled")
    run = api.get(f"/v1/runs/{report['runId']}").json()
    assert run["status"] == "cancelled" and run["cancel"]["mode"] == "soft"

    events = events_of(api, report["runId"])
    assert events[-1]["type"] == "cancelled"
    assert report["eventsAfterTerminal"] == 0
    partial_id = events[-1]["data"]["partial_message_id"]
    stored = next(m for m in path_of(api, thread_id(page)) if m["id"] == partial_id)
    assert stored["status"] == "cancelled"
    # Every token on the server precedes `cancelled`; the page shows exactly those tokens.
    assert report["streamedText"][partial_id] == stored["content"]
    assert report["mismatches"] == []
    partial = page.locator(f"#chat .msg[data-id='{partial_id}']")
    expect(partial).to_have_attribute("data-status", "cancelled")
    expect(partial.locator(".badge-cancelled")).to_have_text("stopped")
    expect(partial.locator(".text")).to_have_text(stored["content"])
    assert 15 <= len(stored["content"].split()) < 600
    shot(page, "stopped")


def test_escape_stops_the_run_and_a_second_stop_makes_it_hard(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, script({"tool_calls": [{"name": "sleep", "args": {"seconds": 30}}]}))
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "running")

    page.locator("body").press("Escape")  # soft: the sleeping tool would be left to finish
    expect(conn(page)).to_have_attribute("data-state", "cancelling")
    expect(conn(page)).to_have_text("stopping…")
    expect(page.locator("#stop")).to_be_hidden()  # one button is left: "Stop now"
    page.locator("#stop-now").click()  # hard: the tool is cancelled

    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    run = api.get(f"/v1/runs/{run_report(page)['runId']}").json()
    assert run["status"] == "cancelled"
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "cancelled")
    audit = api.get("/v1/audit", params={"thread_id": thread_id(page)}).json()["items"]
    assert [a["details"]["mode"] for a in audit if a["action"] == "cancel"] == ["soft", "hard"]


def test_a_network_drop_shows_reconnecting_and_the_text_ends_exactly_as_stored(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, script({"tokens": 300, "delay_ms": 20}))
    live_text = page.locator(".live-run .msg.assistant .text")
    expect(live_text).to_contain_text("t10 ")
    run_id = run_report(page)["runId"]

    page.context.set_offline(True)
    expect(conn(page)).to_have_attribute("data-state", "recovering")
    expect(conn(page)).to_have_text("reconnecting…")
    shot(page, "reconnecting")
    # The run goes on without us: wait until the server has produced tokens we have not seen.
    seen = run_report(page)["tokenEvents"]

    def server_tokens() -> int:
        return sum(e["type"] == "token" for e in events_of(api, run_id))

    wait_until(lambda: server_tokens() >= min(seen + 20, 300), "the run to go on while offline")
    assert server_tokens() > seen, "the page saw every token although it was offline"
    assert api.get(f"/v1/runs/{run_id}").json()["status"] in ("running", "completed")  # not cancelled
    expect(conn(page)).to_have_attribute("data-state", "recovering")  # still: never "stopped"
    page.context.set_offline(False)

    expect(conn(page)).to_have_attribute("data-state", "completed", timeout=30_000)
    report = wait_settled(page)
    assert "cancelled" not in report["states"] and "cancelling" not in report["states"]
    assert report["reconnects"] >= 1
    final = [m for m in path_of(api, thread_id(page)) if m["role"] == "assistant"][-1]
    expected = "".join(f"t{n} " for n in range(1, 301))
    assert final["content"] == expected
    assert report["streamedText"][final["id"]] == expected, "a token was lost or duplicated"
    assert report["tokenEvents"] == 300
    assert report["mismatches"] == []
    expect(page.locator(f"#chat .msg[data-id='{final['id']}'] .text")).to_have_text(expected)


def test_a_server_stopped_mid_answer_shows_reconnecting_and_its_restart_finishes_the_answer(
    browser: Browser, processes: list[ServerProcess], tmp_path: Path
) -> None:
    first = start_server(processes, tmp_path, "--drain-seconds", "0")
    assert first.proc is not None
    with fresh_page(browser) as page:
        page.goto(first.url + "/")
        expect(page.locator("body")).to_have_attribute("data-ready", "true")
        send(page, script({"tokens": 300, "delay_ms": 20}))
        expect(page.locator(".live-run .msg.assistant .text")).to_contain_text("t10 ")

        first.proc.send_signal(signal.SIGTERM)  # a deploy stops the server mid-answer
        first.proc.wait(30)
        expect(conn(page)).to_have_attribute("data-state", "recovering")
        expect(conn(page)).to_have_text("reconnecting…")  # never "stopped": the run was not cancelled

        # The new version starts on the same port and database, and takes the run over.
        second = ServerProcess(first.db_url, tmp_path / "server-restarted.log", extra_args=("--drain-seconds", "0"))
        second.port, second.url = first.port, first.url
        processes.append(second)
        second.start()
        expect(conn(page)).to_have_attribute("data-state", "completed", timeout=60_000)
        report = wait_settled(page)
        assert "cancelled" not in report["states"] and "cancelling" not in report["states"]
        assert report["reconnects"] >= 1 and report["mismatches"] == []
        with httpx.Client(base_url=second.url, timeout=10) as api:
            final = [m for m in path_of(api, thread_id(page)) if m["role"] == "assistant"][-1]
            log = events_of(api, report["runId"])
        assert any(e["type"] == "status" and e["data"]["stage"] == "recovering" for e in log)  # taken over, not finished before the stop
        expected = "".join(f"t{n} " for n in range(1, 301))
        assert final["content"] == expected
        assert report["streamedText"][final["id"]] == expected, "the page kept tokens of the discarded answer, or lost some"
        expect(page.locator(f"#chat .msg[data-id='{final['id']}'] .text")).to_have_text(expected)


CUT_STREAMS_JS = """
async (runId) => {
  const { TetherClient } = await import('/static/tether-client.js');
  const asked = [];  // the Last-Event-ID of every connection
  let connection = 0;
  // A fetch whose first three event streams break after a few chunks (as a dropped network
  // does, possibly in the middle of an event); the second one also asks from 5 seqs too early,
  // so the server sends events the client already has.
  async function flakyFetch(url, init) {
    if (!String(url).includes('/events')) return fetch(url, init);
    connection += 1;
    const headers = { ...init.headers };
    asked.push(headers['Last-Event-ID']);
    if (connection === 2) headers['Last-Event-ID'] = String(Math.max(0, Number(headers['Last-Event-ID']) - 5));
    const response = await fetch(url, { ...init, headers });
    if (connection > 3) return response;
    const reader = response.body.getReader();
    let chunks = 0;
    const body = new ReadableStream({
      async pull(controller) {
        if (chunks++ >= 3) { reader.cancel(); controller.error(new TypeError('network error')); return; }
        const { value, done } = await reader.read();
        if (done) controller.close(); else controller.enqueue(value);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  }
  const client = new TetherClient({ fetch: flakyFetch });
  const seqs = [];
  const states = [];
  const stream = client.follow(runId, { minBackoffMs: 20, onEvent: (e) => seqs.push(e.seq), onState: (s) => states.push(s) });
  const last = await stream.finished;
  return { seqs, states, asked, terminal: last && last.type, stats: stream.stats };
}
"""


def test_the_browser_client_resumes_a_cut_stream_from_its_last_seq_without_gaps_or_duplicates(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)  # for the origin and the module
    # Started only now, and long enough (2 s) to be live while the first three connections are
    # cut: a run that had already ended would come in a few large chunks, and fewer reconnects.
    thread = api.post("/v1/threads").json()
    run = api.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": script({"tokens": 200, "delay_ms": 10})}}).json()

    result = page.evaluate(CUT_STREAMS_JS, run["id"])

    stored = [e["seq"] for e in events_of(api, run["id"])]
    assert result["terminal"] == "done"
    assert result["seqs"] == stored, "events were lost, repeated or reordered"
    assert result["stats"]["duplicates"] > 0, "the replayed events were not seen (the test did not test dedup)"
    asked = [int(seq) for seq in result["asked"]]
    assert len(asked) >= 4 and asked[0] == 0
    assert asked == sorted(asked), f"a reconnect asked from before what it had delivered: {asked}"
    assert "recovering" in result["states"] and result["states"][-1] == "completed"
    assert "cancelling" not in result["states"] and "cancelled" not in result["states"]


# -- steering ----------------------------------------------------------------------------


def test_editing_a_message_forks_and_the_branch_switcher_shows_each_path(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send_and_finish(page, "hello")
    send_and_finish(page, "order A100")
    thread = thread_id(page)
    expect(page.locator("#chat .msg.user")).to_have_count(2)
    assert displayed_path(page) == expected_path(api, thread)

    first = page.locator("#chat .msg.user").first
    first.locator(".edit-user").click()
    first.locator(".msg-editor").fill("order B200")
    before = page.evaluate("window.tetherUI.lastRunId")
    first.locator(".save-edit").click()
    page.wait_for_function("prev => window.tetherUI.lastRunId !== prev", arg=before)
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    first = page.locator("#chat .msg.user").first
    expect(first.locator(".text")).to_have_text("order B200")
    expect(first.locator(".branch .pos")).to_have_text("2/2")
    expect(page.locator("#chat .msg.user")).to_have_count(1)
    assert displayed_path(page) == expected_path(api, thread)
    shot(page, "branch-switcher", first)

    first.locator(".branch .prev").click()
    first = page.locator("#chat .msg.user").first
    expect(first.locator(".branch .pos")).to_have_text("1/2")
    expect(first.locator(".text")).to_have_text("hello")
    expect(page.locator("#chat .msg.user")).to_have_count(2)
    assert displayed_path(page) == expected_path(api, thread)

    first.locator(".branch .next").click()
    expect(page.locator("#chat .msg.user").first.locator(".branch .pos")).to_have_text("2/2")
    assert displayed_path(page) == expected_path(api, thread)

    # Edit the agent's answer: a new version, made active, with its own switcher.
    answer = page.locator("#chat .msg.assistant").last
    answer.locator(".edit-answer").click()
    answer.locator(".msg-editor").fill("Order B200 is on its way.")
    answer.locator(".save-edit").click()
    answer = page.locator("#chat .msg.assistant").last
    expect(answer.locator(".text")).to_have_text("Order B200 is on its way.")
    expect(answer.locator(".branch .pos")).to_have_text("2/2")
    assert displayed_path(page) == expected_path(api, thread)

    # The thread list on a phone: a drawer that Esc closes.
    page.set_viewport_size({"width": 360, "height": 740})
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    page.locator("#toggle-threads").click()
    expect(page.locator("#toggle-threads")).to_have_attribute("aria-expanded", "true")
    expect(page.locator(f".thread-item[data-thread-id='{thread}']")).to_be_in_viewport()
    expect(page.locator(f".thread-item[data-thread-id='{thread}']")).to_have_attribute("aria-current", "page")
    shot(page, "threads", desktop=False)
    page.keyboard.press("Escape")
    expect(page.locator("#toggle-threads")).to_have_attribute("aria-expanded", "false")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


def test_a_correction_joins_the_running_run_and_regenerate_adds_a_second_answer(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    # Call 1 streams for a while (8 s: a loaded machine once took the 2.4 s of 120 tokens to
    # show the page streaming, and the run was over before it could be steered); call 2 (made
    # because a steering message arrived) echoes the history it was given, so the page can
    # show that the correction reached the model.
    send(page, script({"tokens": 400, "delay_ms": 20}, {"echo": True}))
    expect(page.locator(".live-run .msg.assistant .text")).to_contain_text("t5 ")
    expect(page.locator("#send")).to_have_text("Send to steer")
    page.locator("#input").fill("Actually, make it shorter.")
    page.locator("#send").click()
    correction = page.locator(".live-run .msg.user.steering")
    expect(correction.locator(".text")).to_have_text("Actually, make it shorter.")
    expect(page.locator("#input")).to_have_value("")

    expect(conn(page)).to_have_attribute("data-state", "completed", timeout=40_000)  # the rest of call 1, then call 2
    wait_settled(page)
    thread = thread_id(page)
    final = page.locator("#chat .msg.assistant").last
    expect(final.locator(".text")).to_contain_text('"content": "Actually, make it shorter."')
    assert displayed_path(page) == expected_path(api, thread)

    before = page.evaluate("window.tetherUI.lastRunId")
    final.locator(".regenerate").click()
    page.wait_for_function("prev => window.tetherUI.lastRunId !== prev", arg=before)
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    final = page.locator("#chat .msg.assistant").last
    expect(final.locator(".branch .pos")).to_have_text("2/2")
    assert displayed_path(page) == expected_path(api, thread)


# -- what a person trips over (issue 14) -----------------------------------------------------

REFUNDS = [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}, {"name": "refund", "args": {"order_id": "A2", "amount": 7}}]


def pending_card(page: Page, text: str = "refund 25 on order A100") -> Locator:
    """Send ``text`` and return its approval card once it is pending."""
    send(page, text)
    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    return card


def current_run(api: httpx.Client, page: Page) -> dict[str, Any]:
    return api.get(f"/v1/runs/{run_report(page)['runId']}").json()  # type: ignore[no-any-return]


def audit_of(api: httpx.Client, page: Page) -> list[dict[str, Any]]:
    return api.get("/v1/audit", params={"thread_id": thread_id(page)}).json()["items"]  # type: ignore[no-any-return]


def reload(page: Page) -> None:
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def button_names(scope: Locator) -> list[str]:
    """The accessible names of the buttons in ``scope``, as Chromium computes them."""
    return re.findall(r'button "((?:[^"\\]|\\.)*)"', scope.aria_snapshot())


#: Text colour against the element's own background, for filled buttons (WCAG ratio).
CONTRAST_JS = """
(els) => {
  const rgb = (s) => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  return els.filter((el) => el.offsetParent !== null).map((el) => {
    const cs = getComputedStyle(el);
    const [hi, lo] = [lum(rgb(cs.color)), lum(rgb(cs.backgroundColor))].sort((a, b) => b - a);
    return { text: el.textContent.trim(), ratio: Math.round(((hi + 0.05) / (lo + 0.05)) * 100) / 100 };
  });
}
"""


def low_contrast_buttons(page: Page, selector: str) -> list[dict[str, Any]]:
    """Filled buttons matching ``selector`` whose text is under 4.5:1, in either colour scheme."""
    low = []
    try:
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
            found = page.locator(selector).evaluate_all(CONTRAST_JS)
            assert found, f"no button matches {selector}"
            low += [{"scheme": scheme, **b} for b in found if b["ratio"] < 4.5]
    finally:
        page.emulate_media(color_scheme="light")
    return low


def test_escape_never_cancels_a_request_that_waits_for_a_person(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page)

    card.locator(".choice-approve").focus()
    page.keyboard.press("Escape")  # on the card
    hint = page.locator("#composer-hint")
    expect(hint).to_contain_text("Esc does not cancel a request that waits for you")
    page.locator("#input").focus()
    page.keyboard.press("Escape")  # in the message box
    card.locator(".choice-reject").click()
    expect(card.locator(".reason")).to_be_focused()
    page.keyboard.press("Escape")  # backs out of the reason panel, nothing more
    expect(card.locator(".reason")).to_have_count(0)
    expect(card.locator(".choice-reject")).to_be_focused()
    page.keyboard.press("Escape")

    expect(card).to_have_attribute("data-state", "pending")
    expect(conn(page)).to_have_attribute("data-state", "interrupted")
    run = current_run(api, page)
    assert run["status"] == "waiting_human" and run["cancel"] is None
    assert run["pending_interrupt"]["status"] == "pending"
    assert [a for a in audit_of(api, page) if a["action"] == "cancel"] == []
    # The request is still there to decide.
    card.locator(".choice-approve").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    assert len(effects(api, "refund")) == 1


def test_after_a_reload_an_edited_approval_shows_what_ran_the_change_and_who_decided(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page, script({"tool_calls": [{"name": "refund", "args": {"order_id": "A100", "amount": 30}}]}, {"text": "Refunded."}))
    card.locator(".choice-edit").click()
    card.locator(".args-editor").fill('{"order_id": "A100", "amount": 12.5}')
    card.locator(".confirm-edit").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    assert [e["args"] for e in effects(api, "refund")] == [{"order_id": "A100", "amount": 12.5}]

    for when in ("redrawn from the stored messages", "after a reload"):
        tool = page.locator(".tool-card[data-tool=refund]")
        expect(tool, when).to_have_attribute("data-status", "ok")
        decision = tool.locator(".tool-decision")
        expect(decision, when).to_contain_text("Approved with edits by local")
        expect(decision.locator(".diff li"), when).to_have_count(1)
        expect(decision.locator(".diff .diff-key"), when).to_have_text("amount: ")
        expect(decision.locator(".diff del"), when).to_have_text("was 30")
        expect(decision.locator(".diff ins"), when).to_have_text("now 12.5")
        expect(tool.locator(".args"), when).to_contain_text('"amount": 12.5')
        expect(tool.locator(".args"), when).not_to_contain_text("30")
        expect(tool.locator(".tool-summary"), when).to_contain_text("amount: 12.5")
        if when == "redrawn from the stored messages":
            shot(page, "edited-approval", tool)
            reload(page)


def test_after_a_reload_approved_rejected_and_answered_calls_still_say_how_and_by_whom(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    calls = [*REFUNDS, {"name": "ask_user", "args": {"question": "Which colour?"}}]
    card = pending_card(page, script({"tool_calls": calls}, {"text": "Handled."}))
    expect(card.locator(".approve-all")).to_have_count(0)  # a question cannot be approved
    expect(card).not_to_contain_text("null")
    interrupt = current_run(api, page)["pending_interrupt"]
    decisions = [{"decision": "approve"}, {"decision": "reject", "reason": "not eligible"}, {"decision": "respond", "message": "blue"}]
    response = api.post(f"/v1/threads/{thread_id(page)}/resume", json={"interrupt_id": interrupt["id"], "decisions": decisions})
    assert response.status_code == 200, response.text
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    reload(page)

    cards = page.locator(".tool-card")
    expect(cards).to_have_count(3)
    expect(cards.nth(0).locator(".tool-decision")).to_contain_text("Approved by local")
    expect(cards.nth(1)).to_have_attribute("data-status", "rejected")
    expect(cards.nth(1).locator(".tool-decision")).to_contain_text("Rejected by local")
    expect(cards.nth(1).locator(".tool-decision")).to_contain_text("not eligible")
    expect(cards.nth(2).locator(".tool-decision")).to_contain_text("Answered by local")
    expect(cards.nth(2).locator(".tool-summary")).to_contain_text("blue")
    for i in range(3):
        expect(cards.nth(i).locator(".tool-decision")).to_have_text(re.compile(r"^\S+ \w+ by local · \d{1,2}:\d{2}:\d{2}( [AP]M)?( — “not eligible”)?$"))
    shot(page, "decisions", cards.nth(0))


def test_a_failed_runs_error_stays_on_the_page_after_a_reload(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, script({"fail": "provider exploded"}))
    expect(conn(page)).to_have_attribute("data-state", "failed")
    wait_settled(page)
    error = page.locator("#chat .run-error")
    expect(error).to_have_text("The run failed: provider exploded (model_error)")
    shot(page, "run-failed")

    reload(page)
    expect(error).to_have_text("The run failed: provider exploded (model_error)")
    expect(page.locator("#chat .msg.assistant .badge-failed")).to_have_text("failed")
    expect(page.locator("#chat .msg.assistant .text.empty")).to_have_count(0)  # no "(no text)"


def test_the_mobile_drawer_closes_on_a_tap_outside_that_reaches_nothing_and_is_out_of_the_tab_order_when_closed(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
    page.set_viewport_size(MOBILE)
    open_ui(page, server)
    toggle = page.locator("#toggle-threads")
    toggle.focus()
    page.keyboard.press("Tab")
    assert not page.evaluate("document.getElementById('sidebar').contains(document.activeElement)"), "Tab went into the closed drawer"

    page.locator("#input").fill("hello")
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.locator("#new-thread")).to_be_in_viewport()
    expect(page.locator("#new-thread")).to_be_focused()
    box = page.locator("#send").bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    assert page.evaluate("([x, y]) => document.elementFromPoint(x, y).id", [x, y]) == "scrim", "the dimmed Send button takes taps"
    requests: list[str] = []
    page.on("request", lambda request: requests.append(f"{request.method} {request.url}") if request.method != "GET" else None)
    page.mouse.click(x, y)  # a tap on the dimmed area, right over the Send button

    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(toggle).to_be_focused()
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    expect(page.locator("#input")).to_have_value("hello")
    assert requests == [] and api.get("/v1/threads").json()["items"] == [], "the tap sent the message"


def test_focus_lands_on_the_next_control_after_a_keyboard_approval_and_after_saving_an_edit(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page)
    card.locator(".choice-approve").focus()
    page.keyboard.press("Enter")
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    expect(page.locator("#input")).to_be_focused()  # not <body>: the card it was on is gone

    answer = page.locator("#chat .msg.assistant").last
    answer.locator(".edit-answer").click()
    editor = answer.locator(".msg-editor")
    expect(editor).to_be_focused()
    editor.fill("The refund is on its way.")
    editor.press("Control+Enter")
    answer = page.locator("#chat .msg.assistant").last
    expect(answer.locator(".text")).to_have_text("The refund is on its way.")
    expect(answer.locator(".edit-answer")).to_be_focused()  # the saved answer's own Edit button

    first = page.locator("#chat .msg.user").first
    first.locator(".edit-user").click()
    first.locator(".msg-editor").fill("hello")
    before = page.evaluate("window.tetherUI.lastRunId")
    first.locator(".msg-editor").press("Control+Enter")
    page.wait_for_function("prev => window.tetherUI.lastRunId !== prev", arg=before)
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    expect(page.locator("#chat .msg.user").first.locator(".text")).to_have_text("hello")
    expect(page.locator("#input")).to_be_focused()


def test_a_soft_stop_leaves_one_stop_now_button_and_says_it_waits_for_the_running_tool(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send(page, script({"tool_calls": [{"name": "sleep", "args": {"seconds": 30}}]}))
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "running")
    page.locator("#stop").click()

    expect(conn(page)).to_have_attribute("data-state", "cancelling")
    composer = page.locator("#composer")
    expect(composer.get_by_role("button", name="Stop now")).to_have_count(1)
    expect(composer.get_by_role("button", name="Stop", exact=True)).to_have_count(0)
    status = page.locator("#status-line")
    expect(status).to_contain_text("waiting for sleep to finish")
    expect(status).to_contain_text("“Stop now” cancels it")
    expect(status).to_contain_text(re.compile(r"\([1-9]\d* s so far\)"))  # the elapsed time counts
    shot(page, "stopping")
    page.locator("#stop-now").click()
    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "cancelled")


def test_filled_buttons_meet_aa_contrast_in_both_colour_schemes(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page, script({"tool_calls": REFUNDS}, {"text": "Handled."}))
    assert low_contrast_buttons(page, "#composer .btn.danger, #composer .btn.primary, .approval .btn.danger, .approval .btn.primary") == []
    card.locator(".approve-all").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)

    page.locator("#new-thread").click()
    card = pending_card(page)
    card.locator(".choice-reject").click()
    assert low_contrast_buttons(page, ".approval .confirm-reject, #stop, #send") == []


def test_a_question_is_asked_not_approved_its_box_has_focus_and_enter_sends_the_answer(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page, "ask what colour")
    expect(card.locator(".approval-title")).to_have_text("The agent asks you a question")
    expect(card).not_to_contain_text(re.compile("approv", re.IGNORECASE))
    expect(card.locator(".risk")).to_have_count(0)
    expect(page.locator(".tool-card[data-tool=ask_user] .tool-state")).to_have_text("waiting for your answer")
    answer = card.locator(".response")
    expect(answer).to_be_focused()
    shot(page, "question", card)

    # Enter in the message box says why nothing was sent, and keeps the text.
    page.locator("#input").fill("green")
    page.locator("#input").press("Enter")
    expect(page.locator("#composer-hint")).to_contain_text("waiting for your answer to its question")
    expect(page.locator("#input")).to_have_value("green")

    answer.fill("blue")
    answer.press("Enter")
    expect(conn(page)).to_have_attribute("data-state", "completed")
    tool_card = page.locator(".tool-card[data-tool=ask_user]")
    expect(tool_card).to_have_attribute("data-status", "responded")
    expect(tool_card.locator(".result")).to_have_text("blue")
    assert "green" not in [m["content"] for m in path_of(api, thread_id(page))]


def test_an_expired_request_stays_in_the_chat_as_expired_not_executed_with_its_time(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server, "?approval_ttl_s=1")
    send(page, script({"tool_calls": [{"name": "refund", "args": {"order_id": "A100", "amount": 25}}]}, {"text": "It expired."}))
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)

    for when in ("redrawn from the stored messages", "after a reload"):
        tool = page.locator(".tool-card[data-tool=refund]")
        expect(tool, when).to_have_attribute("data-status", "expired")
        decision = tool.locator(".tool-decision")
        expect(decision, when).to_contain_text(re.compile(r"Expired at \d{1,2}:\d{2}:\d{2}.* — not executed"))
        if when == "redrawn from the stored messages":
            reload(page)
    assert effects(api, "refund") == []


CURSORS_JS = "() => [...document.querySelectorAll('#chat .msg.assistant .text')].filter((t) => getComputedStyle(t, '::after').content.includes('▍')).length"


def test_the_typing_cursor_shows_only_while_text_streams(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(
        page,
        script(
            {"text": "Let me refund that first.", "tool_calls": [{"name": "refund", "args": {"order_id": "A1", "amount": 5}}]},
            {"tokens": 40, "delay_ms": 40, "tool_calls": [{"name": "sleep", "args": {"seconds": 30}}]},
        ),
    )
    expect(page.locator(".live-run .msg.assistant .text").first).to_have_text("Let me refund that first. ")
    assert page.evaluate(CURSORS_JS) == 0, "the cursor blinks on text that waits for approval"

    card.locator(".choice-approve").click()
    # While the second answer streams: one cursor, on it (not on the first answer).
    page.wait_for_function(
        f"() => {{ const t = [...document.querySelectorAll('.live-run .msg.assistant .text')]; "
        f"return t.length === 2 && t[1].textContent.includes('t3 ') && ({CURSORS_JS})() === 1 "
        f"&& getComputedStyle(t[1], '::after').content.includes('▍'); }}"
    )
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "running")
    assert page.evaluate(CURSORS_JS) == 0, "the cursor blinks while a tool runs"
    page.locator("#stop-now").click()
    expect(conn(page)).to_have_attribute("data-state", "cancelled")


def test_the_reject_panel_names_its_buttons_apart_keeps_the_countdown_in_view_and_enter_confirms(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page)
    expect(card.locator(".waited")).to_have_text("asked just now")  # not "waiting for 0 s"
    card.locator(".choice-reject").click()
    reason = card.locator(".reason")
    expect(reason).to_be_focused()
    names = button_names(card)
    assert len(names) == len(set(names)), f"two buttons share a name in one card: {names}"
    assert "Confirm rejection" in names
    expect(card.locator(".countdown")).to_be_in_viewport()

    reason.fill("not eligible")
    reason.press("Enter")
    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(page.locator(".tool-card[data-tool=refund]")).to_have_attribute("data-status", "rejected")
    assert [(a["decision"], a["reason"]) for a in audit_of(api, page) if a["action"] == "decision"] == [("reject", "not eligible")]


def test_a_card_of_several_actions_says_what_is_missing_and_marks_each_choice_as_pressed(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page, script({"tool_calls": REFUNDS}, {"text": "Handled both."}))
    names = button_names(card)
    assert len(names) == len(set(names)), f"two buttons share a name in one card: {names}"
    hint = card.locator(".submit-hint")
    expect(hint).to_have_text("0 of 2 decided — choose for each action")
    card.locator(".submit").click()  # too early: it says where a choice is missing
    first, second = card.locator(".action[data-index='0']"), card.locator(".action[data-index='1']")
    expect(first.locator(".field-errors")).to_have_text("Choose a decision for this action.")
    expect(first.locator(".choice-approve")).to_be_focused()

    approve = first.locator(".choice-approve")
    unpressed = approve.evaluate("b => getComputedStyle(b).backgroundColor")
    approve.click()
    expect(approve).to_have_attribute("aria-pressed", "true")
    expect(first.locator(".choice-reject")).to_have_attribute("aria-pressed", "false")
    assert approve.evaluate("b => getComputedStyle(b).backgroundColor") != unpressed, "pressed looks like not pressed"
    expect(hint).to_have_text("1 of 2 decided — choose for each action")
    second.locator(".choice-reject").click()
    expect(hint).to_have_text("All 2 decided")
    card.locator(".submit").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    assert [e["args"]["order_id"] for e in effects(api, "refund")] == ["A1"]


PLACEHOLDER_FITS_JS = """
(input) => {
  const cs = getComputedStyle(input);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const room = input.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  return ctx.measureText(input.placeholder).width <= room;
}
"""

OPTIONS_FIT_JS = """
(select) => {
  const cs = getComputedStyle(select);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
  const widest = Math.max(...[...select.options].map((o) => ctx.measureText(o.text).width));
  // The arrow takes about 1.2em beside the text.
  return widest + parseFloat(cs.paddingLeft) + parseFloat(cs.paddingRight) + 1.2 * parseFloat(cs.fontSize) <= select.getBoundingClientRect().width;
}
"""


def test_at_390px_the_message_box_is_compact_and_a_two_action_card_fits_uncut(page: Page, server: LiveServer, api: httpx.Client) -> None:
    page.set_viewport_size(MOBILE)
    open_ui(page, server)
    card = pending_card(page, script({"text": "Two refunds, then.", "tool_calls": REFUNDS}, {"text": "Handled both."}))
    # The message box and one row of controls under it (no audit bar, no wrapped row).
    tops = page.locator("#composer .composer-row > :visible").evaluate_all("els => els.map((e) => e.getBoundingClientRect().top)")
    assert max(tops) - min(tops) < 16, f"the composer's controls wrap onto more than one row: {tops}"
    chat_height = page.locator("#chat").evaluate("c => c.clientHeight")
    card_box = card.bounding_box()
    assert card_box is not None and card_box["height"] <= chat_height, (card_box, chat_height)
    assert card.locator(".reject-all-reason").evaluate(PLACEHOLDER_FITS_JS), "'Reason for Reject all' is cut off"
    assert page.evaluate("document.documentElement.scrollWidth") <= MOBILE["width"]


def test_run_settings_show_their_options_uncut_on_a_desktop(page: Page, server: LiveServer) -> None:
    open_ui(page, server)
    page.locator("#settings summary").click()
    assert page.locator("#set-threshold").evaluate(OPTIONS_FIT_JS), "the approval threshold's options are cut off"


def test_a_finished_tool_card_is_folded_to_one_line_that_says_what_happened(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send_and_finish(page, "order A100")
    tool = page.locator(".tool-card[data-tool=get_order]")
    expect(tool.locator("details")).not_to_have_attribute("open", "")
    summary = tool.locator(".tool-summary")
    expect(summary).to_contain_text("order_id: A100 → order_id: A100, status: shipped")
    expect(tool.locator(".result")).not_to_be_visible()
    box = tool.bounding_box()
    assert box is not None and box["height"] < 48, box
    tool.locator("summary").click()
    expect(tool.locator(".result")).to_be_visible()
    expect(tool.locator(".result")).to_contain_text('"status": "shipped"')


def test_the_empty_page_keeps_its_examples_and_one_fills_the_message_box(page: Page, server: LiveServer) -> None:
    open_ui(page, server)
    starter = page.locator("#chat .empty")
    expect(starter).to_contain_text("Start a conversation below")
    example = starter.get_by_role("button", name=re.compile("refund 25 on order A100"))
    expect(example).to_be_visible()
    example.click()
    expect(page.locator("#input")).to_have_value("refund 25 on order A100")
    expect(page.locator("#input")).to_be_focused()


def test_the_run_was_not_stopped_banner_goes_away_when_the_run_ends(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    page.route("**/cancel", lambda route: route.abort())  # the stop request never arrives
    send(page, script({"tokens": 150, "delay_ms": 20}))
    expect(page.locator(".live-run .msg.assistant .text")).to_contain_text("t3 ")
    page.locator("#stop").click()
    banner = page.locator("#banner")
    expect(banner).to_contain_text("The run was not stopped")
    expect(conn(page)).to_have_attribute("data-state", "completed")
    expect(banner).to_be_hidden()


def test_reasoning_is_still_there_after_a_reload(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    send_and_finish(page, script({"thinking": "The customer wants a summary.", "text": "Here it is."}))
    reload(page)
    thinking = page.locator("#chat .thinking")
    expect(thinking.locator(".thinking-text")).to_have_text("The customer wants a summary.")
    expect(thinking).not_to_have_attribute("open", "")


def test_field_errors_are_the_accessible_description_of_their_field(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    card = pending_card(page)
    card.locator(".choice-edit").click()
    editor = card.locator(".args-editor")
    editor.fill('{"order_id": "A100", "amount": -5}')
    card.locator(".confirm-edit").click()
    expect(card.locator(".field-errors")).to_have_text("amount: Input should be greater than 0")
    expect(editor).to_have_accessible_description(re.compile("amount: Input should be greater than 0"))


def test_the_thread_list_says_in_words_which_thread_waits_for_you(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server)
    pending_card(page)
    item = page.locator(f".thread-item[data-thread-id='{thread_id(page)}']")
    expect(item).to_contain_text("waiting for you")
    expect(page.get_by_role("button", name=re.compile("waiting for you"))).to_have_count(1)


def test_the_main_states_have_no_serious_accessibility_violations_in_either_colour_scheme(
    page: Page, server: LiveServer, api: httpx.Client, axe_source: str
) -> None:
    open_ui(page, server)
    assert_accessible(page, axe_source, "empty")
    shot(page, "empty")

    send(page, script({"tokens": 400, "delay_ms": 20}))
    expect(page.locator(".live-run .msg.assistant .text")).to_contain_text("t10 ")
    assert_accessible(page, axe_source, "streaming")
    page.locator("#stop-now").click()
    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    wait_settled(page)

    page.locator("#new-thread").click()
    card = pending_card(page)
    assert_accessible(page, axe_source, "approval card")
    card.locator(".choice-reject").click()
    assert_accessible(page, axe_source, "approval card with the reason panel")
    shot(page, "reject-panel", card)
    page.locator("#stop").click()
    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    wait_settled(page)

    page.locator("#new-thread").click()
    pending_card(page, script({"thinking": "Both qualify.", "text": "Two refunds.", "tool_calls": REFUNDS}, {"text": "Handled."}))
    assert_accessible(page, axe_source, "two-action card")

    page.locator("#audit-btn").click()
    expect(page.locator("#audit")).to_be_visible()
    assert_accessible(page, axe_source, "audit dialog")
    page.locator("#audit-close").click()

    page.set_viewport_size(MOBILE)
    page.locator("#toggle-threads").click()
    expect(page.locator("#new-thread")).to_be_in_viewport()
    assert_accessible(page, axe_source, "mobile drawer")


# -- identity ----------------------------------------------------------------------------------


def test_signing_in_with_a_key_shows_only_your_threads_and_an_approver_decides_from_the_approvals_view(
    browser: Browser, tmp_path: Path, axe_source: str
) -> None:
    import asyncio
    import concurrent.futures

    from tether.demo import build_demo_agent

    from .test_auth import create_keys

    db = sqlite_url(tmp_path)
    server = LiveServer(build_demo_agent(), db, auth="keys").start()
    context = browser.new_context(viewport=DESKTOP, color_scheme="light")
    context.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
            keys = pool.submit(asyncio.run, create_keys(db)).result()
        with httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {keys.bob}"}) as bob:
            bobs_thread = bob.post("/v1/threads", json={"metadata": {"title": "bob's private thread"}}).json()["id"]
            bobs_run = bob.post(f"/v1/threads/{bobs_thread}/runs", json={"input": {"content": "refund 7 on order B200"}}).json()["id"]
            wait_until(lambda: bob.get(f"/v1/runs/{bobs_run}").json()["status"] == "waiting_human", "bob's refund to wait")

        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        signin = page.locator("#signin")
        expect(signin).to_be_visible()
        assert_accessible(page, axe_source, "sign-in")
        page.locator("#signin-key").fill("tk_" + "x" * 43)
        page.locator("#signin-form button[type=submit]").click()
        expect(page.locator("#signin-error")).to_contain_text("not accepted")
        page.locator("#signin-key").fill(keys.alice)
        page.locator("#signin-form button[type=submit]").click()
        expect(page.locator("body")).to_have_attribute("data-ready", "true")
        expect(page.locator("#who")).to_have_text("alice · user")
        expect(page.locator("#thread-list li")).to_have_count(0)  # Bob's thread is not Alice's to see
        assert keys.alice not in page.url

        send(page, "refund 25 on order A100")
        expect(page.locator(".approval")).to_have_attribute("data-state", "pending")
        alices_thread = thread_id(page)
        expect(page.locator("#thread-list li")).to_have_count(1)
        expect(page.locator("#approvals-count")).to_have_text("1")  # hers only
        assert "bob's private thread" not in page.content()

        page.locator("#sign-out").click()
        expect(signin).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('tether.apiKey') || localStorage.getItem('tether.apiKey')") is None

        page.locator("#signin-key").fill(keys.carol)
        page.locator("#signin-remember").check()
        page.locator("#signin-form button[type=submit]").click()
        expect(page.locator("#who")).to_have_text("carol · approver")
        expect(page.locator("#approvals-count")).to_have_text("2")
        page.locator("#approvals-btn").click()
        items = page.locator("#approvals .approval-item")
        expect(items).to_have_count(2)
        expect(items.nth(0)).to_contain_text("by bob")  # soonest expiry first: Bob's came first
        expect(items.nth(1)).to_contain_text("by alice")
        expect(items.nth(0).locator(".approval-countdown")).to_have_text(re.compile(r"^expires in \d+:\d\d$"))
        assert_accessible(page, axe_source, "approvals")

        # Open Alice's in its thread, then come back and decide both at once.
        items.filter(has_text="by alice").get_by_role("button", name=re.compile("^Open")).click()
        expect(page.locator(".approval")).to_have_attribute("data-state", "pending")
        assert thread_id(page) == alices_thread
        page.locator("#approvals-btn").click()
        for item in (items.nth(0), items.nth(1)):
            item.locator("input[type=checkbox]").check()
        page.locator("#approvals-approve").click()
        expect(page.locator("#approvals-status")).to_have_text("Approved 2.")
        expect(page.locator("#approvals .empty")).to_have_text("Nothing waits for a decision.")
        page.locator("#approvals-close").click()

        with httpx.Client(base_url=server.url, timeout=10, headers={"Authorization": f"Bearer {keys.root}"}) as root:
            wait_until(lambda: len(root.get("/v1/demo/effects", params={"tool": "refund"}).json()["items"]) == 2, "both refunds to run")
            time.sleep(0.3)  # a second execution would show up here; there must be none
            refunds = root.get("/v1/demo/effects", params={"tool": "refund"}).json()["items"]
            assert sorted(e["args"]["amount"] for e in refunds) == [7, 25]
            audit = root.get("/v1/audit", params={"thread_id": alices_thread}).json()["items"]
            assert [(e["action"], e["actor"]) for e in audit] == [("decision", "carol"), ("tool_executed", "carol")]

        page.reload()  # "remember me": still signed in
        expect(page.locator("#who")).to_have_text("carol · approver")
        page.locator("#sign-out").click()
        expect(signin).to_be_visible()
        assert page.evaluate("localStorage.getItem('tether.apiKey')") is None
    finally:
        context.close()
        server.stop()
    assert not errors, f"JavaScript errors on the page: {errors}"


# -- MCP tools -------------------------------------------------------------------------------------


def test_an_mcp_write_shows_its_tier_and_source_on_the_card_and_an_mcp_image_shows_as_an_image(browser: Browser, tmp_path: Path, axe_source: str) -> None:
    from .test_mcp import agent_with, shop_mcp

    directory = tmp_path / "mcp"
    directory.mkdir()
    live = LiveServer(agent_with(shop_mcp(directory)), sqlite_url(tmp_path)).start()
    try:
        with fresh_page(browser) as page:
            open_ui(page, live)
            send(page, 'call write_record {"name": "ui.txt", "content": "from the page"}')
            card = page.locator(".approval")
            expect(card).to_have_attribute("data-state", "pending")
            expect(card.locator(".risk")).to_have_text("destructive")
            expect(card.locator(".tool-source")).to_have_text("MCP server shop · tier from its annotations")
            expect(card.locator(".description")).to_have_text("Write a record (shop)")
            assert not (directory / "records" / "ui.txt").exists(), "the MCP server was sent the call before anyone approved it"
            assert_accessible(page, axe_source, "MCP approval card")
            shot(page, "mcp-approval-card", card)
            card.locator(".choice-approve").click()
            expect(conn(page)).to_have_attribute("data-state", "completed")
            expect(page.locator(".tool-card[data-tool=write_record]")).to_have_attribute("data-status", "ok")
            assert (directory / "records" / "ui.txt").read_text() == "from the page"
            wait_settled(page)

            send_and_finish(page, "call picture {}")
            tool = page.locator(".tool-card[data-tool=picture]")
            expect(tool).to_have_attribute("data-status", "ok")
            tool.locator("summary").first.click()
            image = tool.locator(".block-image img")
            expect(image).to_be_visible()
            expect(image).to_have_attribute("alt", "Image returned by the tool (image/png)")
            page.wait_for_function("img => img.complete && img.naturalWidth === 96 && img.naturalHeight === 64", arg=image.element_handle())
            assert_accessible(page, axe_source, "MCP image result")
            shot(page, "mcp-image-result", tool)

            send_and_finish(page, 'call manual {"sku": "A1"}')
            manual = page.locator(".tool-card[data-tool=manual]")
            manual.locator("summary").first.click()
            expect(manual.locator(".block-text")).to_have_text("Manual of A1")
            resource = manual.locator(".block-resource")
            expect(resource.locator("summary")).to_have_text("Resource file:///manuals/A1.txt (text/plain)")
            resource.locator("summary").click()
            expect(resource.locator("pre")).to_have_text("Step 1: unpack.")
            link = manual.locator(".block-link a")
            expect(link).to_have_attribute("href", "https://example.com/manuals/A1")
            expect(link).to_have_attribute("rel", "noopener noreferrer")

            # After a reload the stored result shows the same image.
            page.reload()
            expect(page.locator("body")).to_have_attribute("data-ready", "true")
            stored = page.locator(".tool-card[data-tool=picture]")
            stored.locator("summary").first.click()
            page.wait_for_function("img => img && img.complete && img.naturalWidth === 96", arg=stored.locator(".block-image img").element_handle())
    finally:
        live.stop()


# -- thread titles -----------------------------------------------------------------------------


def test_a_thread_is_titled_after_its_first_message_and_renamed_from_the_header(page: Page, server: LiveServer, api: httpx.Client, axe_source: str) -> None:
    open_ui(page, server)
    expect(page.locator("#thread-title")).to_have_text("New thread")
    expect(page.locator("#rename-btn")).to_be_hidden()  # nothing to rename before the first message
    send_and_finish(page, "order   A100\nplease")
    first = thread_id(page)
    title = page.locator("#thread-title")
    expect(title).to_have_text("order A100 please")  # on one line, as the server titled it
    assert api.get(f"/v1/threads/{first}").json()["title"] == "order A100 please"
    item = page.locator(f".thread-item[data-thread-id='{first}'] .thread-name")
    expect(item).to_have_text("order A100 please")

    page.locator("#new-thread").click()
    pending_card(page, "charge 4242424242424242 10 please, it is urgent")
    second = thread_id(page)
    expect(title).to_have_text("charge ****4242 10 please, it is urgent")  # no card number in the header or the list
    expect(page.locator(f".thread-item[data-thread-id='{second}'] .thread-name")).to_have_text("charge ****4242 10 please, it is urgent")
    page.locator("#stop").click()
    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    wait_settled(page)

    rename = page.get_by_role("button", name="Rename thread")
    rename.click()
    dialog = page.locator("#rename")
    box = page.get_by_role("textbox", name="Title")
    expect(dialog).to_be_visible()
    expect(box).to_be_focused()
    expect(box).to_have_value("charge ****4242 10 please, it is urgent")
    box.fill("   ")
    page.locator("#rename-save").click()
    expect(page.locator("#rename-error")).to_have_text("Write a title first.")
    expect(box).to_have_attribute("aria-invalid", "true")
    expect(box).to_have_accessible_description("Write a title first.")
    box.fill("Card charge for Ada")
    assert_accessible(page, axe_source, "rename dialog")
    shot(page, "rename-thread", dialog, desktop=True)
    box.press("Enter")

    expect(dialog).to_be_hidden()
    expect(title).to_have_text("Card charge for Ada")
    expect(rename).to_be_focused()  # back where the person was
    expect(page.locator(f".thread-item[data-thread-id='{second}'] .thread-name")).to_have_text("Card charge for Ada")
    assert api.get(f"/v1/threads/{second}").json()["title"] == "Card charge for Ada"
    expect(item).to_have_text("order A100 please")  # the other thread keeps its own

    # Esc leaves the dialog without renaming (and stops nothing).
    rename.click()
    expect(box).to_be_focused()
    box.fill("not this")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert api.get(f"/v1/threads/{second}").json()["title"] == "Card charge for Ada"

    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(title).to_have_text("Card charge for Ada")
    # On a phone the header shows the title (the brand steps aside) and Rename as an icon.
    page.set_viewport_size(MOBILE)
    expect(title).to_be_visible()
    expect(rename).to_be_visible()
    box_of = rename.bounding_box()
    assert box_of is not None and box_of["x"] + box_of["width"] <= MOBILE["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= MOBILE["width"], "the page scrolls sideways on a phone"
    assert_accessible(page, axe_source, "thread title on a phone")
    page.locator("#toggle-threads").click()
    expect(page.locator(f".thread-item[data-thread-id='{first}'] .thread-name")).to_be_in_viewport()
    shot(page, "thread-titles", page.locator("#sidebar"), desktop=False)


# -- a run's timeline --------------------------------------------------------------------------


def timeline_rows(page: Page) -> list[dict[str, Any]]:
    """Each row of the open Timeline dialog: its kind, its words, and where its bar is drawn."""
    return page.evaluate(  # type: ignore[no-any-return]
        """() => [...document.querySelectorAll('#timeline .tl-row')].map((row) => {
          const bar = row.querySelector('.tl-bar').getBoundingClientRect();
          return { kind: row.dataset.kind, open: row.dataset.open === 'true', text: row.querySelector('.tl-text').textContent,
                   left: bar.left, right: bar.right };
        })"""
    )


def test_a_runs_timeline_shows_model_calls_a_tool_a_human_wait_and_a_cancel_as_bars_and_a_list(
    page: Page, server: LiveServer, api: httpx.Client, axe_source: str
) -> None:
    open_ui(page, server)
    steps = script(
        {"text": "Let me look.", "tool_calls": [{"name": "get_order", "args": {"order_id": "A100"}}]},
        {"tool_calls": [{"name": "refund", "args": {"order_id": "A100", "amount": 5}}]},
        {"text": "Refunded. One slow check.", "tool_calls": [{"name": "sleep", "args": {"seconds": 2}}]},
        {"tokens": 400, "delay_ms": 20},
    )
    card = pending_card(page, steps)

    # While the run waits for a person, its timeline so far says so (the wait is still open).
    live_button = page.locator(f".timeline-btn[data-run-id='{run_report(page)['runId']}']")
    expect(live_button).to_have_count(1)  # under the live run only, not also on its input message
    expect(page.locator(".live-actions .timeline-btn")).to_have_count(1)
    live_button.click()
    dialog = page.locator("#timeline")
    expect(dialog).to_have_attribute("data-ready", "true")
    expect(dialog).to_have_attribute("data-status", "waiting_human")
    expect(dialog.locator(".tl-row[data-kind=human]")).to_have_attribute("data-open", "true")
    expect(dialog.locator(".tl-row[data-kind=human] .tl-detail")).to_contain_text("refund: waiting")
    expect(dialog.locator("#timeline-refresh")).to_be_visible()  # a run under way can be read again
    page.keyboard.press("Escape")  # closes the dialog; the run is not stopped
    expect(dialog).to_be_hidden()
    expect(card).to_have_attribute("data-state", "pending")

    card.locator(".choice-approve").click()
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "running")
    page.locator("#stop").click()  # soft: the sleeping tool finishes first, then the cancel lands
    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    run_id = wait_settled(page)["runId"]

    # The run's last stored message carries its Timeline button.
    opener = page.locator(f"#chat .msg .timeline-btn[data-run-id='{run_id}']")
    expect(opener).to_have_count(1)
    expect(opener).to_have_accessible_name("Timeline of this run")
    opener.click()
    expect(dialog).to_have_attribute("data-ready", "true")
    expect(dialog).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#timeline-refresh")).to_be_hidden()  # an ended run's log never changes

    # The browser's derivation (run-timeline.js) and the server's route agree exactly.
    derived = page.evaluate("window.tetherUI.timeline")
    served = api.get(f"/v1/runs/{run_id}/timeline").json()
    assert derived == served
    segments = served["segments"]
    assert [(s["kind"], s.get("name")) for s in segments] == [
        ("queued", None),
        ("model", None),
        ("tool", "get_order"),
        ("model", None),
        ("human", None),
        ("tool", "refund"),
        ("model", None),
        ("tool", "sleep"),
        ("cancel", None),
    ]
    queued, model1, lookup, model2, wait, refund, model3, sleep, cancel = segments
    assert served["status"] == "cancelled" and not any(s["open"] for s in segments)
    assert [m["index"] for m in (model1, model2, model3)] == [1, 2, 3]
    assert [m["outcome"] for m in (model1, model2, model3)] == ["tool_calls", "tool_calls", "tool_calls"]
    assert all(m["first_token_ms"] is not None and 0 <= m["first_token_ms"] <= m["duration_ms"] for m in (model1, model2, model3))
    assert (lookup["tier"], lookup["ran"], lookup["status"], lookup["gated"]) == ("read_only", True, "ok", False)
    assert (refund["tier"], refund["ran"], refund["status"], refund["gated"]) == ("destructive", True, "ok", True)
    assert (wait["actor"], wait["resolution"], wait["actions"]) == (
        "local",
        "decided",
        [{"call_id": refund["call_id"], "name": "refund", "decision": "approve"}],
    )
    assert wait["start_ms"] + wait["duration_ms"] <= refund["start_ms"]  # the refund ran after the decision, never before
    assert sleep["duration_ms"] >= 1900 and sleep["status"] == "ok"  # a soft stop let it finish
    assert (cancel["mode"], cancel["actor"], cancel["landed"]) == ("soft", "local", True)
    # Asked for while the tool slept; landed once it had finished: that wait is the cancel's bar.
    assert sleep["start_ms"] < cancel["start_ms"] < sleep["start_ms"] + sleep["duration_ms"] <= cancel["start_ms"] + cancel["duration_ms"]
    assert cancel["start_ms"] + cancel["duration_ms"] == pytest.approx(served["duration_ms"])
    assert queued["start_ms"] == 0 and served["ended_at"] is not None

    # What people read: one row per segment, in words, in order; the bars share one time axis.
    rows = timeline_rows(page)
    assert [r["kind"] for r in rows] == [s["kind"] for s in segments]
    texts = [r["text"] for r in rows]
    assert texts[1].startswith("Model call 1: first token after ")
    assert texts[2].startswith("Tool get_order: read-only · ran in ")
    assert re.match(r"Waiting for a person: local approved refund after [\d.]+ (ms|s) \(at ", texts[4]), texts[4]
    assert texts[5].startswith("Tool refund: destructive · ran in ")
    assert re.match(r"Stopped: soft stop by local: landed [\d.]+ (ms|s) after it was asked for", texts[8]), texts[8]
    expect(dialog.locator(".tl-summary")).to_have_text(re.compile(r"^Stopped after [\d.]+ s: 3 model calls, 3 tools, 1 wait for a person \("))
    by_kind = dict(zip([f"{s['kind']}:{s.get('name')}" for s in segments], rows, strict=True))
    assert by_kind["human:None"]["left"] < by_kind["tool:refund"]["left"] < by_kind["tool:sleep"]["left"] < by_kind["cancel:None"]["left"]
    assert by_kind["tool:sleep"]["right"] - by_kind["tool:sleep"]["left"] > 5 * (by_kind["tool:get_order"]["right"] - by_kind["tool:get_order"]["left"])
    assert by_kind["tool:sleep"]["right"] <= by_kind["cancel:None"]["right"] + 1

    # Screen readers get the list (the bars and the axis are hidden from them).
    listing = page.get_by_role("list", name="Where the time went, in order")
    expect(listing.get_by_role("listitem")).to_have_count(9)
    expect(dialog.locator(".tl-track[aria-hidden=true]")).to_have_count(9)
    expect(dialog).to_have_accessible_description(re.compile("^Stopped after"))
    assert_accessible(page, axe_source, "timeline")
    shot(page, "run-timeline", dialog)

    # On a phone the rows stack (words, then the bar) and nothing scrolls sideways.
    page.set_viewport_size(MOBILE)
    rows = timeline_rows(page)
    assert all(r["right"] <= MOBILE["width"] for r in rows)
    assert page.evaluate("(() => { const d = document.getElementById('timeline'); return d.scrollWidth <= d.clientWidth; })()")
    assert_accessible(page, axe_source, "timeline on a phone")
    page.locator("#timeline-close").click()
    expect(dialog).to_be_hidden()
    expect(opener).to_be_focused()  # back to the button that opened it


def synthetic_logs() -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Event logs (and cancel audit entries) of runs that are awkward to make for real: a
    takeover after a crash, a retried call, a steering message, two calls of one tool with
    different tiers, invalid arguments, a stop while waiting, a failure, a run still queued."""
    from datetime import UTC, datetime, timedelta

    from tether.events import format_ts

    t0 = datetime(2026, 11, 30, 20, 0, 0, 123456, tzinfo=UTC)

    def log(*entries: tuple[float, str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"run_id": "run_x", "seq": i + 1, "type": kind, "ts": format_ts(t0 + timedelta(milliseconds=ms)), "data": data}
            for i, (ms, kind, data) in enumerate(entries)
        ]

    def call(ms: float, call_id: str, name: str, risk: str = "read_only", gated: bool = False) -> tuple[float, str, dict[str, Any]]:
        return (ms, "tool_call", {"call_id": call_id, "name": name, "args": {}, "risk": risk, "gated": gated, "message_id": "msg_1"})

    def result(ms: float, call_id: str, name: str, status: str = "ok") -> tuple[float, str, dict[str, Any]]:
        return (ms, "tool_result", {"call_id": call_id, "name": name, "status": status, "result": None, "error": None, "reason": None})

    def status(ms: float, stage: str, detail: str | None = None) -> tuple[float, str, dict[str, Any]]:
        return (ms, "status", {"stage": stage, "detail": detail, "discard_message_id": None})

    def token(ms: float, message: str = "msg_1") -> tuple[float, str, dict[str, Any]]:
        return (ms, "token", {"message_id": message, "text": "x "})

    started = (0, "run_started", {"thread_id": "thr_x", "input_message_id": "msg_0"})
    done = {"message_id": "msg_9", "usage": {"input_tokens": 1, "output_tokens": 1}}
    interrupt = {"interrupt_id": "int_1", "action_requests": [{"call_id": "c2", "action": "refund", "args": {}, "description": "", "risk": "destructive"}]}
    cancel_at = {"action": "cancel", "actor": "alice", "details": {"mode": "soft"}}
    return {
        "takeover": (
            log(
                started,
                status(0.4, "model"),
                token(5),
                status(900, "recovering", "continuing"),
                status(901, "model"),
                token(903, "msg_2"),
                call(904, "c1", "get_order"),
                status(905, "tool", "get_order"),
                result(930, "c1", "get_order"),
                status(931, "model"),
                token(950, "msg_3"),
                (960.5, "done", done),
            ),
            [],
        ),
        "retried, steered": (
            log(
                started,
                status(1, "model"),
                status(2, "model", "retrying in 1.0 s after model_rate_limited (attempt 2 of 4)"),
                status(1002, "model", "calling a tool: sleep"),
                (1003, "user_message", {"message_id": "msg_u", "content": "also"}),
                call(1004, "c1", "sleep"),
                call(1004, "c9", "lookup", gated=False),
                result(1005, "c9", "lookup", "error"),
                status(1006, "tool", "sleep"),
                result(3006, "c1", "sleep"),
                status(3007, "model"),
                token(3100),
                (3200, "done", done),
            ),
            [],
        ),
        "one tool, two tiers": (
            log(
                started,
                status(1, "model"),
                call(10, "c1", "refund", "reversible"),
                call(10, "c2", "refund", "destructive", gated=True),
                status(11, "tool", "refund"),
                result(20, "c1", "refund"),
                (21, "interrupt", interrupt),
                (
                    5021,
                    "resumed",
                    {"interrupt_id": "int_1", "resolution": "decided", "actor": "carol", "decisions": [{"call_id": "c2", "decision": "edit", "args": {}}]},
                ),
                status(5022, "tool", "refund"),
                result(5040, "c2", "refund"),
                status(5041, "model"),
                (5050, "done", done),
            ),
            [],
        ),
        "stopped while waiting": (
            log(
                started,
                status(1, "model"),
                call(10, "c2", "refund", "destructive", gated=True),
                (11, "interrupt", interrupt),
                result(7000, "c2", "refund", "cancelled"),
                (7001, "cancelled", {"mode": "soft", "reason": "no", "actor": "alice", "partial_message_id": None}),
            ),
            [{**cancel_at, "ts": format_ts(t0 + timedelta(milliseconds=6999.25))}],
        ),
        "still waiting, stop asked": (
            log(started, status(1, "model"), call(10, "c1", "sleep"), status(11, "tool", "sleep")),
            [
                {**cancel_at, "ts": format_ts(t0 + timedelta(milliseconds=500))},
                {**cancel_at, "details": {"mode": "hard"}, "ts": format_ts(t0 + timedelta(milliseconds=800))},
            ],
        ),
        "failed": (
            log(
                started,
                status(1, "model"),
                token(3),
                status(4, "model", "retrying in 0.5 s after model_error (attempt 2 of 4)"),
                (600, "error", {"code": "model_stream_broken", "message": "gone", "retryable": False, "partial_message_id": "msg_1"}),
            ),
            [],
        ),
        "a result without its call": (log(started, status(1, "model"), result(9, "c7", "mystery", "unknown"), (10, "done", done)), []),
        "queued": (log((0, "run_started", {"thread_id": "thr_x", "input_message_id": "msg_0"})), []),
        "nothing": ([], []),
    }


def test_the_browser_and_the_server_derive_the_same_timeline_from_the_same_logs(page: Page, server: LiveServer) -> None:
    from datetime import datetime

    from tether.server._timeline import TimelineBuilder, cancel_requests, ts_us
    from tether.store import AuditEntry

    open_ui(page, server)
    now = ts_us("2026-11-30T20:00:09.000001Z")
    for name, (events, audit) in synthetic_logs().items():
        builder = TimelineBuilder("run_x")
        for event in events:
            if builder.wants(event["type"]):
                builder.add(event["type"], event["ts"], event["data"])
        entries = [
            AuditEntry(action=e["action"], actor=e["actor"], details=e["details"], ts=datetime.fromisoformat(e["ts"].replace("Z", "+00:00"))) for e in audit
        ]
        served = builder.finish(cancel_requests(entries), now)
        derived = page.evaluate(
            "async ([events, audit, now]) => (await import('/static/run-timeline.js')).buildTimeline(events, audit, now)", [events, audit, now]
        )
        if not events:
            served["run_id"] = None  # an empty log names no run; the route always knows it
        assert derived == served, name
    # A few facts the cases are there for.
    logs = synthetic_logs()

    def timeline(name: str) -> dict[str, Any]:
        events, audit = logs[name]
        return page.evaluate(  # type: ignore[no-any-return]
            "async ([events, audit, now]) => (await import('/static/run-timeline.js')).buildTimeline(events, audit, now)", [events, audit, now]
        )

    takeover = timeline("takeover")["segments"]
    assert [s["kind"] for s in takeover] == ["queued", "model", "recovering", "model", "tool", "model"]
    assert takeover[1]["outcome"] == "interrupted" and takeover[3]["index"] == 2
    retried = timeline("retried, steered")["segments"]
    assert [(s["kind"], s.get("name")) for s in retried] == [
        ("queued", None), ("model", None), ("steering", None), ("tool", "lookup"), ("tool", "sleep"), ("model", None),
    ]  # fmt: skip
    assert retried[1]["retries"] == 1 and retried[1]["tool_calls"] == 2 and retried[3]["ran"] is False
    two = timeline("one tool, two tiers")["segments"]
    tiers = [(s["tier"], s["ran"], s["start_ms"]) for s in two if s["kind"] == "tool"]
    assert tiers == [("reversible", True, 11), ("destructive", True, 5022)]  # the gated one started after its decision only
    human = next(s for s in two if s["kind"] == "human")
    assert (human["actor"], human["actions"][0]["decision"], human["duration_ms"]) == ("carol", "edit", 5000)
    stopped = timeline("stopped while waiting")
    assert [s["kind"] for s in stopped["segments"]] == ["queued", "model", "human", "cancel", "tool"]
    wait, cancel, refund = stopped["segments"][2:]
    assert (wait["resolution"], refund["ran"], cancel["duration_ms"]) == ("cancelled", False, 1.75)
    waiting = timeline("still waiting, stop asked")
    assert waiting["status"] == "cancelling" and waiting["duration_ms"] == 8876.545  # to now
    assert [(s["kind"], s["open"]) for s in waiting["segments"][-2:]] == [("tool", True), ("cancel", True)]
    assert [r["mode"] for r in waiting["segments"][-1]["requests"]] == ["soft", "hard"] and waiting["segments"][-1]["mode"] == "hard"
    assert timeline("failed")["error"] == {"code": "model_stream_broken", "message": "gone"}
    assert timeline("queued")["status"] == "queued" and timeline("queued")["segments"][0]["open"] is True


def test_an_answer_cut_short_says_so_under_it_live_and_after_a_reload(page: Page, server: LiveServer, api: httpx.Client, axe_source: str) -> None:
    open_ui(page, server)
    send_and_finish(page, script({"text": "The refund went through and the order will", "cut": "length"}))
    answer = page.locator("#chat .msg.assistant").last
    note = answer.locator(".cut-note")
    expect(note).to_have_text("Cut short: the answer reached the model’s output limit.")
    expect(answer.locator(".text")).to_have_text("The refund went through and the order will")
    # The server says the same: the stored answer and the run's done event carry the reason.
    stored = path_of(api, thread_id(page))[-1]
    assert stored["status"] == "complete" and stored["finish_reason"] == "length"
    assert events_of(api, stored["run_id"])[-1]["data"]["finish_reason"] == "length"
    assert_accessible(page, axe_source, "an answer cut short")
    shot(page, "answer-cut", answer)

    reload(page)
    expect(page.locator("#chat .msg.assistant").last.locator(".cut-note")).to_have_text("Cut short: the answer reached the model’s output limit.")
    # An answer the model ended has no note; a repetition stop says why.
    send_and_finish(page, script({"text": "All done."}))
    expect(page.locator("#chat .msg.assistant").last.locator(".cut-note")).to_have_count(0)
    send_and_finish(page, script({"text": "la la la la", "cut": "repetition"}))
    expect(page.locator("#chat .msg.assistant").last.locator(".cut-note")).to_have_text("Cut short: the model was repeating itself.")


# -- standing approvals ----------------------------------------------------------------------

ALLOWED_LINE = re.compile(r"^✓ Allowed by your approval at \d{1,2}:\d{2}( [AP]M)?, until \d{1,2}:\d{2}( [AP]M)?$")


def choose(choice: Locator, *options: str) -> None:
    """Pick options of an "Approve and allow…" choice by their radio buttons' names."""
    for option in options:
        choice.get_by_role("radio", name=option).check()


def test_approve_and_allow_from_the_card_then_the_chip_lists_it_a_tool_card_says_so_and_revoke_asks_again(
    page: Page, server: LiveServer, api: httpx.Client, axe_source: str
) -> None:
    open_ui(page, server)
    card = pending_card(page)
    chip = page.locator("#allowances-btn")
    expect(chip).to_be_hidden()  # none yet

    # "Approve and allow…" opens the choice: a refund (destructive) permits the same arguments only.
    card.locator(".choice-allow").click()
    choice = card.locator(".allow-choice")
    expect(choice.get_by_role("radio", name="for the rest of this run")).to_be_focused()
    expect(choice.locator(".allow-fixed")).to_have_text("With these same arguments only (the tool permits no other).")
    expect(choice.get_by_role("radio", name="any arguments")).to_have_count(0)
    summary = choice.locator(".allow-summary")
    expect(summary).to_contain_text("refund with these same arguments (order_id: A100, amount: 25) will run without asking you, for the rest of this run")
    choose(choice, "in this thread (later runs too)", "1 h")
    expect(summary).to_contain_text("will run without asking you, in this thread, later runs too. Anything else is still asked.")
    assert effects(api, "refund") == [], "nothing runs before the decision is sent"
    assert_accessible(page, axe_source, "approve and allow")
    shot(page, "approve-and-allow", card)

    card.locator(".confirm-allow").click()
    expect(conn(page)).to_have_attribute("data-state", "completed")
    wait_settled(page)
    thread = thread_id(page)
    [allowance] = api.get(f"/v1/threads/{thread}/allowances").json()["items"]
    assert (allowance["tool"], allowance["scope"], allowance["args"], allowance["status"]) == ("refund", "thread", "same", "active")
    lifetime = time_of(allowance["expires_at"]) - time_of(allowance["created_at"])
    assert lifetime == 3600
    expect(chip).to_be_visible()
    expect(chip).to_have_text("✓ 1 allowed")

    # The same refund again: no card; its tool card says which approval let it through.
    before = page.evaluate("window.tetherUI.lastRunId")
    send(page, "refund 25 on order A100")
    page.wait_for_function("prev => window.tetherUI.lastRunId && window.tetherUI.lastRunId !== prev", arg=before)
    expect(conn(page)).to_have_attribute("data-state", "completed")
    allowed = page.locator(".tool-card[data-tool=refund] .tool-decision[data-decision=allowed]")
    expect(allowed).to_have_count(1)
    expect(allowed).to_have_text(ALLOWED_LINE)
    wait_settled(page)  # rendered again from the stored messages and the audit log: still says so
    expect(allowed).to_have_text(ALLOWED_LINE)
    assert [e["args"] for e in effects(api, "refund")] == [{"order_id": "A100", "amount": 25.0}] * 2
    decisions = page.locator(".tool-card[data-tool=refund] .tool-decision")
    expect(decisions).to_have_count(2)
    expect(decisions.first).to_have_attribute("data-decision", "approve")  # only the first refund asked
    shot(page, "tool-card-allowed", allowed)
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(allowed).to_have_text(ALLOWED_LINE)

    # The chip opens the thread's allowances: what each covers, who gave it, until when, Revoke.
    chip.click()
    dialog = page.locator("#allowances")
    expect(dialog).to_be_visible()
    entry = dialog.locator(".allowance[data-status=active]")
    expect(entry).to_have_count(1)
    expect(entry.locator(".allowance-covers")).to_have_text("Refund with these same arguments (order_id: A100, amount: 25), in this thread, later runs too")
    expect(entry.locator(".allowance-meta")).to_have_text(re.compile(r"^Given by you at \d{1,2}:\d{2}( [AP]M)? · until \d{1,2}:\d{2}( [AP]M)?$"))
    revoke = entry.get_by_role("button", name=re.compile("^Revoke: refund with these same arguments"))
    assert_accessible(page, axe_source, "standing approvals dialog")
    shot(page, "allowances", dialog)
    revoke.click()
    expect(dialog.locator("#allowances-status")).to_have_text("Revoked: refund is asked about again.")
    expect(dialog.locator(".allowance[data-status=revoked] .allowance-meta")).to_contain_text("revoked by local at ")
    expect(dialog.locator("#allowances-close")).to_be_focused()
    expect(chip).to_be_hidden()
    assert api.get(f"/v1/threads/{thread}/allowances").json()["items"][0]["status"] == "revoked"
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    # Revoked: the same refund asks again.
    card = pending_card(page)
    expect(card.locator(".description")).to_have_text("Refund 25 on order A100")
    assert len(effects(api, "refund")) == 2


def test_a_reversible_call_offers_any_arguments_and_the_summary_says_so(page: Page, server: LiveServer, api: httpx.Client) -> None:
    open_ui(page, server, "?approval_ttl_s=600")
    page.locator("#settings summary").click()
    page.locator("#set-threshold").select_option("reversible")
    card = pending_card(page, "note buy milk")
    card.locator(".choice-allow").click()
    choice = card.locator(".allow-choice")
    choose(choice, "any arguments", "8 h")
    expect(choice.locator(".allow-summary")).to_contain_text("any write_note call will run without asking you, for the rest of this run")
    page.keyboard.press("Enter")  # Enter in the choice confirms
    expect(conn(page)).to_have_attribute("data-state", "completed")
    [allowance] = api.get(f"/v1/threads/{thread_id(page)}/allowances").json()["items"]
    assert (allowance["tool"], allowance["scope"], allowance["args"]) == ("write_note", "run", "any")
    assert time_of(allowance["expires_at"]) - time_of(allowance["created_at"]) == 8 * 3600


def test_the_approvals_inbox_approves_several_and_allows_each_in_its_own_thread(page: Page, server: LiveServer, api: httpx.Client, axe_source: str) -> None:
    runs = {}
    for text in ("refund 25 on order A100", "refund 7 on order B200", "ask what colour"):
        thread = api.post("/v1/threads", json={}).json()["id"]
        run = api.post(f"/v1/threads/{thread}/runs", json={"input": {"content": text}}).json()["id"]
        runs[text] = (thread, run)
    for text, (_, run) in runs.items():
        wait_until(lambda run=run: api.get(f"/v1/runs/{run}").json()["status"] == "waiting_human", f"{text!r} to wait")

    open_ui(page, server)
    page.locator("#approvals-btn").click()
    items = page.locator("#approvals .approval-item")
    expect(items).to_have_count(3)
    allow = page.locator("#approvals-allow")
    panel = page.locator("#approvals-allow-panel")
    expect(allow).to_be_disabled()  # nothing selected
    for text in ("A100", "B200", "what colour"):
        items.filter(has_text=text).locator("input[type=checkbox]").check()
    expect(allow).to_be_disabled()  # a question permits no standing approval
    expect(allow).to_have_attribute("title", re.compile("Not every selected call permits a standing approval"))
    items.filter(has_text="what colour").locator("input[type=checkbox]").uncheck()
    expect(allow).to_be_enabled()

    allow.click()
    expect(allow).to_have_attribute("aria-expanded", "true")
    expect(panel.get_by_role("radio", name="for the rest of each run")).to_be_focused()
    expect(panel.locator(".allow-fixed")).to_have_text("With their same arguments only (not every selected call permits more).")
    summary = panel.locator(".allow-summary")
    expect(summary).to_contain_text("these 2 calls (refund), each with its same arguments will run without asking you, for the rest of each one's run")
    choose(panel, "in each thread (later runs too)", "1 h")
    expect(summary).to_contain_text("in each one's thread, later runs too. Anything else is still asked. You can revoke each from its thread's header.")
    assert effects(api, "refund") == [], "nothing runs before the decision is sent"
    assert_accessible(page, axe_source, "approvals: approve and allow")
    shot(page, "approvals-allow", page.locator("#approvals"))

    # Changing the selection closes a choice made for another one.
    items.filter(has_text="what colour").locator("input[type=checkbox]").check()
    expect(panel).to_be_hidden()
    items.filter(has_text="what colour").locator("input[type=checkbox]").uncheck()
    allow.click()
    choose(panel, "in each thread (later runs too)", "1 h")
    panel.locator("#approvals-allow-confirm").click()
    expect(page.locator("#approvals-status")).to_have_text("Approved 2 and allowed with the same arguments in each one's thread, later runs too, for 1 h.")
    expect(items).to_have_count(1)  # the question still waits
    expect(items.first).to_contain_text("what colour")
    expect(panel).to_be_hidden()

    wait_until(lambda: len(effects(api, "refund")) == 2, "both refunds to run")
    for text, amount in (("refund 25 on order A100", 25), ("refund 7 on order B200", 7)):
        thread, run = runs[text]
        wait_until(lambda run=run: api.get(f"/v1/runs/{run}").json()["status"] == "completed", f"{text!r} to complete")
        [granted] = api.get(f"/v1/threads/{thread}/allowances").json()["items"]
        assert (granted["tool"], granted["scope"], granted["args"], granted["status"], granted["run_id"]) == ("refund", "thread", "same", "active", None)
        assert time_of(granted["expires_at"]) - time_of(granted["created_at"]) == 3600
        # The same refund again in that thread runs unasked, under that thread's own allowance.
        again = api.post(f"/v1/threads/{thread}/runs", json={"input": {"content": text}}).json()["id"]
        wait_until(lambda again=again: api.get(f"/v1/runs/{again}").json()["status"] == "completed", f"{text!r} to run again unasked")
        [call] = [e for e in events_of(api, again) if e["type"] == "tool_call"]
        assert (call["data"]["gated"], call["data"]["allowed_by"]) == (False, granted["id"])
        assert [e["args"]["amount"] for e in effects(api, "refund")].count(amount) == 2
    # Each allowance holds in its own thread only: the question's thread has none.
    other = runs["ask what colour"][0]
    assert api.get(f"/v1/threads/{other}/allowances").json()["items"] == []


def time_of(ts: str) -> float:
    """Seconds since the epoch of a wire timestamp."""
    from datetime import datetime

    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
