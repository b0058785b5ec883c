"""Warm-up data (scripts/make_sft_data.py) of a multi-turn environment is a whole correct episode:
each reference turn followed by the environment's own reply, which the environment scores 1. A tool
environment's records also carry its tool schemas ("tools"), for `sft` to show the model as `rl` does."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.alphabet_sort import expected_turns
from lorarl.orchestrator.envs.base import Episode
from lorarl.orchestrator.envs.calculator import calculate
from lorarl.orchestrator.envs.search_docs import DOCUMENTS
from tests.conftest import REPO
from tests.unit.orchestrator.envs.env_play import play_and_score

ARGS = {"min_turns": 3, "max_turns": 3, "min_names_per_turn": 1, "max_names_per_turn": 2}


def make_data(out: Path, env: str, args: dict[str, Any], num: int = 4, *flags: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", env, "--args", json.dumps(args),
           "--num", str(num), "--out", str(out), *flags]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_alphabet_sort_warmup_episodes_are_correct_and_whole(tmp_path: Path) -> None:
    env = load_environment("alphabet_sort", ARGS)
    for record in make_data(tmp_path / "alphabet.jsonl", "alphabet_sort", ARGS):
        messages = record["messages"]
        assert "tools" not in record
        assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 3]
        # Rebuilt from what the record tells the model (the sort key, the names of each turn), the
        # episode scores full marks.
        sort_by = "first" if "by FIRST name" in messages[0]["content"] else "last"
        turns = [m["content"].splitlines() for m in messages if m["role"] == "user"]
        example = {"expected": expected_turns(sort_by, turns)}
        scores = asyncio.run(env.score(Episode(example, messages)))
        assert scores["turn_similarity"] == 1.0 and scores["all_turns_exact"] == 1.0


def calculator_example(question: str) -> dict[str, Any]:
    expression = question.removesuffix(" = ?")
    return {"expression": expression, "answer": calculate(expression)}


def search_example(question: str) -> dict[str, Any]:
    (doc,) = (d for d in DOCUMENTS if d.question == question)
    return {"question": question, "answer": doc.answer}


@pytest.mark.parametrize(
    "env_id, args, rebuild, reward",
    [
        ("calculator", {"terms": 2, "max_value": 999}, calculator_example, "correct"),
        ("search", {"max_turns": 3, "top_k": 2}, search_example, "answer_match"),
    ],
)
@pytest.mark.slow
def test_tool_warmup_episodes_are_whole_tool_episodes_with_their_schemas(
    tmp_path: Path, env_id: str, args: dict[str, Any], rebuild: Any, reward: str
) -> None:
    env = load_environment(env_id, args)
    for record in make_data(tmp_path / f"{env_id}.jsonl", env_id, args):
        messages = record["messages"]
        assert record["tools"] == env.tool_schemas()
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        # Rebuilt from the question the record asks, the answer is right...
        example = rebuild(messages[1]["content"])
        assert asyncio.run(env.score(Episode(example, messages)))[reward] == 1.0
        # ... and the model turns, played through the environment, give back the record's tool
        # results exactly and full marks, the tool used well-formed.
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        episode, scores = play_and_score(env, example, turns)
        assert episode.messages == messages
        assert scores["reward"] == 1.0 and scores["used_tools"] == 1.0 and scores["tool_malformed"] == 0.0


@pytest.mark.slow
def test_guessing_warmup_records_answer_at_once_with_another_questions_answer(tmp_path: Path) -> None:
    """--guess-frac: that share of the records answer without a tool call, with another document's
    answer (wrong, so reward 0, unless it drew its own); the rest stay whole correct episodes."""
    args = {"max_turns": 3, "top_k": 2}
    env = load_environment("search", args)
    records = make_data(tmp_path / "search.jsonl", "search", args, 400, "--guess-frac", "0.3")
    guesses = [r for r in records if len(r["messages"]) == 3]
    assert 0.2 < len(guesses) / len(records) < 0.4
    answers = {d.answer for d in DOCUMENTS}
    wrong = 0
    for record in guesses:
        assert record["tools"] == env.tool_schemas()
        system, question, guess = record["messages"]
        assert [system["role"], question["role"], guess["role"]] == ["system", "user", "assistant"]
        example = search_example(question["content"])
        assert guess["content"].removeprefix("<answer>").removesuffix("</answer>") in answers
        scores = asyncio.run(env.score(Episode(example, record["messages"])))
        right = guess["content"] == f"<answer>{example['answer']}</answer>"
        assert scores["used_tools"] == 0.0 and scores["answer_match"] == float(right)
        wrong += not right
    assert wrong > 0.8 * len(guesses)  # drawn from all the questions, a guess is rarely its own answer
    assert all(len(r["messages"]) == 5 for r in records if r not in guesses)


@pytest.mark.slow
def test_no_tools_records_are_the_same_episodes_without_the_schemas(tmp_path: Path) -> None:
    """--no-tools (calculator's first warm-up stage): the same episodes, and no "tools", so the chat
    template renders them without its tools block."""
    args = {"terms": 2, "max_value": 999}
    with_tools = make_data(tmp_path / "with.jsonl", "calculator", args, 8)
    without = make_data(tmp_path / "without.jsonl", "calculator", args, 8, "--no-tools")
    assert [r["messages"] for r in without] == [r["messages"] for r in with_tools]
    assert all("tools" in r for r in with_tools) and not any("tools" in r for r in without)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--guess-frac", "0.3"], ["--no-tools"]], ids=lambda f: f[0])
def test_tool_flags_need_an_environment_with_tools(tmp_path: Path, flags: list[str]) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", "reverse_text", *flags,
           "--out", str(tmp_path / "r.jsonl")]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{flags[0]} is for environments with tools; reverse_text has none" in result.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_an_environment_without_solutions_is_one_line(tmp_path: Path) -> None:
    env = "tests.unit.orchestrator.scripted_env:Scripted"  # a custom environment, from the repo root
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", env, "--num", "2",
           "--out", str(tmp_path / "s.jsonl")]  # fmt: skip
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": pythonpath})
    assert result.returncode == 2
    assert "scripted has no reference solutions" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "s.jsonl").exists()
