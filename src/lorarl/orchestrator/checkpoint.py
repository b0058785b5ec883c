"""The orchestrator's half of each checkpoint: where the example sampler stood.

The checkpoint of step N (`run.orchestrator_checkpoint(N)`, beside the trainer's) holds the
sampler's state once the last group for step N was drawn, so a run resumed from N draws exactly
the examples the uninterrupted run drew for steps N + 1 on. The state is taken when that group is
drawn, which is usually well before batch N is written, and saved just before it is.
"""

from __future__ import annotations

import json
from typing import Any

from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.run_folder import RunFolder

STATE_FILE = "state.json"


class SamplerCheckpoints:
    def __init__(self, run: RunFolder, sampler: ExampleSampler, interval: int | None) -> None:
        self.run, self.sampler, self.interval = run, sampler, interval  # interval: trainer.ckpt.interval
        self._drawn: dict[int, dict[str, Any]] = {}  # step -> the sampler's state once its groups were drawn

    def step_drawn(self, step: int) -> None:
        """The last group for `step` was drawn: keep the sampler's state if `step` is checkpointed."""
        if self.interval is not None and step % self.interval == 0:
            self._drawn[step] = self.sampler.state_dict()

    def save(self, step: int) -> None:
        """The batch for `step` was written: save its checkpoint, if it has one."""
        if (state := self._drawn.pop(step, None)) is not None:
            self.run.write_checkpoint_half(
                step, "orchestrator", lambda d: (d / STATE_FILE).write_text(json.dumps(state))
            )

    def restore(self, step: int) -> None:
        """Put the sampler where the checkpoint of `step` left it."""
        self.sampler.load_state_dict(json.loads((self.run.orchestrator_checkpoint(step) / STATE_FILE).read_text()))
