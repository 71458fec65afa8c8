"""The HTTP API's error contract: every bad request gets the right 4xx and the one
error shape ``{"error": {"code", "message", "details"}}``; never a stack trace, never a 500.

Besides the named cases, a property-style fuzz sends arbitrary JSON (and non-JSON) bodies to
the write endpoints and checks the contract holds for whatever comes in, and that the server,
its runs and its stored data are still sound afterwards.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether.demo import build_demo_agent
from tether.events import TERMINAL_TYPES

from .conftest import LiveServer, script, sqlite_url

pytestmark = pytest.mark.anyio

JSON = {"content-type": "application/json"}


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One demo server for the whole module: these tests only read, or write their own thread."""
    live = LiveServer(build_demo_agent(), sqlite_url(tmp_path_factory.mktemp("api-errors"))).start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
async def http(shared_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=shared_server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def thread_id(http: httpx.AsyncClient) -> str:
    response = await http.post("/v1/threads", json={})
    assert response.status_code == 201
    return str(response.json()["id"])


@pytest.fixture
async def finished_run(http: httpx.AsyncClient) -> dict[str, Any]:
    thread = (await http.post("/v1/threads", json={})).json()
    run = (await http.post(f"/v1/threads/{thread['id']}/runs", json={"input": {"content": script({"text": "hi"})}})).json()
    await http.get(f"/v1/runs/{run['id']}/events", headers={"Accept": "text/event-stream"})
    return (await http.get(f"/v1/runs/{run['id']}")).json()  # type: ignore[no-any-return]


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is ``status`` with the standard error body; returns the error object."""
    assert response.status_code == status, f"{response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"], body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    if code is not None:
        assert error["code"] == code, error
    return error  # type: ignore[no-any-return]


def locs(error: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(d["loc"]) for d in error["details"]]


def assert_no_5xx_shape(response: httpx.Response) -> None:
    """Any answer at all, as long as it is not a 5xx and errors have the standard shape."""
    assert response.status_code < 500, f"{response.status_code}: {response.text}"
    if response.status_code >= 400:
        assert_error(response, response.status_code)


def target(kind: str, thread_id: str, finished_run: dict[str, Any]) -> str:
    return {
        "threads": "/v1/threads",
        "runs": f"/v1/threads/{thread_id}/runs",
        "cancel": f"/v1/runs/{finished_run['id']}/cancel",
    }[kind]


# -- malformed and invalid bodies ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["threads", "runs", "cancel"])
@pytest.mark.parametrize("body", [b"{bad", b'{"input": ', b"{'single': 'quotes'}", b'{"a": 1,}', b"\xff\xfe\x00"])
async def test_a_malformed_json_body_is_400_invalid_json(http: httpx.AsyncClient, thread_id: str, finished_run: dict[str, Any], kind: str, body: bytes) -> None:
    response = await http.post(target(kind, thread_id, finished_run), content=body, headers=JSON)
    assert_error(response, 400, "invalid_json")


WRONG_TYPES = [
    ("runs", {"input": {"content": 5}}, ("body", "input", "content")),
    ("runs", {"input": "hello"}, ("body", "input")),
    ("runs", {"input": {"content": "hi"}, "config": {"approval_threshold": "nope"}}, ("body", "config", "approval_threshold")),
    ("runs", {"input": {"content": "hi"}, "config": {"max_steps": 0}}, ("body", "config", "max_steps")),
    ("runs", {"input": {"content": "hi"}, "config": {"approval_ttl_s": "soon"}}, ("body", "config", "approval_ttl_s")),
    ("runs", {"input": {"content": "hi"}, "config": []}, ("body", "config")),
    ("runs", {"input": {"content": "hi"}, "parent_id": 5}, ("body", "parent_id")),
    ("cancel", {"mode": "medium"}, ("body", "mode")),
    ("cancel", {"mode": "hard", "reason": 7}, ("body", "reason")),
    ("threads", {"metadata": "x"}, ("body", "metadata")),
    ("threads", {"metadata": [1, 2]}, ("body", "metadata")),
]


@pytest.mark.parametrize(("kind", "body", "loc"), WRONG_TYPES)
async def test_a_field_of_the_wrong_type_is_422_naming_the_field(
    http: httpx.AsyncClient, thread_id: str, finished_run: dict[str, Any], kind: str, body: Any, loc: tuple[str, ...]
) -> None:
    response = await http.post(target(kind, thread_id, finished_run), json=body)
    error = assert_error(response, 422, "validation_error")
    assert loc in locs(error)
    assert ".".join(loc[1:]) in error["message"]


UNKNOWN_FIELDS = [
    ("runs", {"input": {"content": "hi"}, "bogus": 1}, ("body", "bogus")),
    ("runs", {"input": {"content": "hi", "role": "system"}}, ("body", "input", "role")),
    ("runs", {"input": {"content": "hi"}, "config": {"temperature": 2}}, ("body", "config", "temperature")),
    ("threads", {"metdata": {}}, ("body", "metdata")),
    ("cancel", {"mode": "hard", "force": True}, ("body", "force")),
]


@pytest.mark.parametrize(("kind", "body", "loc"), UNKNOWN_FIELDS)
async def test_an_unknown_field_is_422_naming_it(
    http: httpx.AsyncClient, thread_id: str, finished_run: dict[str, Any], kind: str, body: Any, loc: tuple[str, ...]
) -> None:
    response = await http.post(target(kind, thread_id, finished_run), json=body)
    error = assert_error(response, 422, "validation_error")
    assert loc in locs(error)
    assert "extra_forbidden" in [d["type"] for d in error["details"]]


async def test_empty_or_missing_content_is_422_and_starts_nothing(http: httpx.AsyncClient, thread_id: str) -> None:
    error = assert_error(await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": ""}}), 422, "validation_error")
    assert ("body", "input", "content") in locs(error)
    error = assert_error(await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {}}), 422, "validation_error")
    assert ("body", "input", "content") in locs(error)
    error = assert_error(await http.post(f"/v1/threads/{thread_id}/runs", json={}), 422, "input_required")
    assert ("body", "input") in locs(error)
    # A refused request changes nothing: no run, no message.
    thread = (await http.get(f"/v1/threads/{thread_id}")).json()
    assert thread["active_run_id"] is None and thread["active_leaf_id"] is None
    assert (await http.get(f"/v1/threads/{thread_id}/messages")).json()["items"] == []


async def test_a_refused_cancel_body_leaves_the_run_running(http: httpx.AsyncClient, thread_id: str) -> None:
    run = (await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": script({"tokens": 300, "delay_ms": 10})}})).json()
    assert_error(await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "medium"}), 422)
    assert_error(await http.post(f"/v1/runs/{run['id']}/cancel", content=b"{oops", headers=JSON), 400, "invalid_json")
    untouched = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert untouched["status"] in ("queued", "running") and untouched["cancel"] is None
    assert (await http.post(f"/v1/runs/{run['id']}/cancel", json={"mode": "hard"})).status_code == 202


# Values that parse as JSON but cannot be sent back as JSON: one of them stored in a thread's
# metadata would make every later read of the thread (and the thread list) a 500.
UNSTORABLE_METADATA = [
    b'{"metadata": {"key": "\\ud800"}}',
    b'{"metadata": {"\\udfff": 1}}',
    b'{"metadata": {"big": 1e400}}',
    b'{"metadata": {"nan": NaN}}',
    b'{"metadata": {"deep": ' + b"[" * 300 + b"]" * 300 + b"}}",
]


@pytest.mark.parametrize("body", UNSTORABLE_METADATA)
async def test_metadata_that_cannot_be_sent_back_as_json_is_422(http: httpx.AsyncClient, body: bytes) -> None:
    error = assert_error(await http.post("/v1/threads", content=body, headers=JSON), 422, "validation_error")
    assert ("body", "metadata") in locs(error)
    listing = await http.get("/v1/threads")
    assert listing.status_code == 200, listing.text


async def test_edited_args_that_cannot_be_stored_are_422_and_the_interrupt_stays_pending(http: httpx.AsyncClient, thread_id: str) -> None:
    # The demo's keyword rule asks for a refund: a destructive tool, so the run waits for review.
    run = (await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": "refund 25 on order A100"}})).json()
    async with http.stream("GET", f"/v1/runs/{run['id']}/events", headers={"Accept": "text/event-stream"}) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("event: interrupt"):
                break
    interrupt = (await http.get(f"/v1/threads/{thread_id}")).json()["pending_interrupt"]
    assert interrupt is not None
    body = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "edit", "args": {"order_id": "A100", "amount": 5}}]}
    raw = json.dumps(body).replace('"A100"', '"\\ud800"').encode()

    error = assert_error(await http.post(f"/v1/threads/{thread_id}/resume", content=raw, headers=JSON), 422, "validation_error")
    assert ("body", "decisions", 0, "edit", "args") in locs(error)
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "waiting_human"
    reject = {"interrupt_id": interrupt["id"], "decisions": [{"decision": "reject", "reason": "no"}]}
    assert (await http.post(f"/v1/threads/{thread_id}/resume", json=reject)).status_code == 200
    await http.get(f"/v1/runs/{run['id']}/events", headers={"Accept": "text/event-stream"})
    assert (await http.get(f"/v1/runs/{run['id']}")).json()["status"] == "completed"
    assert (await http.get("/v1/demo/effects", params={"run_id": run["id"]})).json()["items"] == []


async def test_reasonable_metadata_round_trips(http: httpx.AsyncClient) -> None:
    metadata: dict[str, Any] = {"name": "ünïcödé ✓", "n": 10**30, "f": -1.5e300, "nested": [[[[{"a": None}]]]], "deep": {}}
    cursor = metadata["deep"]
    for _ in range(25):
        cursor["d"] = {}
        cursor = cursor["d"]
    created = await http.post("/v1/threads", json={"metadata": metadata})
    assert created.status_code == 201, created.text
    assert (await http.get(f"/v1/threads/{created.json()['id']}")).json()["metadata"] == metadata
    assert (await http.get("/v1/threads")).status_code == 200


async def test_parent_id_from_another_thread_is_refused(http: httpx.AsyncClient, thread_id: str, finished_run: dict[str, Any]) -> None:
    other_message = finished_run["input_message_id"]
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": "fork"}, "parent_id": other_message})
    error = assert_error(response, 422, "invalid_parent")
    assert ("body", "parent_id") in locs(error)
    response = await http.post(f"/v1/threads/{thread_id}/runs", json={"input": {"content": "fork"}, "parent_id": "msg_nope"})
    assert_error(response, 422, "invalid_parent")
    thread = (await http.get(f"/v1/threads/{thread_id}")).json()
    assert thread["active_run_id"] is None and thread["active_leaf_id"] is None


async def test_a_field_the_store_refuses_is_located_in_the_body_or_the_path(http: httpx.AsyncClient, thread_id: str, finished_run: dict[str, Any]) -> None:
    error = assert_error(await http.post(f"/v1/threads/{thread_id}/runs", json={"parent_id": None}), 422, "input_required")
    assert error["details"] == [{"loc": ["body", "input"], "msg": "input.content is required unless parent_id is a user message", "type": "missing"}]
    user_message = finished_run["input_message_id"]
    error = assert_error(await http.patch(f"/v1/messages/{user_message}", json={"content": "x"}), 422, "not_an_assistant_message")
    assert error["details"] == [{"loc": ["path", "message_id"], "msg": "message role is user", "type": "role"}]


# -- unknown ids, routes and methods ---------------------------------------------------------

NOT_FOUND = [
    ("GET", "/v1/threads/thr_nope", None, "thread_not_found"),
    ("GET", "/v1/threads/thr_nope/messages", None, "thread_not_found"),
    ("POST", "/v1/threads/thr_nope/runs", {"input": {"content": "hi"}}, "thread_not_found"),
    ("GET", "/v1/runs/run_nope", None, "run_not_found"),
    ("GET", "/v1/runs/run_nope/events", None, "run_not_found"),
    ("POST", "/v1/runs/run_nope/cancel", {"mode": "hard"}, "run_not_found"),
    ("POST", "/v1/runs/run_nope/cancel", None, "run_not_found"),
]


@pytest.mark.parametrize(("method", "path", "body", "code"), NOT_FOUND)
async def test_an_unknown_id_is_404_with_its_code(http: httpx.AsyncClient, method: str, path: str, body: Any, code: str) -> None:
    assert_error(await http.request(method, path, json=body), 404, code)


async def test_an_unknown_run_stream_is_404_json_not_an_empty_stream(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/runs/run_nope/events", headers={"Accept": "text/event-stream"})
    assert_error(response, 404, "run_not_found")


@pytest.mark.parametrize("path", ["/v1/nope", "/nope", "/v1/threads/thr_x/nope", "/v1/runs/run_x/events/more"])
async def test_an_unknown_route_is_404_json(http: httpx.AsyncClient, path: str) -> None:
    assert_error(await http.get(path), 404, "not_found")
    assert_error(await http.post(path, json={}), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"), [("DELETE", "/v1/threads"), ("PUT", "/v1/runs/run_x"), ("GET", "/v1/runs/run_x/cancel"), ("PATCH", "/v1/threads/thr_x/runs")]
)
async def test_a_wrong_method_is_405_json(http: httpx.AsyncClient, method: str, path: str) -> None:
    response = await http.request(method, path)
    assert_error(response, 405, "method_not_allowed")
    assert response.headers.get("allow")


# -- query parameters and headers ------------------------------------------------------------

BAD_QUERIES = [
    ({"after_seq": -1}, ("query", "after_seq")),
    ({"after_seq": "abc"}, ("query", "after_seq")),
    ({"after_seq": 2**31}, ("query", "after_seq")),
    ({"after_seq": 10**30}, ("query", "after_seq")),
    ({"limit": 0}, ("query", "limit")),
    ({"limit": 1001}, ("query", "limit")),
    ({"limit": 1.5}, ("query", "limit")),
]


@pytest.mark.parametrize(("params", "loc"), BAD_QUERIES)
async def test_a_bad_events_query_is_422_naming_the_parameter(
    http: httpx.AsyncClient, finished_run: dict[str, Any], params: dict[str, Any], loc: tuple[str, ...]
) -> None:
    error = assert_error(await http.get(f"/v1/runs/{finished_run['id']}/events", params=params), 422, "validation_error")
    assert loc in locs(error)


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", str(2**31), "9" * 40, "9" * 5000])
async def test_a_bad_last_event_id_is_422(http: httpx.AsyncClient, finished_run: dict[str, Any], value: str) -> None:
    for accept in ("text/event-stream", "application/json"):
        response = await http.get(f"/v1/runs/{finished_run['id']}/events", headers={"Last-Event-ID": value, "Accept": accept})
        assert_error(response, 422, "invalid_last_event_id")


async def test_a_cursor_past_the_end_is_an_empty_page(http: httpx.AsyncClient, finished_run: dict[str, Any]) -> None:
    response = await http.get(f"/v1/runs/{finished_run['id']}/events", params={"after_seq": 2**31 - 1})
    assert response.status_code == 200
    assert response.json() == {"items": []}


async def test_other_bad_queries_are_422(http: httpx.AsyncClient, thread_id: str) -> None:
    assert ("query", "view") in locs(assert_error(await http.get(f"/v1/threads/{thread_id}/messages", params={"view": "sideways"}), 422))
    assert ("query", "limit") in locs(assert_error(await http.get("/v1/threads", params={"limit": 0}), 422))
    assert ("query", "limit") in locs(assert_error(await http.get("/v1/threads", params={"limit": 10**30}), 422))


# -- the OpenAPI document --------------------------------------------------------------------


async def test_openapi_json_is_served_and_lists_the_v1_paths(http: httpx.AsyncClient) -> None:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path, method in [
        ("/v1/threads", "post"),
        ("/v1/threads", "get"),
        ("/v1/threads/{thread_id}", "get"),
        ("/v1/threads/{thread_id}/messages", "get"),
        ("/v1/threads/{thread_id}/runs", "post"),
        ("/v1/runs/{run_id}", "get"),
        ("/v1/runs/{run_id}/events", "get"),
        ("/v1/runs/{run_id}/cancel", "post"),
    ]:
        assert method in paths.get(path, {}), f"{method.upper()} {path} missing from the OpenAPI document"


# -- fuzz ------------------------------------------------------------------------------------


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # A named function: hypothesis's check that a lambda uses its argument misreads this one.
    return st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    _containers,
    max_leaves=12,
)


def near_valid(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Objects with the endpoint's own field names (valid or not), sometimes with strangers."""
    known = st.fixed_dictionaries({}, optional=fields)
    return st.one_of(known, st.builds(lambda a, b: {**a, **b}, known, st.dictionaries(st.text(max_size=8), json_values, max_size=2)))


run_bodies = near_valid(
    {
        "input": st.one_of(json_values, near_valid({"content": st.one_of(st.text(max_size=40), json_values)})),
        "parent_id": st.one_of(st.none(), st.text(max_size=70), json_values),
        "config": st.one_of(
            json_values,
            near_valid(
                {
                    "approval_threshold": st.one_of(st.sampled_from(["reversible", "destructive"]), json_values),
                    "approval_ttl_s": st.one_of(st.floats(), st.integers(), json_values),
                    "max_steps": st.one_of(st.integers(), json_values),
                }
            ),
        ),
    }
)
valid_run_bodies = st.fixed_dictionaries(
    {"input": st.fixed_dictionaries({"content": st.text(min_size=1, max_size=40)})},
    optional={
        "parent_id": st.none(),
        "config": st.fixed_dictionaries(
            {},
            optional={
                "approval_threshold": st.sampled_from(["reversible", "destructive"]),
                "approval_ttl_s": st.floats(min_value=0.001, max_value=3600),
                "max_steps": st.integers(min_value=1, max_value=1000),
            },
        ),
    },
)
thread_bodies = near_valid({"metadata": json_values})
valid_thread_bodies = st.fixed_dictionaries({}, optional={"metadata": st.dictionaries(st.text(max_size=10), json_values, max_size=4)})
cancel_bodies = near_valid({"mode": st.one_of(st.sampled_from(["soft", "hard"]), json_values), "reason": st.one_of(st.text(), json_values)})
valid_cancel_bodies = st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["soft", "hard"]), "reason": st.none() | st.text(max_size=100)})


