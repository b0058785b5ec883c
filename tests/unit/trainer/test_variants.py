"""Several adapters on one base model ([[variants]]): each trains the adapter it would train alone,
and no variant's gradient or optimizer state reaches another's. No vLLM: the batches are written by hand."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from lorarl.config.run import RLConfig
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.trainer.rl import train, train_step
from lorarl.trainer.variants import set_up_variants
from tests.unit.trainer.test_loss_with_model import rollout_samples

SOLO = {"lora": {"rank": 4, "alpha": 8.0}, "optim": {"lr": 2e-3}}
OTHER = {"lora": {"rank": 8, "alpha": 64.0, "use_rslora": True}, "optim": {"lr": 1e-2}}


def batch(step: int, scale: float) -> list[Rollout]:
    """The rollouts of `step`: the fixed samples, their advantages scaled per step and per variant."""
    return [
        Rollout(prompt_ids=s.input_ids[:3], completion_ids=s.input_ids[3:], completion_logprobs=s.old_logprobs[3:],
                completion_mask=s.loss_mask[3:], advantage=s.advantage * step * scale, reward=0.0,
                policy_version=step - 1, temperature=s.temperature)
        for s in rollout_samples()
    ]  # fmt: skip


def config(tiny_model: Path, out: Path, max_steps: int = 3, **keys: Any) -> RLConfig:
    return RLConfig(model={"name": str(tiny_model), "lora": {"target_modules": ["q_proj", "v_proj", "down_proj"]}},
                    max_steps=max_steps, output_dir=out, monitor={"console": False},
                    trainer={"micro_batch_size": 2, "keep_rollouts": True}, **keys)  # fmt: skip


def sweep(tiny_model: Path, out: Path, max_steps: int = 3, **keys: Any) -> RLConfig:
    """Variant "a" is SOLO, variant "b" another rank, alpha, rsLoRA and learning rate."""
    variants = [{"name": name, "model": {"lora": v["lora"]}, "trainer": {"optim": v["optim"]}}
                for name, v in (("a", SOLO), ("b", OTHER))]  # fmt: skip
    return config(tiny_model, out, max_steps, variants=variants, **keys)


def write_batches(run: RunFolder, scale: float, steps: range) -> None:
    for step in steps:
        RolloutBatch(step, batch(step, scale)).write(run.rollouts(step))


def adapter(folder: Path) -> dict[str, torch.Tensor]:
    assert (folder / "adapter_config.json").is_file(), f"{folder} is not a plain PEFT adapter folder"
    return load_file(folder / "adapter_model.safetensors")


@pytest.mark.slow  # over a second on 2 cores: out of the fast lane
def test_a_variant_trains_the_adapter_of_a_run_of_its_own(tiny_model: Path, tmp_path: Path) -> None:
    alone = config(tiny_model, tmp_path / "alone")
    alone.model.lora = alone.lora.model_copy(update=SOLO["lora"])
    alone.trainer.optim.lr = SOLO["optim"]["lr"]
    write_batches(RunFolder(alone.run_dir).create(), 1.0, range(1, 4))
    train(alone)

    cfg = sweep(tiny_model, tmp_path / "sweep")
    root = RunFolder(cfg.run_dir).create()
    write_batches(root.for_variant("a"), 1.0, range(1, 4))
    write_batches(root.for_variant("b"), -2.0, range(1, 4))  # other batches for b
    train(cfg)

    solo = RunFolder(alone.run_dir)
    for step in range(4):
        mine, its_own = adapter(root.for_variant("a").broadcast(step)), adapter(solo.broadcast(step))
        assert mine.keys() == its_own.keys() and len(mine) == 2 * 3 * 4  # A and B of 3 modules in 4 layers
        for key in mine:
            torch.testing.assert_close(mine[key], its_own[key], rtol=1e-5, atol=1e-7, msg=f"step {step}: {key}")
    a3, b3 = adapter(root.for_variant("a").broadcast(3)), adapter(root.for_variant("b").broadcast(3))
    assert any(a3[k].shape != b3[k].shape for k in a3)  # rank 4 against rank 8
    configs = {v: json.loads((root.for_variant(v).broadcast(3) / "adapter_config.json").read_text()) for v in "ab"}
    assert (configs["a"]["r"], configs["a"]["lora_alpha"], configs["a"]["use_rslora"]) == (4, 8.0, False)
    assert (configs["b"]["r"], configs["b"]["lora_alpha"], configs["b"]["use_rslora"]) == (8, 64.0, True)

    rows = [json.loads(line) for line in root.metrics.read_text().splitlines()]
    assert sorted((r["variant"], r["step"]) for r in rows) == [(v, s) for v in "ab" for s in (1, 2, 3)]
    assert {r["lr"] for r in rows if r["variant"] == "b"} == {OTHER["optim"]["lr"]}
    alone_rows = [json.loads(line) for line in solo.metrics.read_text().splitlines()]
    assert "variant" not in alone_rows[0]
    for mine_row, its_row in zip((r for r in rows if r["variant"] == "a"), alone_rows, strict=True):
        assert mine_row["loss"] == pytest.approx(its_row["loss"], rel=1e-5, abs=1e-7)


def test_no_variant_touches_another_variants_gradients_or_optimizer(tiny_model: Path, tmp_path: Path) -> None:
    cfg = sweep(tiny_model, tmp_path, max_steps=1)
    root = RunFolder(cfg.run_dir).create()
    for variant, scale in (("a", 1.0), ("b", -2.0)):
        write_batches(root.for_variant(variant), scale, range(1, 2))
    trainers = {v.variant.name: v for v in set_up_variants(cfg)}
    model = trainers["a"].trainer.model
    params = {name: dict(((n, p) for n, p in model.named_parameters() if f".variant_{name}." in n))
              for name in ("a", "b")}  # fmt: skip
    assert len(params["a"]) == len(params["b"]) == 24
    for name, v in trainers.items():
        owned = {id(p) for group in v.trainer.optimizer.param_groups for p in group["params"]}
        assert owned == {id(p) for p in params[name].values()}, f"{name}'s optimizer holds other parameters"

    before = {n: p.detach().clone() for n, p in params["a"].items()}
    a = trainers["a"].activate()
    train_step(a, trainers["a"].variant.cfg, 1, a.metrics_logger("trainer", cfg))
    a_after = {n: p.detach().clone() for n, p in params["a"].items()}
    assert any(not torch.equal(a_after[n], before[n]) for n in before)  # a trained

    b = trainers["b"].activate()
    assert all(not p.requires_grad for p in params["a"].values())
    train_step(b, trainers["b"].variant.cfg, 1, b.metrics_logger("trainer", cfg))
    for n, p in params["a"].items():
        assert p.grad is None, f"b's step left a gradient on {n}"
        assert torch.equal(p.detach(), a_after[n]), f"b's step changed {n}"
    state = trainers["b"].trainer.optimizer.state
    assert state and all(id(p) in {id(q) for q in params["b"].values()} for p in state)


@pytest.mark.slow
def test_a_resumed_sweep_trains_the_adapters_of_an_uninterrupted_one(tiny_model: Path, tmp_path: Path) -> None:
    """Stopped after step 2 (each variant's checkpoint), resumed, fed the same batch 3: the same adapters."""

    def run_to(out: Path, max_steps: int, resume: bool = False) -> RunFolder:
        cfg = sweep(tiny_model, out, max_steps, resume={} if resume else None)
        cfg.trainer.ckpt.interval = 2
        root = RunFolder(cfg.run_dir).create()
        for variant, scale in (("a", 1.0), ("b", -2.0)):
            write_batches(root.for_variant(variant), scale, range(1, 4))
        train(cfg)
        return root

    straight = run_to(tmp_path / "straight", 3)
    run_to(tmp_path / "stopped", 2)
    resumed = run_to(tmp_path / "stopped", 3, resume=True)
    for variant in ("a", "b"):
        checkpoint = resumed.for_variant(variant).trainer_checkpoint(2) / "adapter"
        assert adapter(checkpoint).keys() == adapter(resumed.for_variant(variant).broadcast(2)).keys()
        a, b = (adapter(run.for_variant(variant).broadcast(3)) for run in (straight, resumed))
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=f"{variant}: {key}")
    rows = [json.loads(line) for line in resumed.metrics.read_text().splitlines()]
    assert sorted((r["variant"], r["step"]) for r in rows) == [(v, s) for v in "ab" for s in (1, 2, 3)]
