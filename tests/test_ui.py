"""The web UI at ``/``, driven like a person would: headless Chromium through Playwright.

Each test runs the demo agent on a real server (real sockets, a real SQLite file) and checks
what the page shows against what the server says through the API: the refund the card
approved is the refund the shop executed, the text on screen is the stored message byte for
byte, a lost network shows "reconnecting" and never "stopped", and a stopped run is
``cancelled`` on the server with nothing streamed after its ``cancelled`` event.

Chromium is Debian's (``/usr/bin/chromium``; ``scripts/test`` installs it): Playwright never
downloads a browser of its own. With ``TETHER_UI_SCREENSHOTS=docs/ui`` the tests also save
screenshots of the main states (that is how the ones in ``docs/ui/`` were made).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from .conftest import LiveServer, script, sqlite_url

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


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[Page]:
    """A fresh browser context; closed before the server stops (so no stream holds it up)."""
    context = browser.new_context(viewport={"width": 1100, "height": 800})
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


def shot(page: Page, name: str, focus: Locator | None = None) -> None:
    """Save a screenshot of the current state (``focus`` scrolled into view) when
    TETHER_UI_SCREENSHOTS names a folder."""
    if not SCREENSHOTS:
        return
    if focus is not None:
        focus.scroll_into_view_if_needed()
    Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), animations="disabled")


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
        for item in page.evaluate(
            "[...document.querySelectorAll('#chat .msg')].map(m => ({id: m.dataset.id, text: m.querySelector('.text').textContent}))"
        )
    ]


def expected_path(api: httpx.Client, thread: str) -> list[tuple[str, str]]:
    """(message id, text) of the active path as the API gives it, tool messages left out."""
    return [(m["id"], m["content"] or "") for m in path_of(api, thread) if m["role"] != "tool"]


# -- human review ----------------------------------------------------------------------------


def test_approving_a_refund_with_one_click_runs_it_and_the_audit_view_lists_the_decision(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
    open_ui(page, server)
    send(page, "refund 25 on order A100")

    card = page.locator(".approval")
    expect(card).to_have_attribute("data-state", "pending")
    expect(card.locator(".description")).to_have_text("Refund 25.0 on order A100")
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


def test_editing_args_shows_the_servers_field_error_inline_and_a_valid_edit_runs(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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


def test_a_card_with_two_actions_submits_one_approval_and_one_rejection_with_its_reason(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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
    expect(submit).to_be_disabled()
    card.locator(".action[data-index='0'] .choice-approve").click()
    card.locator(".action[data-index='1'] .choice-reject").click()
    card.locator(".action[data-index='1'] .reason").fill("wrong order")
    expect(submit).to_be_enabled()
    assert page.evaluate("document.documentElement.scrollWidth") <= 360, "the page scrolls sideways at 360 px"
    shot(page, "multi-action-360px")
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


def test_a_question_for_the_user_offers_only_an_answer_box_and_the_answer_is_the_result(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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


def test_reload_brings_back_the_pending_card_with_the_same_countdown_and_approving_works(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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


def test_an_unanswered_card_expires_by_itself_and_offers_nothing_to_click(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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


def test_stop_during_a_long_stream_ends_in_stopped_and_nothing_streams_after_cancelled(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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
    expect(page.locator("#stop")).to_have_text("Stop now")
    page.locator("#stop").click()  # clicked twice: hard, the tool is cancelled

    expect(conn(page)).to_have_attribute("data-state", "cancelled")
    run = api.get(f"/v1/runs/{run_report(page)['runId']}").json()
    assert run["status"] == "cancelled"
    expect(page.locator(".tool-card[data-tool=sleep]")).to_have_attribute("data-status", "cancelled")
    audit = api.get("/v1/audit", params={"thread_id": thread_id(page)}).json()["items"]
    assert [a["details"]["mode"] for a in audit if a["action"] == "cancel"] == ["soft", "hard"]


def test_a_network_drop_shows_reconnecting_and_the_text_ends_exactly_as_stored(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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


def test_the_browser_client_resumes_a_cut_stream_from_its_last_seq_without_gaps_or_duplicates(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
    thread = api.post("/v1/threads").json()
    run = api.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": script({"tokens": 80, "delay_ms": 10})}}).json()
    open_ui(page, server)  # for the origin and the module

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


# -- correction ------------------------------------------------------------------------------


def test_editing_a_message_forks_and_the_branch_switcher_shows_each_path(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
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
    shot(page, "threads-360px")
    page.keyboard.press("Escape")
    expect(page.locator("#toggle-threads")).to_have_attribute("aria-expanded", "false")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


def test_a_correction_joins_the_running_run_and_regenerate_adds_a_second_answer(
    page: Page, server: LiveServer, api: httpx.Client
) -> None:
    open_ui(page, server)
    # Call 1 streams for a while; call 2 (made because a correction arrived) echoes the
    # history it was given, so the page can show that the correction reached the model.
    send(page, script({"tokens": 120, "delay_ms": 20}, {"echo": True}))
    expect(page.locator(".live-run .msg.assistant .text")).to_contain_text("t5 ")
    expect(page.locator("#send")).to_have_text("Send correction")
    page.locator("#input").fill("Actually, make it shorter.")
    page.locator("#send").click()
    correction = page.locator(".live-run .msg.user.correction")
    expect(correction.locator(".text")).to_have_text("Actually, make it shorter.")
    expect(page.locator("#input")).to_have_value("")

    expect(conn(page)).to_have_attribute("data-state", "completed")
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

