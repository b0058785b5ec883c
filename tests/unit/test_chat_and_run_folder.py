from pathlib import Path

from lorarl.run_folder import RunFolder, write_folder_atomically
from lorarl.tiny_model import build_tokenizer
from lorarl.trainer.chat import tokenize_with_assistant_mask


def test_assistant_mask_on_a_multi_turn_conversation() -> None:
    tok = build_tokenizer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "ok!"},
    ]
    ids, mask = tokenize_with_assistant_mask(tok, messages)
    assert len(ids) == len(mask)
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    # Exactly the assistant turns, each with its end-of-turn token, nothing of the prompts.
    assert trained == "yo<|im_end|>\nok!<|im_end|>\n"
    assert tok.decode(ids).count("<|im_start|>") == 5


def test_latest_stable_broadcast_ignores_unfinished_folders(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    assert run.latest_stable_broadcast() is None
    for step in (0, 1):
        run.broadcast(step).parent.mkdir(parents=True, exist_ok=True)
        write_folder_atomically(run.broadcast(step), lambda d: (d / "x").write_text("w"), stable_marker=True)
    run.broadcast(2).mkdir()  # being written: no STABLE yet
    assert run.latest_stable_broadcast() == 1
    assert (run.broadcast(1) / "x").read_text() == "w"
    assert not list(run.broadcast(1).parent.glob(".*tmp*"))
