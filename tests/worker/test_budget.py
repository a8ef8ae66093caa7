"""The budget a process serving several cells shares among their claim loops: pure logic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jobbus.worker.budget import CellBudget


class Loop:
    """A claim loop as the budget sees it: its running handlers, and whether it was woken."""

    def __init__(self, budget: CellBudget, cell: str) -> None:
        self.budget = budget
        self.cell = cell
        self.running = 0
        self.woken = 0
        budget.join(cell, running=lambda: self.running, wake=self.wake)

    def wake(self) -> None:
        self.woken += 1

    def claim(self, wanted: int, available: int) -> int:
        """Request, reserve, claim what the queues have (`available`), settle: the claim loop's round."""
        granted = self.budget.request(self.cell, wanted)
        if granted == 0:
            return 0
        slots, _ = self.budget.reserve(self.cell, granted, None)
        claimed = min(slots, available)
        self.budget.settle(self.cell, slots, None, full=claimed == slots)
        self.running += claimed
        self.budget.count(claimed)
        return claimed

    def finish(self, jobs: int = 1) -> None:
        self.running -= jobs
        self.budget.released()


def test_each_cell_gets_its_guarantee_and_a_lone_busy_cell_borrows_the_rest() -> None:
    budget = CellBudget(["a", "b"], 10)
    a, b = Loop(budget, "a"), Loop(budget, "b")
    assert budget.guarantee == 5
    assert a.claim(10, 1000) == 5  # b may still claim: its guarantee is kept
    assert budget.waiting("a")
    assert b.claim(10, 0) == 0  # b's queues are empty: it keeps nothing
    assert not budget.waiting("b")
    assert a.woken  # and a, waiting, was told
    assert a.claim(5, 1000) == 5
    assert budget.in_use() == 10


def test_slots_a_borrower_frees_go_to_the_cell_that_waits_for_them() -> None:
    budget = CellBudget(["a", "b"], 4)
    a, b = Loop(budget, "a"), Loop(budget, "b")
    b.claim(4, 0)
    assert a.claim(4, 1000) == 4  # a borrowed b's guarantee
    assert b.claim(4, 1000) == 0  # b has jobs now: cut, in line
    assert budget.waiting("b")
    woken = b.woken
    a.finish()
    assert b.woken > woken  # b is woken when a slot frees
    assert a.claim(1, 1000) == 0  # a may not take it back
    assert b.claim(4, 1000) == 1
    a.finish(2)  # a runs 1, b runs 1: each takes what it lacks to its guarantee of 2, no more
    assert a.claim(2, 1000) == 1
    assert b.claim(3, 1000) == 1
    assert (a.running, b.running) == (2, 2)
    assert budget.in_use() == 4


def test_more_cells_than_slots_are_served_in_the_order_they_were_cut() -> None:
    budget = CellBudget(["a", "b", "c"], 2)
    a, b, c = Loop(budget, "a"), Loop(budget, "b"), Loop(budget, "c")
    assert budget.guarantee == 1
    assert a.claim(2, 1000) == 1
    assert b.claim(2, 1000) == 1
    assert c.claim(2, 1000) == 0
    a.finish()
    assert a.claim(2, 1000) == 0  # c runs as few and was never served: the slot a freed is c's
    assert c.claim(2, 1000) == 1
    b.finish()
    assert b.claim(1, 1000) == 0  # a was served longer ago than b
    assert a.claim(1, 1000) == 1


def test_a_paused_or_departed_cell_keeps_nothing() -> None:
    budget = CellBudget(["a", "b"], 6)
    a, _ = Loop(budget, "a"), Loop(budget, "b")
    assert a.claim(6, 1000) == 3
    budget.idle("b")  # b's claim loop is paused
    assert a.claim(3, 1000) == 3
    budget.leave("a")
    assert budget.in_use() == 0


def test_the_limit_counts_every_cell_and_reservations_in_flight() -> None:
    budget = CellBudget(["a", "b"], 10, limit=3)
    a, b = Loop(budget, "a"), Loop(budget, "b")
    granted = budget.request("a", 5)
    slots, jobs = budget.reserve("a", granted, 3)
    assert (slots, jobs) == (3, 3)
    assert budget.request("b", 5) == 0  # a's claim in flight may take all three
    budget.settle("a", slots, jobs, full=False)
    a.running += 1
    budget.count(1)  # it took one
    assert b.claim(5, 1000) == 2
    assert budget.limit_reached and budget.claimed == 3


@settings(max_examples=300, deadline=None)
@given(
    cells=st.integers(1, 4),
    concurrency=st.integers(1, 9),
    steps=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["claim", "finish", "idle"]), st.integers(0, 12))),
)
def test_the_cells_never_hold_more_slots_than_the_budget(
    cells: int, concurrency: int, steps: list[tuple[int, str, int]]
) -> None:
    budget = CellBudget([f"c{n}" for n in range(cells)], concurrency)
    loops = [Loop(budget, f"c{n}") for n in range(cells)]
    for index, action, amount in steps:
        loop = loops[index % cells]
        if action == "claim":
            loop.claim(max(0, concurrency - loop.running), amount)
        elif action == "finish" and loop.running:
            loop.finish(min(loop.running, max(1, amount)))
        elif action == "idle":
            budget.idle(loop.cell)
        assert sum(each.running for each in loops) <= concurrency
        assert budget.in_use() == sum(each.running for each in loops)


@settings(max_examples=200, deadline=None)
@given(cells=st.integers(2, 4), concurrency=st.integers(1, 9), rounds=st.integers(1, 30))
def test_a_cell_with_jobs_is_served_within_a_round_of_the_others(cells: int, concurrency: int, rounds: int) -> None:
    """Every cell has endless jobs and each round every running job ends; whatever order the loops run
    in, each cell gets a slot at least every `cells` rounds (none waits behind the others forever)."""
    budget = CellBudget([f"c{n}" for n in range(cells)], concurrency)
    loops = [Loop(budget, f"c{n}") for n in range(cells)]
    last_served = [0] * cells
    for round_ in range(1, rounds + 1):
        order = loops[round_ % cells :] + loops[: round_ % cells]
        for loop in order:
            if loop.claim(concurrency, 10_000):
                last_served[loops.index(loop)] = round_
        for served in last_served:
            assert round_ - served <= cells, (round_, last_served)
        assert sum(each.running for each in loops) <= concurrency
        for loop in loops:
            loop.finish(loop.running)


def test_a_cell_whose_claim_failed_neither_keeps_nor_borrows_slots() -> None:
    budget = CellBudget(["a", "b"], 4)
    a, b = Loop(budget, "a"), Loop(budget, "b")
    b.claim(4, 0)
    slots, _ = budget.reserve("a", budget.request("a", 4), None)
    assert slots == 4  # b is empty: a may borrow it all
    budget.settle("a", slots, None, full=False, failed=True)  # a's database is away
    assert b.claim(4, 1000) == 4  # nothing is kept for a
    b.finish(4)
    assert budget.request("a", 4) == 2  # while failing, a tries its guarantee only
    budget.reserve("a", 2, None)
    budget.settle("a", 2, None, full=True)
    b.claim(4, 0)  # b's queues are empty again
    assert a.claim(4, 1000) == 4  # and a's claims go through: it borrows again
