"""serve/folder.py: a `tinker://` path from a request names a folder of this server's run folder and
nothing else: not another form, not `..`, not an absolute path, not through a symlink leading out."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.serve.folder import ServeFolder, check_name, parse_tinker_path, tinker_path
from lorarl.serve.ops import BadRequest

MODEL = "s0123456789ab:train:0"


def test_the_sdks_form_round_trips() -> None:
    path = tinker_path(MODEL, "weights", "step-3")
    assert parse_tinker_path(path) == (MODEL, "weights", "step-3")
    assert parse_tinker_path(tinker_path(MODEL, "sampler_weights", "s.1")) == (MODEL, "sampler_weights", "s.1")


@pytest.mark.parametrize(
    "path",
    [
        f"tinker://{MODEL}/weights/..",
        f"tinker://{MODEL}/weights/../../etc",
        f"tinker://{MODEL}/weights/a/../b",
        f"tinker://{MODEL}/weights/.hidden",
        f"tinker://{MODEL}/weights/-x",
        f"tinker://{MODEL}/weights/",
        f"tinker://{MODEL}/other/x",
        "tinker://../weights/x",
        "tinker://s0123456789ab:train:0/../../weights/x",
        "tinker:///etc/passwd",
        "/etc/passwd",
        "file:///etc/passwd",
        f"tinker://{MODEL.replace('s', 'S', 1)}/weights/x",
        "tinker://sZZZZZZZZZZZZ:train:0/weights/x",
        f"tinker://{MODEL}/weights/{'a' * 129}",
    ],
)
def test_other_forms_are_refused_naming_the_field(path: str) -> None:
    with pytest.raises(BadRequest, match=r"^model_path: "):
        parse_tinker_path(path, "model_path")


@pytest.mark.parametrize("name", ["..", ".", "/abs", "a/b", "a\\b", "", "x\n", "a b"])
def test_a_name_is_one_plain_file_name(name: str) -> None:
    with pytest.raises(BadRequest, match=r"^path: "):
        check_name(name)


def test_tenant_state_is_under_the_run_folder(tmp_path: Path) -> None:
    folder = ServeFolder(tmp_path / "run")
    state = folder.tenant_state(MODEL, "weights", "step-1")
    assert state == tmp_path / "run" / "tenants" / MODEL.replace(":", "-") / "weights" / "step-1"


@pytest.mark.parametrize("where", ["tenants", "model", "state"])
def test_a_symlink_leading_out_of_the_run_folder_is_refused(tmp_path: Path, where: str) -> None:
    folder = ServeFolder(tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    links = {
        "tenants": folder.root / "tenants",
        "model": folder.root / "tenants" / MODEL.replace(":", "-"),
        "state": folder.root / "tenants" / MODEL.replace(":", "-") / "weights" / "step-1",
    }
    links[where].parent.mkdir(parents=True, exist_ok=True)
    links[where].symlink_to(outside, target_is_directory=True)
    with pytest.raises(BadRequest, match="outside the run folder"):
        folder.tenant_state(MODEL, "weights", "step-1")


def test_a_symlink_within_the_run_folder_is_followed(tmp_path: Path) -> None:
    folder = ServeFolder(tmp_path / "run")
    (folder.root / "elsewhere").mkdir(parents=True)
    (folder.root / "tenants").symlink_to(folder.root / "elsewhere", target_is_directory=True)
    assert folder.tenant_state(MODEL, "weights", "a").parent.parent.parent == folder.root / "tenants"
