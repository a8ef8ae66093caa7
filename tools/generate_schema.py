"""Write src/jobbus/sql/current.sql, the database program the migrations build, from a migrated database.

The migrations are applied one by one to an empty database, and after each the schema is read back from
PostgreSQL's catalogs (pg_get_functiondef, pg_get_indexdef, pg_get_constraintdef, pg_get_triggerdef,
pg_attribute, ...), not by pg_dump, whose major must match the server's. The file holds the last state,
each object under the migrations that created or changed it, with `{schema}` where the schema's name
goes, as the migrations write it. PostgreSQL 15 (CI's server) is the reference; 14, 16, 17 and 18 print the
same file (docs/development.md, "The database program").

    python tools/generate_schema.py                       # write it (`make schema`)
    python tools/generate_schema.py --check               # exit 1 if it is stale
    python tools/generate_schema.py --check-migrations    # no server: exit 1 if made from other migrations

The server is the tests' (`JOBBUS_TEST_DSN`, else the embedded one), or `--dsn`; the generator creates a
database there and drops it.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import re
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, LiteralString

import psycopg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/generate_schema.py` puts tools/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from tests.dbserver import fresh_database, server_dsn  # noqa: E402

from jobbus import schema  # noqa: E402

TARGET = ROOT / "src/jobbus/sql/current.sql"
#: The schema the generator builds and reads: a name no migration writes.
SCRATCH_SCHEMA = "jobbus_current_sql"


class GenerationError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class SchemaObject:
    """One object of a schema as current.sql prints it, `{schema}` standing for the schema's name."""

    kind: str  # table, index, statistics, sequence, function, view, trigger, ...
    name: str  # unique within its kind: a function's carries its arguments, a trigger's its table
    statement: str


# ---------------------------------------------------------------------------------------------------------
# Reading a schema from the catalogs


def describe(conn: psycopg.Connection[Any], name: str) -> list[SchemaObject]:
    """Every object of schema `name` in current.sql's order, as the server prints it back.

    Sequences of their own first, then the tables, each followed by its indexes and statistics (none
    of which calls a function of the schema), then foreign keys, the functions by name, the views, and
    the triggers by table. `name` must be a name no migration writes: each of its occurrences becomes
    `{schema}`. Raises `GenerationError` for an object current.sql cannot show yet (a rule, a policy, a
    domain, a comment, ...), so that a migration adding one teaches the generator instead of going unseen.
    """
    placeholder = _Placeholder(name)
    namespace = _one(conn, "SELECT oid FROM pg_namespace WHERE nspname = %s", (name,))
    if namespace is None:
        raise GenerationError(f"there is no schema {name}")
    conn.execute("SET search_path = pg_catalog")  # the schema's objects print qualified, built-in ones not
    _refuse_unsupported(conn, namespace)
    sequences = conn.execute(_SEQUENCES, (namespace,)).fetchall()
    serials = {(table, column): word for *_, table, column, word in sequences if word is not None}
    columns = _by_table(conn.execute(_COLUMNS, (namespace,)))
    constraints = _by_table(conn.execute(_CONSTRAINTS, (namespace,)))
    indexes = _by_table(conn.execute(_INDEXES, (namespace,)))
    statistics = _by_table(conn.execute(_STATISTICS, (namespace,)))
    triggers = _by_table(conn.execute(_TRIGGERS, (namespace,)))
    relations = conn.execute(_RELATIONS, (namespace,)).fetchall()
    found = [
        SchemaObject("sequence", sequence, f"CREATE SEQUENCE {qualified} AS {parameters};")
        for sequence, qualified, parameters, _, _, _, word in sequences
        if word is None
    ]
    for oid, table, qualified, relkind, persistence, options, _ in relations:
        if relkind == "r":
            found.append(_table(table, qualified, persistence, options, columns[oid], constraints[oid], serials, oid))
            found += [
                SchemaObject("index", index, _break_before(text, " WHERE ") + ";") for index, text in indexes[oid]
            ]
            found += [_statistics(*row) for row in statistics[oid]]
    found += [
        SchemaObject(
            "foreign key", f"{constraint} on {table}", f"ALTER TABLE {qualified} ADD CONSTRAINT {constraint} {text};"
        )
        for oid, table, qualified, *_ in relations
        for constraint, kind, text in constraints[oid]
        if kind == "f"
    ]
    found += [
        SchemaObject("sequence owner", sequence, f"ALTER SEQUENCE {qualified} OWNED BY {owner};")
        for sequence, qualified, _, owner, _, _, word in sequences
        if word is None and owner is not None
    ]
    found += [
        SchemaObject("function", f"{function}({arguments})", text.rstrip("\n") + ";")
        for function, arguments, text in conn.execute(_FUNCTIONS, (namespace,))
    ]
    found += [
        SchemaObject("view", view, f"CREATE VIEW {qualified}{_with(options)} AS\n{text.rstrip().rstrip(';')};")
        for _, view, qualified, relkind, _, options, text in relations
        if relkind == "v"
    ]
    found += [_trigger(table, *row) for oid, table, *_ in relations for row in triggers[oid]]
    return [SchemaObject(o.kind, placeholder(o.name), placeholder(o.statement)) for o in found]


