"""The bad-input table's tools, shared by its files (`test_bad_inputs*.py`): the workspace a user has
on disk when the bad input arrives, builders of each command's arguments, and the check every case
makes: exit code 2, one line naming the key, file or line at fault, no traceback, and no file written
or deleted anywhere (a previous run, a user's folder, the model and the adapter stay as they were).

Each file of the table holds the cases of one class of bad input and calls `assert_refused`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import peft
import pytest
from transformers import AutoModelForCausalLM

from lorarl.cli import inference, merge, orchestrator, plot, rl, serve, sft, trainer
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import save_tiny_model


class Workspace:
    """What a user has on disk when the bad input arrives."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = save_tiny_model(root / "model", hidden_size=64, num_layers=2)
        self.adapter = root / "adapter"
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        peft.get_peft_model(AutoModelForCausalLM.from_pretrained(self.model), lora).save_pretrained(self.adapter)
        self.out = root / "outputs"
        previous = RunFolder(self.out / "previous")  # a finished rl run, checkpoint of step 2 included
        previous.prepare("rl", {}, resume=False, overwrite=False)
        previous.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text('{"step": 2}'))
        previous.metrics.write_text('{"step": 1, "component": "trainer"}\n')
        self.user = root / "thesis"  # a user's own folder
        self.user.mkdir()
        (self.user / "chapter1.tex").write_text("precious")
        (self.out / "mine").mkdir(parents=True)
        (self.out / "mine" / "notes.txt").write_text("mine")
        self.earlier_merge = root / "merged"
        self.earlier_merge.mkdir()
        (self.earlier_merge / "lorarl-merge.json").write_text("{}")
        (self.earlier_merge / "config.json").write_text("{}")
        self.data = self.write("chat.jsonl", json.dumps({"prompt": "abc", "completion": "cba"}) + "\n")

    def write(self, name: str, text: str | bytes) -> Path:
        path = self.root / "inputs" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """Size and mtime of every entry, a link's own (one may lead nowhere; what it leads to in the
        workspace has an entry of its own)."""
        stats = {str(p.relative_to(self.root)): p.lstat() for p in self.root.rglob("*")}
        return {name: (s.st_size, s.st_mtime_ns) for name, s in stats.items()}


Case = tuple[str, Callable[[Workspace], list[str]], str]  # (command, its arguments, what the message names)


def fill(arg: str, w: Workspace) -> str:
    """`{w.model}` and the like replaced by the workspace's paths (JSON braces left alone)."""
    return re.sub(r"\{w\.(\w+)\}", lambda m: str(getattr(w, m.group(1))), arg)


def rl_args(*args: str, run_name: str = "new") -> Callable[[Workspace], list[str]]:
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(w.out), "--run_name", run_name,
                      *(fill(a, w) for a in args), "--dry-run"]  # fmt: skip


def serve_args(*args: str) -> Callable[[Workspace], list[str]]:
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(w.out), "--run_name", "new-serve",
                      *(fill(a, w) for a in args), "--dry-run"]  # fmt: skip


def sft_args(*args: str, data: str = "{w.data}", run_name: str = "new-sft") -> Callable[[Workspace], list[str]]:
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(w.out), "--run_name", run_name,
                      "--data.path", fill(data, w), *(fill(a, w) for a in args)]  # fmt: skip


def merge_args(base: str = "{w.model}", adapter: str = "{w.adapter}", out: str = "{w.root}/new-merge",
               *more: str) -> Callable[[Workspace], list[str]]:  # fmt: skip
    return lambda w: ["--base", fill(base, w), "--adapter", fill(adapter, w), "--out", fill(out, w), *more]


COMMANDS = {
    "rl": rl.main,
    "sft": sft.main,
    "lorarl-merge": merge.main,
    "lorarl-plot": plot.main,
    "lorarl-trainer": trainer.main,
    "lorarl-orchestrator": orchestrator.main,
    "lorarl-inference": inference.main,
    "lorarl-serve": serve.main,
}


def refused(command: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """stderr of `command` given `argv`, which must exit with code 2."""
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS[command](argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    return err


def assert_refused(w: Workspace, capsys: pytest.CaptureFixture[str], command: str, argv: list[str], names: str) -> None:
    """`command` refuses `argv` in one "error: " line containing `names` and leaves the workspace as it was."""
    before = w.snapshot()
    cwd = os.getcwd()
    os.chdir(w.root)  # nothing may land in the working directory either
    try:
        err = refused(command, argv, capsys)
    finally:
        os.chdir(cwd)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], err
    assert w.snapshot() == before


def case_ids(cases: list[Case]) -> list[str]:
    return [f"{c[0]}-{i}" for i, c in enumerate(cases)]
