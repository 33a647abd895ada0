"""The speed tricks, in one place: statements compiled once, and every cache a process keeps.

1. Statements. Building and compiling a queryset costs several times what PostgreSQL needs
   to answer a lookup by a unique key (decision 06). A `Compiled` lookup lets the ORM write
   the SQL once per thread, with markers where the values go; each call only binds the values,
   runs the SQL and builds the model instances as the ORM would (same converters,
   `Model.from_db`). `insert` and `update` do the same for writing one row. They are used only
   on the hot paths `make bench` measures: the API's authentication and replay, the intake's
   insert, a worker's claim, its last look at the grant before the call and each move's locked
   read, and the runner's fenced checkpoint. `STATEMENTS` lists them; `python manage.py fastpath` prints
   their SQL. Only the SQL text is kept here: the statements psycopg prepares belong to its
   connection, so one that replaced a connection the database dropped (CONN_HEALTH_CHECKS,
   ledger.outages) prepares them afresh and never names a statement of the dead one.
2. Caches. Each is registered with `register_cache`: what it holds, what makes it stale,
   how it is emptied. `python manage.py fastpath` lists them; tests/ledger/test_compiled.py
   checks that no module keeps one unregistered.
"""

import inspect
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Callable

from django.db import connections, router
from django.db.transaction import TransactionManagementError
from django.db.models import AutoField, BigAutoField, SmallAutoField

# What stands in for a value while the SQL is written: unlike any value a query holds, and
# of the value's type, so that fields prepare it as they would the value.
MARKERS = {
    str: lambda i: f"\x1ecompiled-value-{i}\x1e",
    int: lambda i: 2_147_483_000 + i,  # within a 32-bit integer field's range
    datetime: lambda i: datetime(1970, 1, 1, 0, 0, 0, i, tzinfo=UTC),
}


class Compiled:
    """`Compiled(lambda key: Action.objects.filter(operation_key=key))`, then `.first(key)`
    or `.all(key)`. The values stand in for string fields unless `kinds` names their types
    (`Compiled(lambda pk: ..., int)`); the queryset may not follow relations in its SELECT
    (no select_related), since rows become instances of its model. Annotations become
    attributes of the instances, as the ORM sets them."""

    def __init__(self, build, *kinds, name=""):
        self.name = name or f"{build.__module__}.{build.__qualname__}"
        self._build = build
        self._kinds = kinds
        self._local = threading.local()
        STATEMENTS.append(self)

    def __str__(self):
        return self.name

    def sql(self):
        """The statement as the database receives it, with a placeholder for each value."""
        return self._plan(len(inspect.signature(self._build).parameters))[2]

    def _plan(self, arity):
        plans = self._local.__dict__.setdefault("plans", {})
        if arity not in plans:
            kinds = self._kinds + (str,) * (arity - len(self._kinds))
            markers = [MARKERS[kind](i) for i, kind in enumerate(kinds)]
            queryset = self._build(*markers)
            if queryset.query.select_related:
                raise ValueError("Compiled lookups build instances of one model: no select_related")
            compiler = queryset.query.get_compiler(queryset.db)
            sql, params = compiler.as_sql()
            # A value reaches the SQL as the backend adapts it (SQLite: a datetime as text).
            adapt = [_adapter(kind, compiler.connection) for kind in kinds]
            slots = [_slot(p, [a(m) for a, m in zip(adapt, markers)]) for p in params]
            columns = [col for col, _, _ in compiler.select]
            annotations = list(queryset.query.annotation_select)
            names = [col.target.attname for col, _, alias in compiler.select if alias not in annotations]
            plans[arity] = (queryset.model, queryset.db, sql, slots, adapt, names, annotations,
                            compiler, compiler.get_converters(columns))
        return plans[arity]

    def all(self, *values):
        model, db, sql, slots, adapt, names, annotations, compiler, converters = self._plan(len(values))
        if compiler.query.select_for_update and not connections[db].in_atomic_block:
            # As the ORM says it: outside a transaction the lock would be gone at once.
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        params = [adapt[v](values[v]) if is_marker else v for is_marker, v in slots]
        with connections[db].cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        if converters:
            rows = compiler.apply_converters(rows, converters)
        if not annotations:
            return [model.from_db(db, names, row) for row in rows]
        found = []
        for row in rows:  # the ORM selects a model's columns first, then its annotations
            obj = model.from_db(db, names, row[:len(names)])
            for name, value in zip(annotations, row[len(names):]):
                setattr(obj, name, value)
            found.append(obj)
        return found

    def first(self, *values):
        found = self.all(*values)
        return found[0] if found else None


