"""The orchestrator's filters end to end with the stand-in pool and trainer of test_orchestrator_loop.py:
zero-advantage groups left out, extra groups drawn to fill a batch (within its bound and the launch
bound), the difficulty filter, and an exact resume with both."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lorarl.rollouts import RolloutBatch, policy_lag
from lorarl.run_folder import RunFolder
from tests.unit.orchestrator.test_orchestrator_loop import TOKENIZER, config, run_orchestrator

SCRIPTED = "tests.unit.orchestrator.scripted_env:Scripted"
NAME = re.compile(r"(?:easy|hard|mixed)-\d+")


def scripted(tmp_path: Path, kinds: tuple[str, ...] = ("easy", "hard", "mixed"), top: dict | None = None,
             **orchestrator: Any):  # fmt: skip
    """4 groups of 2 per step, every episode in samples/ (to see the groups left out of the batch too)."""
    env = [{"id": SCRIPTED, "args": {"kinds": list(kinds)}}]
    return config(tmp_path, top, env=env, batch_size=8, num_samples_to_log=1000, **orchestrator)


def batch_names(run: RunFolder, step: int) -> list[str]:
    """The example of each rollout the trainer gets at `step`."""
    rollouts = RolloutBatch.read(run.rollouts(step), step).rollouts
    return sorted(NAME.findall(TOKENIZER.decode(r.prompt_ids))[0] for r in rollouts)


def played_names(run: RunFolder, step: int) -> list[str]:
    """The example of each episode played for `step` (every group: samples/ logs them all here)."""
    rows = [json.loads(line) for line in run.samples(step).read_text().splitlines()]
    return sorted(row["messages"][0]["content"] for row in rows)


def orchestrator_rows(metrics: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in metrics if r["component"] == "orchestrator"}


@pytest.mark.parametrize("skip", [True, False])
def test_zero_advantage_groups_are_left_out_of_the_batch_and_counted(tmp_path: Path, skip: bool) -> None:
    run, metrics = run_orchestrator(scripted(tmp_path, skip_zero_advantage=skip))
    rows = orchestrator_rows(metrics)
    for step in range(1, 5):
        played = played_names(run, step)
        assert len(played) == 8  # 4 groups of 2, all in the metrics and samples
        zero = sum(not name.startswith("mixed") for name in played) // 2
        row = rows[step]
        assert row["groups/zero_advantage"] == zero
        trained = [n for n in played if n.startswith("mixed")] if skip else played
        assert batch_names(run, step) == trained
        assert row["rollouts/trained"] == len(trained) and row["rollouts/skipped"] == 8 - len(trained)
        assert row["groups/extra_drawn"] == 0 and row["fill/bound_hit"] == 0
        # Of every group played, trained on or not: easy episodes score 1, mixed ones half the time.
        kinds = Counter(name.split("-")[0] for name in played)
        assert row["reward/mean"] == (kinds["easy"] + kinds["mixed"] / 2) / 8
    assert sum(rows[s]["groups/zero_advantage"] for s in rows) > 0  # the seed draws some easy and hard ones


def test_a_step_whose_groups_all_have_zero_advantage_gets_an_empty_batch(tmp_path: Path) -> None:
    run, metrics = run_orchestrator(scripted(tmp_path, kinds=("easy",)))
    for step, row in orchestrator_rows(metrics).items():
        assert RolloutBatch.read(run.rollouts(step), step).rollouts == []
        assert row["groups/zero_advantage"] == 4 and row["rollouts/skipped"] == 8 and row["reward/mean"] == 1.0


@pytest.mark.parametrize("level", [0, 1])
def test_fill_informative_draws_extra_groups_until_the_batch_is_full(tmp_path: Path, level: int) -> None:
    cfg = scripted(tmp_path, fill_informative=True, fill_max_draw_factor=10, max_async_level=level)
    run, metrics = run_orchestrator(cfg)
    rows = orchestrator_rows(metrics)
    for step in range(1, 5):
        row, played = rows[step], played_names(run, step)
        assert len(played) == 2 * (4 + row["groups/extra_drawn"])  # the extra groups belong to the step
        assert row["groups/zero_advantage"] == 4 + row["groups/extra_drawn"] - 4
        assert row["fill/bound_hit"] == 0
        assert batch_names(run, step) == [n for n in played if n.startswith("mixed")]
        assert len(batch_names(run, step)) == 8  # batch_size rollouts, all informative
        lags = [policy_lag(step, r.policy_version) for r in RolloutBatch.read(run.rollouts(step), step).rollouts]
        assert min(lags) >= 0 and max(lags) <= level
    assert sum(r["groups/extra_drawn"] for r in rows.values()) > 0


def test_fill_informative_stops_at_its_bound(tmp_path: Path) -> None:
    """A task the policy always fails: each step draws fill_max_draw_factor times its groups, no more,
    and the batch goes out empty."""
    run, metrics = run_orchestrator(
        scripted(tmp_path, kinds=("hard",), fill_informative=True, fill_max_draw_factor=2.5)
    )
    for step, row in orchestrator_rows(metrics).items():
        assert row["groups/extra_drawn"] == 6 and row["groups/zero_advantage"] == 10  # int(1.5 * 4) extra
        assert row["fill/bound_hit"] == 1 and RolloutBatch.read(run.rollouts(step), step).rollouts == []


@pytest.mark.parametrize("level", [0, 1])
def test_the_difficulty_filter_stops_drawing_examples_always_solved_or_failed(tmp_path: Path, level: int) -> None:
    """window 1: once an example's latest attempt (in a batch the draw is sure to follow, step - 1 -
    max_async_level or older) was all solved or all failed, it is not drawn again."""
    cfg = scripted(tmp_path, top={"max_steps": 6}, max_async_level=level, difficulty_filter={"window": 1})
    run, metrics = run_orchestrator(cfg)
    rows = orchestrator_rows(metrics)
    latest: dict[str, list[tuple[int, float]]] = {}  # example -> [(step, pass rate)]
    for step in range(1, 7):
        rows_of_step = [json.loads(line) for line in run.samples(step).read_text().splitlines()]
        rates: dict[str, list[float]] = {}
        for row in rows_of_step:
            rates.setdefault(row["messages"][0]["content"], []).append(row["reward"])
        for name in rates:
            seen = [rate for s, rate in latest.get(name, []) if s <= step - 1 - level]
            assert not seen or 0.0 < seen[-1] < 1.0, (step, name, seen)
        for name, r in rates.items():
            latest.setdefault(name, []).append((step, sum(r) / len(r)))
    skipped = sum(rows[s]["difficulty/skipped_easy"] + rows[s]["difficulty/skipped_hard"] for s in rows)
    assert skipped > 0 and all(rows[s]["difficulty/forced"] == 0 for s in rows)
    assert rows[6]["groups/zero_advantage"] == 0  # only the mixed examples are left
    assert rows[6]["difficulty/remembered"] == 9  # 3 kinds x 3


def test_a_resumed_run_draws_what_the_uninterrupted_one_drew(tmp_path: Path) -> None:
    """With extra groups (their own stream) and the difficulty memory, both in the checkpoint."""

    def run_to(name: str, max_steps: int, resume: bool = False) -> RunFolder:
        top = {"run_name": name, "max_steps": max_steps, "trainer": {"ckpt": {"interval": 2}}}
        top |= {"resume": {}} if resume else {}
        cfg = scripted(tmp_path, top=top, max_async_level=1, fill_informative=True,
                       difficulty_filter={"window": 1, "min_pass": None})  # fmt: skip
        return run_orchestrator(cfg)[0]

    straight = run_to("straight", 4)
    run_to("stopped", 2)
    state = json.loads((RunFolder(tmp_path / "stopped").orchestrator_checkpoint(2) / "state.json").read_text())
    assert {"rng", "drawn", "extra_sampler", "difficulty"} <= state.keys()
    resumed = run_to("stopped", 4, resume=True)
    for step in (3, 4):
        assert played_names(resumed, step) == played_names(straight, step)
        assert batch_names(resumed, step) == batch_names(straight, step)
    extra: dict[str, Counter[int]] = {run: Counter() for run in ("straight", "stopped")}
    for run in extra:
        for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["component"] == "orchestrator":
                extra[run][row["step"]] = row["groups/extra_drawn"]
    assert extra["stopped"] == extra["straight"] and sum(extra["straight"].values()) > 0
