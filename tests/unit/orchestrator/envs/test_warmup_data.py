"""Warm-up data (scripts/make_sft_data.py) of a multi-turn environment is a whole correct episode:
each reference turn followed by the environment's own reply, which the environment scores 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.alphabet_sort import expected_turns
from lorarl.orchestrator.envs.base import Episode
from tests.conftest import REPO

ARGS = {"min_turns": 3, "max_turns": 3, "min_names_per_turn": 1, "max_names_per_turn": 2}


def test_alphabet_sort_warmup_episodes_are_correct_and_whole(tmp_path: Path) -> None:
    out = tmp_path / "alphabet.jsonl"
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", "alphabet_sort",
           "--args", json.dumps(ARGS), "--num", "4", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    env = load_environment("alphabet_sort", ARGS)
    for line in out.read_text().splitlines():
        messages = json.loads(line)["messages"]
        assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 3]
        # Rebuilt from what the record tells the model (the sort key, the names of each turn), the
        # episode scores full marks.
        sort_by = "first" if "by FIRST name" in messages[0]["content"] else "last"
        turns = [m["content"].splitlines() for m in messages if m["role"] == "user"]
        example = {"expected": expected_turns(sort_by, turns)}
        scores = asyncio.run(env.score(Episode(example, messages)))
        assert scores["turn_similarity"] == 1.0 and scores["all_turns_exact"] == 1.0


def test_an_environment_without_solutions_is_one_line(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "make_sft_data.py"), "--env", "search", "--num", "2",
           "--out", str(tmp_path / "s.jsonl")]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2
    assert "search has no reference solutions" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "s.jsonl").exists()
