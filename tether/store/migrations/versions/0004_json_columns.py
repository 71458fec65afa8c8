"""PostgreSQL: ``json`` instead of ``jsonb``, so JSON values round-trip as written.

jsonb normalises what it stores: keys are reordered and numbers rewritten (``1e300`` comes back
as an integer), so the same value read back differed between PostgreSQL and SQLite (tool-call
arguments, for one, reached the model in another key order). Nothing queries inside these
columns. SQLite already keeps the text: nothing to do there.

Revision ID: 0004
Revises: 0003
"""

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON_COLUMNS = {
    "threads": ("metadata",),
    "messages": ("tool_calls",),
    "runs": ("config", "error"),
    "interrupts": ("action_requests", "review_configs", "turn", "decisions"),
    "audit": ("details",),
}


def _retype(to_type: sa.types.TypeEngine[Any], cast: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in JSON_COLUMNS.items():
        for column in columns:
            op.alter_column(table, column, type_=to_type, postgresql_using=f'"{column}"::{cast}')


def upgrade() -> None:
    _retype(sa.JSON(), "json")


def downgrade() -> None:
    _retype(JSONB(), "jsonb")
