import asyncio
import random

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Episode
from lorarl.orchestrator.envs.search import LexicalIndex, Search, normalize
from lorarl.orchestrator.envs.search_docs import DOCUMENTS
from tests.unit.orchestrator.envs.env_play import play_by_hand

EXAMPLE = {"question": "Who founded the Sorrel Academy of Music?", "answer": "Petra Lind"}


def play(env: Search, answers: list[str], example: dict = EXAMPLE) -> Episode:
    return play_by_hand(env, example, answers)


def score(answers: list[str], env: Search | None = None) -> dict[str, float]:
    env = env or Search()
    return asyncio.run(env.score(play(env, answers)))


def test_a_search_returns_the_top_k_documents_as_a_user_message() -> None:
    env = Search(top_k=2)
    episode = play(env, ["<search>Sorrel Academy in Lisle</search>"])
    reply = env.env_response(episode)
    assert reply is not None and [m["role"] for m in reply] == ["user"]
    lines = reply[0]["content"].split("\n")
    assert len(lines) == 2 and lines[0].startswith("Sorrel Academy: ") and "Petra Lind" in lines[0]
    assert "Lisle" in lines[1]
    assert env.search_results("xyzzy plugh") == "No results."


def test_env_response_drives_search_then_answer() -> None:
    env = Search(max_turns=3)
    episode = play(
        env, ["<search>glimmerfish</search>", "<search>Sorrel Academy</search>", "<answer>Petra Lind</answer>"]
    )
    assert [m["role"] for m in episode.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert "Glimmerfish: " in episode.messages[3]["content"]
    assert "Petra Lind" in episode.messages[5]["content"]
    assert env.env_response(episode) is None  # the answer ends the episode
    # An answer, or a turn with neither tag, ends the episode at once.
    assert play(env, ["<answer>Petra Lind</answer>", "<search>more</search>"]).turns == ["<answer>Petra Lind</answer>"]
    assert play(env, ["I think it is Petra Lind.", "<answer>Petra Lind</answer>"]).turns == [
        "I think it is Petra Lind."
    ]
    # Only the last query of a turn is run.
    reply = env.env_response(play(env, ["<search>glimmerfish</search><search>Fenn Canal</search>"]))
    assert reply is not None and reply[0]["content"].startswith("Fenn Canal: ")


def test_right_answers_score_one() -> None:
    scores = score(["<search>Sorrel Academy</search>", "<answer>Petra Lind</answer>"])
    assert scores == {"answer_match": 1.0, "used_search": 1.0, "reward": 1.0, "reward_errors": 0}
    assert score(["<answer> petra lind. </answer>"])["reward"] == 1.0  # case, punctuation, spaces
    assert score(["<answer>The Petra Lind</answer>"])["reward"] == 1.0  # articles
    assert score(["<answer>Petra Lind</answer>"])["used_search"] == 0.0  # right without searching


def test_partial_wrong_and_malformed_answers() -> None:
    assert score(["<answer>the violinist Petra Lind</answer>"])["reward"] == 0.5
    assert score(["<answer>Petra</answer>"])["reward"] == 0.0
    assert score(["<answer>Ines Varga</answer>"])["reward"] == 0.0
    assert score(["<answer>Petra Lindqvist</answer>"])["reward"] == 0.0  # whole words only
    assert score(["Petra Lind"])["reward"] == 0.0  # no answer tag
    assert score(["<answer>Petra Lind"])["reward"] == 0.0  # unclosed
    assert score(["<search>Sorrel</search>"] * 3)["reward"] == 0.0  # ran out of turns
    assert score([""])["reward"] == 0.0


def test_every_question_finds_its_document_first_and_its_answer_is_in_it() -> None:
    env = Search(top_k=1)
    assert 30 <= len(DOCUMENTS) <= 60 and len({d.title for d in DOCUMENTS}) == len(DOCUMENTS)
    for doc in DOCUMENTS:
        assert env.search_results(doc.question) == f"{doc.title}: {doc.text}"
        assert normalize(doc.answer) in normalize(doc.text)


def test_lexical_index_ranks_by_bm25() -> None:
    index = LexicalIndex(["red fox", "red red red house with a long long name here", "blue whale"])
    assert index.top_k("red fox", 3) == [0, 1]  # texts with no query word are left out
    assert index.top_k("whale", 1) == [2]


def test_examples_are_reproducible_and_the_prompt_states_the_search_budget() -> None:
    env = load_environment("search", {"max_turns": 4, "top_k": 3})
    assert env.max_turns == 4
    assert [next(env.examples(random.Random(2))) for _ in range(5)] == [
        next(env.examples(random.Random(2))) for _ in range(5)
    ]
    ex = next(env.examples(random.Random(0)))
    system, question = env.prompt(ex)
    assert "search 3 times" in system["content"] and question == {"role": "user", "content": ex["question"]}


@pytest.mark.parametrize(
    "args, match", [({"max_turns": 1}, "max_turns"), ({"top_k": 0}, "top_k"), ({"top_k": 1000}, "top_k")]
)
def test_bad_args_are_clear_errors(args: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Search(**args)
