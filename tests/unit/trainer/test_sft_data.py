import json
from collections import Counter
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lorarl.chat import encode_chat, tokenize_with_assistant_mask
from lorarl.config.sft import SFTDataConfig
from lorarl.orchestrator.envs.calculator import Calculator
from lorarl.orchestrator.envs.search import Search
from lorarl.tiny_model import build_tokenizer
from lorarl.trainer.sft_data import (
    Conversation,
    DataError,
    DataOrder,
    load_sft_data,
    read_conversations,
    read_sft_data,
    tokenize,
)
from tests.unit.orchestrator.envs.env_play import play_by_hand

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "ok!"},
]


def trained_text(loss_on: str) -> str:
    tok = build_tokenizer()
    ids, mask = tokenize_with_assistant_mask(tok, CHAT, loss_on)  # type: ignore[arg-type]
    assert len(ids) == len(mask)
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_loss_on_modes_of_a_multi_turn_conversation() -> None:
    whole = build_tokenizer().apply_chat_template(CHAT, tokenize=False)
    assert trained_text("assistant") == "yo<|im_end|>\nok!<|im_end|>\n"
    assert trained_text("last_turn") == "ok!<|im_end|>\n"
    assert trained_text("all") == whole
    assert whole.count("<|im_start|>") == 5  # every turn, the system prompt included


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


RECORDS = [
    {"messages": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}]},
    {"prompt": "stone", "completion": "enots"},
    {
        "prompt": [{"role": "system", "content": "Reverse."}, {"role": "user", "content": "ab"}],
        "completion": [{"role": "assistant", "content": "ba"}],
    },
]
EXPECTED = [
    [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
    [{"role": "user", "content": "stone"}, {"role": "assistant", "content": "enots"}],
    [
        {"role": "system", "content": "Reverse."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "ba"},
    ],
]


def test_jsonl_with_messages_and_prompt_completion_pairs(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    conversations = read_conversations(path)
    assert [c.messages for c in conversations] == EXPECTED
    assert [c.where for c in conversations] == [f"{path}:1", f"{path}:2", f"{path}:3"]


def test_parquet(tmp_path: Path) -> None:
    # One column type per file: chats in one, string pairs in another.
    chats = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([RECORDS[0], RECORDS[0]]), chats)
    assert [c.messages for c in read_conversations(chats)] == [EXPECTED[0]] * 2
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([RECORDS[1]]), pairs)
    assert [c.messages for c in read_conversations(pairs)] == [EXPECTED[1]]


def test_datasets_folders(tmp_path: Path) -> None:
    datasets.Dataset.from_list([RECORDS[1], RECORDS[1]]).save_to_disk(str(tmp_path / "saved"))
    assert [c.messages for c in read_conversations(tmp_path / "saved")] == [EXPECTED[1]] * 2

    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list([RECORDS[0]]), "test": datasets.Dataset.from_list([RECORDS[1]])}
    )
    splits.save_to_disk(str(tmp_path / "splits"))
    assert [c.messages for c in read_conversations(tmp_path / "splits", "test")] == [EXPECTED[1]]
    with pytest.raises(ValueError, match=r"no split 'dev' \(it has \['test', 'train'\]\)"):
        read_conversations(tmp_path / "splits", "dev")

    # A folder of data files, read file by file; the split by the file names, as datasets.load_dataset does.
    (tmp_path / "files").mkdir()
    write_jsonl(tmp_path / "files" / "part-0.jsonl", [RECORDS[0], RECORDS[0]])
    (tmp_path / "files" / "README.md").write_text("left alone")
    assert [c.messages for c in read_conversations(tmp_path / "files")] == [EXPECTED[0]] * 2
    (tmp_path / "named").mkdir()
    write_jsonl(tmp_path / "named" / "train.jsonl", [RECORDS[0]])
    pq.write_table(pa.Table.from_pylist([RECORDS[1]]), tmp_path / "named" / "test-00000.parquet")
    test = read_conversations(tmp_path / "named", "test")
    assert [c.messages for c in test] == [EXPECTED[1]] and test[0].where == f"{tmp_path}/named/test-00000.parquet row 0"
    assert [c.where for c in read_conversations(tmp_path / "named")] == [f"{tmp_path}/named/train.jsonl:1"]


