"""`CellBudget`: the one concurrency budget of a process serving several cells, shared fairly by their workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class _Cell:
    """What the budget knows of one cell's claim loop while it runs."""

    running: Callable[[], int]  # its handlers running now (the slots it holds)
    wake: Callable[[], None]  # wakes its claim loop
    reserved: int = 0  # slots of a claim statement in flight
    #: Whether it may want slots soon: its last claim came back full, or the budget cut its last request.
    hungry: bool = True
    granted: int = 0  # what its last request was granted, for the claim that follows at once
    served: int = -1  # when a request of it was last granted slots (the budget's count of grants)
    failing: bool = False  # its last claim failed: its database is away


class CellBudget:
    """`concurrency` slots shared by the claim loops of several cells, so that the handlers running in all
    of them never exceed it, and a busy cell does not starve another.

    Each cell is guaranteed `concurrency // cells` slots (at least one). A cell may borrow free slots beyond
    its guarantee only while the slots the other cells could still claim up to theirs stay free: a cell
    whose last claim came back short (its queues are empty) reserves nothing, so a lone busy cell uses the
    whole budget; as soon as the other cell has jobs again, its claim is cut, and the slots the borrower
    frees go to it first. Among the cells cut by the budget, those running fewer handlers come first,
    then those served longest ago: with more cells than slots, every cell with jobs takes its turn.

    A slot is held from the claim that takes it until its handler ends (the claim loop's count of running
    handlers), and reserved while a claim statement is in flight: the event loop runs one claim loop at a
    time, so a grant is never given twice. With `limit` (`--limit`, `--run-once`), the jobs claimed in all
    cells together never exceed it, and every cell's claim loop sees the shared count.
    """

    def __init__(self, cells: Sequence[str], concurrency: int, limit: int | None = None) -> None:
        if not cells:
            raise ValueError("a budget needs at least one cell")
        self.concurrency = concurrency
        self.guarantee = max(1, concurrency // len(cells))
        self.limit = limit
        #: Jobs claimed in all cells so far (what `limit` counts).
        self.claimed = 0
        self._jobs_reserved = 0
        self._cells: dict[str, _Cell] = {}
        #: Cells whose last request the budget cut (in the order they were cut: the order they are woken).
        self._waiting: dict[str, None] = {}
        self._grants = 0

    # -- the claim loops come and go ----------------------------------------------------------------

    def join(self, cell: str, *, running: Callable[[], int], wake: Callable[[], None]) -> None:
        """A cell's claim loop starts: until its first claim, its guarantee is kept for it."""
        self._cells[cell] = _Cell(running, wake)

    def leave(self, cell: str) -> None:
        """A cell's worker ended (or its database is down): its slots and its guarantee go to the others."""
        if self._cells.pop(cell, None) is not None:
            self._waiting.pop(cell, None)
            self._wake_waiting()

    def idle(self, cell: str) -> None:
        """The cell claims nothing for now (paused, fenced, stopping): nothing is kept for it."""
        state = self._cells.get(cell)
        if state is not None and state.hungry:
            state.hungry = False
            self._waiting.pop(cell, None)
            self._wake_waiting()

    # -- slots ---------------------------------------------------------------------------------------

    def used(self, cell: str) -> int:
        state = self._cells.get(cell)
        return 0 if state is None else state.running() + state.reserved

    def in_use(self) -> int:
        """Slots held or reserved in all cells."""
        return sum(state.running() + state.reserved for state in self._cells.values())

    def waiting(self, cell: str) -> bool:
        """Whether the budget cut the cell's last request and has not served it since: its claim loop
        found nothing because it could claim nothing, not because its queues are empty."""
        return cell in self._waiting

    def grantable(self, cell: str) -> int:
        """How many slots `cell` may take now: its guarantee's room, or more while the slots owed to the
        other cells stay free; never what is owed to the cells in line before it."""
        states = self._cells
        own = states.get(cell)
        if own is None:
            return 0
        free = self.concurrency - self.in_use()
        if free <= 0:
            return 0
        if cell in self._waiting:  # in line: behind those running fewer, then those served longer ago
            place = (own.running() + own.reserved, own.served)
            ahead = [
                name
                for name in self._waiting
                if name != cell and (states[name].running() + states[name].reserved, states[name].served) < place
            ]
        else:
            ahead = list(self._waiting)
        owed_ahead = sum(self._shortfall(name) for name in ahead)
        owed_others = sum(
            self._shortfall(name)
            for name, state in self._cells.items()
            if name != cell and state.hungry and name not in ahead
        )
        unowed = free - owed_ahead
        own_room = self.guarantee - self.used(cell)
        if own.failing:  # its database is away: it may try its guarantee, never borrow
            return max(0, min(unowed, own_room))
        return max(0, min(unowed, max(own_room, unowed - owed_others)))

    def request(self, cell: str, wanted: int) -> int:
        """The slots `cell` may claim for now, of the `wanted` it has free. A request the budget cuts puts
        the cell in line: it is woken when slots free, and they go to it before cells that are not in
        line. The claim that follows at once (nothing else runs in between) reserves what was granted."""
        state = self._cells.get(cell)
        if state is None:
            return 0
        granted = min(wanted, self.grantable(cell))
        if self.limit is not None:
            granted = min(granted, max(0, self.limit - self.claimed - self._jobs_reserved))
        if granted < wanted and not self.limit_reached:
            state.hungry = True
            self._waiting.setdefault(cell, None)
        else:
            self._waiting.pop(cell, None)
        if granted:
            self._grants += 1
            state.served = self._grants
        state.granted = granted
        return granted

    def reserve(self, cell: str, slots: int, jobs: int | None, *, jobs_per_slot: int = 1) -> tuple[int, int | None]:
        """Reserve, for a claim statement about to be sent, at most the slots `request` just granted and,
        with a limit, the jobs they may take (`jobs_per_slot`: a batch handler's slot takes a batch);
        returns what may be claimed. `settle` ends the reservation."""
        state = self._cells.get(cell)
        if state is None:
            return 0, 0
        slots = min(slots, state.granted)
        state.granted = 0
        if self.limit is not None:
            left = max(0, self.limit - self.claimed - self._jobs_reserved)
            jobs = min(left if jobs is None else min(jobs, left), slots * jobs_per_slot)
            slots = min(slots, jobs)
            self._jobs_reserved += jobs
        state.reserved += slots
        return slots, jobs

    def settle(self, cell: str, slots: int, jobs: int | None, *, full: bool, failed: bool = False) -> None:
        """The claim statement reserved for returned (`full`: as many jobs as it could take, so there may
        be more; else fewer: its queues are empty for now), or `failed` (its database is away: until a
        claim of it succeeds, it keeps nothing and borrows nothing). The reservation ends; the claim loop
        counts the jobs and takes their slots before anything else runs."""
        state = self._cells.get(cell)
        if state is not None:
            state.reserved -= slots
            state.hungry = full and not failed
            state.failing = failed
            if not state.hungry:
                self._waiting.pop(cell, None)
        if jobs is not None:
            self._jobs_reserved -= jobs
        self.released()  # what it did not take goes to the cells waiting

    def reserve_jobs(self, jobs: int) -> int:
        """How many of `jobs` a batch still gathering may claim into the slot it holds (`limit` counts
        them); `settle_jobs` ends the reservation."""
        if self.limit is None:
            return jobs
        jobs = min(jobs, max(0, self.limit - self.claimed - self._jobs_reserved))
        self._jobs_reserved += jobs
        return jobs

    def settle_jobs(self, jobs: int) -> None:
        if self.limit is not None:
            self._jobs_reserved -= jobs
            self.released()

    def released(self) -> None:
        """A handler ended somewhere: the cells waiting for a slot look again."""
        if self._waiting:
            self._wake_waiting()

    # -- the limit -----------------------------------------------------------------------------------

    def count(self, claimed: int) -> None:
        """Jobs claimed in a cell (what `limit` counts); the limit reached wakes every claim loop to end."""
        if not claimed:
            return
        self.claimed += claimed
        if self.limit is not None and self.claimed >= self.limit:
            for state in self._cells.values():  # every claim loop ends once its jobs are done
                state.wake()

    @property
    def limit_reached(self) -> bool:
        return self.limit is not None and self.claimed >= self.limit

    # -- helpers -------------------------------------------------------------------------------------

    def _shortfall(self, cell: str) -> int:
        """Slots `cell` lacks to reach its guarantee."""
        return max(0, self.guarantee - self.used(cell))

    def _wake_waiting(self) -> None:
        for name in self._waiting:
            state = self._cells.get(name)
            if state is not None:
                state.wake()
