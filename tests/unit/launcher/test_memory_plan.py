"""The memory plan: parameters counted on the meta device, each process's estimate against its device,
refusals in one line naming the keys, `rl`/`sft --dry-run` printing it, and the trainer's estimate
against peaks measured on the CPU (scripts/validate_memory_plan.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import peft
import pytest
from transformers import AutoModelForCausalLM

from lorarl.config.loader import load_config
from lorarl.config.model import LoraConfig
from lorarl.config.run import RLConfig
from lorarl.launcher.memory_plan import MemoryPlan, adapter_parameters, model_shape, rl_memory_plan
from lorarl.launcher.placement import place
from lorarl.run_folder import MARKER
from lorarl.trainer.model import peft_lora_config
from lorarl.written_files import RECORD
from tests.unit.test_learning_check import script

REPO = Path(__file__).resolve().parents[3]
MATH_8GPU = REPO / "configs/gpu/math/8gpu.toml"


def recipe(path: Path, *overrides: str) -> RLConfig:
    return load_config(RLConfig, ["@", str(path), *overrides])


def plan_of(cfg: RLConfig, gpus: int) -> MemoryPlan:
    return rl_memory_plan(cfg, place(cfg, gpus))


def process(plan: MemoryPlan | str, name: str) -> str:
    """The row of process `name` in the plan's table (or in printed text holding it)."""
    text = plan if isinstance(plan, str) else plan.table()
    return next(line for line in text.splitlines() if line.startswith(f"{name} "))


def cells(row: str) -> list[str]:
    """process, devices, estimate, capacity, parts: the columns of a row of the plan's table."""
    return re.split(r"\s{2,}", row, maxsplit=4)


def test_counts_match_the_real_model_and_its_adapter(tiny_model: Path) -> None:
    shape = model_shape(str(tiny_model))
    assert shape is not None and shape.source == f"{tiny_model}/config.json"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    lora = LoraConfig(rank=4, target_modules=["q_proj", "down_proj"])
    wrapped = peft.get_peft_model(model, peft_lora_config(lora))
    assert adapter_parameters(str(tiny_model), lora) == sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


def test_the_8gpu_math_recipe_fits_with_its_parts() -> None:
    plan = plan_of(recipe(MATH_8GPU), 8)
    assert plan.problem() is None
    assert "DeepSeek-R1-Distill-Qwen-7B, 7.62B parameters, vocab 152,064" in plan.header
    assert "lorarl's table of published configs" in plan.header and "GPUs of 80 GiB" in plan.header
    trainer = process(plan, "trainer")
    # 7.62B bf16 weights per rank (no FSDP), a rank-16 adapter in float32 with its AdamW state.
    assert "weights 14.2" in trainer and "activations (checkpointed)" in trainer and "chunks of" in trainer
    assert "per GPU: weights 7.1" in process(plan, "inference-0")  # split over tensor_parallel_size 2


def test_a_trainer_that_cannot_fit_is_refused_naming_the_keys() -> None:
    cfg = recipe(MATH_8GPU, "--trainer.micro_batch_size", "8", "--no-trainer.gradient_checkpointing")
    problem = plan_of(cfg, 8).problem()
    assert problem is not None and "\n" not in problem
    assert problem.startswith("memory plan: trainer on gpu 4-7 needs ~")
    for key in ("lower trainer.micro_batch_size", "set trainer.gradient_checkpointing = true", "trainer.parallel.fsdp"):
        assert key in problem
    # FSDP over the 4 ranks shares out the weights: smaller, with the layer being gathered on top.
    sharded = plan_of(recipe(MATH_8GPU, "--trainer.parallel.fsdp"), 8)
    assert "weights 4.0" in process(sharded, "trainer")  # 14.2 / 4 + 0.4


def test_vllm_without_room_for_one_sequence_is_refused() -> None:
    cfg = recipe(
        MATH_8GPU,
        "--inference.gpu_memory_utilization",
        "0.12",
        "--inference.tensor_parallel_size",
        "1",
        "--inference.gpu_ids",
        "[0, 1]",
    )
    problem = plan_of(cfg, 8).problem()
    assert problem is not None and problem.startswith("memory plan: inference-0 on gpu 0:")
    assert "inference.gpu_memory_utilization" in problem and "inference.tensor_parallel_size" in problem


