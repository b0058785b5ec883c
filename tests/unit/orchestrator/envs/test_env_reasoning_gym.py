"""reasoning-gym tasks as environments: seeded and disjoint example streams, the task's own scorer on
the last <answer> tag, and one-line errors from `check_environment` for unknown tasks and bad args."""

import asyncio
import json
import random
import re
import subprocess
import sys
import tomllib
from itertools import islice
from pathlib import Path

import pytest

from lorarl.orchestrator.envs import check_environment, load_environment
from lorarl.orchestrator.envs.base import Environment, Episode, Example
from lorarl.orchestrator.envs.reasoning_gym_env import BLOCK
from tests.conftest import REPO

SMALL_LEGS = {"config": {"min_animals": 1, "max_animals": 2}}


def score(env: Environment, example: Example, completion: str) -> dict[str, float]:
    messages = [*env.prompt(example), {"role": "assistant", "content": completion}]
    return asyncio.run(env.score(Episode(example, messages)))


def questions(stream, n: int = 300) -> list[str]:
    return [example["entry"]["question"] for example in islice(stream, n)]


def test_examples_are_reproducible_for_a_seed_and_differ_across_seeds() -> None:
    env = load_environment("reasoning_gym:leg_counting")
    assert questions(env.examples(random.Random(7))) == questions(env.examples(random.Random(7)))
    assert questions(env.examples(random.Random(7)), 20) != questions(env.examples(random.Random(8)), 20)


def test_eval_examples_are_disjoint_from_training_ones_even_with_the_same_seed() -> None:
    env = load_environment("reasoning_gym:leg_counting")  # default config: billions of questions
    train = set(questions(env.examples(random.Random(0)), 3000))
    held_out = questions(env.eval_examples(random.Random(0)), 3000)
    assert len(train) == 3000 and not train & set(held_out)
    assert held_out == questions(env.eval_examples(random.Random(0)), 3000)  # the same held-out set each time