def test_what_looks_odd_but_is_sound_is_read(tmp_path: Path) -> None:
    """A byte order mark before the first record; Parquet rows of both forms (each with the other's
    columns null); an assistant turn that only calls a tool; records without an answer among others."""
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + (json.dumps(RECORDS[1]) + "\n").encode())
    assert [c.messages for c in read_conversations(bom)] == [EXPECTED[1]]
    rows = [RECORDS[0] | {"prompt": None, "completion": None}, RECORDS[1] | {"messages": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    assert [c.messages for c in read_conversations(tmp_path / "mixed.parquet")] == EXPECTED[:2]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    chat = [
        {"role": "user", "content": "a"},
        call,
        {"role": "tool", "content": ""},
        {"role": "assistant", "content": "b"},
    ]
    assert read_conversations(write_jsonl(tmp_path / "calls.jsonl", [{"messages": chat}]))[0].messages == chat
    no_answer = {"messages": [{"role": "user", "content": "a"}]}
    cfg = SFTDataConfig(path=write_jsonl(tmp_path / "some.jsonl", [no_answer, RECORDS[0]]))
    assert len(read_sft_data(cfg)[0]) == 2  # the one without loss tokens is left out later, counted
    only_users = SFTDataConfig(path=write_jsonl(tmp_path / "users.jsonl", [no_answer]), loss_on="all")
    assert len(read_sft_data(only_users)[0]) == 1  # "all": its tokens carry loss


def test_eval_data_must_lie_apart_from_the_training_data(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", RECORDS)
    (tmp_path / "held").mkdir()
    held = write_jsonl(tmp_path / "held" / "eval.jsonl", RECORDS[:1])
    assert [len(c) for c in read_sft_data(SFTDataConfig(path=train, eval_path=held))] == [3, 1]
    (tmp_path / "link.jsonl").symlink_to(train)
    for same in (train, tmp_path / "link.jsonl", tmp_path / "held" / ".." / "train.jsonl"):
        with pytest.raises(DataError, match=f"^data.eval_path: {same} is the training data"):
            read_sft_data(SFTDataConfig(path=train, eval_path=same))
    with pytest.raises(DataError, match="lie one in the other"):
        read_sft_data(SFTDataConfig(path=tmp_path / "held", eval_path=held))


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"messages": "not a list"}, "'messages' must be a list of {role, content}"),
        ({"messages": [{"role": "user"}]}, "'messages' must be a list"),
        ({"prompt": "only a prompt"}, "'completion' is missing or null"),
        ({"text": "neither form"}, "expected 'messages', or 'prompt' and 'completion' (it has ['text'])"),
        ({"prompt": "p", "completion": 3}, "'completion' must be a string or a list"),
        ([1, 2], "expected an object, got a list"),
        ({"prompt": "", "completion": "c"}, "'prompt' is empty"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}]}, "is blank"),
        (RECORDS[0] | {"tools": "calculate"}, "'tools' must be a list of tool schemas"),
        (RECORDS[0] | {"tools": [{"type": "function"}, "calculate"]}, "'tools' must be a list of tool schemas"),
    ],
)
def test_malformed_jsonl_record_names_file_and_line(tmp_path: Path, record: object, error: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="malformed record") as e:
        read_conversations(path)
    assert str(e.value).startswith(f"{path}:3: malformed record: ")
    assert error in str(e.value)


def test_malformed_parquet_record_names_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": None}]), path
    )
    with pytest.raises(ValueError, match=f"^{path} row 1: malformed record: 'completion' is missing or null"):
        read_conversations(path)


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"expected a \.jsonl or \.parquet file, or a `datasets` folder"):
        (tmp_path / "d.csv").write_text("a,b\n")
        read_conversations(tmp_path / "d.csv")
    with pytest.raises(DataError, match="no such file"):
        read_conversations(tmp_path / "missing.jsonl")


def tool_record() -> dict:
    """A calculator warm-up record as scripts/make_sft_data.py writes it: a whole tool episode and its schemas."""
    env = Calculator(terms=2, max_value=999)
    example = {"expression": "12 * 34", "answer": "408"}
    return {"messages": play_by_hand(env, example, env.solutions(example)).messages, "tools": env.tool_schemas()}


