"""The store's SQLAlchemy Core statements compiled once per shape, run on the driver itself.

SQLAlchemy's ``Connection.execute`` costs tens of microseconds of Python per statement (the
execution context, parameter and result processing through several layers, the compiled
cache's lookup, events), and on PostgreSQL its asyncio layer adds a greenlet hop and the pool's
checkout and checkin: several times what the database takes for the small statements of the
store's hot paths (``docs/benchmarks.md``, the eighth and ninth stages). So the store's own
operations keep building their statements with SQLAlchemy Core (one schema and one query
language for SQLite and PostgreSQL) and have them compiled here by SQLAlchemy's dialect once
per statement shape (SQLAlchemy's own cache key, as its compiled cache does), with
SQLAlchemy's processing of each bound value and result column (timestamps as aware UTC, JSON
as SQLAlchemy reads and writes it); the driver (asyncpg, ``sqlite3``) executes them.

This leans on a few of SQLAlchemy's compiler internals (the post-compile expansion of ``IN``
lists, the bind and result processors); ``pyproject.toml`` bounds SQLAlchemy's version, and the
store's contract tests run every operation through here on both backends.

The statements of the hot paths (``Hot`` in ``_tables``) are built once and passed to
:class:`Plans` by the store: their plans are found by the statement object itself, and bound
to it once (:class:`BoundPlan`), so a call of one neither computes its cache key nor has
SQLAlchemy build the call's parameters.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import Compiled, Dialect
    from sqlalchemy.sql.elements import ClauseElement

__all__ = ["BoundPlan", "DirectResult", "Plan", "Plans"]

#: Statement shapes whose compiled form is kept (the store has a few hundred at most).
_MAX_PLANS = 2000


class DirectResult:
    """The rows of one statement (with attribute access) and its row count, with the methods
    of SQLAlchemy's result that the store uses."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        #: Rows an UPDATE or DELETE matched, or the rows returned; -1 for a batch.
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        """Every row."""
        return list(self._rows)

    def first(self) -> Any:
        """The first row, or None."""
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row, or None."""
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        """The first column of the only row (``NoResultFound``/``MultipleResultsFound`` else)."""
        if not self._rows:
            raise sa.exc.NoResultFound("no row was found when one was required")
        if len(self._rows) > 1:
            raise sa.exc.MultipleResultsFound("multiple rows were found when exactly one was required")
        return self._rows[0][0]

    def scalar_one_or_none(self) -> Any:
        """The first column of the only row, or None (``MultipleResultsFound`` for more)."""
        if len(self._rows) > 1:
            raise sa.exc.MultipleResultsFound("multiple rows were found when one or none was required")
        return self._rows[0][0] if self._rows else None


class Plan:
    """One statement shape compiled for a driver: its SQL, how a call's values become the
    driver's positional arguments, and how the driver's rows become the store's rows."""

    def __init__(self, compiled: Compiled, dialect: Dialect) -> None:
        assert isinstance(compiled, SQLCompiler)  # a Core statement's, compiled by a SQL dialect
        # Python-side column defaults are filled in by SQLAlchemy's execution context, which
        # does not run here: the store's tables have none (a server default is fine).
        assert not (compiled.insert_prefetch or compiled.update_prefetch), "a column with a Python-side default"
        self._compiled = compiled
        #: IN lists and the like: the SQL depends on the values, expanded at each call.
        self._expands = bool(compiled.post_compile_params or compiled.literal_execute_params)
        self.sql = compiled.string
        self._order = tuple(compiled.positiontup or ())
        self._processors: dict[str, Any] = dict(compiled._bind_processors)
        columns = compiled._result_columns or []
        #: A SELECT or a statement with RETURNING (its result columns), or plain SQL.
        self.returns_rows = bool(columns) or compiled.isplaintext
        self._result_processors = [column[3]._cached_result_processor(dialect, None) for column in columns]
        self._row: Any = namedtuple("Row", [column[0] for column in columns], rename=True) if columns else None

    def arguments(self, values: dict[str, Any] | None, extracted: Sequence[Any] | None) -> tuple[str, list[Any]]:
        """The SQL and its positional arguments for one call's ``values`` (``extracted``: the
        literal values of this call's statement, by its cache key)."""
        params = self._compiled.construct_params(values, extracted_parameters=extracted, escape_names=False, _no_postcompile=self._expands)
        sql, order, processors = self.sql, self._order, self._processors
        if self._expands:
            expanded = self._compiled._process_parameters_for_postcompile(params)
            sql, order, params = expanded.statement, tuple(expanded.positiontup or ()), dict(expanded.parameters)
            processors = {**processors, **expanded.processors}  # the expanded values' own, beside the rest
        args = []
        for name in order:
            value = params[name]
            process = processors.get(name)
            args.append(value if process is None else process(value))
        return sql, args

    def rows(self, records: Sequence[Any]) -> list[Any]:
        """The driver's rows as rows with attribute access, each column processed as SQLAlchemy does."""
        if self._row is None:
            return list(records)
        row, processors = self._row, self._result_processors
        return [row(*(value if process is None else process(value) for process, value in zip(processors, record, strict=True))) for record in records]


