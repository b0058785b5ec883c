"""scripts/gpu_acceptance.sh up to its first GPU need: its --dry-run names the shapes by hub id and
passes `rl --dry-run` with the very flags of its runs (memory plan included), and its report reads
a run folder in the format `rl` writes (the memory plan from that dry run, metrics rows with the keys
the trainer and orchestrator log, an nvidia-smi log as its poller writes it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_acceptance.sh"


def run_script(out: Path, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    # A free port: the dry run checks it, and the quickstart's may be taken by a test's vLLM server.
    env = {
        **os.environ,
        "OUT_DIR": str(out),
        "PY": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
        "PORT": str(free_port()),
    }
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env, cwd=REPO, check=False)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("acceptance")
    result = run_script(out, "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result.stdout


@pytest.mark.slow
def test_the_dry_run_plans_both_shapes_on_one_gpu_and_the_small_one_in_nf4_too(dry_run: tuple[Path, str]) -> None:
    out, stdout = dry_run
    assert "596.0M parameters, vocab 151,936" in stdout and "4.02B parameters, vocab 151,936" in stdout
    assert stdout.count("inference.colocate_with_trainer") == 3 and stdout.count("GPUs of 139 GiB") == 3
    runs = (("qwen3-0.6B", "Qwen/Qwen3-0.6B", "none"), ("qwen3-0.6B-nf4", "Qwen/Qwen3-0.6B", "nf4"),
            ("qwen3-4B", "Qwen/Qwen3-4B", "none"))  # fmt: skip
    for name, hub_id, quantization in runs:
        trainer = json.loads((out / name / "configs" / "trainer.json").read_text())
        assert trainer["model"]["name"] == hub_id  # planned from lorarl's shapes: no model built
        assert trainer["model"]["quantization"] == quantization
        orchestrator = json.loads((out / name / "configs" / "orchestrator.json").read_text())
        assert trainer["model"]["dtype"] == "bfloat16" and trainer["trainer"]["ckpt"]["interval"] == 1
        assert orchestrator["orchestrator"]["max_async_level"] == 0
    assert json.loads((out / "qwen3-4B" / "configs" / "trainer.json").read_text())["model"]["lora"]["rank"] == 64
    assert stdout.count("weights (nf4)") == 1  # the nf4 run's trainer plan
    assert not (out / "models").exists() or not any((out / "models").iterdir())


@pytest.mark.slow
def test_without_a_gpu_it_stops_in_one_line(tmp_path: Path) -> None:
    result = run_script(tmp_path)
    assert result.returncode == 1
    assert (
        result.stderr.strip() == "gpu_acceptance: no GPU visible to torch; run it on a GPU machine, or with --dry-run"
    )


@pytest.mark.slow
def test_the_report_puts_measured_peaks_beside_the_plan(dry_run: tuple[Path, str], tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "configs").mkdir(parents=True)
    shutil.copy(dry_run[0] / "qwen3-4B" / "configs" / "memory_plan.txt", run / "configs")
    # The trainer's estimate as the plan's table has it: "trainer  gpu 0  52.5 GiB  97.3 GiB  weights ..."
    plan = (run / "configs" / "memory_plan.txt").read_text()
    (trainer_plan,) = re.findall(r"^trainer +gpu 0 +(\d+\.\d) GiB ", plan, re.M)
    rows = [
        {
            "component": "trainer",
            "step": s,
            "time/step": 2.0,
            "tokens_per_s": 9000.0,
            "time/broadcast": 0.4,
            "time/checkpoint": 1.5,
            "mismatch/logprob_abs_diff": 0.003,
            "memory/peak_gib": 30.5,
        }
        for s in (1, 2, 3)
    ]
    rows += [
        {"component": "orchestrator", "step": s, "time/step": 20.0, "tokens_per_s": 800.0, "perf/adapter_live_s": 1.25}
        for s in (1, 2, 3)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    smi = tmp_path / "smi.log"
    smi.write_text(
        "proc 11 40000 python -m vllm.entrypoints.openai.api_server --model m\n"
        "proc 12 33000 python -m lorarl.cli.trainer @ c.json\ngpu 0 74000\n"
    )
    report = REPO / "scripts" / "gpu_acceptance_report.py"
    result = subprocess.run(
        [sys.executable, str(report), str(run), str(smi)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "   3       2.00          9,000    20.00         800       3.00e-03     0.40        1.25    1.50" in lines[4]
    assert lines[0] == "== per step (no adapter found)" and lines[6].startswith("process")
    assert lines[7].split()[:3] == ["inference-0", "41.7", "39.1"]  # 40,000 MiB
    assert lines[8].split()[:3] == ["trainer", trainer_plan, "32.2"]
    assert lines[9].split()[0] == "30.5"
    assert lines[10].startswith("gpu 0: 72.3 GiB used at most")
    assert lines[10].endswith(f"together {41.7 + float(trainer_plan):.1f} GiB")


def test_the_report_fails_a_run_that_stopped_early(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"component": "trainer", "step": 1, "memory/peak_gib": 1.0}) + "\n"
    )
    report = REPO / "scripts" / "gpu_acceptance_report.py"
    result = subprocess.run(
        [sys.executable, str(report), str(tmp_path), str(tmp_path / "none.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and "expected trainer steps 1-3" in result.stderr and "got [1]" in result.stderr