def encoded(bodies: st.SearchStrategy[Any], valid: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Valid bodies, near-valid ones, any JSON value, raw bytes and JSON's corner cases."""
    return st.one_of(
        valid.map(lambda b: json.dumps(b).encode()),
        bodies.map(lambda b: json.dumps(b).encode()),
        json_values.map(lambda b: json.dumps(b).encode()),
        st.binary(max_size=40),
        st.sampled_from([b"", b"null", b"NaN", b'{"metadata": {"x": Infinity}}', b'"\\ud800"', b"1e999", b"[" * 2000]),
    )


FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_fuzzed_bodies_never_get_a_5xx_and_leave_a_sound_server(server: LiveServer) -> None:
    # Synchronous on purpose: Hypothesis drives a plain function, and the server has its own loop.
    http = httpx.Client(base_url=server.url, timeout=30)
    created_threads: list[str] = []
    started_runs: list[str] = []
    busy_thread = http.post("/v1/threads", json={}).json()["id"]
    long_run = http.post(f"/v1/threads/{busy_thread}/runs", json={"input": {"content": script({"tokens": 100_000, "delay_ms": 20})}}).json()

    @FUZZ
    @given(kind=st.sampled_from(["runs_fresh", "runs_busy", "threads", "cancel_active", "cancel_unknown"]), data=st.data())
    def one_request(kind: str, data: st.DataObject) -> None:
        if kind.startswith("runs"):
            body = data.draw(encoded(run_bodies, valid_run_bodies), label="body")
            thread = http.post("/v1/threads", json={}).json()["id"] if kind == "runs_fresh" else busy_thread
            response = http.post(f"/v1/threads/{thread}/runs", content=body, headers=JSON)
            if response.status_code == 202:
                started_runs.append(response.json()["id"])
        elif kind == "threads":
            body = data.draw(encoded(thread_bodies, valid_thread_bodies), label="body")
            response = http.post("/v1/threads", content=body, headers=JSON)
            if response.status_code == 201:
                created_threads.append(response.json()["id"])
        else:
            body = data.draw(encoded(cancel_bodies, valid_cancel_bodies), label="body")
            run_id = long_run["id"] if kind == "cancel_active" else data.draw(st.text(min_size=1, max_size=30), label="run_id")
            response = http.post(f"/v1/runs/{quote(run_id, safe='')}/cancel", content=body, headers=JSON)
        assert_no_5xx_shape(response)
        if response.status_code == 409:
            assert response.json()["error"]["code"] in ("thread_busy", "run_not_active")

    try:
        one_request()

        # Whatever was accepted is readable, and every run the fuzz started ends soundly.
        listing = http.get("/v1/threads", params={"limit": 1000})
        assert listing.status_code == 200, listing.text
        for thread in created_threads:
            assert http.get(f"/v1/threads/{thread}").status_code == 200
        runs = started_runs + [long_run["id"]]
        for run_id in runs:
            # Some fuzzed contents trigger the demo's keyword rules (a long answer, a sleep): stop them.
            response = http.post(f"/v1/runs/{run_id}/cancel", json={"mode": "hard"})
            assert response.status_code in (202, 409), response.text
        for run_id in runs:
            http.get(f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"})  # closes at the end
            run = http.get(f"/v1/runs/{run_id}").json()
            log = http.get(f"/v1/runs/{run_id}/events", params={"limit": 1000}).json()["items"]
            assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
            assert [e["type"] for e in log if e["type"] in TERMINAL_TYPES] == [log[-1]["type"]]
            assert (run["status"], log[-1]["type"]) in (("completed", "done"), ("cancelled", "cancelled")), (run, log[-1])
    finally:
        http.close()


async def test_a_nul_character_in_an_id_or_query_is_a_clean_4xx_on_every_backend(server: LiveServer) -> None:
    # PostgreSQL refuses NUL in text: it must never reach the database as a lookup key.
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        thread = (await http.post("/v1/threads", json={})).json()["id"]
        for method, path in (("POST", "/v1/runs/run_x%00/cancel"), ("GET", "/v1/threads/thr%00"), ("GET", "/v1/runs/%00/events")):
            response = await http.request(method, path, json={})
            assert_error(response, 404, "not_found")
        assert_error(await http.get("/v1/audit", params={"thread_id": "a\x00b"}), 422, "validation_error")
        for method, path, body in (
            ("POST", f"/v1/threads/{thread}/runs", {"input": {"content": "x"}, "parent_id": "m\x00"}),
            ("PUT", f"/v1/threads/{thread}/active_leaf", {"message_id": "m\x00"}),
            ("POST", f"/v1/threads/{thread}/resume", {"interrupt_id": "i\x00", "decisions": [{"decision": "approve"}]}),
        ):
            assert_error(await http.request(method, path, json=body), 422, "validation_error")
        assert (await http.get(f"/v1/threads/{thread}")).json()["active_run_id"] is None  # nothing was started
