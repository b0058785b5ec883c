"""A sweep in one run: `rl` with four [[variants]] (different ranks and learning rates) trains four
adapters on one base model and samples all of them through the one vLLM server it starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import free_port
from tests.integration.helpers import ModelListWatcher, metrics, rl_config, run_rl, write_config

pytestmark = pytest.mark.integration

# name -> (rank, lr): r16 and r16-fast differ in the learning rate alone.
VARIANTS = {"r1": (1, 1e-3), "r4": (4, 1e-3), "r16": (16, 1e-3), "r16-fast": (16, 1e-2)}


@pytest.fixture(scope="module")
def sweep(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("runs")
    port = free_port()
    cfg = rl_config(tiny_model, out, "sweep", max_steps=2, **{"inference.port": port})
    cfg["model"]["lora"] = {"alpha": 64, "use_rslora": True}
    cfg["orchestrator"] |= {"batch_size": 8, "delete_old_broadcasts": False,
                            "eval": {"interval": 2, "num_examples": 2, "rollouts_per_example": 2}}  # fmt: skip
    cfg["trainer"]["ckpt"] = {"interval": 2}
    cfg["variants"] = [{"name": name, "model": {"lora": {"rank": rank}}, "trainer": {"optim": {"lr": lr}}}
                       for name, (rank, lr) in VARIANTS.items()]  # fmt: skip
    config = write_config(cfg, out / "rl.json")
    with ModelListWatcher(f"http://127.0.0.1:{port}") as watcher:
        result = run_rl(config, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"run": out / "sweep", "seen": watcher.seen, "result": result}


def test_vllm_is_started_for_every_variant(sweep: dict) -> None:
    command = (sweep["run"] / "configs" / "commands.txt").read_text()
    assert "--max-lora-rank 16" in command and "--max-loras 8" in command  # 2 versions for each of 4 variants
    for name in VARIANTS:
        assert {f"sweep-{name}-step{s}" for s in (0, 1, 2)} <= sweep["seen"], sorted(sweep["seen"])


def test_each_variant_broadcasts_its_own_adapter_every_step(sweep: dict) -> None:
    run: Path = sweep["run"]
    final = {}
    for name, (rank, _) in VARIANTS.items():
        for step in (0, 1, 2):
            folder = run / "broadcasts" / name / f"step_{step}"
            assert (folder / "STABLE").exists(), folder
            assert json.loads((folder / "adapter_config.json").read_text())["r"] == rank
        final[name] = load_file(run / "broadcasts" / name / "step_2" / "adapter_model.safetensors")
        assert (run / "checkpoints" / name / "step_2" / "trainer" / "adapter" / "adapter_config.json").is_file()
        assert (run / "checkpoints" / name / "step_2" / "orchestrator").is_dir()
        assert (run / "samples" / name / "step_1.jsonl").is_file()
    # The same rank, another learning rate: another adapter.
    assert any(not torch.equal(final["r16"][k], final["r16-fast"][k]) for k in final["r16"])


def test_each_variant_has_its_own_metrics_and_evals(sweep: dict) -> None:
    rows = metrics(sweep["run"])
    for name, (_, lr) in VARIANTS.items():
        mine = [r for r in rows if r.get("variant") == name]
        for component in ("trainer", "orchestrator"):
            assert sorted(r["step"] for r in mine if r["component"] == component) == [1, 2], (name, component)
        assert {r["lr"] for r in mine if r["component"] == "trainer"} == {lr}
        assert {0, 2} <= {r["step"] for r in mine if r["component"] == "eval"}
        # Each batch is scored by the trainer with the adapter vLLM sampled it with: its variant's, not another's.
        diffs = [r["mismatch/logprob_abs_diff"] for r in mine if "mismatch/logprob_abs_diff" in r]
        assert diffs and all(d < 1e-3 for d in diffs), (name, diffs)
    assert all("variant" in r for r in rows)
    assert sweep["result"].stdout.count("r16-fast step") == 2  # the console's line per variant and step