@pytest.mark.slow
def test_sharing_a_gpu_leaves_the_trainer_the_rest_of_it() -> None:
    one = REPO / "configs/gpu/alphabet_sort/1gpu.toml"
    plan = plan_of(recipe(one), 1)
    fraction = recipe(one).inference.memory_fraction
    assert cells(process(plan, "trainer"))[1:4:2] == ["gpu 0", f"{80 * (1 - fraction):.1f} GiB"]
    squeezed = plan_of(recipe(one, "--inference.gpu_memory_utilization", "0.95"), 1)
    problem = squeezed.problem()
    assert (
        problem is not None and "(trainer.gpu_ids)" in problem and "lower inference.gpu_memory_utilization" in problem
    )


def test_without_a_gpu_the_ram_plan_is_information_unless_far_too_big(tiny_model: Path) -> None:
    cfg = load_config(RLConfig, ["--model.name", str(tiny_model)])
    plan = plan_of(cfg, 0)
    assert plan.problem() is None and "no GPU" in plan.header and "of RAM" in plan.footer
    huge = load_config(
        RLConfig,
        [
            "--model.name",
            str(tiny_model),
            "--seq_len",
            "1000000",
            "--trainer.micro_batch_size",
            "64",
            "--trainer.logits_chunk_size",
            "0",
        ],
    )
    problem = plan_of(huge, 0).problem()
    assert problem is not None and "RAM" in problem and "micro_batch_size" in problem


def test_an_unknown_model_gets_no_plan_and_no_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(RLConfig, ["--model.name", "nobody/unknown-model"])
    plan = plan_of(cfg, 0)
    assert plan.problem() is None and "unknown here" in plan.header


def console(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed console script `script` (beside this interpreter), as a user runs it. Without
    HF_HUB_OFFLINE a hub name passes the model check (the plan takes its shape from lorarl's table)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    exe = str(Path(sys.executable).with_name(script))
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=cwd, check=False)


def assert_refused_in_one_line(result: subprocess.CompletedProcess[str], start: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    err = result.stderr
    assert err.startswith(f"error: memory plan: {start}") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_rl_dry_run_prints_the_plan_and_refuses_in_one_line(tmp_path: Path) -> None:
    args = ["@", str(MATH_8GPU), "--dry-run", "--dry-run-devices", "8", "--output_dir", str(tmp_path)]
    result = console("rl", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "memory plan: deepseek-ai/DeepSeek-R1-Distill-Qwen-7B" in result.stdout and "KV cache" in result.stdout
    assert (tmp_path / "math-r1-7b-8gpu/configs/memory_plan.txt").read_text() in result.stdout
    refused = console("rl", *args, "--trainer.micro_batch_size", "16", cwd=REPO)
    assert_refused_in_one_line(refused, "trainer on gpu 4-7 needs ~")
    assert "lower trainer.micro_batch_size" in refused.stderr


@pytest.mark.slow
def test_sft_dry_run_prints_the_plan_refuses_in_one_line_and_starts_nothing(tiny_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "ab", "completion": "ba"}\n')
    args = ["--model.name", str(tiny_model), "--data.path", str(data), "--output_dir", str(tmp_path / "out")]
    args += ["--dry-run", "--dry-run-devices", "2", "--parallel.dp", "2", "--parallel.fsdp"]
    result = console("sft", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "GPUs of 80 GiB" in result.stdout and cells(process(result.stdout, "sft"))[1:4:2] == ["gpu 0-1", "80.0 GiB"]
    assert "per rank: weights" in result.stdout
    # 1 GiB GPUs: the CUDA runtime's allowance alone fills them.
    refused = console("sft", *args, "--device_memory_gib", "1", cwd=tmp_path)
    assert_refused_in_one_line(refused, "sft on gpu 0-1 needs ~")
    assert sorted(p.name for p in (tmp_path / "out" / "default").iterdir()) == [RECORD, MARKER]  # a dry run's


@pytest.mark.slow  # over 20 s: out of the fast lane
def test_trainer_estimate_within_a_quarter_of_measured_peaks() -> None:
    """Two corners of the grid of docs/memory_plan.md (whose script measures all of it), each in a
    subprocess of its own: the peak of live tensor memory over a real trainer step."""
    validate = script("validate_memory_plan")
    cases = [
        validate.Case("h256-L2-v151936", 1024, lora=True, checkpointing=False),  # the logits' chunks dominate
        validate.Case("h256-L4-v259", 4096, lora=False, checkpointing=True),
    ]
    for case in cases:
        result = validate.run(case)
        assert abs(result.ratio - 1) <= validate.TOLERANCE, (case, result)
