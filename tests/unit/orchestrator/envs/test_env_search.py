import asyncio
import random

import pytest

from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Episode
from lorarl.orchestrator.envs.search import LexicalIndex, Search, normalize
from lorarl.orchestrator.envs.search_docs import DOCUMENTS
from tests.unit.orchestrator.envs.env_play import play_and_score, play_by_hand

EXAMPLE = {"question": "Who founded the Sorrel Academy of Music?", "answer": "Petra Lind"}


def search(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


def play(env: Search, answers: list[str], example: dict = EXAMPLE) -> Episode:
    return play_by_hand(env, example, answers)


def score(answers: list[str], env: Search | None = None) -> dict[str, float]:
    env = env or Search()
    return asyncio.run(env.score(play(env, answers)))


def test_the_search_tool_returns_the_top_k_documents() -> None:
    env = Search(top_k=2)
    (schema,) = env.tool_schemas() or []
    assert schema["function"]["name"] == "search" and schema["function"]["parameters"]["required"] == ["query"]
    lines = env.search("Sorrel Academy in Lisle").split("\n")
    assert len(lines) == 2 and lines[0].startswith("Sorrel Academy: ") and "Petra Lind" in lines[0]
    assert "Lisle" in lines[1]
    assert env.search("xyzzy plugh") == "No results."


def test_tool_calls_drive_search_then_answer() -> None:
    env = Search(max_turns=3)
    episode = play(env, [search("glimmerfish"), search("Sorrel Academy"), "<answer>Petra Lind</answer>"])
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                     "assistant"]  # fmt: skip
    assert episode.messages[3]["content"].startswith("Glimmerfish: ")
    assert "Petra Lind" in episode.messages[5]["content"]
    # A turn without a tool call is the answer and ends the episode.
    assert play(env, ["<answer>Petra Lind</answer>", search("more")]).turns == ["<answer>Petra Lind</answer>"]
    # Two calls in one turn: two results, in order.
    reply = play(env, [search("glimmerfish") + search("Fenn Canal")]).messages[3:]
    assert [m["content"].split(":")[0] for m in reply] == ["Glimmerfish", "Fenn Canal"]


def test_right_answers_score_one() -> None:
    scores = score([search("Sorrel Academy"), "<answer>Petra Lind</answer>"])
    assert scores == {"answer_match": 1.0, "used_tools": 1.0, "reward": 1.0, "reward_errors": 0, "tool_calls": 1.0,
                      "tool_malformed": 0.0, "tool_failed": 0.0, "tool_timeouts": 0.0}  # fmt: skip
    assert score(["<answer> petra lind. </answer>"])["reward"] == 1.0  # case, punctuation, spaces
    assert score(["<answer>The Petra Lind</answer>"])["reward"] == 1.0  # articles
    assert score(["<answer>Petra Lind</answer>"])["used_tools"] == 0.0  # right without searching


def test_partial_wrong_and_malformed_answers() -> None:
    assert score(["<answer>the violinist Petra Lind</answer>"])["reward"] == 0.5
    assert score(["<answer>Petra</answer>"])["reward"] == 0.0
    assert score(["<answer>Ines Varga</answer>"])["reward"] == 0.0
    assert score(["<answer>Petra Lindqvist</answer>"])["reward"] == 0.0  # whole words only
    assert score(["Petra Lind"])["reward"] == 0.0  # no answer tag
    assert score(["<answer>Petra Lind"])["reward"] == 0.0  # unclosed
    assert score([search("Sorrel")] * 3)["reward"] == 0.0  # ran out of turns
    assert score([""])["reward"] == 0.0
    malformed = score(['<tool_call>{"name": "search", "arguments": {"q": "Sorrel"}}</tool_call>', "<answer>x</answer>"])
    assert malformed["tool_malformed"] == 1.0 and malformed["used_tools"] == 0.0


def test_every_question_finds_its_document_first_and_its_answer_is_in_it() -> None:
    env = Search(top_k=1)
    assert 30 <= len(DOCUMENTS) <= 60 and len({d.title for d in DOCUMENTS}) == len(DOCUMENTS)
    for doc in DOCUMENTS:
        assert env.search(doc.question) == f"{doc.title}: {doc.text}"
        assert normalize(doc.answer) in normalize(doc.text)


def test_every_reference_episode_finds_its_document_first_and_scores_one() -> None:
    env = Search()  # the default top_k: the reference query must rank its document first, not only in the top k
    for doc in DOCUMENTS:
        example = {"question": doc.question, "answer": doc.answer}
        turns = env.solutions(example)
        assert turns == [search(doc.question), f"<answer>{doc.answer}</answer>"]
        episode, scores = play_and_score(env, example, turns)
        assert episode.messages[3]["content"].split("\n")[0] == f"{doc.title}: {doc.text}"
        assert scores["reward"] == 1.0 and scores["used_tools"] == 1.0 and scores["tool_malformed"] == 0.0


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
