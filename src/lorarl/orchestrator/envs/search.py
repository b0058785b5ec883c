"""search (multi-turn, tool calling): answer a question about a local document collection by searching it.

The model calls the `search` tool (shown by the chat template, called in its `<tool_call>` format);
each call returns the top-k documents by BM25 over lowercase word tokens as a `tool` message. A turn
without tool calls ends the episode and is the answer, in `<answer>...</answer>`. Reward: 1 if the
answer equals the true answer after normalization (case, punctuation, articles), 0.5 if it contains
it as whole words, else 0. `used_tools` (weight 0) logs whether it searched. Warm-up data
(`solutions`) is the whole correct episode: a search for the question itself, which BM25 ranks its
document first for, then the answer.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Iterator

from lorarl.orchestrator.envs.base import Episode, Example, Message, WeightedReward
from lorarl.orchestrator.envs.search_docs import DOCUMENTS
from lorarl.orchestrator.envs.tool_env import ToolEnvironment, used_tools
from lorarl.orchestrator.tools import format_tool_call

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
STOPWORDS = frozenset("a an and are at by did do does for how in is many of on the to was what which who".split())


def tokenize(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS]


class LexicalIndex:
    """BM25 (k1 = 1.2, b = 0.75) over a fixed list of texts."""

    def __init__(self, texts: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.counts = [Counter(tokenize(t)) for t in texts]
        self.lengths = [sum(c.values()) for c in self.counts]
        self.mean_length = sum(self.lengths) / len(texts)
        df = Counter(word for c in self.counts for word in c)
        self.idf = {w: math.log(1 + (len(texts) - n + 0.5) / (n + 0.5)) for w, n in df.items()}
        self.k1, self.b = k1, b

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the k best-scoring texts, best first; texts sharing no word with the query are left out."""
        words = set(tokenize(query))
        scored = []
        for i, (counts, length) in enumerate(zip(self.counts, self.lengths, strict=True)):
            norm = self.k1 * (1 - self.b + self.b * length / self.mean_length)
            score = sum(self.idf[w] * counts[w] * (self.k1 + 1) / (counts[w] + norm) for w in words if w in counts)
            if score > 0:
                scored.append((-score, i))
        return [i for _, i in sorted(scored)[:k]]


def normalize(text: str) -> str:
    words = re.sub(r"[^a-z0-9]+", " ", text.lower()).split()
    return " ".join(w for w in words if w not in ("a", "an", "the"))


def answer_match(episode: Episode) -> float:
    answers = ANSWER.findall(episode.completion)
    if not answers:
        return 0.0
    got, want = normalize(answers[-1]), normalize(episode.example["answer"])
    if got == want:
        return 1.0
    return 0.5 if f" {want} " in f" {got} " else 0.0


class Search(ToolEnvironment):
    name = "search"
    rewards = [WeightedReward(answer_match), WeightedReward(used_tools, 0.0)]

    def __init__(self, max_turns: int = 3, top_k: int = 2) -> None:
        if max_turns < 2:
            raise ValueError(f"max_turns must be >= 2 (at least one search and one answer), got {max_turns}")
        if not 1 <= top_k <= len(DOCUMENTS):
            raise ValueError(f"top_k must be in 1..{len(DOCUMENTS)}, got {top_k}")
        self.max_turns, self.top_k = max_turns, top_k
        self.index = LexicalIndex([f"{d.title} {d.text}" for d in DOCUMENTS])
        self.tools = [self.search]

    def examples(self, rng: random.Random) -> Iterator[Example]:
        while True:
            doc = rng.choice(DOCUMENTS)
            yield {"question": doc.question, "answer": doc.answer}

    def solutions(self, example: Example) -> list[str]:
        """A correct episode, for warm-up data: search for the question as asked (it ranks its own
        document first, tests/unit/orchestrator/envs/test_env_search.py checks every one), then answer."""
        return [format_tool_call("search", {"query": example["question"]}), f"<answer>{example['answer']}</answer>"]

    def prompt(self, example: Example) -> list[Message]:
        system = (
            f"Answer the question. Search the documents with the search tool; you may search {self.max_turns - 1} "
            "times. When you know the answer, reply without a tool call, with <answer>...</answer>."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": example["question"]}]

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: Words to look for.
        """
        hits = [DOCUMENTS[i] for i in self.index.top_k(query, self.top_k)]
        return "\n".join(f"{d.title}: {d.text}" for d in hits) or "No results."
