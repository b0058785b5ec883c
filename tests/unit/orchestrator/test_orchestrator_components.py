"""The orchestrator's helpers on hand-made groups: rollout conversion, batch metrics, samples and
its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorarl.config.run import MonitorConfig
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.batch_metrics import StepCounters, batch_metrics
from lorarl.orchestrator.checkpoint import SamplerCheckpoints
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Episode
from lorarl.orchestrator.episodes import PlayedEpisode, Sample
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.rollout_conversion import to_rollouts
from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.orchestrator.samples import write_samples
from lorarl.run_folder import RunFolder


class Named(Environment):
    def __init__(self, name: str) -> None:
        self.name = name


def played(answer: str, model_tokens: int, samples: int = 1, truncated: bool = False) -> PlayedEpisode:
    episode = Episode({}, [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}])
    return PlayedEpisode(episode, [Sample([1, 2], [3] * model_tokens) for _ in range(samples)], model_tokens, truncated)


def group(env: str, version: int, rewards: list[float]) -> Group:
    episodes = [played(f"a{i}", model_tokens=10 * (i + 1)) for i in range(len(rewards))]
    mean = sum(rewards) / len(rewards)
    return Group(Named(env), version, episodes, [{"reward": r, "reward_errors": 0} for r in rewards],
                 [r - mean for r in rewards])  # fmt: skip


def test_rollouts_carry_their_groups_advantages_version_and_scores() -> None:
    g = group("a", 3, [1.0, 0.0])
    g.episodes[1] = played("two samples", model_tokens=4, samples=2)  # a multi-turn episode split in two
    rollouts = to_rollouts([g, group("b", 2, [0.5, 0.5])], temperature=0.7)
    assert [r.advantage for r in rollouts] == [0.5, -0.5, -0.5, 0.0, 0.0]
    assert [r.env for r in rollouts] == ["a", "a", "a", "b", "b"]
    assert [r.policy_version for r in rollouts] == [3, 3, 3, 2, 2]
    assert {r.temperature for r in rollouts} == {0.7}
    assert rollouts[0].metrics == {"reward": 1.0, "reward_errors": 0}


def test_batch_metrics_lag_is_measured_against_the_step_trained() -> None:
    m = batch_metrics([group("a", 3, [1.0, 0.0]), group("b", 1, [0.5, 0.5])], step=5)
    assert m["policy_version"] == 1
    assert m["policy_lag/mean"] == 2.0 and m["policy_lag/max"] == 3  # policy_lag(5, v) = 4 - v
    assert m["reward/mean"] == 0.5 and m["completion_len/max"] == 20
    assert m["env/a/reward"] == 0.5 and m["env/b/reward"] == 0.5


def test_batch_metrics_average_each_key_over_the_episodes_that_have_it() -> None:
    g = group("a", 3, [1.0, 0.0, 0.5])
    g.scores[1]["tool_calls"] = 2.0  # e.g. a metric another library's environment logs now and then
    g.scores[2]["tool_calls"] = 4.0
    m = batch_metrics([g], step=4)
    assert m["env/a/tool_calls"] == 3.0 and m["env/a/reward"] == 0.5


def test_step_counters_become_the_steps_metrics() -> None:
    counters = StepCounters(
        started=10.0, busy_at_start=4.0, outages_at_start=1, dropped_groups=2, waited_for_policy=1.5
    )
    m = counters.metrics(
        14.0, 8.0, workers=2, rollouts_per_example=3, groups_in_flight=5, completion_tokens=100, outages=3
    )
    assert m == {
        "dropped/groups": 2,
        "dropped/rollouts": 6,
        "time/wait_for_policy": 1.5,
        "time/step": 4.0,
        "inference/busy_frac": 0.5,  # 4 busy seconds out of 4 s on each of 2 workers
        "inference/groups_in_flight": 5,
        "inference/outages": 2,  # workers taken out of routing during the step
        "tokens_per_s": 25.0,
    }


def test_samples_are_the_first_episodes_of_the_batch(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    groups = [group("a", 0, [1.0, 0.0]), group("b", 0, [0.5])]
    metrics = MetricsLogger(run.metrics, "orchestrator", MonitorConfig(), "r")  # no wandb: no table
    write_samples(run, 2, groups, num=3, metrics=metrics)
    rows = [json.loads(line) for line in run.samples(2).read_text().splitlines()]
    assert [(r["env"], r["messages"][-1]["content"], r["reward"]) for r in rows] == [
        ("a", "a0", 1.0), ("a", "a1", 0.0), ("b", "a0", 0.5)
    ]  # fmt: skip
    write_samples(run, 3, groups, num=0, metrics=metrics)
    assert not run.samples(3).exists()


@pytest.mark.parametrize("interval", [2, None])
def test_a_checkpoint_holds_the_sampler_once_its_steps_groups_were_drawn(tmp_path: Path, interval: int | None) -> None:
    def sampler() -> ExampleSampler:
        return ExampleSampler([load_environment("reverse_text")], [1.0], seed=3)

    run, drawing = RunFolder(tmp_path), sampler()
    checkpoints = SamplerCheckpoints(run, drawing, interval)
    for step in (1, 2):
        drawing.draw()
        checkpoints.step_drawn(step)
    expected = [drawing.draw()[1] for _ in range(3)]  # drawn for step 3 before batch 2 is written
    for step in (1, 2):
        checkpoints.save(step)
    assert not run.orchestrator_checkpoint(1).exists()
    if interval is None:
        assert not run.orchestrator_checkpoint(2).exists()
        return
    resumed = sampler()
    SamplerCheckpoints(run, resumed, interval).restore(2)
    assert [resumed.draw()[1] for _ in range(3)] == expected
