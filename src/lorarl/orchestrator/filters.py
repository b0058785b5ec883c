"""`StepFilter`: which of a step's finished groups the trainer gets, and how many more to draw for it.

A group whose advantages are all 0 (every rollout rewarded the same) carries no policy gradient. With
`skip_zero_advantage` it is left out of the batch; it still counts in the step's metrics, samples and
difficulty memory, as an attempt of its example. With `fill_informative` (DAPO's dynamic sampling)
the step then asks for as many extra groups as it lacks informative ones, round after round, until it
holds `groups_per_step` informative groups or has drawn `max_extra_groups` extra ones.

The loop feeds it the groups the batch assembler hands over for the current step (`wanted` of them),
draws `extra_to_draw()` more whenever that is above 0, and writes `finish()` once it is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorarl.config.orchestrator import OrchestratorConfig
from lorarl.orchestrator.groups import Group


@dataclass
class StepBatch:
    """One step's groups: all that were taken for it, and those the trainer gets."""

    groups: list[Group]
    trained: list[Group]
    extra_drawn: int  # groups drawn for the step beyond its regular ones
    bound_hit: bool  # filling stopped at its bound, short of a full batch

    def metrics(self) -> dict[str, float]:
        trained = {id(g) for g in self.trained}
        skipped = [g for g in self.groups if id(g) not in trained]
        return {
            "groups/zero_advantage": sum(g.zero_advantage for g in self.groups),
            "groups/extra_drawn": self.extra_drawn,
            "rollouts/trained": sum(len(e.samples) for g in self.trained for e in g.episodes),
            "rollouts/skipped": sum(len(e.samples) for g in skipped for e in g.episodes),
            "fill/bound_hit": int(self.bound_hit),
        }


class StepFilter:
    def __init__(self, groups_per_step: int, skip_zero_advantage: bool, fill: bool, max_extra_groups: int) -> None:
        self.groups_per_step, self.skip_zero_advantage = groups_per_step, skip_zero_advantage
        self.fill, self.max_extra_groups = fill, max_extra_groups
        self._reset()

    @classmethod
    def for_config(cls, cfg: OrchestratorConfig, groups_per_step: int) -> StepFilter:
        max_extra_groups = int((cfg.fill_max_draw_factor - 1) * groups_per_step)
        return cls(groups_per_step, cfg.skip_zero_advantage, cfg.fill_informative, max_extra_groups)

    def _reset(self) -> None:
        self.groups: list[Group] = []
        self.extra_drawn = 0
        self.wanted = self.groups_per_step  # groups still to come from the assembler for this step

    def add(self, groups: list[Group]) -> None:
        """The `wanted` groups the assembler handed over."""
        self.groups += groups
        self.wanted -= len(groups)

    @property
    def trained(self) -> list[Group]:
        return [g for g in self.groups if not (self.skip_zero_advantage and g.zero_advantage)]

    def extra_to_draw(self) -> int:
        """How many more groups to draw for this step now: as many as informative ones are missing,
        within the bound; 0 once the batch is complete (or without fill_informative)."""
        if not self.fill or self.wanted:
            return 0
        missing = self.groups_per_step - len(self.trained)
        return max(0, min(missing, self.max_extra_groups - self.extra_drawn))

    def drawing(self, n: int) -> None:
        """`n` extra groups were drawn for this step: the assembler owes them."""
        self.extra_drawn += n
        self.wanted += n

    def finish(self) -> StepBatch:
        """The step's batch; the filter starts over for the next step."""
        trained = self.trained
        batch = StepBatch(self.groups, trained, self.extra_drawn, self.fill and len(trained) < self.groups_per_step)
        self._reset()
        return batch
