"""The orchestrator's half of each checkpoint: where the example streams stood.

The checkpoint of step N (`run.orchestrator_checkpoint(N)`, beside the trainer's) holds the
sampler's state once the last group for step N was drawn, so a run resumed from N draws exactly
the examples the uninterrupted run drew for steps N + 1 on. The state is taken when that group is
drawn, which is usually well before batch N is written, and saved just before it is.

Parts whose state changes only as batch N is put together (the stream of extra groups, which are
drawn for the step being assembled only; the difficulty memory, which each written batch adds to)
are saved as they are then, under their names beside the sampler's state.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.run_folder import RunFolder

STATE_FILE = "state.json"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SamplerCheckpoints:
    def __init__(
        self, run: RunFolder, sampler: ExampleSampler, interval: int | None, at_batch: dict[str, Stateful] | None = None
    ) -> None:
        self.run, self.sampler, self.interval = run, sampler, interval  # interval: trainer.ckpt.interval
        self.at_batch = at_batch or {}  # name -> a part saved as it is when the batch is written
        self._drawn: dict[int, dict[str, Any]] = {}  # step -> the sampler's state once its groups were drawn

    def step_drawn(self, step: int) -> None:
        """The last group for `step` was drawn: keep the sampler's state if `step` is checkpointed."""
        if self.interval is not None and step % self.interval == 0:
            self._drawn[step] = self.sampler.state_dict()

    def save(self, step: int) -> None:
        """The batch for `step` is complete and about to be written: save its checkpoint, if it has one."""
        if (state := self._drawn.pop(step, None)) is not None:
            state |= {name: part.state_dict() for name, part in self.at_batch.items()}
            self.run.write_checkpoint_half(
                step, "orchestrator", lambda d: (d / STATE_FILE).write_text(json.dumps(state))
            )

    def restore(self, step: int) -> None:
        """Put the sampler, and every part the checkpoint has, where the checkpoint of `step` left them
        (a part it lacks, such as one turned on since, starts afresh)."""
        state = json.loads((self.run.orchestrator_checkpoint(step) / STATE_FILE).read_text())
        self.sampler.load_state_dict(state)
        for name, part in self.at_batch.items():
            if name in state:
                part.load_state_dict(state[name])
