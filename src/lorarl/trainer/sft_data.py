"""SFT data: local files in, tokenized samples with loss masks out, and the order they are drawn in.

Formats (by `data.path`): a `.jsonl` file, a `.parquet` file, or a folder that `datasets` loads
(one written by `Dataset.save_to_disk`, or a folder of data files). A record is a chat,
`{"messages": [{"role", "content"}, ...]}`, or a pair `{"prompt", "completion"}` whose parts are
strings (a user and an assistant message) or message lists. A record may carry `"tools"`, the
OpenAI-style schemas of the tools its conversation calls (the Hugging Face convention, what
scripts/make_sft_data.py writes for tool environments): the chat template shows them to the model as
`rl` does (EpisodeRunner.encode), so a warm-up trains on the very prompt RL samples from. A
malformed record stops the run with its place: `file.jsonl:LINE` or `file.parquet row INDEX` (0-based).
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from transformers import PreTrainedTokenizerBase

from lorarl.chat import LossOn, Message, tokenize_with_assistant_mask
from lorarl.config.models import SFTDataConfig
from lorarl.trainer.batching import TrainSample

log = logging.getLogger("lorarl.sft")


class DataError(ValueError):
    """The data cannot be trained on; str() names the file (and line or row) and what is wrong."""


# The roles chat templates know; any other would be rendered wrongly or dropped without a word.
CHAT_ROLES = {"system", "user", "assistant", "tool"}


class Conversation(NamedTuple):
    where: str  # "file.jsonl:12" or "file.parquet row 11", for error messages
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None  # the schemas the chat template renders (`tools=`)


@dataclass
class SFTData:
    train: list[TrainSample]
    eval: list[TrainSample]
    # What happened to the records on the way: "truncated", "skipped_too_long", "no_loss_tokens".
    counts: Counter[str] = field(default_factory=Counter)


def load_sft_data(cfg: SFTDataConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int, seed: int) -> SFTData:
    """Train and held-out eval samples. `eval_fraction` holds out a random part of `path` drawn with
    `seed`, so every run with the same seed evaluates on the same records."""
    train = read_conversations(cfg.path, cfg.split)
    held_out: list[Conversation] = []
    if cfg.eval_path is not None:
        held_out = read_conversations(cfg.eval_path, cfg.split)
    elif cfg.eval_fraction > 0:
        picked = set(random.Random(seed).sample(range(len(train)), max(1, round(cfg.eval_fraction * len(train)))))
        held_out = [c for i, c in enumerate(train) if i in picked]
        train = [c for i, c in enumerate(train) if i not in picked]
    data = SFTData([], [])
    data.train = tokenize(train, tokenizer, seq_len, cfg.loss_on, cfg.truncation, data.counts)
    data.eval = tokenize(held_out, tokenizer, seq_len, cfg.loss_on, cfg.truncation, Counter())
    if not data.train:
        raise DataError(f"{cfg.path}: no trainable records ({dict(data.counts)})")
    return data


def read_conversations(path: Path, split: str = "train") -> list[Conversation]:
    """Every record of `path` as chat messages; a malformed record is a ValueError naming its place."""
    conversations = []
    for where, record in _records(Path(path), split):
        try:
            conversations.append(Conversation(where, to_messages(record), to_tools(record)))
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{where}: malformed record: {e}") from None
    if not conversations:
        raise DataError(f"{path}: no records")
    return conversations


def to_messages(record: Any) -> list[Message]:
    """A record's chat: its `messages`, or its `prompt` followed by its `completion`."""
    if not isinstance(record, dict):
        raise TypeError(f"expected an object, got {type(record).__name__}")
    if "messages" in record:
        messages = _message_list(record["messages"], "messages")
    elif "prompt" in record and "completion" in record:
        messages = _as_messages(record["prompt"], "user", "prompt") + _as_messages(
            record["completion"], "assistant", "completion"
        )
    else:
        raise KeyError("expected 'messages', or 'prompt' and 'completion'")
    if not messages:
        raise ValueError("no messages")
    return messages


