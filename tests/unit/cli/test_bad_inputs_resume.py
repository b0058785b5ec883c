"""Bad input of one class: a resume that changes the run (issue 49). `rl --resume` (its dry run) and
`sft --resume` on a run folder whose marker records the config the run started with, and a complete
checkpoint of step 2: another adapter shape, another base model (by name, or its files changed under
the same name), other environments or variants are refused in one line naming the key and both values
(run_identity.py), and nothing is written (`bad_inputs.assert_refused`). What may change (the learning
rate, max_steps) passes, which shows that the refusals are for their key alone.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from lorarl.cli import rl, sft
from lorarl.config.loader import load_config
from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import save_tiny_model
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, fill

ENVS = '[{"id": "reverse_text", "args": {"max_words": 3}}]'
SFT_LORA = ("--model.lora.rank", "8", "--model.lora.alpha", "16")


def resumes(w: Workspace) -> Path:
    """This file's part of the workspace (`started` makes it)."""
    return w.root / "resumes"


def started(w: Workspace, name: str, kind: str, argv: list[str]) -> None:
    """A run folder `name` as `rl` or `sft` leaves it after two steps: marker with its config, checkpoint 2."""
    cls = RLConfig if kind == "rl" else SFTConfig
    base = ["--output_dir", str(resumes(w)), "--run_name", name]
    cfg = load_config(cls, [*base, *argv])  # type: ignore[type-var]
    run = RunFolder(resumes(w) / name)
    run.prepare(kind, cfg.model_dump(mode="json"), resume=False, overwrite=False)
    for view in [run.for_variant(v.name) for v in getattr(cfg, "variants", [])] or [run]:
        view.write_checkpoint_half(2, "trainer", lambda d: (d / "state.json").write_text('{"step": 2}'))


@pytest.fixture(scope="module", autouse=True)
def runs(ws: Workspace) -> None:
    copy = resumes(ws) / "model-copy"  # the same model under another name, and one whose weights then change
    shutil.copytree(ws.model, copy)
    changed = resumes(ws) / "model-changed"
    shutil.copytree(ws.model, changed)
    save_tiny_model(resumes(ws) / "other-model", hidden_size=32, num_layers=2)
    rank = ("--model.lora.rank", "16", "--model.lora.alpha", "32")
    started(ws, "rl-run", "rl", ["--model.name", str(ws.model), *rank, "--orchestrator.env", ENVS])
    started(ws, "rl-changed", "rl", ["--model.name", str(changed)])
    started(ws, "rl-sweep", "rl", ["--model.name", str(ws.model), "--variants", '[{"name": "a"}, {"name": "b"}]'])
    started(ws, "rl-sweep-half", "rl", ["--model.name", str(ws.model), "--variants", '[{"name": "a"}, {"name": "b"}]'])
    RunFolder(resumes(ws) / "rl-sweep-half").for_variant("b").remove_checkpoint(2)  # a crash between the two
    started(ws, "sft-run", "sft", ["--model.name", str(ws.model), "--data.path", str(ws.data), *SFT_LORA])
    weights = changed / "model.safetensors"  # regenerated in place: same name, other bytes
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    weights.write_bytes(bytes(data))


def resume(name: str, *more: str, model: str = "{w.model}") -> Callable[[Workspace], list[str]]:
    """`rl --resume --dry-run` of run folder `name` with the config it started with, changed by `more`."""

    def args(w: Workspace) -> list[str]:
        # A list flag given twice is one list of both: the run's environments only where `more` has none.
        envs = [] if "--orchestrator.env" in more else ["--orchestrator.env", ENVS]
        keep = ["--model.lora.rank", "16", "--model.lora.alpha", "32", *envs] if name == "rl-run" else []
        folder = str(model).replace("{w.model}", str(w.model)).replace("{resumes}", str(resumes(w)))
        return ["--model.name", folder, "--output_dir", str(resumes(w)), "--run_name", name, *keep, *more,
                "--resume", "--dry-run"]  # fmt: skip

    return args


def sft_resume(*more: str) -> Callable[[Workspace], list[str]]:
    """`sft --resume --dry-run` of the sft run with the config it started with, changed by `more`."""
    return lambda w: ["--model.name", str(w.model), "--output_dir", str(resumes(w)), "--run_name", "sft-run",
                      "--data.path", str(w.data), *SFT_LORA, *(fill(a, w) for a in more),
                      "--resume", "--dry-run"]  # fmt: skip


