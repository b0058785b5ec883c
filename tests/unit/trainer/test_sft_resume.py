"""`sft --resume` continues a run exactly: same step, same data order, same weights and loss log."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lorarl.trainer.sft as sft
from lorarl.config.loader import load_config
from lorarl.config.sft import SFTConfig
from lorarl.run_folder import RunFolder, RunFolderError
from lorarl.tiny_model import save_tiny_model

# Numbers that do not change between runs; tokens_per_s and times do.
LOGGED = ("loss", "grad_norm", "lr", "padding_frac", "epoch")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sft-resume")
    model = save_tiny_model(root / "tiny", hidden_size=64, num_layers=2)
    words = "apple stone river cloud green paper tiger lemon honey kite".split()
    rows = [{"prompt": w, "completion": w[::-1]} for w in words]  # 10 samples: 4 per step wraps epochs
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, data


def config(setup: tuple[Path, Path], out: Path, lora: bool, *flags: str) -> SFTConfig:
    model, data = setup
    args = ["--model.name", str(model), "--data.path", str(data), "--output_dir", str(out), "--max_steps", "6",
            "--seq_len", "64", "--batch_size", "4", "--micro_batch_size", "2", "--log_interval", "1",
            "--scheduler.type", "cosine", "--scheduler.warmup_steps", "2", "--optim.lr", "1e-2",
            "--data.eval_fraction", "0.2", "--eval.interval", "3", "--no-monitor.console"]  # fmt: skip
    if lora:
        args += ["--model.lora.rank", "8", "--model.lora.dropout", "0.1"]  # dropout: the torch RNG matters
    return load_config(SFTConfig, [*args, *flags])


def result(cfg: SFTConfig) -> tuple[list[dict], dict[str, torch.Tensor]]:
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = next((cfg.run_dir / "final").glob("*.safetensors"))
    return [{k: r[k] for k in (*LOGGED, "step", "eval/loss") if k in r} for r in rows], load_file(weights)


def assert_same_run(a: tuple[list[dict], dict], b: tuple[list[dict], dict]) -> None:
    assert [r["step"] for r in b[0]] == [1, 2, 3, 4, 5, 6]
    assert b[0] == a[0]
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        torch.testing.assert_close(b[1][key], a[1][key], rtol=0, atol=0)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_resume_from_the_latest_checkpoint_after_a_crash(
    setup: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    straight = config(setup, tmp_path / "a", lora)
    sft.train(straight)

    crashing = config(setup, tmp_path / "b", lora, "--ckpt.interval", "2")
    save = sft.save_checkpoint

    def save_then_crash_at_4(run: RunFolder, step: int, *args: object) -> Path:
        path = save(run, step, *args)  # type: ignore[arg-type]
        if step == 4:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(sft, "save_checkpoint", save_then_crash_at_4)
    with pytest.raises(KeyboardInterrupt):
        sft.train(crashing)
    monkeypatch.undo()
    assert RunFolder(crashing.run_dir).checkpoint_steps() == [2, 4]

    resumed = config(setup, tmp_path / "b", lora, "--ckpt.interval", "2", "--resume")
    assert resumed.resume is not None and resumed.resume.step is None
    sft.train(resumed)
    assert_same_run(result(straight), result(resumed))


def test_resume_from_an_earlier_step_rewrites_what_came_after(setup: tuple[Path, Path], tmp_path: Path) -> None:
    straight = config(setup, tmp_path / "a", lora=True)
    sft.train(straight)
    finished = config(setup, tmp_path / "b", True, "--ckpt.interval", "2", "--ckpt.keep_last", "2")
    sft.train(finished)
    assert RunFolder(finished.run_dir).checkpoint_steps() == [4, 6]
    state = json.loads((finished.run_dir / "checkpoints" / "step_4" / "trainer" / "state.json").read_text())
    assert state == {"step": 4, "data": {"consumed": 16, "num_samples": 8}}
    assert (finished.run_dir / "checkpoints" / "step_4" / "trainer" / "adapter" / "adapter_config.json").is_file()

    # Steps 5 and 6 again, as if step 4 had been the last checkpoint.
    resumed = config(setup, tmp_path / "b", True, "--ckpt.interval", "2", "--resume.step", "4")
    RunFolder(resumed.run_dir).discard_after(4)  # as `sft`'s RunFolder.prepare does, before the trainer starts
    assert RunFolder(finished.run_dir).checkpoint_steps() == [4]
    sft.train(resumed)
    assert_same_run(result(straight), result(resumed))
    assert RunFolder(finished.run_dir).checkpoint_steps() == [4, 6]

    with pytest.raises(RunFolderError, match=r"--resume.step 3: no complete checkpoint of that step .* \(\[4, 6\]\)"):
        sft.train(config(setup, tmp_path / "b", True, "--resume.step", "3"))
