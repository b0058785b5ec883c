"""`RolloutBatch`: what the orchestrator hands the trainer for one step (rollouts/step_N/).

Stored as JSON lines, one rollout per line, so anyone can inspect a batch with `head`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lorarl.run_folder import BATCH_FILE, write_folder_atomically


def policy_lag(step: int, version: int) -> int:
    """How many versions a rollout of policy `version` lags the policy that trainer step `step`
    updates (version step - 1): 0 is on-policy. The orchestrator bounds it, the trainer logs it."""
    return step - 1 - version


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    # vLLM's logprob of each completion token under the sampling policy (temperature applied).
    completion_logprobs: list[float]
    # True for tokens the model generated; False for environment tokens inside a multi-turn
    # episode (no loss, logprob 0.0).
    completion_mask: list[bool]
    advantage: float
    reward: float
    policy_version: int
    temperature: float
    env: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutBatch:
    step: int
    rollouts: list[Rollout]

    def write(self, folder: Path) -> None:
        def _write(tmp: Path) -> None:
            with open(tmp / BATCH_FILE, "w") as f:
                for r in self.rollouts:
                    f.write(json.dumps(asdict(r)) + "\n")

        write_folder_atomically(folder, _write)

    @classmethod
    def read(cls, folder: Path, step: int) -> RolloutBatch:
        with open(folder / BATCH_FILE) as f:
            return cls(step, [Rollout(**json.loads(line)) for line in f])