OTHERWISE = "was trained otherwise:"
CASES: list[Case] = [
    # The adapter's shape.
    ("rl", resume("rl-run", "--model.lora.rank", "8"), f"{OTHERWISE} model.lora.rank: 16 -> 8"),
    ("rl", resume("rl-run", "--model.lora.alpha", "64"), "model.lora.alpha: 32.0 -> 64.0"),
    ("rl", resume("rl-run", "--model.lora.target_modules", '["q_proj"]'), "model.lora.target_modules: ['q_proj', 'k"),
    ("rl", resume("rl-run", "--model.lora.target_modules", "all-linear"), "model.lora.target_modules: ["),
    ("rl", resume("rl-run", "--model.lora.use_rslora"), "model.lora.use_rslora: False -> True"),
    ("rl", resume("rl-run", "--model.lora.exclude_modules", '["o_proj"]'), "model.lora.exclude_modules: [] -> ['o_"),
    # The base model: another one, the same under another path, or its files changed under the same name.
    ("rl", resume("rl-run", model="{resumes}/other-model"), "model.name: '"),
    ("rl", resume("rl-run", model="{resumes}/model-copy"), "model-copy'"),
    ("rl", resume("rl-changed", model="{resumes}/model-changed"), "model files: the files of"),
    # The environments, and a sweep's variants.
    ("rl", resume("rl-run", "--orchestrator.env", '[{"id": "alphabet_sort"}]'), "orchestrator.env.0.id: 'reverse"),
    ("rl", resume("rl-run", "--orchestrator.env", '[{"id": "reverse_text", "args": {"max_words": 4}}]'), "max_w"),
    (
        "rl",
        resume("rl-run", "--orchestrator.env", f'{ENVS[:-1]}, {{"id": "unscramble"}}]'),
        "orchestrator.env.1.id: (none) -> 'unscramble'",
    ),
    ("rl", resume("rl-sweep", "--variants", '[{"name": "b"}, {"name": "a"}]'), "variants.0.name: 'a' -> 'b'"),
    ("rl", resume("rl-sweep", "--variants", '[{"name": "a"}]'), "variants.1.name: 'b' -> (none)"),
    # A variant renamed: named as such, not as a missing checkpoint (it has none under its new name).
    ("rl", resume("rl-sweep", "--variants", '[{"name": "a"}, {"name": "c"}]'), "variants.1.name: 'b' -> 'c'"),
    ("rl", resume("rl-sweep", "--variants", '[{"name": "x"}, {"name": "y"}]'), "variants.0.name: 'a' -> 'x'"),
    (
        "rl",
        resume("rl-sweep", "--variants", '[{"name": "a", "model": {"lora": {"rank": 16}}}, {"name": "b"}]'),
        "variants.0.model.lora.rank: (none) -> 16",
    ),
    # The same run, without the checkpoint asked for (or one complete for every variant).
    ("rl", resume("rl-run", "--resume.step", "3"), "--resume.step 3: no complete checkpoint of that step in"),
    (
        "rl",
        resume("rl-sweep-half", "--variants", '[{"name": "a"}, {"name": "b"}]'),
        "--resume: no complete checkpoint in",
    ),
    # A max_steps the checkpoint is already past: sft rewrote final/ without a word.
    ("rl", resume("rl-run", "--max_steps", "1"), "--resume: max_steps = 1 is below step 2, the checkpoint the run"),
    ("sft", sft_resume("--max_steps", "1"), "--resume: max_steps = 1 is below step 2"),
    # sft's adapter and base alike.
    ("sft", sft_resume("--model.lora.rank", "32"), f"{OTHERWISE} model.lora.rank: 8 -> 32"),
    ("sft", sft_resume("--model.name", "{w.root}/resumes/other-model"), "model.name: '"),
    ("sft", sft_resume("--model.lora.target_modules", '["v_proj"]'), "model.lora.target_modules: ["),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_a_resume_that_changes_the_run_is_refused_in_one_line(
    ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    command, args, names = case
    assert_refused(ws, capsys, command, args(ws), names)


def test_what_may_change_passes_and_is_named(
    ws: Workspace, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The cases' runs resume as they started, with another learning rate and more steps: the refusals
    above are for their keys alone."""
    before = json.loads((resumes(ws) / "rl-run" / "run.json").read_text())
    with caplog.at_level(logging.INFO):
        rl.main(resume("rl-run", "--trainer.optim.lr", "1e-4", "--max_steps", "30")(ws))
        sft.main(sft_resume("--optim.lr", "1e-4")(ws))
    capsys.readouterr()
    said = [r.getMessage() for r in caplog.records if "changed since the run started" in r.getMessage()]
    assert len(said) == 2 and "trainer.optim.lr: 5e-05 -> 0.0001" in said[0] and "max_steps: 20 -> 30" in said[0]
    assert "optim.lr: 0.001 -> 0.0001" in said[1]
    assert json.loads((resumes(ws) / "rl-run" / "run.json").read_text()) == before  # a dry run keeps the marker


def test_a_dry_run_names_the_newer_checkpoint_a_resume_would_skip(
    tmp_path: Path, ws: Workspace, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """sft's dry run said nothing of a damaged newest checkpoint, which the resume itself skips with a
    warning (the trainer says it; a dry run has none)."""
    shutil.copytree(resumes(ws) / "sft-run", tmp_path / "sft-run")
    run = RunFolder(tmp_path / "sft-run")
    run.write_checkpoint_half(3, "trainer", lambda d: (d / "state.json").write_text('{"step": 3}'))
    (run.checkpoint(3) / "trainer" / "state.json").write_text("{}")  # cut short: not the size recorded
    argv = [a if a != str(resumes(ws)) else str(tmp_path) for a in sft_resume()(ws)]
    with caplog.at_level(logging.INFO):
        sft.main(argv)
    capsys.readouterr()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("skipping checkpoint step 3: ") for m in said), said
    assert "resuming from checkpoint step 2 in " + str(run.root) in said