class _Placeholder:
    """Writes `{schema}` for the schema's name, quoted (as the migrations' bodies hold it) or bare (as
    PostgreSQL prints a qualified name), and doubles `{` and `}`, as the migrations' text does."""

    def __init__(self, name: str) -> None:
        if any(name in migration.template for migration in schema.migrations()):
            raise GenerationError(f"a migration writes {name!r}: read the schema under another name")
        self._quoted = f'"{name}"'
        self._bare = re.compile(rf"\b{re.escape(name)}\b")

    def __call__(self, text: str) -> str:
        text = text.replace("{", "{{").replace("}", "}}").replace(self._quoted, "{schema}")
        return self._bare.sub("{schema}", text)


def _refuse_unsupported(conn: psycopg.Connection[Any], namespace: int) -> None:
    problems = [row[0] for row in conn.execute(_UNSUPPORTED, {"ns": namespace})]
    if problems:
        raise GenerationError(
            "current.sql cannot show these yet, teach tools/generate_schema.py: " + "; ".join(problems)
        )


def _by_table(cursor: psycopg.Cursor[Any]) -> defaultdict[int, list[tuple[Any, ...]]]:
    """Rows whose first column is a table's oid, by that oid, without it."""
    grouped: defaultdict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for table, *rest in cursor:
        grouped[table].append(tuple(rest))
    return grouped


def _table(
    table: str,
    qualified: str,
    persistence: str,
    options: list[str] | None,
    columns: list[tuple[Any, ...]],
    constraints: list[tuple[Any, ...]],
    serials: dict[tuple[int, str], str],
    oid: int,
) -> SchemaObject:
    """CREATE TABLE with its columns in their order and its constraints but foreign keys, then what sets
    a column apart from its type's defaults."""
    width = max(len(column[0]) for column in columns)
    lines = []
    after = []
    for column, type_, not_null, default, generated, collation, statistics, storage, compression in columns:
        words = [type_]
        if (oid, column) in serials:
            words = [serials[oid, column]]
        else:
            if collation:
                words.append(f"COLLATE {collation}")
            if not_null:
                words.append("NOT NULL")
            if generated:
                words.append(f"GENERATED ALWAYS AS ({default}) {'STORED' if generated == 's' else 'VIRTUAL'}")
            elif default is not None:
                words.append(f"DEFAULT {default}")
        lines.append(f"    {column.ljust(width)} {' '.join(words)}")
        alter = f"ALTER TABLE {qualified} ALTER COLUMN {column}"
        if statistics != -1:
            after.append(f"{alter} SET STATISTICS {statistics};")
        if storage:
            after.append(f"{alter} SET STORAGE {_STORAGE[storage]};")
        if compression:
            after.append(f"{alter} SET COMPRESSION {_COMPRESSION[compression]};")
    lines += [f"    CONSTRAINT {constraint} {text}" for constraint, kind, text in constraints if kind != "f"]
    unlogged = "UNLOGGED " if persistence == "u" else ""
    statement = f"CREATE {unlogged}TABLE {qualified} (\n" + ",\n".join(lines) + f"\n){_with(options)};"
    return SchemaObject("table", table, "\n".join([statement, *after]))


