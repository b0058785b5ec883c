"""Which finished groups make up each batch: by step drawn for, or first finished (continuous)."""

from __future__ import annotations

from dataclasses import dataclass

from lorarl.orchestrator.batch_assembly import BatchAssembler


@dataclass(eq=False)
class G:
    version: int
    name: str = ""


def test_by_default_a_batch_is_the_groups_drawn_for_its_step() -> None:
    a: BatchAssembler[G] = BatchAssembler(groups_per_step=2, max_off_policy_steps=None)
    early = [G(0, "for step 2"), G(0, "for step 2")]
    for g in early:
        a.add(2, g)
    a.add(1, G(0, "for step 1"))
    # Enough groups have finished, but the batch of step 1 waits for its own second group.
    assert a.take(1) is None
    last = G(0, "for step 1")
    a.add(1, last)
    assert [g.name for g in a.take(1) or []] == ["for step 1", "for step 1"]
    assert a.take(2) == early
    # Nothing is ever too old: the batch waits instead of dropping.
    a.add(3, G(0))
    assert not a.is_stale(0, 100) and a.drop_stale(100) == 0 and len(a) == 1


def test_continuous_batches_take_the_oldest_finished_groups_first() -> None:
    a: BatchAssembler[G] = BatchAssembler(groups_per_step=2, max_off_policy_steps=1)
    newer, older, oldest = G(1, "newer"), G(0, "older"), G(0, "oldest")
    a.add(3, newer)
    assert a.take(2) is None  # one group is not a batch
    a.add(2, older)
    a.add(1, oldest)
    # Whatever step they were drawn for; same version: in the order they finished.
    assert [g.name for g in a.take(2) or []] == ["older", "oldest"]
    assert len(a) == 1


def test_continuous_batches_drop_groups_older_than_the_bound() -> None:
    a: BatchAssembler[G] = BatchAssembler(groups_per_step=1, max_off_policy_steps=1)
    a.add(1, G(0))
    a.add(2, G(1))
    # For the batch of step 2, version 0 lags 1: allowed. For step 3 it lags 2: dropped.
    assert not a.is_stale(0, 2) and a.is_stale(0, 3) and not a.is_stale(1, 3)
    assert a.drop_stale(2) == 0
    assert a.drop_stale(3) == 1
    assert [g.version for g in a.take(3) or []] == [1]
