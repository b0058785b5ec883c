"""SFT data: local files in, tokenized samples with loss masks out, and the order they are drawn in.

Formats (by `data.path`): a `.jsonl` file, a `.parquet` file, or a folder: one written by
`Dataset.save_to_disk`, or a folder of `.jsonl` and `.parquet` files, whose split `data.split` picks
by the file names as `datasets.load_dataset` would (read here file by file, so that a mistake is
named by file and line, and nothing is cached). A record is a chat,
`{"messages": [{"role", "content"}, ...]}`, or a pair `{"prompt", "completion"}` whose parts are
strings (a user and an assistant message) or message lists. A record may carry `"tools"`, the
OpenAI-style schemas of the tools its conversation calls (the Hugging Face convention, what
scripts/make_sft_data.py writes for tool environments): the chat template shows them to the model as
`rl` does (EpisodeRunner.encode), so a warm-up trains on the very prompt RL samples from. A
malformed record stops the run with its place: `file.jsonl:LINE` or `file.parquet row INDEX` (0-based).
So does a record that cannot teach what it seems to: an empty or blank prompt, completion, user or
assistant message (an assistant turn that calls tools may have no text), data in which no record
carries loss tokens under `data.loss_on`, and eval data that is (or lies in) the training data.
`read_sft_data` makes every check that needs no tokenizer and `check_some_trainable` the one that
does: `sft` runs both before the run folder is touched (preflight), and the trainer again, as it loads
the data.
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
from lorarl.config.sft import SFTDataConfig
from lorarl.file_kinds import NOT_REGULAR, shortened, special_file
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
    train, held_out = read_sft_data(cfg)
    if cfg.eval_path is None and cfg.eval_fraction > 0:
        picked = set(random.Random(seed).sample(range(len(train)), held_out_count(cfg.eval_fraction, len(train))))
        held_out = [c for i, c in enumerate(train) if i in picked]
        train = [c for i, c in enumerate(train) if i not in picked]
    data = SFTData([], [])
    data.train = tokenize(train, tokenizer, seq_len, cfg.loss_on, cfg.truncation, data.counts)
    data.eval = tokenize(held_out, tokenizer, seq_len, cfg.loss_on, cfg.truncation, Counter())
    if not data.train:
        raise _none_trainable(cfg, seq_len, data.counts)
    return data


def check_some_trainable(
    cfg: SFTDataConfig, records: list[Conversation], tokenizer: PreTrainedTokenizerBase, seq_len: int
) -> None:
    """DataError unless a record of `records` keeps a loss token at `seq_len`: tokenized one by one until
    one does (the first, as a rule), so a seq_len or loss_on that leaves nothing to train on is found
    before the run folder is touched, at the cost of all records only when none does."""
    counts: Counter[str] = Counter()
    for record in records:
        if tokenize([record], tokenizer, seq_len, cfg.loss_on, cfg.truncation, counts):
            return
    raise _none_trainable(cfg, seq_len, counts)


def _none_trainable(cfg: SFTDataConfig, seq_len: int, counts: Counter[str]) -> DataError:
    said = ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in counts.items())
    return DataError(
        f"{cfg.path}: no record keeps a token to learn from at seq_len {seq_len} with data.loss_on "
        f"{cfg.loss_on!r} and data.truncation {cfg.truncation!r} ({said})"
    )


def read_sft_data(cfg: SFTDataConfig) -> tuple[list[Conversation], list[Conversation]]:
    """The records of `path` and of `eval_path` (none without it), with every check that needs no
    tokenizer made (module docstring); a DataError names the file, line or key at fault."""
    if cfg.eval_path is not None:
        _check_apart(cfg.path, cfg.eval_path)
    train = read_conversations(cfg.path, cfg.split)
    _check_loss_tokens(train, cfg.loss_on, cfg.path)
    if cfg.eval_path is None:
        if cfg.eval_fraction > 0 and (held := held_out_count(cfg.eval_fraction, len(train))) >= len(train):
            raise DataError(
                f"data.eval_fraction {cfg.eval_fraction:g} holds out {held} of the {len(train)} records of "
                f"{cfg.path}: none is left to train on; lower it, or give data.eval_path"
            )
        return train, []
    held_out = read_conversations(cfg.eval_path, cfg.split)
    _check_loss_tokens(held_out, cfg.loss_on, cfg.eval_path)
    return train, held_out


def held_out_count(fraction: float, records: int) -> int:
    """How many of `records` data.eval_fraction holds out: at least one."""
    return max(1, round(fraction * records))


def read_conversations(path: Path, split: str = "train") -> list[Conversation]:
    """Every record of `path` as chat messages; a malformed record is a ValueError naming its place."""
    conversations = []
    for where, record in _records(Path(path), split):
        try:
            conversations.append(Conversation(where, to_messages(record), to_tools(record)))
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: malformed record: {e}") from None
    if not conversations:
        raise DataError(f"{path}: no records")
    return conversations


def to_messages(record: Any) -> list[Message]:
    """A record's chat: its `messages`, or its `prompt` followed by its `completion`."""
    if not isinstance(record, dict):
        raise TypeError(f"expected an object, got {_json_type(record)}")
    # Parquet and `datasets` give every record every column, None where a record has none.
    keys = {k for k, v in record.items() if v is not None}
    if "messages" in keys and keys & {"prompt", "completion"}:
        raise ValueError("has 'messages' and 'prompt'/'completion': give one form or the other")
    if "messages" in keys:
        messages = _message_list(record["messages"], "messages")
    elif {"prompt", "completion"} <= keys:
        prompt = _as_messages(record["prompt"], "user", "prompt")
        completion = _as_messages(record["completion"], "assistant", "completion")
        if not any(m["role"] == "assistant" for m in completion):
            raise ValueError("'completion' has no assistant message: nothing to learn from")
        messages = prompt + completion
    elif keys & {"prompt", "completion"}:
        (missing,) = {"prompt", "completion"} - keys
        raise ValueError(f"'{missing}' is missing or null")
    else:
        raise ValueError(f"expected 'messages', or 'prompt' and 'completion' (it has {sorted(keys)[:10]})")
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
    try:
        exists = path.exists()
    except OSError as e:  # e.g. a name too long for the file system
        raise DataError(f"{shortened(path)}: {e.strerror}") from None
    if not exists:
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        yield from _folder_records(path, split)
    elif special_file(path):
        raise DataError(f"{path}: {NOT_REGULAR}: give a .jsonl or .parquet file")
    elif path.suffix in _READERS:
        yield from _READERS[path.suffix](path)
    else:
        raise DataError(f"{path}: expected a .jsonl or .parquet file, or a `datasets` folder")


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    yield f"{path}:{lineno}", _json_line(line, f"{path}:{lineno}", first=lineno == 1)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


