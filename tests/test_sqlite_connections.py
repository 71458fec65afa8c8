"""SQLite's own connections (``tether/store/_sqlite.py``): inline writes, reads in threads,
group commits in the writer's thread, checkpoints off the loop, in-memory databases.

The store contract itself is ``test_store.py`` (on both backends); these pin what is particular
to how the SQLite store talks to its file.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tether.events import Envelope, Token
from tether.store import AtLeaf, Store, StoredEvent
from tether.store._sqlite import BLOCKING_CHECKPOINT_BYTES, CHECKPOINT_BYTES, WAL_KEPT_BYTES, WRITER_BUSY_TIMEOUT_S

from .conftest import sqlite_url

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A store on a fresh SQLite file (``tmp_path / "tether.db"``)."""
    opened = await Store.open(sqlite_url(tmp_path))
    try:
        yield opened
    finally:
        await opened.aclose()


async def _run(store: Store) -> str:
    thread = await store.create_thread(owner="local", metadata={})
    run = (await store.create_run(thread_id=thread.id, attach=AtLeaf(content="hi"), config={})).run
    return run.id


def _tokens(run_id: str, first_seq: int, count: int, text: str) -> list[StoredEvent]:
    return [
        StoredEvent(seq, "token", Envelope.encode(run_id, seq, Token(message_id="msg_x", text=text), "2026-12-01T10:00:00.000000Z"))
        for seq in range(first_seq, first_seq + count)
    ]


async def test_the_wal_stays_bounded_under_a_flood_of_commits(store: Store, tmp_path: Path) -> None:
    # The writer never checkpoints itself (wal_autocheckpoint=0). Commits back to back leave
    # the background checkpoints no moment to finish in, so the WAL is never started again
    # from its beginning; without the writer's own checkpoint past BLOCKING_CHECKPOINT_BYTES
    # it would hold every page written, here about 10x CHECKPOINT_BYTES.
    run_id = await _run(store)
    wal = Path(str(tmp_path / "tether.db") + "-wal")
    text = "x" * 2000
    seq = 2
    written = 0
    largest = 0
    while written < 10 * CHECKPOINT_BYTES:
        batch = _tokens(run_id, seq, 64, text)
        await store.append_events(run_id, batch)
        seq += len(batch)
        written += sum(len(e.envelope) for e in batch)
        largest = max(largest, wal.stat().st_size)
    assert largest < BLOCKING_CHECKPOINT_BYTES, f"the WAL grew to {largest} bytes"
    assert store._sqlite is not None and store._sqlite.checkpoints >= 5
    assert await store.last_seq(run_id) == seq - 1
    assert len(await store.read_events(run_id, after_seq=seq - 1001, limit=1000)) == 1000


async def _fill_the_wal_behind_a_reader(store: Store, tmp_path: Path, run_id: str, size: int) -> int:
    """Commit events until the WAL holds ``size`` bytes while a reader holds the snapshot it
    took before them; the next seq. A checkpoint that waited for that reader (SQLite's busy
    timeout, 5 s) would hold up every commit behind it: the commits must not wait."""
    wal = Path(str(tmp_path / "tether.db") + "-wal")
    reader = sqlite3.connect(tmp_path / "tether.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM events").fetchone() == (1,)
        text = "x" * 2000
        seq = 2
        with anyio.fail_after(WRITER_BUSY_TIMEOUT_S * 0.8):
            while wal.stat().st_size < size:
                batch = _tokens(run_id, seq, 64, text)
                await store.append_events(run_id, batch)
                seq += len(batch)
        # The snapshot is what it was: the reader never saw the commits made meanwhile.
        assert reader.execute("SELECT count(*) FROM events").fetchone() == (1,)
        return seq
    finally:
        reader.execute("ROLLBACK")
        reader.close()


async def test_a_checkpoint_does_not_hold_up_commits_and_the_wal_starts_again(store: Store, tmp_path: Path) -> None:
    run_id = await _run(store)
    connections = store._sqlite
    assert connections is not None
    seq = await _fill_the_wal_behind_a_reader(store, tmp_path, run_id, 2 * CHECKPOINT_BYTES)
    assert connections.blocking_checkpoints == 0
    # Without the reader, a checkpoint in the background copies everything; the next commit
    # starts the WAL again from its beginning and cuts the file back.
    wal = Path(str(tmp_path / "tether.db") + "-wal")
    with anyio.fail_after(10):
        while True:
            done = connections.checkpoints
            await store.append_events(run_id, _tokens(run_id, seq, 1, "t"))
            seq += 1
            if wal.stat().st_size <= WAL_KEPT_BYTES:
                break
            while connections.checkpoints == done:  # this commit's checkpoint, in the background
                await asyncio.sleep(0.001)
    assert connections.blocking_checkpoints == 0
    assert await store.last_seq(run_id) == seq - 1


