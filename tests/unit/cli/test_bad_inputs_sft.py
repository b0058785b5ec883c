"""Bad input to `sft`: its data. Each case is refused with exit code 2 and one line naming the file
and line (or row, or key) at fault, no traceback, and nothing written or deleted
(`bad_inputs.assert_refused`); the cases run `sft` for real, not a dry run: its checks run before
the run folder is touched. The data files are written once, before any case runs.

Besides records that do not parse: records that parse but cannot teach what they seem to (an empty
prompt, completion or turn), data in which no record has a loss token under `data.loss_on`, eval
data that is the training data, and folders that hold no data `sft` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, sft_args

PAIR = {"prompt": "abc", "completion": "cba"}
USER, ANSWER = {"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}


def lines(*records: object) -> str:
    """JSON Lines of `records`; a str is a line as it stands."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


# name -> the file's content, written under the workspace's inputs/ with an "sft-" prefix.
FILES: dict[str, str | bytes] = {
    "empty-prompt.jsonl": lines({"prompt": "", "completion": "x"}),
    "blank-completion.jsonl": lines(PAIR, {"prompt": "a", "completion": " \n\t"}),
    "empty-answer.jsonl": lines(PAIR, {"messages": [USER, {"role": "assistant", "content": ""}]}),
    "empty-user.jsonl": lines({"messages": [{"role": "user", "content": ""}, ANSWER]}),
    "blank-prompt-list.jsonl": lines({"prompt": [{"role": "user", "content": "   "}], "completion": "x"}),
    "completion-of-user.jsonl": lines({"prompt": "a", "completion": [USER]}),
    "list-record.jsonl": lines([PAIR]),
    "string-record.jsonl": lines('"abc"'),
    "no-form.jsonl": lines({"question": "abc", "answer": "cba"}),
    "null-record.jsonl": lines(PAIR, "null"),
    "number-record.jsonl": lines("42"),
    "no-completion.jsonl": lines({"prompt": "abc"}),
    "both-forms.jsonl": lines(PAIR | {"messages": [USER, ANSWER]}),
    "number-prompt.jsonl": lines({"prompt": 7, "completion": "x"}),
    "huge-number.jsonl": lines('{"prompt": "a", "completion": 1e400}'),
    "huge-integer.jsonl": lines('{"prompt": "a", "completion": ' + "9" * 5000 + "}"),
    "nan-prompt.jsonl": lines('{"prompt": NaN, "completion": "x"}'),
    "deep.jsonl": lines("[" * 100_000 + "]" * 100_000),
    "content-parts.jsonl": lines({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}),
    "no-role.jsonl": lines({"messages": [{"content": "abc"}, ANSWER]}),
    "unknown-role.jsonl": lines({"messages": [USER, {"role": "bot", "content": "cba"}]}),
    "no-messages.jsonl": lines({"messages": []}),
    "tools-string.jsonl": lines({"messages": [USER, ANSWER], "tools": "calculate"}),
    "latin1-line3.jsonl": lines(PAIR, PAIR).encode() + b'{"prompt": "caf\xe9", "completion": "x"}\n',
    "utf16.jsonl": lines(PAIR).encode("utf-16"),
    "bom-line2.jsonl": lines(PAIR).encode() + b"\xef\xbb\xbf" + lines(PAIR).encode(),
    "truncated.jsonl": lines(PAIR, '{"prompt": "a", "completion": "b"'),
    "empty.jsonl": "",
    "blank-lines.jsonl": "\n  \n\t\n",
    "only-users.jsonl": lines({"messages": [USER]}, {"messages": [{"role": "system", "content": "Be brief."}, USER]}),
    "not-parquet.parquet": b"PAR1 but not really",
    "eval-blank.jsonl": lines(PAIR, PAIR, {"prompt": "a", "completion": ""}),
    "eval-no-answers.jsonl": lines({"messages": [USER]}),
    "long-prompts.jsonl": lines(*({"prompt": "word " * 100, "completion": "x"} for _ in range(3))),
}


