"""Policy watchers. The hand-off latency: the trainer writes when its optimizer step ended beside the
adapter (`write_policy`), and `AdapterWatcher` measures from then until the version is loaded on every
worker. With full fine-tuning (`WeightsWatcher`) each version is a whole model that replaces the last."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from lorarl.config.model import LoraConfig
from lorarl.orchestrator.adapters import AdapterWatcher, WeightsWatcher
from lorarl.run_folder import RunFolder
from lorarl.tiny_model import build_model, build_tokenizer
from lorarl.trainer.broadcast import write_policy
from lorarl.trainer.model import apply_lora


class Pool:
    """Stand-in for the workers: loading takes `load_s` (a real pool awaits every worker)."""

    def __init__(self, load_s: float) -> None:
        self.load_s, self.loaded = load_s, []

    async def served(self) -> list[tuple[object, list[object]]]:
        return []  # no adapter of another run

    async def load_adapter(self, name: str, path: str) -> None:
        await asyncio.sleep(self.load_s)
        self.loaded.append(name)

    async def unload_adapter(self, name: str) -> None:
        self.loaded.remove(name)

    async def reload_weights(self, path: str) -> None:
        self.loaded.append(path)


def test_live_latency_runs_from_the_optimizer_step_to_the_load_on_the_workers(tmp_path: Path) -> None:
    tok = build_tokenizer()
    model = apply_lora(build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2),
                       LoraConfig(rank=4))  # fmt: skip
    run = RunFolder(tmp_path / "run")
    write_policy(model, run.broadcast(0))  # the starting adapter: no optimizer step made it
    step_end = time.time() - 0.5  # the optimizer step ended half a second before the write
    write_policy(model, run.broadcast(1), updated_at=step_end)
    assert run.broadcast_updated_at(0) is None and run.broadcast_updated_at(1) == step_end

    pool = Pool(load_s=0.2)
    watcher = AdapterWatcher(pool, run, "exp")  # type: ignore[arg-type]
    assert asyncio.run(watcher.refresh())
    [live] = watcher.take_live_latencies()
    assert pool.loaded == ["exp-step1"]
    assert 0.5 + 0.2 <= live <= time.time() - step_end  # from the step's end, through the load
    assert watcher.take_live_latencies() == []  # each version is reported once


def test_versions_written_faster_than_they_are_loaded_are_deleted_with_the_unloaded(tmp_path: Path) -> None:
    """The trainer may write versions 1 and 2 before the watcher looks: it loads 2, and 1, never to
    be loaded, goes with the unloaded version 0 (orchestrator.delete_old_broadcasts)."""
    tok = build_tokenizer()
    model = apply_lora(build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2),
                       LoraConfig(rank=4))  # fmt: skip
    run = RunFolder(tmp_path / "run")
    write_policy(model, run.broadcast(0))
    pool = Pool(load_s=0.0)
    watcher = AdapterWatcher(pool, run, "exp", delete_unloaded=True)  # type: ignore[arg-type]
    assert asyncio.run(watcher.refresh())
    for step in (1, 2):
        write_policy(model, run.broadcast(step), updated_at=time.time())
    assert asyncio.run(watcher.refresh())
    assert pool.loaded == ["exp-step2"]
    assert sorted(p.name for p in run.broadcast(2).parent.iterdir()) == ["step_2"]


def test_full_finetune_versions_are_whole_models_reloaded_under_the_served_name(tmp_path: Path) -> None:
    """Every version is written as a model folder and reloaded in place; requests keep naming the
    served model. A version nothing holds is deleted once a newer one is on the workers."""
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    model = build_model(len(tok), tok.eos_token_id, tok.pad_token_id, hidden_size=64, num_layers=2)
    run = RunFolder(tmp_path / "run")
    write_policy(model, run.broadcast(0))
    reloaded = AutoModelForCausalLM.from_pretrained(run.broadcast(0))
    for name, weight in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], weight), name
    pool = Pool(load_s=0.0)
    watcher = WeightsWatcher(pool, run, "models/base", delete_unloaded=True)  # type: ignore[arg-type]
    assert asyncio.run(watcher.refresh())
    assert watcher.acquire() == (0, "models/base")
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    write_policy(model, run.broadcast(1), updated_at=time.time())
    assert asyncio.run(watcher.refresh())
    assert pool.loaded == [str(run.broadcast(0).resolve()), str(run.broadcast(1).resolve())]
    assert watcher.acquire() == (1, "models/base")
    assert run.broadcast(0).is_dir()  # held by work still in flight
    asyncio.run(watcher.release(0))
    assert not run.broadcast(0).exists() and run.broadcast(1).is_dir()
