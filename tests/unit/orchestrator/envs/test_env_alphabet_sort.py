import asyncio
import random

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.alphabet_sort import FIRST_NAMES, LAST_NAMES, AlphabetSort, expected_turns
from lorarl.orchestrator.envs.base import Episode
from tests.unit.orchestrator.envs.env_play import play_by_hand

TURNS = [["Zoe Adler", "Ada Young"], ["Milo Baker"]]
BY_LAST = {"sort_by": "last", "turns": TURNS, "expected": expected_turns("last", TURNS)}
RIGHT = ["Zoe Adler // new name!\nAda Young // new name!", "Zoe Adler\nMilo Baker // new name!\nAda Young"]


def score(answers: list[str], example: dict = BY_LAST) -> dict[str, float]:
    env = AlphabetSort()
    return asyncio.run(env.score(play_by_hand(env, example, answers)))


def test_expected_lists_are_cumulative_sorted_and_mark_this_turns_names() -> None:
    assert BY_LAST["expected"] == RIGHT
    assert expected_turns("first", TURNS) == [
        "Ada Young // new name!\nZoe Adler // new name!",
        "Ada Young\nMilo Baker // new name!\nZoe Adler",
    ]


def test_env_response_feeds_names_turn_by_turn_then_ends() -> None:
    env = AlphabetSort()
    assert env.prompt(BY_LAST)[-1] == {"role": "user", "content": "Zoe Adler\nAda Young"}
    assert "sorted by LAST name" in env.prompt(BY_LAST)[0]["content"]
    episode = Episode(BY_LAST, [*env.prompt(BY_LAST), {"role": "assistant", "content": RIGHT[0]}])
    assert env.env_response(episode) == [{"role": "user", "content": "Milo Baker"}]
    episode.messages += [{"role": "user", "content": "Milo Baker"}, {"role": "assistant", "content": RIGHT[1]}]
    assert env.env_response(episode) is None
    assert play_by_hand(env, BY_LAST, [*RIGHT, "one turn too many"]).turns == RIGHT


def test_right_answers_score_one_per_turn() -> None:
    scores = score(RIGHT)
    assert scores["turn_similarity"] == 1.0 and scores["all_turns_exact"] == 1.0 and scores["reward"] == 1.0
    # Blank lines and stray spaces are not errors.
    assert score(["\n Zoe  Adler // new name!\n\nAda Young // new name! ", RIGHT[1]])["reward"] == 1.0


def test_wrong_partial_and_malformed_answers() -> None:
    wrong_order = score([RIGHT[0], "Ada Young\nMilo Baker // new name!\nZoe Adler"])
    assert 0.5 < wrong_order["reward"] < 1.0 and wrong_order["all_turns_exact"] == 0.0
    no_marks = score(["Zoe Adler\nAda Young", "Zoe Adler\nMilo Baker\nAda Young"])["reward"]
    assert 0.2 < no_marks < wrong_order["reward"]
    assert score([RIGHT[0], "Zoe Adler\nMilo Baker // new name!"])["reward"] == pytest.approx((1 + 0.8) / 2)
    assert score(RIGHT[:1])["reward"] == 0.5  # a turn never played counts 0
    assert score(["", ""])["reward"] == 0.0
    assert score(["<|im_end|>###", "sorry, I cannot"])["reward"] == 0.0


def test_examples_are_reproducible_with_unique_sort_keys_and_both_orders() -> None:
    env = load_environment("alphabet_sort", {"min_turns": 2, "max_turns": 4, "max_names_per_turn": 2})
    assert env.max_turns == 4
    a = [next(env.examples(random.Random(3))) for _ in range(5)]
    assert a == [next(env.examples(random.Random(3))) for _ in range(5)]
    examples = env.examples(random.Random(0))
    seen_orders = set()
    for _ in range(200):
        ex = next(examples)
        seen_orders.add(ex["sort_by"])
        names = [n for turn in ex["turns"] for n in turn]
        assert 2 <= len(ex["turns"]) <= 4 and all(1 <= len(t) <= 2 for t in ex["turns"])
        assert len({n.split()[0] for n in names}) == len({n.split()[1] for n in names}) == len(names)
        assert asyncio.run(env.score(play_by_hand(env, ex, ex["expected"])))["reward"] == 1.0
    assert seen_orders == {"first", "last"}
    assert len(set(FIRST_NAMES)) == len(FIRST_NAMES) and len(set(LAST_NAMES)) == len(LAST_NAMES)


@pytest.mark.parametrize(
    "args, match",
    [
        ({"min_turns": 0}, "min_turns"),
        ({"min_turns": 3, "max_turns": 2}, "min_turns"),
        ({"min_names_per_turn": 4}, "names_per_turn"),
        ({"max_turns": 20, "max_names_per_turn": 5}, "distinct names"),
    ],
)
def test_bad_args_are_clear_errors(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AlphabetSort(**args)
