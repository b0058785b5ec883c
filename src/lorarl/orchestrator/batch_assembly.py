"""`BatchAssembler`: which finished groups make up the batch of each trainer step.

Two policies, chosen by `orchestrator.max_off_policy_steps`:

* None (the default): the batch for step s is exactly the groups drawn for s. It waits for the
  slowest of them, and which examples train at which step does not depend on timing.
* K: continuous batching. The batch for step s takes the first `groups_per_step` groups to finish,
  oldest policy first, whichever step they were drawn for; a slow group never holds a batch up but
  rolls over into a later one, as long as its lag there (s - 1 - version) stays <= K. A group
  older than that is dropped. Batches then depend on timing, and dropping stragglers drops long
  episodes more often than short ones: a larger K trades staleness for less of that bias.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from lorarl.rollouts import policy_lag


class Versioned(Protocol):
    @property
    def version(self) -> int: ...


G = TypeVar("G", bound=Versioned)


class BatchAssembler(Generic[G]):
    def __init__(self, groups_per_step: int, max_off_policy_steps: int | None) -> None:
        self.groups_per_step = groups_per_step
        self.max_off_policy_steps = max_off_policy_steps
        self._finished: list[tuple[int, G]] = []  # (the step it was drawn for, group), in finish order

    def add(self, drawn_for: int, group: G) -> None:
        self._finished.append((drawn_for, group))

    def is_stale(self, version: int, step: int) -> bool:
        """Too old for the batch of `step`, and so for every later one."""
        return self.max_off_policy_steps is not None and policy_lag(step, version) > self.max_off_policy_steps

    def drop_stale(self, step: int) -> int:
        """Forget the finished groups too old for the batch of `step`; returns how many."""
        kept = [(s, g) for s, g in self._finished if not self.is_stale(g.version, step)]
        dropped = len(self._finished) - len(kept)
        self._finished = kept
        return dropped

    def take(self, step: int, n: int | None = None) -> list[G] | None:
        """`n` groups (default groups_per_step) for the batch of `step` once there are enough, else
        None. A step may take more than one round: extra groups drawn for it (filters.py)."""
        n = self.groups_per_step if n is None else n
        if self.max_off_policy_steps is None:
            chosen = [(s, g) for s, g in self._finished if s == step][:n]
        else:
            # Oldest policy first (stable: finish order within a version), so that rolled-over
            # groups are used before they grow too old.
            chosen = sorted(self._finished, key=lambda sg: sg[1].version)[:n]
        if len(chosen) < n:
            return None
        taken = {id(g) for _, g in chosen}
        self._finished = [(s, g) for s, g in self._finished if id(g) not in taken]
        return [g for _, g in chosen]

    def __len__(self) -> int:
        return len(self._finished)
