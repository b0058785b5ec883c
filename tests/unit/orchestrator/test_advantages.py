"""Advantage estimators, the overlong remedies, the advantage stage that combines them, and the
difficulty memory, on plain numbers and hand-made groups."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import TypeAdapter, ValidationError

import lorarl
from lorarl.config.algorithms import AdvantageBase, AdvantageConfig, CustomAdvantage
from lorarl.config.orchestrator import DifficultyFilterConfig, OrchestratorConfig, OverlongConfig
from lorarl.orchestrator.advantages import GroupAdvantages, advantage_estimator, dr_grpo
from lorarl.orchestrator.difficulty import DifficultyFilter, example_key
from lorarl.orchestrator.envs.base import Environment, Episode
from lorarl.orchestrator.episodes import PlayedEpisode, Sample
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.overlong import overlong_metrics, overlong_penalty
from lorarl.plugins import ArgsError, PluginError


def played(answer: str = "a", turn_tokens: tuple[int, ...] = (4,), truncated: bool = False) -> PlayedEpisode:
    episode = Episode({"q": 1}, [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}])
    return PlayedEpisode(episode, [Sample([1])], sum(turn_tokens), truncated, list(turn_tokens))


def group(rewards: list[float], episodes: list[PlayedEpisode] | None = None, name: str = "env") -> Group:
    env = Environment()
    env.name = name
    episodes = episodes or [played() for _ in rewards]
    return Group(env, 0, episodes, [{"reward": r, "reward_errors": 0} for r in rewards])


ADVANTAGE: TypeAdapter[AdvantageBase] = TypeAdapter(AdvantageConfig)


def estimate(rewards: list[float], **cfg: object) -> list[float]:
    section = ADVANTAGE.validate_python({"type": "grpo", **cfg})
    return advantage_estimator(section)(rewards, [played() for _ in rewards])


def section(**given: object) -> AdvantageBase:
    """[orchestrator.advantage] as a config file gives it, old keys included."""
    return OrchestratorConfig(advantage=given).advantage


def users(fn: str, **args: object) -> CustomAdvantage:
    return CustomAdvantage(fn=fn if ":" in fn else f"tests.unit.orchestrator.test_advantages:{fn}", args=args)


def test_grpo_dr_grpo_and_rloo() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0]
    mean, std = 0.6, math.sqrt(0.24)
    assert estimate(rewards) == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards])
    assert estimate(rewards, type="dr_grpo") == pytest.approx([0.4, -0.6, -0.6, 0.4, 0.4])
    # RLOO: each reward against the mean of the other four.
    assert estimate(rewards, type="rloo") == pytest.approx([1 - 2 / 4, 0 - 3 / 4, 0 - 3 / 4, 1 - 2 / 4, 1 - 2 / 4])
    assert estimate([0.7], type="rloo") == [0.0]  # a group of one has nothing to compare with


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_a_tied_group_gets_exactly_zero_advantages(estimator: str) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: a computed mean would leave crumbs of 1e-17.
    assert estimate([0.1, 0.1, 0.1], type=estimator) == [0.0, 0.0, 0.0]
    assert dr_grpo([0.1] * 7) == [0.0] * 7


def test_grpo_takes_its_eps() -> None:
    assert estimate([1.0, 0.0], eps=1.0) == pytest.approx([0.5 / 1.5, -0.5 / 1.5])
    with pytest.raises(ValidationError, match="eps"):
        estimate([1.0, 0.0], type="rloo", eps=1.0)  # a key of another type: unknown here


def test_the_old_keys_still_pick_a_type_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert section(std_normalize=False).type == "dr_grpo"
    assert section(std_normalize=True).type == "grpo"
    assert section(estimator="dr_grpo", std_normalize=False).type == "dr_grpo"
    assert section(estimator="rloo").type == "rloo"
    assert section(fn="m:f") == CustomAdvantage(fn="m:f")
    assert section(estimator="grpo", fn="m:f") == CustomAdvantage(fn="m:f")
    for bad in ({"estimator": "rloo", "std_normalize": False}, {"estimator": "dr_grpo", "std_normalize": True},
                {"fn": "m:f", "std_normalize": True}):  # fmt: skip
        with pytest.raises(ValidationError, match="std_normalize = .* does not go with"):
            section(**bad)
    with pytest.raises(ValidationError, match="fn replaces the estimator"):
        section(estimator="rloo", fn="m:f")
    with pytest.raises(ValidationError, match="chooses type 'rloo', but type = 'grpo'"):
        section(estimator="rloo", type="grpo")
    # One line per old key, naming the new spelling (each once per process: other tests may have said it).
    for line in capsys.readouterr().err.splitlines():
        assert line.startswith("warning: orchestrator.advantage.") and "write orchestrator.advantage.type" in line


def test_a_users_estimator_gets_the_rewards_and_if_it_wants_them_the_episodes() -> None:
    by_length = advantage_estimator(users("tests.unit.orchestrator.scripted_env:by_answer_length"))
    assert by_length([0.0, 0.0], [played("x" * 13), played("x" * 15)]) == [0.0, 2.0]
    centered = advantage_estimator(users("centered"))
    assert centered([1.0, 3.0], []) == [-1.0, 1.0]
    scaled = advantage_estimator(users("scaled", scale="2.5"))  # args converted to the annotated types
    assert scaled([1.0, 3.0], [played(), played()]) == [-2.5, 2.5]


@lorarl.plugin("advantage")
def scaled(rewards: list[float], episodes: list[PlayedEpisode], *, scale: float) -> list[float]:
    """An estimator with an argument of its own from the config (args)."""
    return [scale * a for a in centered(rewards)]


@lorarl.plugin("advantage")
def centered(rewards: list[float]) -> list[float]:
    """An `advantage.fn` that takes the rewards alone."""
    return [r - sum(rewards) / len(rewards) for r in rewards]


@lorarl.plugin("advantage")
def wrong_length(rewards: list[float]) -> list[float]:
    return [0.0]


@lorarl.plugin("advantage")
def not_finite(rewards: list[float]) -> list[float]:
    return [math.nan] * len(rewards)


def test_a_users_estimator_is_checked() -> None:
    for spec in ("mypkg.mod", "mypkg.mod:", "a b:c", ":f", "mod:f.g"):
        with pytest.raises(ValidationError, match="package.module:function"):
            CustomAdvantage(fn=spec)
    with pytest.raises(PluginError, match="orchestrator.advantage.fn 'no_such_module:f': No module named"):
        advantage_estimator(users("no_such_module:f"))
    with pytest.raises(PluginError, match="has no attribute 'nope'"):
        advantage_estimator(users("nope"))
    with pytest.raises(ArgsError, match="args do not fit centered: got an unexpected keyword argument 'scale'"):
        advantage_estimator(users("centered", scale=2))
    for fn in ("wrong_length", "not_finite"):
        estimator = advantage_estimator(users(fn))
        with pytest.raises(ValueError, match="give one finite advantage per reward"):
            estimator([1.0, 0.0], [])


def test_the_overlong_penalty_grows_linearly_over_the_buffer() -> None:
    cfg = OverlongConfig(buffer=4, penalty=0.5)  # max_tokens 10: the buffer is tokens 7..10
    assert [overlong_penalty(played(turn_tokens=(n,)), cfg, 10) for n in (3, 6, 7, 8, 10)] == [0, 0, 0.125, 0.25, 0.5]
    assert overlong_penalty(played(turn_tokens=(5,), truncated=True), cfg, 10) == 0.5  # cut short by seq_len
    # Multi-turn: each turn has max_tokens of its own; the longest one counts.
    assert overlong_penalty(played(turn_tokens=(6, 8, 2)), cfg, 10) == 0.25
    assert overlong_penalty(played(turn_tokens=(10,), truncated=True), OverlongConfig(), 10) == 0.0  # no buffer


def test_the_advantage_stage_shapes_the_rewards_then_masks_truncated_episodes() -> None:
    episodes = [played(turn_tokens=(2,)), played(turn_tokens=(8,)), played(turn_tokens=(10,), truncated=True)]
    cfg = OrchestratorConfig(sampling={"max_tokens": 10}, advantage={"type": "dr_grpo"},
                             overlong={"buffer": 4, "penalty": 1.0, "mask_truncated": True})  # fmt: skip
    g = GroupAdvantages(cfg)(group([1.0, 1.0, 1.0], episodes))
    # Shaped rewards 1, 0.5, 0 (mean 0.5): 0.5, 0, -0.5; the truncated one masked.
    assert g.advantages == [0.5, 0.0, 0.0] and not g.zero_advantage
    assert [s["overlong_penalty"] for s in g.scores] == [0.0, 0.5, 1.0]
    assert [s["reward"] for s in g.scores] == [1.0, 1.0, 1.0]  # the environment's, for the metrics
    assert overlong_metrics([g], cfg.overlong) == {"overlong/masked": 1}
    plain = GroupAdvantages(OrchestratorConfig())(group([1.0, 1.0], [played(), played(truncated=True)]))
    assert plain.advantages == [0.0, 0.0] and plain.zero_advantage and "overlong_penalty" not in plain.scores[0]
    assert overlong_metrics([plain], OverlongConfig()) == {}
    masked_only = OrchestratorConfig(overlong={"mask_truncated": True})
    assert GroupAdvantages(masked_only)(group([1.0, 0.0], [played(), played(truncated=True)])).advantages[1] == 0.0


def test_overlong_and_fill_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="longer than sampling.max_tokens"):
        OrchestratorConfig(sampling={"max_tokens": 8}, overlong={"buffer": 9})
    with pytest.raises(ValidationError, match="set skip_zero_advantage = true too"):
        OrchestratorConfig(fill_informative=True, skip_zero_advantage=False)
    with pytest.raises(ValidationError, match="must be below max_pass"):
        DifficultyFilterConfig(min_pass=0.5, max_pass=0.5)


def memory_group(name: str, rewards: list[float]) -> Group:
    g = group(rewards)
    for e in g.episodes:
        e.episode.example = {"name": name}
    return g


def test_the_difficulty_memory_answers_as_of_the_batches_a_draw_is_sure_to_follow() -> None:
    memory = DifficultyFilter(DifficultyFilterConfig(window=2), max_async_level=1)
    memory.record(1, [memory_group("a", [1.0, 1.0]), memory_group("b", [0.0, 0.0]), memory_group("c", [1.0, 0.0])])
    memory.record(2, [memory_group("a", [1.0, 1.0]), memory_group("b", [0.0, 0.0]), memory_group("c", [1.0, 1.0])])
    verdict = lambda name, step: memory.verdict("env", {"name": name}, step)  # noqa: E731
    # A draw for step 3 reads batches up to 3 - 1 - 1 = 1: one attempt each, fewer than the window.
    assert [verdict(n, 3) for n in "abc"] == [None, None, None]
    # For step 4, batches 1 and 2: a solved twice, b failed twice, c mixed once.
    assert [verdict(n, 4) for n in "abcd"] == ["easy", "hard", None, None]
    assert (
        DifficultyFilter(DifficultyFilterConfig(window=2, max_pass=None, min_pass=None), 0).verdict(
            "env", {"name": "a"}, 4
        )
        is None
    )


def test_the_difficulty_memory_forgets_what_no_draw_reads_and_round_trips() -> None:
    memory = DifficultyFilter(DifficultyFilterConfig(window=1, capacity=2), max_async_level=0)
    for step in range(1, 5):
        memory.record(step, [memory_group("a", [float(step % 2)] * 2)])
    assert memory.attempts[example_key("env", {"name": "a"})] == [(4, 0.0)]  # every later draw reads batch 4
    memory.record(5, [memory_group("b", [1.0]), memory_group("c", [1.0])])
    assert len(memory.attempts) == 2 and example_key("env", {"name": "a"}) not in memory.attempts  # capacity
    copy = DifficultyFilter(DifficultyFilterConfig(window=1, capacity=2), max_async_level=0)
    copy.load_state_dict(json.loads(json.dumps(memory.state_dict())))
    assert copy.attempts == memory.attempts


def test_an_example_is_known_by_its_environment_and_json() -> None:
    assert example_key("e", {"a": 1, "b": [2]}) == example_key("e", {"b": [2], "a": 1})
    assert example_key("e", {"a": 1}) != example_key("f", {"a": 1}) != example_key("e", {"a": 2})
