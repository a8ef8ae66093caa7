"""Cells (SPEC 23): which database of an App's cells a job lives in, and the cell tag its id carries.

Pure rules over the `cells` and `queue_cells` settings: nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict

from jobbus.errors import InvalidJobError

#: The bits of a job id that carry its cell's tag: the lowest 16 of the random part of a UUIDv7, below
#: every bit that orders ids (the time and uuid_utils' counter); version and variant bits are not touched.
TAG_MASK = 0xFFFF


def cell_tag(name: str) -> int:
    """The 16-bit tag of a cell: the first two bytes of the SHA-256 of its name. Two names may share a
    tag (one pair in 65,536): a tag says where to look first, never where a job must be."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:2], "big")


def tagged(job_id: uuid.UUID, tag: int) -> uuid.UUID:
    """`job_id` with its lowest 16 bits replaced by `tag` (still a valid UUIDv7, ordered as before)."""
    return uuid.UUID(int=(job_id.int & ~TAG_MASK) | tag)


def tag_of(job_id: uuid.UUID) -> int:
    return job_id.int & TAG_MASK


@dataclass(frozen=True, slots=True)
class Placement:
    """The cells of an App, in order (the first is the default), and the cell of each named queue."""

    names: tuple[str, ...]
    queue_cells: Mapping[str, str]
    tags: Mapping[str, int]
    #: Each cell's database name, where its DSN names one (to check a `connection=` against it).
    databases: Mapping[str, str | None]

    @classmethod
    def of(cls, cells: Mapping[str, str], queue_cells: Mapping[str, str] | None) -> Placement:
        return cls(
            tuple(cells),
            dict(queue_cells or {}),
            {name: cell_tag(name) for name in cells},
            {name: _database_of(dsn) for name, dsn in cells.items()},
        )

    def cell_for(self, cell: object, queue: object) -> str:
        """Where a job goes: its `cell=`, else its queue's cell (`queue_cells`), else the first cell.
        An unknown cell raises `InvalidJobError` (a `ValueError`) before anything is written."""
        if cell is not None:
            if not isinstance(cell, str) or cell not in self.tags:
                raise InvalidJobError(f"cell {cell!r} is not one of this App's cells ({', '.join(self.names)})")
            return cell
        if isinstance(queue, str):
            return self.queue_cells.get(queue, self.names[0])
        return self.names[0]

    def search_order(self, job_id: uuid.UUID) -> list[str]:
        """The cells to ask for a job: first those whose tag its id carries, then every other one (ids
        made by the SQL API, by a periodic tick, or before cells were configured carry no cell's tag)."""
        tag = tag_of(job_id)
        first = [name for name in self.names if self.tags[name] == tag]
        return first + [name for name in self.names if self.tags[name] != tag]

    def cell_of_tag(self, job_id: uuid.UUID) -> str | None:
        """The one cell whose tag `job_id` carries, or None when none or several (a tag collision) do."""
        tag = tag_of(job_id)
        found = [name for name in self.names if self.tags[name] == tag]
        return found[0] if len(found) == 1 else None

    def cell_of_spec(self, job_id: uuid.UUID, queue: str) -> str:
        """Where a job built already goes (`insert_specs`): the cell its id's tag names; when two cells
        share the tag, the queue's cell if it is one of them, else the first of them; when no cell has
        the tag (an id made elsewhere), the queue's cell."""
        tag = tag_of(job_id)
        found = [name for name in self.names if self.tags[name] == tag]
        by_queue = self.cell_for(None, queue)
        if not found or by_queue in found:
            return by_queue
        return found[0]

    def check_connection(self, cell: str, database: str | None) -> None:
        """`connection=` writes in the caller's transaction: it must be a connection to the job's cell.
        Refused when the cell's DSN names a database and the connection is to another one."""
        expected = self.databases.get(cell)
        if expected is not None and database is not None and database != expected:
            raise InvalidJobError(
                f"connection= is to database {database!r}, but the job goes to cell {cell!r} (database "
                f"{expected!r}): pass a connection to that cell's database, or cell= naming the connection's cell"
            )

    def one_cell(self, what: str, cells: Sequence[str]) -> str:
        """The one cell that all of a call's jobs go to, or `InvalidJobError` naming the cells: one call is
        one transaction in one database."""
        distinct = list(dict.fromkeys(cells))
        if len(distinct) > 1:
            raise InvalidJobError(
                f"{what}: these jobs would go to cells {', '.join(map(repr, distinct))}; one call writes in one "
                "database (one transaction): call it once per cell, or give cell= to place them together"
            )
        return distinct[0] if distinct else self.names[0]


def _database_of(dsn: str) -> str | None:
    try:
        database = conninfo_to_dict(dsn).get("dbname")
    except Exception:  # a DSN psycopg cannot read fails when its pool connects, with psycopg's own error
        return None
    return None if database is None else str(database)