def _statistics(name: str, qualified: str, text: str, target: int) -> SchemaObject:
    if target != -1:
        text += f";\nALTER STATISTICS {qualified} SET STATISTICS {target}"
    return SchemaObject("statistics", name, text + ";")


def _trigger(table: str, trigger: str, qualified: str, text: str, enabled: str) -> SchemaObject:
    """On three lines, as the migrations write them: the event, the level and condition, the function."""
    text = _break_before(_break_before(text, " FOR EACH "), " EXECUTE FUNCTION ", last=True)
    if enabled != "O":
        action = {"D": "DISABLE", "R": "ENABLE REPLICA", "A": "ENABLE ALWAYS"}[enabled]
        text += f";\nALTER TABLE {qualified} {action} TRIGGER {trigger}"
    return SchemaObject("trigger", f"{trigger} on {table}", text + ";")


_STORAGE = {"p": "PLAIN", "e": "EXTERNAL", "m": "MAIN", "x": "EXTENDED"}
_COMPRESSION = {"p": "pglz", "l": "lz4"}


def _break_before(text: str, marker: str, *, last: bool = False) -> str:
    """A line break and an indent in place of the space before `marker`'s first (or last) occurrence."""
    at = text.rfind(marker) if last else text.find(marker)
    return text if at < 0 else text[:at] + "\n    " + text[at + 1 :]


def _with(options: list[str] | None) -> str:
    """` WITH (fillfactor = 85)` from a table's or a view's reloptions."""
    if not options:
        return ""
    pairs = [option.split("=", 1) for option in options]
    return " WITH (" + ", ".join(f"{key} = {_option_value(value)}" for key, value in pairs) + ")"


def _option_value(value: str) -> str:
    return value if re.fullmatch(r"[\w.]+", value) else "'" + value.replace("'", "''") + "'"


def _one(conn: psycopg.Connection[Any], query: LiteralString, params: tuple[Any, ...]) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


# Each query reads one kind of object of the schema whose oid is its parameter; names come quoted as
# identifiers where they are printed, and a table's oid first where its objects are printed with it.

_RELATIONS: LiteralString = """
SELECT c.oid, c.relname, c.oid::regclass::text, c.relkind, c.relpersistence, c.reloptions,
       CASE c.relkind WHEN 'v' THEN pg_get_viewdef(c.oid, true) END
FROM pg_class AS c WHERE c.relnamespace = %s AND c.relkind IN ('r', 'v') ORDER BY c.relname
"""

_COLUMNS: LiteralString = """
SELECT a.attrelid, quote_ident(a.attname), format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attgenerated,
       CASE WHEN a.attcollation <> t.typcollation THEN format('%%I.%%I', cn.nspname, co.collname) END,
       coalesce(a.attstattarget::integer, -1), CASE WHEN a.attstorage <> t.typstorage THEN a.attstorage END,
       a.attcompression::text
FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid
JOIN pg_type AS t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation AS co ON co.oid = a.attcollation
LEFT JOIN pg_namespace AS cn ON cn.oid = co.collnamespace
WHERE c.relnamespace = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

# Not contype 'n': PostgreSQL 18 keeps a NOT NULL as a constraint too; the column says it. Nor 't': a
# constraint trigger prints as a trigger.
_CONSTRAINTS: LiteralString = """
SELECT k.conrelid, quote_ident(k.conname), k.contype, pg_get_constraintdef(k.oid)
FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid
WHERE c.relnamespace = %s AND k.contype IN ('p', 'u', 'x', 'c', 'f')
ORDER BY k.conrelid, array_position(ARRAY['p', 'u', 'x', 'c', 'f']::"char"[], k.contype), k.conname
"""

# Not those a primary key, a unique or an exclusion constraint makes: the constraint says them.
_INDEXES: LiteralString = """
SELECT i.indrelid, c.relname, pg_get_indexdef(i.indexrelid)
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE c.relnamespace = %s AND NOT EXISTS (
    SELECT 1 FROM pg_constraint AS k
    WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid AND k.contype IN ('p', 'u', 'x'))
