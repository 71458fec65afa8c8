"""Thread titles: a thread's ``title``, taken from its first message when the thread has none
(or given, or renamed); existing threads get theirs from their first user message here.

Revision ID: 0012
Revises: 0011
"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# The rule of tether.store._tree.title_from_message as it stood when this migration was
# written (a migration does not change when the code does).
_DERIVED_CHARS = 80
_CARD_LIKE = re.compile(r"\d{12,19}")
_NOT_PRINTABLE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")
_BATCH = 500


def _title(content: str | None) -> str | None:
    text = _NOT_PRINTABLE.sub(" ", _CARD_LIKE.sub(lambda m: "****" + m.group(0)[-4:], content or "")).strip()
    if not text:
        return None
    if len(text) <= _DERIVED_CHARS:
        return text
    cut = text[: _DERIVED_CHARS - 1]
    space = cut.rfind(" ")
    if text[len(cut)] != " " and space >= _DERIVED_CHARS // 2:  # cut inside a word: at its start instead
        cut = cut[:space]
    return cut.rstrip() + "…"


def upgrade() -> None:
    op.add_column("threads", sa.Column("title", sa.String(200), nullable=True))
    threads = sa.table("threads", sa.column("id", sa.String), sa.column("title", sa.String))
    messages = sa.table(
        "messages",
        sa.column("thread_id", sa.String),
        sa.column("role", sa.String),
        sa.column("content", sa.Text),
        sa.column("created_at", sa.DateTime),
        sa.column("id", sa.String),
    )
    first = (
        sa.select(sa.func.substr(messages.c.content, 1, 2000))
        .where(messages.c.thread_id == threads.c.id, messages.c.role == "user")
        .order_by(messages.c.created_at, messages.c.id)
        .limit(1)
        .scalar_subquery()
    )
    conn = op.get_bind()
    after = ""
    while True:
        rows = conn.execute(sa.select(threads.c.id, first).where(threads.c.id > after).order_by(threads.c.id).limit(_BATCH)).all()
        if not rows:
            break
        titled = [{"thread_id": row[0], "title": title} for row in rows if (title := _title(row[1])) is not None]
        if titled:
            conn.execute(threads.update().where(threads.c.id == sa.bindparam("thread_id")).values(title=sa.bindparam("title")), titled)
        after = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("threads") as batch:
        batch.drop_column("title")