def test_a_record_with_tools_shows_them_as_rl_does_and_trains_only_the_model_turns(tmp_path: Path) -> None:
    record = tool_record()
    messages, tools = record["messages"], record["tools"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    (conversation,) = read_conversations(write_jsonl(tmp_path / "t.jsonl", [record]))
    assert conversation.tools == tools
    tok = build_tokenizer()
    (sample,) = tokenize([conversation], tok, 2048, "assistant", "skip", Counter())
    ids, mask = sample.input_ids, sample.loss_mask
    # The prompts of both model turns are exactly what RL's EpisodeRunner.encode gives the model.
    first, second = (encode_chat(tok, messages[:turn], add_generation_prompt=True, tools=tools) for turn in (2, 4))
    assert ids[: len(first)] == first and ids[: len(second)] == second and not any(mask[: len(first)])
    assert "<tools>" in tok.decode(first) and first != encode_chat(tok, messages[:2], add_generation_prompt=True)
    # Loss on the tool call and the answer (each with its end of turn), not on the tool's result.
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained == f"{messages[2]['content']}<|im_end|>\n{messages[4]['content']}<|im_end|>\n"
    assert messages[3]["content"] == "408" and "<tool_response>" not in trained
    assert '<tool_call>\n{"name": "calculate", "arguments": {"expression": "12 * 34"}}\n</tool_call>' in trained


def test_tools_survive_parquet(tmp_path: Path) -> None:
    # Two tools whose parameters differ: Parquet's struct type gives each the other's keys, as nulls.
    tools = [*(Calculator().tool_schemas() or []), *(Search().tool_schemas() or [])]
    pq.write_table(pa.Table.from_pylist([tool_record() | {"tools": tools}, RECORDS[0]]), tmp_path / "t.parquet")
    with_tools, without = read_conversations(tmp_path / "t.parquet")
    assert with_tools.tools == tools and without.tools is None


def test_truncation_policies_are_counted() -> None:
    tok = build_tokenizer()
    short = Conversation("a:1", [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "ba"}])
    long = Conversation("a:2", [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y" * 40}])
    prompt_only = Conversation("a:3", [{"role": "user", "content": "z" * 50}, {"role": "assistant", "content": "w"}])
    counts: Counter[str] = Counter()
    kept = tokenize([short, long, prompt_only], tok, 64, "assistant", "skip", counts)
    assert len(kept) == 1 and counts == {"skipped_too_long": 2}
    counts.clear()
    kept = tokenize([short, long, prompt_only], tok, 64, "assistant", "truncate", counts)
    # Cut to 64 tokens, the long one keeps part of its answer; the other loses all of it.
    assert [len(s.input_ids) for s in kept] == [len(kept[0].input_ids), 64]
    assert counts == {"truncated": 2, "no_loss_tokens": 1}


def test_eval_fraction_holds_out_records_by_seed(tmp_path: Path) -> None:
    records = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(20)]
    cfg = SFTDataConfig(path=write_jsonl(tmp_path / "d.jsonl", records), eval_fraction=0.25)
    tok = build_tokenizer()
    first, again, other = (load_sft_data(cfg, tok, 64, seed) for seed in (0, 0, 1))
    assert (len(first.train), len(first.eval)) == (15, 5)
    assert [s.input_ids for s in first.eval] == [s.input_ids for s in again.eval]
    assert [s.input_ids for s in first.eval] != [s.input_ids for s in other.eval]
    assert not {tuple(s.input_ids) for s in first.eval} & {tuple(s.input_ids) for s in first.train}

    separate = SFTDataConfig(path=cfg.path, eval_path=write_jsonl(tmp_path / "e.jsonl", records[:3]))
    data = load_sft_data(separate, tok, 64, 0)
    assert (len(data.train), len(data.eval)) == (20, 3)
    with pytest.raises(ValueError, match="not both"):
        SFTDataConfig(path=cfg.path, eval_fraction=0.1, eval_path=cfg.path)


def test_data_order_is_a_function_of_the_samples_drawn() -> None:
    straight = DataOrder(10, seed=3, shuffle=True)
    drawn = straight.take(7) + straight.take(9)  # into the second epoch
    assert sorted(drawn[:10]) == list(range(10)) and drawn[:10] != list(range(10))
    assert drawn[10:16] != drawn[:6]  # each epoch is a new permutation

    resumed = DataOrder(10, seed=3, shuffle=True)
    resumed.load_state_dict(DataOrder(10, seed=3, shuffle=True).state_dict() | {"consumed": 7})
    assert resumed.take(9) == drawn[7:]
    assert DataOrder(4, seed=3, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="trained on 10 samples, this data has 11"):
        DataOrder(11, seed=3, shuffle=True).load_state_dict(straight.state_dict())
