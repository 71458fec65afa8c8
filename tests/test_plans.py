"""The store's compiled plans: a hot statement's bound plan gives the driver exactly what the
general path (SQLAlchemy's ``construct_params``) gives it, on both dialects."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from tether._ids import utcnow
from tether.store._plans import BoundPlan, Plans
from tether.store._tables import Hot

DIALECTS = {"sqlite": sqlite.dialect(), "postgresql": postgresql.asyncpg.dialect()}  # type: ignore[attr-defined]


def _value(key: str, column_type: sa.types.TypeEngine[Any], n: int) -> Any:
    """A value of the type a parameter takes (an untyped ``now`` or ``…_at`` is a timestamp)."""
    kinds = (column_type, getattr(column_type, "impl", None))
    if any(isinstance(kind, sa.JSON) for kind in kinds):
        return {"n": n, "text": "ä"}
    if any(isinstance(kind, sa.DateTime) for kind in kinds) or key == "now" or key.endswith("_at"):
        return utcnow()
    if any(isinstance(kind, sa.Integer) for kind in kinds):
        return n
    return f"value-{n}"


def _call_values(statement: sa.ClauseElement, dialect: sa.Dialect) -> dict[str, Any]:
    """Values for every parameter ``statement`` takes (every column of an INSERT)."""
    if isinstance(statement, sa.Insert):
        return {column.key: _value(column.key, column.type, n) for n, column in enumerate(statement.table.c)}
    compiled = statement.compile(dialect=dialect)
    return {bindparam.key: _value(bindparam.key, bindparam.type, n) for n, bindparam in enumerate(compiled.binds.values()) if bindparam.required}


@pytest.mark.parametrize("dialect_name", sorted(DIALECTS))
@pytest.mark.parametrize("name", sorted(name for name, value in vars(Hot).items() if isinstance(value, sa.ClauseElement)))
def test_a_hot_statement_binds_the_same_arguments_as_the_general_path(dialect_name: str, name: str) -> None:
    dialect = DIALECTS[dialect_name]
    statement = getattr(Hot, name)
    values = _call_values(statement, dialect)
    hot, general = Plans(dialect, hot=Hot.statements()), Plans(dialect)
    for call in (values, [values, {**values}]):  # one call, and a batch
        _plan, sql, args, batch = hot.prepare(statement, call)
        _plan, expected_sql, expected_args, expected_batch = general.prepare(statement, call)
        assert (sql, args, batch) == (expected_sql, expected_args, expected_batch)
    found = hot._bound_plan(statement, tuple(sorted(values)), False)
    assert found is not None, f"{name} takes the general path: its SQL depends on its values"


def test_a_bound_plan_refuses_a_call_without_a_required_value() -> None:
    plans = Plans(sqlite.dialect(), hot=Hot.statements())
    with pytest.raises(sa.exc.InvalidRequestError, match="required for bind parameter 'run_id'"):
        plans.prepare(Hot.run_by_id, {"other": 1})


def test_an_expanding_statement_is_not_bound() -> None:
    runs = sa.table("runs", sa.column("id"), sa.column("status"))
    statement = sa.select(runs.c.id).where(runs.c.status.in_(sa.bindparam("statuses", expanding=True)))
    plans = Plans(sqlite.dialect(), hot=[statement])
    plan, sql, args, _ = plans.prepare(statement, {"statuses": ["a", "b"]})
    assert not BoundPlan.bindable(plan)
    assert sql.count("?") == 2 and args == ["a", "b"]
