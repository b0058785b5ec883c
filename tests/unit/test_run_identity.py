"""A resume is the same run (run_identity.py): what may not change is refused in one line, before the
folder is touched; what may change is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from lorarl.run_folder import RunFolder, RunFolderError
from lorarl.run_identity import base_fingerprint, compare, flatten, record


def base(folder: Path, value: float = 0.0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))
    save_file({"w": torch.full((4, 4), value)}, str(folder / "model.safetensors"))
    return folder


def config(model: Path, **changes: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "max_steps": 4,
        "resume": None,
        "model": {"name": str(model), "lora": {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj"]}},
        "trainer": {"optim": {"lr": 1e-3}},
        "orchestrator": {"env": [{"id": "reverse_text", "weight": 1.0, "args": {"max_words": 1}}]},
        "variants": [],
    }
    for key, value in changes.items():
        *path, last = key.split(".")
        node = cfg
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[last] = value
    return cfg


def test_flatten_names_dicts_and_lists_of_dicts_by_key_and_index() -> None:
    flat = flatten(config(Path("m")))
    assert flat["model.lora.rank"] == 8 and flat["model.lora.target_modules"] == ["q_proj"]
    assert flat["orchestrator.env.0.id"] == "reverse_text" and flat["orchestrator.env.0.args.max_words"] == 1
    assert flat["variants"] == [] and flat["resume"] is None


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("model.lora.rank", 16, "model.lora.rank: 8 -> 16"),
        ("model.lora.alpha", 32.0, "model.lora.alpha: 16.0 -> 32.0"),
        (
            "model.lora.target_modules",
            ["q_proj", "v_proj"],
            "model.lora.target_modules: ['q_proj'] -> ['q_proj', 'v_proj']",
        ),
        ("orchestrator.env.0.id", "alphabet_sort", "orchestrator.env.0.id: 'reverse_text' -> 'alphabet_sort'"),
        ("orchestrator.env.0.args.max_words", 3, "orchestrator.env.0.args.max_words: 1 -> 3"),
        ("variants", [{"name": "a"}], "variants.0.name: (none) -> 'a'"),
    ],
)
def test_what_the_checkpoints_were_trained_as_is_refused(tmp_path: Path, key: str, value: Any, said: str) -> None:
    model = base(tmp_path / "m")
    refused, changed = compare(record(config(model)), record(config(model, **{key: value})))
    assert said in refused and changed == []


def test_hyperparameters_may_change_and_are_named(tmp_path: Path) -> None:
    model = base(tmp_path / "m")
    after = config(
        model, max_steps=8, resume={"step": 2}, **{"trainer.optim.lr": 1e-4, "orchestrator.env.0.weight": 2.0}
    )
    refused, changed = compare(record(config(model)), record(after))
    assert refused == []
    assert changed == [
        "max_steps: 4 -> 8",
        "orchestrator.env.0.weight: 1.0 -> 2.0",
        "trainer.optim.lr: 0.001 -> 0.0001",
    ]


def test_the_base_models_files_changed_under_the_same_name_are_refused(tmp_path: Path) -> None:
    model = base(tmp_path / "m")
    before = record(config(model))
    base(model, value=1.0)  # regenerated in place
    refused, _ = compare(before, record(config(model)))
    assert refused == [f"model files: the files of {model} changed since the run started"]
    assert base_fingerprint("Qwen/Qwen3-4B") is None  # a hub name: compared by name only


def test_a_marker_from_before_the_check_compares_as_equal(tmp_path: Path) -> None:
    assert compare({"lorarl": 1, "kind": "rl"}, record(config(base(tmp_path / "m"), max_steps=9))) == ([], [])


def test_the_folder_refuses_a_changed_run_in_one_line_and_keeps_its_marker(tmp_path: Path) -> None:
    model = base(tmp_path / "m")
    run = RunFolder(tmp_path / "run")
    run.prepare("rl", config(model), resume=False, overwrite=False)
    marker = run.marker.read_text()
    for dry_run in (True, False):
        with pytest.raises(
            RunFolderError, match=r"^--resume: .* was trained otherwise: model.lora.rank: 8 -> 4\. "
        ) as e:
            run.prepare("rl", config(model, **{"model.lora.rank": 4}), resume=True, overwrite=False, dry_run=dry_run)
        assert "\n" not in str(e.value) and run.marker.read_text() == marker
    said = run.prepare("rl", config(model, max_steps=6), resume=True, overwrite=False)
    assert said.endswith("changed since the run started: max_steps: 4 -> 6")
    assert run.prepare("rl", config(model, max_steps=6), resume=True, overwrite=False, dry_run=True).endswith(
        "nothing cleared"
    )