def parquet_files(inputs: Path) -> None:
    pq.write_table(pa.table({"text": ["abc"], "label": [1]}), inputs / "sft-columns.parquet")
    pq.write_table(pa.table({"prompt": [1, 2], "completion": [3, 4]}), inputs / "sft-numbers.parquet")
    pq.write_table(
        pa.table({"prompt": pa.array([], pa.string()), "completion": pa.array([], pa.string())}),
        inputs / "sft-no-rows.parquet",
    )
    pq.write_table(pa.table({"prompt": ["a", "b"], "completion": ["x", ""]}), inputs / "sft-empty-row1.parquet")


def folders(w: Workspace, inputs: Path) -> None:
    for name, files in {
        "sft-empty-folder": {},
        "sft-csv-folder": {"data.csv": "prompt,completion\na,b\n"},
        "sft-readme-folder": {"README.md": "my data is elsewhere"},
        "sft-bin-folder": {"weights.bin": b"\x00\x01"},
        "sft-broken-folder": {"part-0.jsonl": lines(PAIR), "part-1.jsonl": lines(PAIR, "{oops")},
        "sft-latin1-folder": {"a.jsonl": b'{"prompt": "caf\xe9", "completion": "x"}\n'},
        "sft-train-only": {"train.jsonl": lines(PAIR)},
        "sft-folder.jsonl": {},  # a folder named like a file
    }.items():
        (inputs / name).mkdir()
        for file, text in files.items():
            (inputs / name / file).write_bytes(text if isinstance(text, bytes) else text.encode())
    (inputs / "sft-saved").mkdir()
    datasets.DatasetDict({"train": datasets.Dataset.from_list([PAIR])}).save_to_disk(str(inputs / "sft-saved"))
    (inputs / "sft-garbage-saved").mkdir()
    (inputs / "sft-garbage-saved" / "state.json").write_text("{not json")
    os.symlink(w.data, inputs / "sft-link-to-chat.jsonl")
    os.link(w.data, inputs / "sft-hardlink-to-chat.jsonl")
    (inputs / "sft-data-folder").mkdir()
    (inputs / "sft-data-folder" / "train.jsonl").write_text(lines(PAIR))


@pytest.fixture(scope="session", autouse=True)
def sft_data_files(ws: Workspace) -> None:
    for name, text in FILES.items():
        ws.write(f"sft-{name}", text)
    inputs = ws.root / "inputs"
    parquet_files(inputs)
    folders(ws, inputs)


def data(name: str, *more: str) -> Callable[[Workspace], list[str]]:
    return sft_args(*more, data=f"{{w.root}}/inputs/sft-{name}")


def eval_data(path: str, *more: str, name: str = "chat.jsonl") -> Callable[[Workspace], list[str]]:
    return sft_args("--data.eval_path", path, *more, data=f"{{w.root}}/inputs/{name}")