def _adapter(kind, connection):
    return connection.ops.adapt_datetimefield_value if kind is datetime else _as_is


def _as_is(value):
    return value


def _slot(param, markers):
    """(True, index of the value) where the SQL takes a value; (False, param) for a constant."""
    for i, marker in enumerate(markers):
        if type(param) is type(marker) and param == marker:
            return True, i
    return False, param


_inserts = {}  # registered below, with _updates


def insert(obj, stored=()):
    """INSERT a new instance as `obj.save(force_insert=True)` would (fields' pre_save and
    database preparation alike), with the statement written once per model. No
    pre_save/post_save signals are sent: nothing in Surety listens to them.

    `stored`: names of text or time fields a trigger may change on the way in, read back
    into obj: on PostgreSQL by the INSERT's own RETURNING (a BEFORE trigger's change shows
    there), elsewhere by a second read (SQLite's RETURNING does not show an AFTER trigger's)."""
    model = type(obj)
    alias = router.db_for_write(model, instance=obj)
    connection = connections[alias]
    stored = tuple(stored)
    in_returning = stored if connection.vendor == "postgresql" else ()
    plan = _inserts.get((model, alias, in_returning))
    if plan is None:
        fields = _inserted(model)
        quote = connection.ops.quote_name
        sql = f"INSERT INTO {_into(model, fields, connection)} VALUES ({', '.join(['%s'] * len(fields))})"
        if connection.features.can_return_columns_from_insert:
            returned = [model._meta.pk, *(model._meta.get_field(name) for name in in_returning)]
            sql += f" RETURNING {', '.join(quote(f.column) for f in returned)}"
        plan = _inserts[(model, alias, in_returning)] = (sql, fields)
    sql, fields = plan
    values = _insert_values(obj, fields, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if connection.features.can_return_columns_from_insert:
            obj.pk, *returned = cursor.fetchone()
        else:
            obj.pk, returned = cursor.lastrowid, ()
    if stored and not in_returning:
        returned = model._base_manager.using(alias).filter(pk=obj.pk).values_list(*stored).get()
    for name, value in zip(stored, returned):
        setattr(obj, model._meta.get_field(name).attname, value)
    obj._state.adding, obj._state.db = False, alias
    return obj


def _inserted(model):
    return [f for f in model._meta.local_concrete_fields if not isinstance(f, (AutoField, BigAutoField, SmallAutoField))]


def _into(model, fields, connection):
    quote = connection.ops.quote_name
    return f"{quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)})"


def _insert_values(obj, fields, connection):
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]


_updates = {}


