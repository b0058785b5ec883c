"""The checks that read the model folder, the init adapter and the environments' prompts accept what
loads and runs (the bad-input table, tests/unit/cli/test_bad_inputs_checks.py, has what they refuse),
and `~` reaches every process `rl` starts expanded."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import peft
import pytest
from transformers import AutoModelForCausalLM

from lorarl.cli import rl
from lorarl.config.loader import load_config
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.launcher.memory_plan import meta_model, model_config
from lorarl.launcher.preflight import (
    PreflightError,
    check_adapter_fits,
    check_model_folder,
    check_prompts,
    warn_single_rollout_groups,
)
from lorarl.tiny_model import save_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("model") / "m", hidden_size=64, num_layers=2)


def _adapter(base: Path, folder: Path, **lora: object) -> Path:
    config = peft.LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], **lora})
    peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(folder)
    return folder


def test_a_whole_model_folder_passes(model: Path) -> None:
    check_model_folder(model)


def test_an_adapter_of_the_same_base_fits_also_with_per_module_ranks(model: Path, tmp_path: Path) -> None:
    net = meta_model(model_config(str(model))[0])  # type: ignore[index]
    check_adapter_fits(LoraConfig(init_adapter=_adapter(model, tmp_path / "a")), net)
    # rank_pattern gives q_proj rank 4 where r is 8: PEFT loads it, so the check does too.
    mixed = _adapter(model, tmp_path / "mixed", rank_pattern={"q_proj": 4})
    check_adapter_fits(LoraConfig(init_adapter=mixed), net)
    # The same tensors read as rank 16 (the config's rank) do not fit.
    with pytest.raises(PreflightError, match="holds tensors of rank 8"):
        check_adapter_fits(LoraConfig(rank=16, init_adapter=_adapter(model, tmp_path / "b")), net)


def test_prompts_must_leave_room_to_generate(model: Path) -> None:
    """The longest prompt the check measures refuses a seq_len of its length and passes one token more."""
    cfg = load_config(RLConfig, ["--model.name", str(model), "--seq_len", "16"])
    with pytest.raises(PreflightError, match="has prompts of") as refused:
        check_prompts(cfg, user_code=False)
    longest = int(re.search(r"prompts of (\d+) tokens", str(refused.value))[1])  # type: ignore[index]
    with pytest.raises(PreflightError):
        check_prompts(cfg.model_copy(update={"seq_len": longest}), user_code=False)
    check_prompts(cfg.model_copy(update={"seq_len": longest + 1}), user_code=False)


def test_a_users_environment_is_built_to_measure_prompts_by_a_start_not_a_dry_run(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run calls no user function; a start builds the (declared) environment and measures it."""
    called = tmp_path / "called"
    (tmp_path / "user_envs.py").write_text(
        "from pathlib import Path\n"
        "from lorarl.orchestrator.envs.base import Environment\n"
        "from lorarl.orchestrator.envs.reverse_text import ReverseText\n"
        "def make() -> Environment:\n"
        f"    Path({str(called)!r}).write_text('')\n"
        "    return ReverseText()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(RLConfig, ["--model.name", str(model), "--orchestrator.env", '[{"id": "user_envs:make"}]'])
    short = cfg.model_copy(update={"seq_len": 16})
    check_prompts(short, user_code=False)
    assert not called.exists()
    with pytest.raises(PreflightError, match="orchestrator.env\\[0\\] 'user_envs:make' has prompts of"):
        check_prompts(short, user_code=True)
    assert called.exists()


def test_groups_of_one_with_a_custom_estimator_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    args = ["--model.name", "m", "--orchestrator.rollouts_per_example", "1", "--orchestrator.advantage.fn", "a:b"]
    with caplog.at_level(logging.WARNING, logger="lorarl.preflight"):
        warn_single_rollout_groups(load_config(RLConfig, args))
        warn_single_rollout_groups(load_config(RLConfig, ["--model.name", "m"]))
    assert [r.message.split(":")[0] for r in caplog.records] == ["orchestrator.rollouts_per_example = 1"]


def test_tilde_reaches_every_process_expanded(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The per-process configs and the commands `rl` writes (what vLLM, the trainer and the
    orchestrator are started with) hold the expanded folders, not "~"."""
    home = model.parent
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    rl.main(["--model.name", f"~/{model.name}", "--output_dir", "~/runs", "--run_name", "r", "--dry-run"])
    configs = home / "runs" / "r" / "configs"
    for role in ("trainer", "orchestrator", "inference"):
        cfg = json.loads((configs / f"{role}.json").read_text())
        assert (cfg["model"]["name"], cfg["output_dir"]) == (str(model), str(home / "runs")), role
    commands = (configs / "commands.txt").read_text()
    assert "~" not in commands and str(model) in commands and str(configs) in commands
    assert not (tmp_path / "~").exists()