def _json_line(line: bytes, where: str, first: bool) -> Any:
    try:
        # utf-8-sig: a byte order mark (Windows editors write one) starts the first line, not the record.
        return json.loads(line.decode("utf-8-sig" if first else "utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
    except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python converts
        raise DataError(f"{where}: malformed record: {e}") from None
    except RecursionError:
        raise DataError(f"{where}: malformed record: nested too deeply") from None


def _parquet_records(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a Parquet file pyarrow can read ({e})") from None
    columns = set(table.column_names)
    if "messages" not in columns and not {"prompt", "completion"} <= columns:
        raise DataError(
            f"{path}: expected a 'messages' column, or 'prompt' and 'completion' (it has {sorted(columns)[:10]})"
        )
    for i, record in enumerate(table.to_pylist()):
        yield f"{path} row {i}", record


_READERS = {".jsonl": _jsonl_records, ".parquet": _parquet_records}
# Data files that `datasets` would read but sft does not: refused by name rather than left out unsaid.
_OTHER_DATA_FILES = {".json", ".ndjson", ".csv", ".tsv", ".txt", ".arrow"}


def _folder_records(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    # save_to_disk writes state.json (one Dataset) or dataset_dict.json (splits); anything else is a
    # folder of data files.
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        yield from _saved_dataset_records(path, split)
        return
    for file in _split_files(path, split):
        yield from _READERS[file.suffix](file)


def _split_files(path: Path, split: str) -> list[Path]:
    """The .jsonl and .parquet files of `split` in the folder `path`, by the names `datasets` gives splits
    (train.jsonl, data/test-00000.parquet, ...; files of no split's name are all "train")."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns

    try:
        patterns = get_data_patterns(str(path))
    except EmptyDatasetError:
        raise DataError(f"{path}: a folder without data files (expected .jsonl or .parquet files)") from None
    splits = {str(k): [Path(f) for f in v] for k, v in DataFilesDict.from_patterns(patterns, str(path)).items()}
    if split not in splits:
        raise DataError(f"{path}: no split {split!r} (it has {sorted(splits)}); set data.split")
    files = splits[split]
    if other := [f for f in files if f.suffix in _OTHER_DATA_FILES]:
        raise DataError(f"{other[0]}: sft reads .jsonl and .parquet files only; convert it or move it out of {path}")
    if not (data := [f for f in files if f.suffix in _READERS]):
        raise DataError(f"{path}: no .jsonl or .parquet files for split {split!r}")
    return data


def _saved_dataset_records(path: Path, split: str) -> Iterator[tuple[str, Any]]:
    import datasets
    import pyarrow as pa

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable `datasets` folder ({type(e).__name__}: {e})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r} (it has {sorted(loaded)}); set data.split")
        loaded = loaded[split]
    for i, record in enumerate(loaded):
        yield f"{path} [{split}] row {i}", record


def _check_apart(path: Path, eval_path: Path) -> None:
    """Eval data that is the training data (or part of it) measures memorizing, not learning."""
    train, held = Path(path).resolve(), Path(eval_path).resolve()
    if train == held or (train.is_file() and held.is_file() and train.samefile(held)):
        raise DataError(
            f"data.eval_path: {eval_path} is the training data (data.path = {path}); "
            "give held-out records, or set data.eval_fraction"
        )
    if train in held.parents or held in train.parents:
        raise DataError(
            f"data.eval_path: {eval_path} and data.path = {path} lie one in the other; "
            "give held-out records apart, or set data.eval_fraction"
        )


def _check_loss_tokens(conversations: list[Conversation], loss_on: LossOn, path: Path) -> None:
    """With loss on assistant turns, data without one trains nothing (every record would be left out)."""
    if loss_on != "all" and not any(m["role"] == "assistant" for c in conversations for m in c.messages):
        raise DataError(
            f"{path}: no record has an assistant message, and data.loss_on = {loss_on!r} trains on "
            'those alone; add the answers, or set data.loss_on = "all"'
        )


def _as_messages(value: Any, role: str, key: str) -> list[Message]:
    if isinstance(value, str):
        return [{"role": role, "content": _text(value, f"'{key}'")}]
    if not isinstance(value, list):
        raise TypeError(f"'{key}' must be a string or a list of {{role, content}}, got {_json_type(value)}")
    return _message_list(value, key)


def _message_list(value: Any, key: str) -> list[Message]:
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    ):
        raise ValueError(f"'{key}' must be a list of {{role, content}} with string values")
    if unknown := sorted({m["role"] for m in value} - CHAT_ROLES):
        raise ValueError(f"'{key}' has messages of unknown role {unknown} (known: {sorted(CHAT_ROLES)})")
    for i, m in enumerate(value):
        # A user turn asks and an assistant turn answers; one that calls tools may have no text.
        if m["role"] in ("user", "assistant") and not m.get("tool_calls"):
            _text(m["content"], f"message {i} of '{key}' ({m['role']})")
    # Parquet and `datasets` give every message every key of the column's struct type, None where unset.
    return [{k: v for k, v in m.items() if v is not None} for m in value]


def _text(value: str, what: str) -> str:
    if not value.strip():
        raise ValueError(f"{what} is {'blank' if value else 'empty'}: nothing to learn from")
    return value


def _json_type(value: Any) -> str:
    names = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