def update(obj, fields, *, and_insert=None, read_back=None, **where):
    """UPDATE `fields` of obj's row, as `obj.save(update_fields=fields)` would, and only while
    the row matches `where` (field=value); return how many rows changed (0 or 1). The
    statement is written once per model, fields and conditions.

    `and_insert`: a new instance (of another model) to INSERT as `insert` does, if and only if
    the row is written (a move's audit event). On PostgreSQL both are one statement, a round
    trip fewer for every audited move (decision 54):
    WITH written AS (UPDATE ... RETURNING ...), inserted AS (INSERT INTO ... SELECT <its values>
    FROM written RETURNING id) SELECT ... FROM written, inserted

    `read_back`: {name: SQL expression over the table}, evaluated by the UPDATE's RETURNING for
    the row it writes and set on obj as attributes `name` (a settle's look at held actions)."""
    model = type(obj)
    alias = router.db_for_write(model, instance=obj)
    connection = connections[alias]
    together = and_insert is not None and connection.vendor == "postgresql"
    read_back = read_back or {}
    key = (model, alias, tuple(fields), tuple(where), type(and_insert) if together else None, tuple(read_back.items()))
    plan = _updates.get(key)
    if plan is None:
        meta, quote = model._meta, connection.ops.quote_name
        columns = [meta.get_field(name) for name in fields]
        conditions = [meta.pk, *(meta.get_field(name) for name in where)]
        sql = (f"UPDATE {quote(meta.db_table)} SET {', '.join(f'{quote(f.column)} = %s' for f in columns)} "
               f"WHERE {' AND '.join(f'{quote(f.column)} = %s' for f in conditions)}")
        if read_back or together:
            returned = [f"{expression} AS {quote(name)}" for name, expression in read_back.items()]
            sql += f" RETURNING {', '.join(returned or ['1'])}"
        inserted = []
        if together:
            other = type(and_insert)
            inserted = _inserted(other)
            # Typed, as a VALUES list is typed by its columns; text stays text, so that a value
            # too long for its column is refused as an INSERT refuses it, not cut short.
            values = ", ".join(f"CAST(%s AS {_cast_type(f, connection)})" for f in inserted)
            selected = ", ".join([f"inserted.{quote(other._meta.pk.column)}",
                                  *(f"written.{quote(name)}" for name in read_back)])
            sql = (f"WITH written AS ({sql}), inserted AS (INSERT INTO {_into(other, inserted, connection)} "
                   f"SELECT {values} FROM written RETURNING {quote(other._meta.pk.column)}) "
                   f"SELECT {selected} FROM written, inserted")
        plan = _updates[key] = (sql, columns, conditions[1:], inserted)
    sql, columns, conditions, inserted = plan
    values = [f.get_db_prep_save(f.pre_save(obj, False), connection) for f in columns]
    values.append(obj.pk)
    values += [f.get_db_prep_value(value, connection, prepared=False) for f, value in zip(conditions, where.values())]
    if together:
        values += _insert_values(and_insert, inserted, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        if read_back or together:
            row = cursor.fetchone()
            written = row is not None
        else:
            row, written = (), cursor.rowcount
    if not written:
        return 0
    if together:
        and_insert.pk, *row = row
        and_insert._state.adding, and_insert._state.db = False, alias
    elif and_insert is not None:
        insert(and_insert)
    for name, value in zip(read_back, row):
        setattr(obj, name, value)
    return 1


def _cast_type(field, connection):
    return "text" if field.get_internal_type() in ("CharField", "TextField") else field.db_type(connection)


# --- Every cache a process keeps ------------------------------------------------------------


@dataclass(frozen=True)
class Cache:
    name: str
    holds: str
    stale_when: str
    clear: Callable[[], None]


CACHES = {}
STATEMENTS = []


def register_cache(name, *, holds, stale_when, clear):
    CACHES[name] = Cache(name, holds, stale_when, clear)


def clear_caches():
    """Empty every cache (tests that change what a cache was built from)."""
    for cache in CACHES.values():
        cache.clear()


register_cache("ledger.compiled._inserts", holds="the INSERT of each model", clear=_inserts.clear,
               stale_when="a migration changes the table's columns: restart the processes")
register_cache("ledger.compiled._updates", holds="the UPDATE of each model, fields and conditions",
               clear=_updates.clear, stale_when="a migration changes the table's columns: restart the processes")
register_cache("ledger.compiled.Compiled", holds="each compiled statement's SQL, per thread",
               clear=lambda: [statement._local.__dict__.clear() for statement in STATEMENTS],
               stale_when="a migration changes the table's columns: restart the processes")
