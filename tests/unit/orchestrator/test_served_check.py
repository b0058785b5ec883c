"""The served-adapter check's logic (orchestrator/served_check.py): the comparisons, the thresholds,
the reload, "stop" and "warn", and the metrics rows. The worker is a stand-in that serves given
logprobs (a unit test of this logic; the real vLLM runs are tests/integration/test_faults_served.py)."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import pytest

from lorarl.config.run import MonitorConfig
from lorarl.inference.client import InferenceClient
from lorarl.inference.pool import WorkerPool
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.served_check import Gaps, ServedCheck, ServedCheckFailed, compare, tolerance_for
from lorarl.run_folder import PROBE_FILE

SEQUENCES = [[5, 6, 7], [8, 9]]
TRAINER = [[-1.0, -2.0], [-0.5]]
BASE = [[-1.5, -2.0], [-0.7]]


class Worker:
    """Serves `answers` in turn (the last one again), one per check, and counts reloads."""

    def __init__(self, *answers: list[list[float]]) -> None:
        self.base_url, self.answers, self.reloads, self.calls = "http://w0:8000", list(answers), 0, 0

    async def prompt_logprobs(self, name: str, ids: list[int]) -> list[float]:
        answer = self.answers[min(self.calls // len(SEQUENCES), len(self.answers) - 1)]
        self.calls += 1
        return answer[SEQUENCES.index(ids)]

    async def unload_adapter(self, name: str) -> None:
        self.reloads += 1

    async def load_adapter(self, name: str, path: str, replace: bool = False) -> None:
        pass


def broadcast(tmp_path: Path, version: int = 3, variant: str | None = None) -> Path:
    folder = tmp_path / "broadcasts" / (variant or "") / f"step_{version}"
    folder.mkdir(parents=True)
    (folder / PROBE_FILE).write_text(json.dumps({"sequences": SEQUENCES, "logprobs": TRAINER, "base": BASE}))
    return folder


def check(tmp_path: Path, mode: Literal["stop", "warn"] = "stop") -> tuple[ServedCheck, list[tuple[Any, str]]]:
    excluded: list[tuple[Any, str]] = []
    metrics = partial(MetricsLogger, tmp_path / "metrics.jsonl", "served", MonitorConfig(), "run")
    return ServedCheck(mode, 1e-3, metrics, lambda w, n: excluded.append((w, n))), excluded


def run_check(served: ServedCheck, worker: Worker, name: str, folder: Path) -> None:
    asyncio.run(served(cast(InferenceClient, worker), name, str(folder)))


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_gaps_name_the_base_model_only_where_the_trainer_differs_from_it() -> None:
    assert compare(TRAINER, TRAINER, BASE) == Gaps(0.0, 0.5, 0.5)
    assert Gaps(0.0, 0.5, 0.5).problem(1e-3) is None
    assert Gaps(0.5, 0.0, 0.5).problem(1e-3) == "the worker is serving the base model"
    assert Gaps(0.5, 0.4, 0.5).problem(1e-3) == "the worker serves other weights than the trainer's"
    # Version 0 (lora_B zero) is the base model: served = trainer = base passes.
    assert compare(BASE, BASE, BASE).problem(1e-3) is None
    assert compare([[-1.0]], TRAINER, BASE).served_trainer == float("inf")  # another tokenization


def test_the_tolerance_follows_the_dtype_unless_set() -> None:
    assert tolerance_for(None, "float32") == 1e-2
    assert tolerance_for(None, "bfloat16") == tolerance_for(None, "float16") == 0.25
    assert tolerance_for(0.02, "bfloat16") == 0.02


def test_a_healthy_worker_passes_and_its_version_is_logged(tmp_path: Path) -> None:
    served, _ = check(tmp_path)
    worker = Worker([[-1.0, -2.0000001], [-0.5]])
    run_check(served, worker, "run-step3", broadcast(tmp_path))
    served.flush()
    [row] = rows(tmp_path)
    assert row["step"] == 3 and row["component"] == "served" and worker.reloads == 0
    assert row["served/probe_gap"] == pytest.approx(1e-7) and row["served/vs_base"] == pytest.approx(0.5)
    assert row["served/check_s"] >= 0


def test_a_failing_worker_is_reloaded_once_and_passes_if_the_reload_mends_it(tmp_path: Path) -> None:
    served, _ = check(tmp_path)
    worker = Worker(BASE, TRAINER)
    run_check(served, worker, "run-step3", broadcast(tmp_path))
    assert worker.reloads == 1


def test_a_worker_serving_the_base_model_stops_the_run_in_one_line(tmp_path: Path) -> None:
    served, _ = check(tmp_path)
    worker = Worker(BASE)
    with pytest.raises(ServedCheckFailed) as failed:
        run_check(served, worker, "run-step3", broadcast(tmp_path))
    line = str(failed.value)
    assert "\n" not in line and worker.reloads == 1
    words = ["served-adapter check failed", "http://w0:8000", "version 3", "serving the base model", "vs trainer 0.5"]
    assert all(w in line for w in [*words, "vs base 0"]), line
    assert rows(tmp_path)[0]["served/probe_gap"] == pytest.approx(0.5)  # logged before it stops


def test_warn_leaves_the_worker_out_of_that_versions_rollouts(tmp_path: Path) -> None:
    served, excluded = check(tmp_path, "warn")
    worker = Worker([[-3.0, -2.0], [-0.5]])
    run_check(served, worker, "run-step3", broadcast(tmp_path))
    assert excluded == [(worker, "run-step3")]


def test_a_version_without_a_probe_is_not_checked(tmp_path: Path) -> None:
    served, _ = check(tmp_path)
    (tmp_path / "step_1").mkdir()
    worker = Worker(BASE)
    run_check(served, worker, "run-step1", tmp_path / "step_1")
    served.flush()
    assert worker.calls == 0 and not (tmp_path / "metrics.jsonl").exists()


def test_the_pool_routes_an_excluded_adapter_to_the_other_workers() -> None:
    pool = WorkerPool(["http://a:1", "http://b:1"])
    a, b = pool.workers
    pool.exclude(a, "run-step3")

    async def picks() -> list[Any]:
        return [await pool._pick(0.0, "run-step3"), await pool._pick(0.0, "run-step4")]

    assert asyncio.run(picks()) == [b, a]
    pool.exclude(b, "run-step3")  # every worker excluded: the run goes on with them
    assert asyncio.run(pool._pick(0.0, "run-step3")) in (a, b)


def test_a_variants_versions_are_logged_as_its_own(tmp_path: Path) -> None:
    served, _ = check(tmp_path)
    run_check(served, Worker(TRAINER), "run-step2", broadcast(tmp_path, 2))
    run_check(served, Worker(TRAINER), "run-rank4-step2", broadcast(tmp_path, 2, "rank4"))
    served.flush()
    assert [(r["step"], r.get("variant")) for r in rows(tmp_path)] == [(2, None), (2, "rank4")]