ORDER BY i.indrelid, c.relname
"""

_STATISTICS: LiteralString = """
SELECT s.stxrelid, s.stxname, format('%%s.%%I', s.stxnamespace::regnamespace, s.stxname),
       pg_get_statisticsobjdef(s.oid), coalesce(s.stxstattarget::integer, -1)
FROM pg_statistic_ext AS s WHERE s.stxnamespace = %s ORDER BY s.stxrelid, s.stxname
"""

_TRIGGERS: LiteralString = """
SELECT t.tgrelid, quote_ident(t.tgname), t.tgrelid::regclass::text, pg_get_triggerdef(t.oid), t.tgenabled
FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
WHERE c.relnamespace = %s AND NOT t.tgisinternal ORDER BY t.tgrelid, t.tgname
"""

_FUNCTIONS: LiteralString = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
FROM pg_proc AS p WHERE p.pronamespace = %s ORDER BY p.proname, pg_get_function_identity_arguments(p.oid) COLLATE "C"
"""

# Each sequence with its parameters, the column owning it, and for one that is exactly what `serial`,
# `bigserial` or `smallserial` makes (a sequence of the column's type named table_column_seq, with the
# defaults, owned by the NOT NULL column whose default it is), that word: current.sql writes the word
# in the column and not the sequence.
_SEQUENCES: LiteralString = """
SELECT sc.relname, sc.oid::regclass::text,
       format('%%s INCREMENT BY %%s MINVALUE %%s MAXVALUE %%s START WITH %%s CACHE %%s%%s',
              format_type(s.seqtypid, NULL), s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache,
              CASE WHEN s.seqcycle THEN ' CYCLE' END),
       format('%%s.%%I', a.attrelid::regclass, a.attname), a.attrelid, quote_ident(a.attname),
       CASE WHEN sc.relname = tc.relname || '_' || a.attname || '_seq' AND a.attnotnull AND s.seqtypid = a.atttypid
             AND s.seqstart = 1 AND s.seqincrement = 1 AND s.seqmin = 1 AND s.seqcache = 1 AND NOT s.seqcycle
             AND pg_get_expr(d.adbin, d.adrelid) = format('nextval(%%L::regclass)', sc.oid::regclass)
             AND (a.atttypid, s.seqmax) IN (('int2'::regtype, 32767), ('int4'::regtype, 2147483647),
                                            ('int8'::regtype, 9223372036854775807))
            THEN CASE a.atttypid WHEN 'int2'::regtype THEN 'smallserial' WHEN 'int4'::regtype THEN 'serial'
                                 ELSE 'bigserial' END END
FROM pg_class AS sc
JOIN pg_sequence AS s ON s.seqrelid = sc.oid
LEFT JOIN pg_depend AS dep ON dep.classid = 'pg_class'::regclass AND dep.objid = sc.oid
     AND dep.refclassid = 'pg_class'::regclass AND dep.deptype = 'a'
LEFT JOIN pg_class AS tc ON tc.oid = dep.refobjid
LEFT JOIN pg_attribute AS a ON a.attrelid = dep.refobjid AND a.attnum = dep.refobjsubid
LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE sc.relnamespace = %s AND sc.relkind = 'S'
ORDER BY sc.relname
"""

