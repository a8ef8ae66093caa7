"""src/jobbus/sql/current.sql is the database program the migrations build: what `make schema` writes
from them today, and a schema built from it is, object by object, the schema the migrations build."""

from __future__ import annotations

import difflib

import psycopg
import pytest
from tools import generate_schema
from tools.generate_schema import SchemaObject

from jobbus import schema

CURRENT = generate_schema.TARGET


def _differences(migrated: list[SchemaObject], built: list[SchemaObject]) -> list[str]:
    """What the migrations build that current.sql does not, the reverse, and each object the two build
    differently, with its lines that differ."""
    unmatched = {(o.kind, o.name): o.statement for o in built}
    found = []
    for ours in migrated:
        theirs = unmatched.pop((ours.kind, ours.name), None)
        if theirs is None:
            found.append(f"{ours.kind} {ours.name}: built by the migrations, not by current.sql")
        elif theirs != ours.statement:
            lines = (ours.statement.splitlines(), theirs.splitlines())
            diff = difflib.unified_diff(*lines, "migrations", "current.sql", n=1, lineterm="")
            found.append(f"{ours.kind} {ours.name} differs:\n" + "\n".join(diff))
    return found + [f"{kind} {name}: built by current.sql, not by the migrations" for kind, name in unmatched]


def _compare_with_the_migrations(dsn: str, text: str) -> list[str]:
    """Migrate one schema, build another from `text` (current.sql), and compare what the catalogs hold."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema.migrate(conn, "jobbus_migrated")
        generate_schema.apply(conn, "jobbus_built", text)
        return _differences(
            generate_schema.describe(conn, "jobbus_migrated"), generate_schema.describe(conn, "jobbus_built")
        )


def test_current_sql_is_what_make_schema_writes(empty_dsn: str) -> None:
    """Exact on every major: PostgreSQL 15 (CI's) is the reference, 14 and 16 to 18 print the same text."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        generated = generate_schema.generate(conn)
        major = conn.info.server_version // 10000
    committed = CURRENT.read_text()
    if generated != committed:
        diff = difflib.unified_diff(
            committed.splitlines(), generated.splitlines(), "current.sql", "generated", n=1, lineterm=""
        )
        pytest.fail(
            "current.sql is stale: run `make schema` (if only PostgreSQL "
            f"{major} prints it differently, teach tools/generate_schema.py to print it as 15 does)\n"
            + "\n".join(list(diff)[:80])
        )


def test_current_sql_names_the_migrations_it_was_generated_from() -> None:
    """What `make lint` checks without a server (tools/generate_schema.py --check-migrations)."""
    assert generate_schema.sources() + "\n" in CURRENT.read_text()


def test_a_schema_built_from_current_sql_is_the_schema_the_migrations_build(empty_dsn: str) -> None:
    assert _compare_with_the_migrations(empty_dsn, CURRENT.read_text()) == []


def test_a_hand_edit_of_current_sql_is_told_apart_from_the_migrations(empty_dsn: str) -> None:
    committed = CURRENT.read_text()
    edited = committed.replace(
        "AS $function$ SELECT '9000-01-01 00:00:00+00'::timestamptz $function$;",
        "AS $function$ SELECT 'infinity'::timestamptz $function$;",
    ).replace("    priority                  integer NOT NULL DEFAULT 0,", "    priority                  integer,")
    assert edited.count("\n") == committed.count("\n") and edited != committed
    differences = _compare_with_the_migrations(empty_dsn, edited)
    assert [d.splitlines()[0] for d in differences] == ["table job differs:", "function never() differs:"]
    assert "+    priority                  integer," in differences[0]
    assert "+AS $function$ SELECT 'infinity'::timestamptz $function$;" in differences[1]


def test_a_migration_without_make_schema_leaves_current_sql_stale(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new migration that changes a function's body and another's setting (as `ALTER FUNCTION ... SET`
    does), current.sql not generated again: both checks say so, the one without a server too."""
    new = schema.Migration(
        schema.latest_version() + 1,
        "a_change",
        "CREATE OR REPLACE FUNCTION {schema}.never() RETURNS timestamptz\n"
        "LANGUAGE sql IMMUTABLE AS $$ SELECT 'infinity'::timestamptz $$;\n"
        "ALTER FUNCTION {schema}.fold_error(text) SET work_mem = '8MB';\n",
    )
    shipped = schema.migrations()
    monkeypatch.setattr(schema, "migrations", lambda: (*shipped, new))
    assert generate_schema.sources() + "\n" not in CURRENT.read_text()
    differences = _compare_with_the_migrations(empty_dsn, CURRENT.read_text())
    assert [d.splitlines()[0] for d in differences] == [
        "function fold_error(p_error text) differs:",
        "function never() differs:",
    ]
    assert "-AS $function$ SELECT 'infinity'::timestamptz $function$;" in differences[1]
    assert "- SET work_mem TO '8MB'" in differences[0]


#: What no migration uses yet but the generator prints: a sequence of its own owned by a column, a
#: serial column, a collation, column settings, an unlogged table, a foreign key, statistics with a
#: target, a view with options, a disabled trigger.
UNUSED_YET = """
CREATE SCHEMA {schema};
CREATE SEQUENCE {schema}.ticket_seq AS integer START WITH 100 INCREMENT BY 5;
CREATE TABLE {schema}.parent (id bigserial PRIMARY KEY, code text COLLATE "C" UNIQUE, note text);
ALTER TABLE {schema}.parent ALTER COLUMN note SET STATISTICS 500, ALTER COLUMN note SET STORAGE EXTERNAL,
    ALTER COLUMN code SET COMPRESSION pglz;
CREATE UNLOGGED TABLE {schema}.child (
    id integer PRIMARY KEY DEFAULT nextval('{schema}.ticket_seq'),
    parent_id bigint REFERENCES {schema}.parent (id) ON DELETE CASCADE
);
ALTER SEQUENCE {schema}.ticket_seq OWNED BY {schema}.child.id;
CREATE STATISTICS {schema}.parent_code_note ON code, note FROM {schema}.parent;
ALTER STATISTICS {schema}.parent_code_note SET STATISTICS 200;
CREATE VIEW {schema}.parent_children WITH (security_barrier = true) AS
    SELECT p.id, count(c.id) AS children FROM {schema}.parent AS p LEFT JOIN {schema}.child AS c ON c.parent_id = p.id
    GROUP BY p.id;
CREATE FUNCTION {schema}.touch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
CREATE TRIGGER child_touched BEFORE UPDATE ON {schema}.child FOR EACH ROW EXECUTE FUNCTION {schema}.touch();
ALTER TABLE {schema}.child DISABLE TRIGGER child_touched;
"""


def test_what_no_migration_uses_yet_is_printed_so_that_it_builds_the_same_schema(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.render(UNUSED_YET, "jobbus_by_hand").encode())
        printed = generate_schema.describe(conn, "jobbus_by_hand")
        generate_schema.apply(conn, "jobbus_built", "\n".join(o.statement for o in printed))
        assert _differences(printed, generate_schema.describe(conn, "jobbus_built")) == []
    kinds = {(o.kind, o.name) for o in printed}
    assert {("sequence", "ticket_seq"), ("sequence owner", "ticket_seq"), ("view", "parent_children")} <= kinds
    assert {("foreign key", "child_parent_id_fkey on child"), ("trigger", "child_touched on child")} <= kinds
    tables = {o.name: o.statement for o in printed if o.kind == "table"}
    assert "    id   bigserial,\n" in tables["parent"] and "CREATE UNLOGGED TABLE" in tables["child"]


@pytest.mark.parametrize(
    "unshown",
    [
        "CREATE DOMAIN {schema}.positive AS integer CHECK (VALUE > 0)",
        "CREATE TABLE {schema}.t (a int); COMMENT ON TABLE {schema}.t IS 'a comment'",
        "CREATE TABLE {schema}.t (a int); ALTER TABLE {schema}.t ENABLE ROW LEVEL SECURITY",
        "CREATE MATERIALIZED VIEW {schema}.v AS SELECT 1 AS one",
    ],
    ids=["domain", "comment", "row level security", "materialized view"],
)
def test_what_current_sql_cannot_show_stops_the_generator(empty_dsn: str, unshown: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(schema.render("CREATE SCHEMA {schema};\n" + unshown, "jobbus_by_hand").encode())
        with pytest.raises(generate_schema.GenerationError, match="cannot show these yet"):
            generate_schema.describe(conn, "jobbus_by_hand")