def to_tools(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A record's tool schemas, or None without a `tools` key (or with null there)."""
    tools = record.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("'tools' must be a list of tool schemas (JSON objects)")
    # Parquet and `datasets` give every schema every key of the column's struct type, None where unset.
    return [_without_nulls(t) for t in tools]


def tokenize(
    conversations: list[Conversation],
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    loss_on: LossOn,
    truncation: Literal["truncate", "skip"],
    counts: Counter[str],
) -> list[TrainSample]:
    """Samples of at most `seq_len` tokens. Counted in `counts`: examples cut to `seq_len`
    ("truncated") or left out ("skipped_too_long"), and examples left out because none of their
    tokens carries loss ("no_loss_tokens", e.g. no assistant turn)."""
    samples = []
    for conversation in conversations:
        try:
            ids, mask = tokenize_with_assistant_mask(tokenizer, conversation.messages, loss_on, conversation.tools)
        except ValueError as e:
            raise DataError(f"{conversation.where}: {e}") from None
        if len(ids) > seq_len:
            if truncation == "skip":
                counts["skipped_too_long"] += 1
                continue
            counts["truncated"] += 1
            ids, mask = ids[:seq_len], mask[:seq_len]
        # The first token is never predicted, so it cannot carry loss.
        if not any(mask[1:]):
            counts["no_loss_tokens"] += 1
            continue
        samples.append(TrainSample(ids, mask))
    return samples


class DataOrder:
    """Which samples each step trains on: epoch after epoch, each a fresh permutation (or the file
    order without shuffling). The permutation of an epoch depends only on the seed and the epoch,
    so the whole order is a function of how many samples were drawn: what a checkpoint stores."""

    def __init__(self, num_samples: int, seed: int, shuffle: bool) -> None:
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.consumed = 0
        self._epoch, self._permutation = -1, list(range(num_samples))

    def take(self, n: int) -> list[int]:
        indices = []
        for _ in range(n):
            epoch, i = divmod(self.consumed, self.num_samples)
            if epoch != self._epoch:
                self._epoch, self._permutation = epoch, self._epoch_order(epoch)
            indices.append(self._permutation[i])
            self.consumed += 1
        return indices

    @property
    def epoch(self) -> float:
        return self.consumed / self.num_samples

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_samples"] != self.num_samples:
            raise ValueError(
                f"the checkpoint was trained on {state['num_samples']} samples, this data has {self.num_samples}: "
                "resume with the data and data settings of the run"
            )
        self.consumed = state["consumed"]

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(self.num_samples))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order


def _records(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        yield from _dataset_folder_records(path, split)
    elif path.suffix == ".jsonl":
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise DataError(f"{path}:{lineno}: not UTF-8 ({e.reason})") from None
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{lineno}: malformed record: {e}") from None
                yield f"{path}:{lineno}", record
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path} row {i}", record
    else:
        raise DataError(f"{path}: expected a .jsonl or .parquet file, or a `datasets` folder")


def _dataset_folder_records(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    import datasets

    # save_to_disk writes state.json (one Dataset) or dataset_dict.json (splits); anything else is a
    # folder of data files for load_dataset.
    saved = (path / "state.json").exists() or (path / "dataset_dict.json").exists()
    loaded = datasets.load_from_disk(str(path)) if saved else datasets.load_dataset(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r} (it has {sorted(loaded)}); set data.split")
        loaded = loaded[split]
    for i, record in enumerate(loaded):
        yield f"{path} [{split}] row {i}", record


def _as_messages(value: Any, role: str, key: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return _message_list(value, key)


def _message_list(value: Any, key: str) -> list[Message]:
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        raise ValueError(f"'{key}' must be a list of {{role, content}} with string values")
    if unknown := sorted({m["role"] for m in value} - CHAT_ROLES):
        raise ValueError(f"'{key}' has messages of unknown role {unknown} (known: {sorted(CHAT_ROLES)})")
    # Parquet and `datasets` give every message every key of the column's struct type, None where unset.
    return [{k: v for k, v in m.items() if v is not None} for m in value]


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