_UNSUPPORTED: LiteralString = """
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) FROM pg_depend AS d
WHERE d.refclassid = 'pg_namespace'::regclass AND d.refobjid = %(ns)s
  AND d.classid NOT IN ('pg_class'::regclass, 'pg_proc'::regclass, 'pg_statistic_ext'::regclass)
UNION ALL
SELECT pg_describe_object('pg_class'::regclass, c.oid, 0) FROM pg_class AS c
WHERE c.relnamespace = %(ns)s AND c.relkind NOT IN ('r', 'i', 'S', 'v')
UNION ALL
SELECT 'row level security of table ' || c.relname FROM pg_class AS c
WHERE c.relnamespace = %(ns)s AND (c.relrowsecurity OR c.relforcerowsecurity)
UNION ALL
SELECT 'replica identity of table ' || c.relname FROM pg_class AS c
WHERE c.relnamespace = %(ns)s AND c.relkind = 'r' AND c.relreplident <> 'd'
UNION ALL
SELECT 'inheritance of table ' || c.relname FROM pg_inherits AS i
JOIN pg_class AS c ON c.oid = i.inhrelid WHERE c.relnamespace = %(ns)s
UNION ALL
SELECT 'identity column ' || c.relname || '.' || a.attname FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid WHERE c.relnamespace = %(ns)s AND a.attidentity <> ''
UNION ALL
SELECT pg_describe_object('pg_proc'::regclass, p.oid, 0) FROM pg_proc AS p
WHERE p.pronamespace = %(ns)s AND p.prokind NOT IN ('f', 'p')
UNION ALL
SELECT pg_describe_object('pg_rewrite'::regclass, r.oid, 0) FROM pg_rewrite AS r
JOIN pg_class AS c ON c.oid = r.ev_class WHERE c.relnamespace = %(ns)s AND r.rulename <> '_RETURN'
UNION ALL
SELECT pg_describe_object('pg_policy'::regclass, p.oid, 0) FROM pg_policy AS p
JOIN pg_class AS c ON c.oid = p.polrelid WHERE c.relnamespace = %(ns)s
UNION ALL
SELECT 'comment on ' || pg_describe_object(d.classoid, d.objoid, d.objsubid) FROM pg_description AS d
WHERE d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT oid FROM pg_class WHERE relnamespace = %(ns)s)
   OR d.classoid = 'pg_proc'::regclass AND d.objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = %(ns)s)
ORDER BY 1
"""


# ---------------------------------------------------------------------------------------------------------
# Building the schema, migration by migration


@dataclass(frozen=True, slots=True)
class Program:
    """The schema the migrations build, and for each object the migrations that created or changed it."""

    objects: list[SchemaObject]
    history: dict[tuple[str, str], list[int]]


def build(conn: psycopg.Connection[Any]) -> Program:
    """Apply every migration to schema `SCRATCH_SCHEMA` of an empty database, reading it after each."""
    history: dict[tuple[str, str], list[int]] = {}
    before: dict[tuple[str, str], str] = {}
    objects: list[SchemaObject] = []
    for version in _migrate_one_by_one(conn, SCRATCH_SCHEMA):
        objects = describe(conn, SCRATCH_SCHEMA)
        now = {(o.kind, o.name): o.statement for o in objects}
        for key, statement in now.items():
            if key not in before:
                history[key] = [version]
            elif before[key] != statement:
                history[key].append(version)
        before = now
    return Program(objects, history)


def _migrate_one_by_one(conn: psycopg.Connection[Any], name: str) -> Iterator[int]:
    """What `schema.migrate` does, a migration at a time, yielding each version once it is applied; its
    bookkeeping first, as version 0."""
    conn.execute(schema.bookkeeping(name).encode())
    yield 0
    for migration in schema.migrations():
        if migration.transactional:
            with conn.transaction():
                conn.execute(migration.render(name).encode())
                conn.execute(schema._record(name, migration).encode())
        else:
            for statement in migration.statements(name):
                conn.execute(statement.encode())
            conn.execute(schema._record(name, migration).encode())
        yield migration.version


# ---------------------------------------------------------------------------------------------------------
# The file