class BoundPlan:
    """A plan bound to one statement object called with one set of value names: the
    statement's own values (its literals, a bound parameter's default) are resolved and
    processed once, so a call only picks and processes the values it passes, as
    ``construct_params`` would, in the SQL's order."""

    __slots__ = ("plan", "_slots")

    def __init__(self, plan: Plan, keys: tuple[str, ...], extracted: Sequence[Any] | None) -> None:
        compiled = plan._compiled
        defaults = compiled.construct_params(None, extracted_parameters=extracted, escape_names=False, _check=False)
        by_name = {name: bindparam for bindparam, name in compiled.bind_names.items()}
        self.plan = plan
        #: Per positional argument: the call's value to take (its key, and its processor), or
        #: the statement's own value, already processed.
        self._slots: list[tuple[str | None, Any, Any]] = []
        for name in plan._order:
            bindparam = by_name[name]
            process = plan._processors.get(name)
            if bindparam.key in keys or name in keys:
                self._slots.append((bindparam.key if bindparam.key in keys else name, process, None))
            elif bindparam.required:
                raise sa.exc.InvalidRequestError(f"A value is required for bind parameter {bindparam.key!r}", code="cd3x")
            else:
                value = defaults[name]
                self._slots.append((None, None, value if process is None else process(value)))

    @staticmethod
    def bindable(plan: Plan) -> bool:
        """Whether ``plan`` can be bound once: its SQL does not depend on the
        values (no ``IN`` list to expand) and none of its values is computed at each call."""
        return not plan._expands and not any(bindparam.callable for bindparam in plan._compiled.bind_names)

    def arguments(self, values: dict[str, Any]) -> list[Any]:
        """The positional arguments of one call with ``values``."""
        return [constant if key is None else (values[key] if process is None else process(values[key])) for key, process, constant in self._slots]


class Plans:
    """Compiled plans by statement shape (SQLAlchemy's cache key), as SQLAlchemy's own compiled
    cache keeps them: a statement built anew at every call finds the plan of its shape.

    ``hot`` are statements built once and called many times (the store's hot paths): their
    plans are kept by the statement object too, bound to it (:class:`BoundPlan`).
    """

    def __init__(self, dialect: Dialect, hot: Iterable[ClauseElement] = ()) -> None:
        self.dialect = dialect
        self._plans: dict[tuple[Any, ...], Plan] = {}
        #: The hot statements by identity (each kept alive here, so its id stays its own).
        self._hot = {id(statement): statement for statement in hot}
        #: Bound plans of hot statements by (statement id, value names), or None where a
        #: statement's plan cannot be bound (it takes the general path).
        self._bound: dict[tuple[int, tuple[str, ...], bool], BoundPlan | None] = {}

    def plan(self, statement: ClauseElement, keys: tuple[str, ...], many: bool) -> tuple[Plan, Sequence[Any] | None]:
        """The plan for ``statement`` called with values named ``keys`` (a batch: ``many``), and
        the statement's own literal values to go with it."""
        cache_key = statement._generate_cache_key()
        if cache_key is None:  # a statement SQLAlchemy cannot cache: compiled for this call
            return Plan(statement.compile(dialect=self.dialect, column_keys=keys, for_executemany=many), self.dialect), None
        shape = (cache_key.key, keys, many)
        plan = self._plans.get(shape)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            compiled = statement.compile(dialect=self.dialect, cache_key=cache_key, column_keys=keys, for_executemany=many)
            plan = self._plans[shape] = Plan(compiled, self.dialect)
        return plan, cache_key.bindparams

    def _bound_plan(self, statement: ClauseElement, keys: tuple[str, ...], many: bool) -> BoundPlan | None:
        found = (id(statement), keys, many)
        if found in self._bound:
            return self._bound[found]
        plan, extracted = self.plan(statement, keys, many)
        bound = BoundPlan(plan, keys, extracted) if BoundPlan.bindable(plan) else None
        self._bound[found] = bound
        return bound

    def prepare(self, statement: ClauseElement, parameters: Any) -> tuple[Plan, str, list[Any] | None, list[list[Any]] | None]:
        """A call of ``statement`` with a dict of values (or None), or a list of dicts (a batch,
        when more than one): its plan, its SQL, and its positional arguments (one call's, or the
        batch's, one list per dict)."""
        batch: list[dict[str, Any]] | None = None
        if isinstance(parameters, list):
            if len(parameters) > 1:
                batch, parameters = parameters, None
            else:
                parameters = parameters[0] if parameters else None
        first = batch[0] if batch is not None else parameters
        keys = tuple(sorted(first or ()))
        if id(statement) in self._hot:
            bound = self._bound_plan(statement, keys, batch is not None)
            if bound is not None:
                if batch is not None:
                    return bound.plan, bound.plan.sql, None, [bound.arguments(values) for values in batch]
                return bound.plan, bound.plan.sql, bound.arguments(parameters or {}), None
        plan, extracted = self.plan(statement, keys, batch is not None)
        if batch is not None:
            return plan, plan.sql, None, [plan.arguments(values, extracted)[1] for values in batch]
        sql, args = plan.arguments(parameters, extracted)
        return plan, sql, args, None