async def test_the_writers_own_checkpoint_does_not_wait_for_a_reader_either(store: Store, tmp_path: Path) -> None:
    run_id = await _run(store)
    connections = store._sqlite
    assert connections is not None
    seq = await _fill_the_wal_behind_a_reader(store, tmp_path, run_id, BLOCKING_CHECKPOINT_BYTES + CHECKPOINT_BYTES)
    assert connections.blocking_checkpoints >= 1  # it tried, and let the commits go on
    # Once the reader is gone, the next commit's checkpoint truncates the WAL.
    await store.append_events(run_id, _tokens(run_id, seq, 1, "t"))
    assert Path(str(tmp_path / "tether.db") + "-wal").stat().st_size == 0
    assert await store.last_seq(run_id) == seq


async def test_a_cancelled_group_commit_keeps_the_write_lock_until_its_transaction_ended(store: Store) -> None:
    run_id = await _run(store)
    connections = store._sqlite
    lock = store._write_lock
    assert connections is not None and lock is not None
    inside = threading.Event()
    release = threading.Event()

    def slow_write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO events (run_id, seq, type, envelope) VALUES (?, 2, 'token', '{}')", (run_id,))
        inside.set()
        release.wait(timeout=30)

    async def commit() -> None:
        async with lock:
            await connections.write_in_thread(slow_write)

    task = asyncio.create_task(commit())
    with anyio.fail_after(10):
        while not inside.is_set():
            await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.sleep(0)  # let the cancellation reach the task
    assert not task.done() and lock.locked()  # the thread still writes: the lock stays taken
    release.set()
    with pytest.raises(asyncio.CancelledError), anyio.fail_after(10):
        await task
    assert not lock.locked()
    # The transaction that was under way committed; the connection is usable again.
    assert [e.seq for e in await store.read_events(run_id)] == [1, 2]
    await store.append_events(run_id, _tokens(run_id, 3, 1, "after"))
    assert [e.seq for e in await store.read_events(run_id)] == [1, 2, 3]


async def test_an_in_memory_database_reads_and_writes_on_its_one_connection() -> None:
    store = await Store.open("sqlite://")
    try:
        run_id = await _run(store)
        await store.append_events(run_id, _tokens(run_id, 2, 3, "t"))
        assert [e.seq for e in await store.read_events(run_id)] == [1, 2, 3, 4]
        assert (await store.get_run(run_id)).status == "queued"
        assert await store.mark_running(run_id)
        assert (await store.get_run(run_id)).status == "running"
    finally:
        await store.aclose()


async def test_reads_run_in_reader_threads_and_see_every_commit(store: Store) -> None:
    run_id = await _run(store)
    seen_threads: set[str] = set()
    connections = store._sqlite
    assert connections is not None

    def which_thread(conn: sqlite3.Connection) -> None:
        seen_threads.add(threading.current_thread().name)

    await connections.read(which_thread)
    assert seen_threads and all(name.startswith("tether-sqlite-read") for name in seen_threads)
    assert threading.current_thread().name not in seen_threads
    # Many reads at once, interleaved with commits: each read sees at least what was
    # committed before it started.
    committed = 1

    async def reader() -> None:
        for _ in range(20):
            floor = committed
            assert len(await store.read_events(run_id)) >= floor

    async def writer() -> None:
        nonlocal committed
        for seq in range(2, 42):
            await store.append_events(run_id, _tokens(run_id, seq, 1, "w"))
            committed = seq

    with anyio.fail_after(30):
        await asyncio.gather(writer(), *(reader() for _ in range(8)))
    assert len(await store.read_events(run_id)) == 41


async def test_a_store_closes_its_threads(tmp_path: Path) -> None:
    before = {t.name for t in threading.enumerate()}
    store = await Store.open(sqlite_url(tmp_path))
    run_id = await _run(store)
    await store.append_events(run_id, _tokens(run_id, 2, 1, "t"))
    await store.read_events(run_id)
    await store.aclose()
    left = {t.name for t in threading.enumerate()} - before
    assert not [name for name in left if name.startswith("tether-sqlite")], left
    assert os.path.exists(tmp_path / "tether.db")