_SECTIONS = (
    ("sequence", "Sequences of their own"),
    ("table", "Tables, each with its indexes and statistics"),
    ("foreign key", "Foreign keys"),
    ("sequence owner", "Sequences owned by a column"),
    ("function", "Functions, by name"),
    ("view", "Views"),
    ("trigger", "Triggers, by table"),
)
_WITH_ITS_TABLE = {"index", "statistics"}
_RULE = "-- " + "=" * 105


def sources() -> str:
    """The line of current.sql's header naming the migrations it is generated from, with a digest of
    their text, so that `make lint` tells without a server that a migration changed since."""
    migrations = schema.migrations()
    text = "".join(f"{m.version:04d}_{m.name}\n{m.template}" for m in migrations)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return (
        f"-- Generated from migrations {migrations[0].version:04d} to {migrations[-1].version:04d} (digest {digest})."
    )


def render_file(program: Program) -> str:
    lines = [
        "-- GENERATED by tools/generate_schema.py: do not edit. To change the database program, write a new",
        '-- migration, then run `make schema` (docs/development.md, "The database program").',
        sources(),
        "--",
        "-- What `jobbus migrate` builds in a schema, as PostgreSQL prints it back: every table (columns,",
        "-- defaults, constraints), index, statistics object, function (its whole body) and trigger, each",
        "-- kind by name. {schema} stands for the schema's name and {{ }} for braces, as in the migrations.",
        "-- Above each object, the migrations that created or changed it (src/jobbus/sql/migrations/): their",
        "-- comments say why. Not here: privileges (docs/security.md; the functions that run as the schema's",
        "-- owner are not executable by PUBLIC) and the optional search index (`jobbus search-index`).",
        "",
        "-- Bodies are checked when they run: functions call functions defined further down.",
        "SET check_function_bodies = off;",
    ]
    for kind, title in _SECTIONS:
        chosen = [o for o in program.objects if o.kind == kind or (kind == "table" and o.kind in _WITH_ITS_TABLE)]
        if not chosen:
            continue
        lines += ["", "", _RULE, f"-- {title}", _RULE]
        for found in chosen:
            made_by = ", ".join(f"{v:04d}" if v else "jobbus migrate" for v in program.history[found.kind, found.name])
            lines += [*([] if found.kind in _WITH_ITS_TABLE else [""]), f"-- {made_by}", found.statement]
    return "\n".join(lines) + "\n"


def generate(conn: psycopg.Connection[Any]) -> str:
    """current.sql as the server of `conn` prints it; `conn` is to an empty database, in autocommit. The
    session's time zone is UTC: a timestamptz constant in a CHECK prints in it (job_debounce_parked_check)."""
    conn.execute("SET TimeZone = 'UTC'")
    return render_file(build(conn))


def apply(conn: psycopg.Connection[Any], name: str, text: str) -> None:
    """Build schema `name` from current.sql's `text`, as a test does to compare it with the migrations'."""
    with conn.transaction():
        conn.execute(schema.render("CREATE SCHEMA {schema};\n" + text, name).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the target is stale")
    mode.add_argument("--check-migrations", action="store_true", help="exit 1 if made from other migrations")
    parser.add_argument("--dsn", help="a server to generate on (default: the tests')")
    parser.add_argument("--target", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    current = args.target.read_text() if args.target.exists() else ""
    if args.check_migrations:
        if sources() + "\n" not in current:
            print(
                f"generate_schema: {args.target} is stale (the migrations changed): run `make schema`", file=sys.stderr
            )
            return 1
        return 0
    try:
        with fresh_database(args.dsn or server_dsn(), None) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
            text = generate(conn)
    except GenerationError as exc:
        print(f"generate_schema: {exc}", file=sys.stderr)
        return 1
    if not args.check:
        args.target.write_text(text)
        return 0
    if current != text:
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "on disk", "generated", lineterm="")
        print("\n".join(list(diff)[:60]), file=sys.stderr)
        print(f"generate_schema: {args.target} is stale: run `make schema`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