def test_training_and_eval_items_come_from_disjoint_generator_seed_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Items are generated from dataset seed + index, index < BLOCK: blocks of BLOCK seeds never overlap."""
    env = load_environment("reasoning_gym:basic_arithmetic")
    seeds: list[int] = []
    dataset = env.dataset
    monkeypatch.setattr(env, "dataset", lambda task, seed, size: seeds.append(seed) or dataset(task, seed, size))
    for parity, stream in enumerate([env.examples, env.eval_examples]):
        seeds.clear()
        for _ in islice(stream(random.Random(0)), 3 * BLOCK):
            pass
        assert len(seeds) == 3 and all(seed % BLOCK == 0 and seed // BLOCK % 2 == parity for seed in seeds)
        assert max(seeds) + BLOCK <= 2**32


@pytest.mark.parametrize(
    "env_id, args",
    [
        ("reasoning_gym:leg_counting", SMALL_LEGS),
        ("reasoning_gym:basic_arithmetic", {}),
        ("reasoning_gym:spell_backward", {}),
        ("reasoning_gym:word_sorting", {}),
        ("reasoning_gym:fraction_simplification", {}),
        ("reasoning_gym", {"tasks": ["gcd", "lcm", "chain_sum"]}),
    ],
)
def test_the_solution_scores_one_and_a_wrong_or_malformed_answer_less(env_id: str, args: dict) -> None:
    env = load_environment(env_id, args)
    for example in islice(env.examples(random.Random(1)), 30):
        solution = env.solution(example)
        assert score(env, example, f"Thinking...\n{solution}") == {
            "task_score": 1.0, "answer_format": 1.0, "reward": 1.0, "reward_errors": 0
        }  # fmt: skip
        assert score(env, example, "<answer>no idea</answer>")["reward"] < 1.0
        untagged = score(env, example, example["entry"]["answer"])  # right, but not in the tag
        assert untagged["reward"] == untagged["answer_format"] == 0.0


def test_the_last_answer_tag_counts() -> None:
    env = load_environment("reasoning_gym:leg_counting", SMALL_LEGS)
    example = next(env.examples(random.Random(0)))
    right = example["entry"]["answer"]
    assert score(env, example, f"<answer>{right}</answer> no, <answer>{right}1</answer>")["reward"] < 1.0
    assert score(env, example, f"<answer>0</answer> no, <answer> {right} </answer>")["reward"] == 1.0
    for malformed in ["", f"<answer>{right}", f"{right}</answer>", "<|im_end|>"]:
        assert score(env, example, malformed)["reward"] == 0.0, malformed


def test_the_prompt_is_the_system_prompt_then_the_question() -> None:
    env = load_environment("reasoning_gym:leg_counting", SMALL_LEGS | {"system_prompt": "Be brief."})
    example = next(env.examples(random.Random(0)))
    assert env.prompt(example) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": example["entry"]["question"]}
    ]  # fmt: skip
    bare = load_environment("reasoning_gym:leg_counting", SMALL_LEGS | {"system_prompt": ""})
    assert [m["role"] for m in bare.prompt(example)] == ["user"]
    default = load_environment("reasoning_gym:leg_counting", SMALL_LEGS).prompt(example)[0]["content"]
    assert "<answer>" in default  # reasoning-gym's own default asks for the tag


@pytest.mark.slow
def test_task_weights_of_a_mix_are_respected() -> None:
    env = load_environment("reasoning_gym", {"tasks": {"leg_counting": 1.0, "basic_arithmetic": 3.0}})
    assert env.name == "reasoning_gym"
    drawn = [example["task"] for example in islice(env.examples(random.Random(3)), 4000)]
    assert drawn.count("basic_arithmetic") / len(drawn) == pytest.approx(0.75, abs=0.03)  # 4.4 sigma


def test_a_mix_passes_each_task_its_config() -> None:
    five_terms = {"chain_sum": {"min_terms": 5, "max_terms": 5}}
    env = load_environment("reasoning_gym", {"tasks": ["leg_counting", "chain_sum"], "config": five_terms})
    for example in islice(env.examples(random.Random(0)), 50):
        if example["task"] == "chain_sum":
            assert example["entry"]["question"].count("+") + example["entry"]["question"].count("-") >= 4


def test_a_task_without_reference_answers_has_no_solution() -> None:
    env = load_environment("reasoning_gym:graph_color")
    with pytest.raises(NotImplementedError, match="'graph_color' has no reference answers"):
        env.solution(next(env.examples(random.Random(0))))


@pytest.mark.parametrize(
    "env_id, args, message",
    [
        ("reasoning_gym:leg_countin", {}, "unknown reasoning-gym task 'leg_countin' (did you mean leg_counting"),
        ("reasoning_gym:", {}, "unknown reasoning-gym task ''"),
        ("reasoning_gym:composite", {}, "task 'composite': mix tasks with id = 'reasoning_gym'"),
        ("reasoning_gym:leg_counting", {"nope": 1}, "unexpected args ['nope']; leg_counting takes"),
        ("reasoning_gym:leg_counting", {"config": {"legs": 2}}, "task 'leg_counting': config has no ['legs']"),
        ("reasoning_gym:leg_counting", {"config": {"max_animals": 0}}, "task 'leg_counting': bad config"),
        ("reasoning_gym:leg_counting", {"config": {"seed": 1}}, "task 'leg_counting': ['seed'] are set by lorarl"),
        ("reasoning_gym:leg_counting", {"config": 3}, "task 'leg_counting': config must be a table"),
        ("reasoning_gym:leg_counting", {"system_prompt": 1}, "system_prompt must be a string"),
        ("reasoning_gym", {}, "reasoning_gym needs args.tasks"),
        ("reasoning_gym", {"tasks": {}}, "tasks must be a non-empty table"),
        ("reasoning_gym", {"tasks": {"gcd": 0}}, "task 'gcd': weight must be a positive number"),
        ("reasoning_gym", {"tasks": {"gcd": 1, "lcmm": 1}}, "unknown reasoning-gym task 'lcmm'"),
        ("reasoning_gym", {"tasks": ["gcd"], "config": {"lcm": {}}}, "config for ['lcm'], which are not in tasks"),
        ("reasoning_gym", {"tasks": ["gcd"], "config": {"gcd": {"min_value": -5}}}, "task 'gcd': bad config"),
    ],
)
def test_unknown_tasks_and_bad_args_are_one_line_errors(env_id: str, args: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError)) as error:
        check_environment(env_id, args)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_check_environment_generates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import reasoning_gym

    def refuse(*args, **kwargs):
        raise AssertionError("check_environment built a dataset")

    monkeypatch.setattr(reasoning_gym, "create_dataset", refuse)
    check_environment("reasoning_gym", {"tasks": {"leg_counting": 1, "gcd": 2}, "config": {"gcd": {"max_value": 50}}})


def test_the_docs_examples_pass_the_check() -> None:
    page = (REPO / "docs" / "environments.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", page, re.DOTALL) if "reasoning_gym" in b]
    envs = [env for block in blocks for env in tomllib.loads(block)["orchestrator"]["env"]]
    assert len(envs) == 2
    for env in envs:
        check_environment(env["id"], env["args"])


@pytest.mark.slow
def test_make_sft_data_writes_solutions(tmp_path: Path) -> None:
    out = tmp_path / "legs.jsonl"
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", "reasoning_gym:leg_counting",
           "--args", json.dumps(SMALL_LEGS), "--num", "5", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5
    assert all(re.fullmatch(r"<answer>\d+</answer>", r["messages"][-1]["content"]) for r in records)
