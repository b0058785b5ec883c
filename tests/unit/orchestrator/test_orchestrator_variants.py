"""A sweep's orchestrator ([[variants]]): one loop per variant through one shared worker pool, each
with its own adapters, batches, samples, evals, checkpoints and metrics rows. No vLLM: the stand-in
pool and trainer of test_orchestrator_loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lorarl.orchestrator.orchestrator import build_orchestrators, run_all
from lorarl.rollouts import RolloutBatch
from lorarl.run_folder import RunFolder
from tests.unit.orchestrator.test_orchestrator_loop import TOKENIZER, InstantPool, config, trainer

VARIANTS = [
    {"name": "a"},
    {"name": "r16", "model": {"lora": {"rank": 16}}, "orchestrator": {"env": [{"id": "alphabet_sort"}]}},
]


def run_sweep(cfg_path: Path, resume: bool = False) -> tuple[RunFolder, InstantPool]:
    top = {"variants": VARIANTS, "trainer": {"ckpt": {"interval": 2}}, "resume": {} if resume else None}
    cfg = config(cfg_path, top, max_async_level=1,
                 skip_zero_advantage=False,  # alphabet_sort rewards the stand-in's answers alike
                 eval={"interval": 2, "num_examples": 1, "rollouts_per_example": 1})  # fmt: skip
    pool = InstantPool()

    async def sweep() -> None:
        orchestrators = build_orchestrators(cfg, pool, TOKENIZER)  # type: ignore[arg-type]
        assert [o.run_folder.variant for o in orchestrators] == ["a", "r16"]
        trainers = [trainer(o.run_folder, cfg.max_steps, o.step - 1, 2) for o in orchestrators]
        await asyncio.gather(run_all(orchestrators), *trainers)

    asyncio.run(sweep())
    return RunFolder(cfg.run_dir), pool


def test_each_variant_samples_its_own_adapters_through_the_shared_pool(tmp_path: Path) -> None:
    root, pool = run_sweep(tmp_path)
    assert pool.loaded == {"run-a-step4", "run-r16-step4"}  # each variant's final policy stays served
    rows = [json.loads(line) for line in root.metrics.read_text().splitlines()]
    for variant, env in (("a", "reverse_text"), ("r16", "alphabet_sort")):
        run = root.for_variant(variant)
        for step in range(1, 5):
            assert len(RolloutBatch.read(run.rollouts(step), step).rollouts) == 4
            assert run.samples(step).is_file()
        mine = [r for r in rows if r.get("variant") == variant]
        assert [r["step"] for r in mine if r["component"] == "orchestrator"] == [1, 2, 3, 4]
        assert all(f"env/{env}/reward" in r for r in mine if r["component"] == "orchestrator")  # its own envs
        assert {r["step"] for r in mine if r["component"] == "eval"} >= {0, 4}
        assert (run.orchestrator_checkpoint(2) / "state.json").is_file()
    assert all("variant" in r for r in rows)
    assert not (root.root / "rollouts" / "step_1").exists()  # nothing at the single-adapter places


def test_a_resumed_sweep_continues_every_variant_from_their_common_checkpoint(tmp_path: Path) -> None:
    root, _ = run_sweep(tmp_path)
    # Variant r16's checkpoint 4 is complete, a's is not (a crash between the two): both resume from 2.
    for variant in ("a", "r16"):
        run = root.for_variant(variant)
        run.write_checkpoint_half(4, "trainer", lambda d: (d / "state.json").write_text("{}"))
    (root.for_variant("a").checkpoint(4) / "trainer" / "state.json").write_text("{")  # cut short
    assert root.sweep_checkpoint_steps(["a", "r16"]) == [2]
    first = {v: RolloutBatch.read(root.for_variant(v).rollouts(3), 3).rollouts for v in ("a", "r16")}
    root.clear_regenerated()
    run_sweep(tmp_path, resume=True)
    for variant, rollouts in first.items():
        again = RolloutBatch.read(root.for_variant(variant).rollouts(3), 3).rollouts
        assert sorted(r.prompt_ids for r in again) == sorted(r.prompt_ids for r in rollouts)  # the same examples