CASES: list[Case] = [
    # A held-out part that leaves nothing to train on (one record): found by the trainer only, which
    # left the new run folder behind.
    ("sft", sft_args("--data.eval_fraction", "0.5"), "data.eval_fraction 0.5 holds out 1 of the 1 records of"),
    ("sft", sft_args("--data.eval_fraction", "0.01", "--dry-run"), "holds out 1 of the 1 records"),
    # Records that parse but have nothing to learn from.
    ("sft", data("empty-prompt.jsonl"), "sft-empty-prompt.jsonl:1: malformed record: 'prompt' is empty"),
    ("sft", data("blank-completion.jsonl"), "sft-blank-completion.jsonl:2: malformed record: 'completion' is blank"),
    (
        "sft",
        data("empty-answer.jsonl"),
        "sft-empty-answer.jsonl:2: malformed record: message 1 of 'messages' (assistant) is empty",
    ),
    (
        "sft",
        data("empty-user.jsonl"),
        "sft-empty-user.jsonl:1: malformed record: message 0 of 'messages' (user) is empty",
    ),
    (
        "sft",
        data("blank-prompt-list.jsonl"),
        "sft-blank-prompt-list.jsonl:1: malformed record: message 0 of 'prompt' (user) is blank",
    ),
    (
        "sft",
        data("completion-of-user.jsonl"),
        "sft-completion-of-user.jsonl:1: malformed record: 'completion' has no assistant message",
    ),
    ("sft", data("empty-row1.parquet"), "sft-empty-row1.parquet row 1: malformed record: 'completion' is empty"),
    # Records of the wrong shape or type.
    ("sft", data("list-record.jsonl"), "sft-list-record.jsonl:1: malformed record: expected an object, got a list"),
    (
        "sft",
        data("string-record.jsonl"),
        "sft-string-record.jsonl:1: malformed record: expected an object, got a string",
    ),
    ("sft", data("null-record.jsonl"), "sft-null-record.jsonl:2: malformed record: expected an object, got null"),
    (
        "sft",
        data("number-record.jsonl"),
        "sft-number-record.jsonl:1: malformed record: expected an object, got a number",
    ),
    (
        "sft",
        data("no-completion.jsonl"),
        "sft-no-completion.jsonl:1: malformed record: 'completion' is missing or null",
    ),
    ("sft", data("no-form.jsonl"), "sft-no-form.jsonl:1: malformed record: expected 'messages', or 'prompt' and"),
    (
        "sft",
        data("both-forms.jsonl"),
        "sft-both-forms.jsonl:1: malformed record: has 'messages' and 'prompt'/'completion'",
    ),
    (
        "sft",
        data("number-prompt.jsonl"),
        "sft-number-prompt.jsonl:1: malformed record: 'prompt' must be a string or a list",
    ),
    (
        "sft",
        data("huge-number.jsonl"),
        "sft-huge-number.jsonl:1: malformed record: 'completion' must be a string or a list",
    ),
    ("sft", data("huge-integer.jsonl"), "sft-huge-integer.jsonl:1: malformed record: Exceeds the limit"),
    ("sft", data("nan-prompt.jsonl"), "sft-nan-prompt.jsonl:1: malformed record: 'prompt' must be a string or a list"),
    ("sft", data("deep.jsonl"), "sft-deep.jsonl:1: malformed record: nested too deeply"),
    (
        "sft",
        data("content-parts.jsonl"),
        "sft-content-parts.jsonl:1: malformed record: 'messages' must be a list of {role, content} with string values",
    ),
    (
        "sft",
        data("no-role.jsonl"),
        "sft-no-role.jsonl:1: malformed record: 'messages' must be a list of {role, content}",
    ),
    (
        "sft",
        data("unknown-role.jsonl"),
        "sft-unknown-role.jsonl:1: malformed record: 'messages' has messages of unknown role ['bot']",
    ),
    ("sft", data("no-messages.jsonl"), "sft-no-messages.jsonl:1: malformed record: no messages"),
    ("sft", data("tools-string.jsonl"), "sft-tools-string.jsonl:1: malformed record: 'tools' must be a list"),
    (
        "sft",
        data("numbers.parquet"),
        "sft-numbers.parquet row 0: malformed record: 'prompt' must be a string or a list",
    ),
    # Bytes that are not JSON Lines in UTF-8.
    ("sft", data("latin1-line3.jsonl"), "sft-latin1-line3.jsonl:3: not UTF-8 (invalid continuation byte"),
    ("sft", data("utf16.jsonl"), "sft-utf16.jsonl:1: not UTF-8 (invalid start byte at byte 0)"),
    ("sft", data("bom-line2.jsonl"), "sft-bom-line2.jsonl:2: malformed record: Unexpected UTF-8 BOM"),
    ("sft", data("truncated.jsonl"), "sft-truncated.jsonl:2: malformed record: Expecting"),
    ("sft", data("empty.jsonl"), "sft-empty.jsonl: no records"),
    ("sft", data("blank-lines.jsonl"), "sft-blank-lines.jsonl: no records"),
    ("sft", data("not-parquet.parquet"), "sft-not-parquet.parquet: not a Parquet file pyarrow can read"),
    (
        "sft",
        data("columns.parquet"),
        "sft-columns.parquet: expected a 'messages' column, or 'prompt' and 'completion' (it has ['label',",
    ),
    ("sft", data("no-rows.parquet"), "sft-no-rows.parquet: no records"),
    # Folders.
    ("sft", data("empty-folder"), "sft-empty-folder: a folder without data files (expected .jsonl or .parquet files)"),
    ("sft", data("folder.jsonl"), "sft-folder.jsonl: a folder without data files"),
    ("sft", data("csv-folder"), "sft-csv-folder/data.csv: sft reads .jsonl and .parquet files only"),
    ("sft", data("readme-folder"), "sft-readme-folder: a folder without data files"),
    ("sft", data("bin-folder"), "sft-bin-folder: no .jsonl or .parquet files for split 'train'"),
    ("sft", data("broken-folder"), "sft-broken-folder/part-1.jsonl:2: malformed record"),
    ("sft", data("latin1-folder"), "sft-latin1-folder/a.jsonl:1: not UTF-8"),
    (
        "sft",
        data("train-only", "--data.split", "test"),
        "sft-train-only: no split 'test' (it has ['train']); set data.split",
    ),
    ("sft", data("saved", "--data.split", "validation"), "sft-saved: no split 'validation' (it has ['train'])"),
    ("sft", data("garbage-saved"), "sft-garbage-saved: not a readable `datasets` folder"),
    # Loss tokens under data.loss_on, and eval data.
    (
        "sft",
        data("only-users.jsonl"),
        "sft-only-users.jsonl: no record has an assistant message, and data.loss_on = 'assistant'",
    ),
    (
        "sft",
        data("only-users.jsonl", "--data.loss_on", "last_turn"),
        "data.loss_on = 'last_turn' trains on those alone",
    ),
    # Every answer cut off by seq_len: found by the trainer, with the run folder made (tokenizer needed).
    (
        "sft",
        data("long-prompts.jsonl", "--seq_len", "16"),
        "sft-long-prompts.jsonl: no record keeps a token to learn from at seq_len 16",
    ),
    ("sft", eval_data("{w.data}"), "data.eval_path: {w.data} is the training data"),
    ("sft", eval_data("{w.root}/inputs/sft-link-to-chat.jsonl"), "is the training data (data.path = "),
    (
        "sft",
        eval_data("{w.root}/inputs/sft-hardlink-to-chat.jsonl"),
        "sft-hardlink-to-chat.jsonl is the training data",
    ),
    (
        "sft",
        eval_data("inputs/chat.jsonl"),
        "data.eval_path: inputs/chat.jsonl is the training data",
    ),  # relative to the cwd
    (
        "sft",
        eval_data("{w.root}/inputs/sft-data-folder", name="sft-data-folder/train.jsonl"),
        "lie one in the other",
    ),
    (
        "sft",
        eval_data("{w.root}/inputs/sft-eval-blank.jsonl"),
        "sft-eval-blank.jsonl:3: malformed record: 'completion' is empty",
    ),
    (
        "sft",
        eval_data("{w.root}/inputs/sft-eval-no-answers.jsonl"),
        "sft-eval-no-answers.jsonl: no record has an assistant message",
    ),
]


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_bad_sft_data_is_refused_in_one_line_and_touches_nothing(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    assert_refused(ws, capsys, command, args(ws), names.replace("{w.data}", str(ws.data)))


def test_every_case_is_its_own_input() -> None:
    assert len({c[2] for c in CASES}) == len(CASES) >= 30
