"""`write_samples`: the first few episodes of each batch, decoded, in samples/step_N.jsonl (and,
with wandb on, as a table there).

For reading what the policy does at a step; the trainer never reads them.
"""

from __future__ import annotations

import json
from itertools import islice

from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.groups import Group
from lorarl.run_folder import RunFolder
from lorarl.written_files import record_written


def write_samples(run: RunFolder, step: int, groups: list[Group], num: int, metrics: MetricsLogger) -> None:
    """The messages, truncation and scores of the first `num` episodes; nothing when `num` is 0."""
    if num == 0:
        return
    path = run.samples(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(
        islice(
            (
                {"env": g.env.name, "messages": e.episode.messages, "truncated": e.truncated, **score}
                for g in groups
                for e, score in zip(g.episodes, g.scores, strict=True)
            ),
            num,
        )
    )
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    record_written(path)
    metrics.log_table(step, "samples", rows)
