"""Faults of what a worker serves, injected into real runs of the installed `rl` with real vLLM: the
served-adapter check (issue 35, docs/served_check.md) must stop each run within one version, in one
line naming the worker and the version, and must not trip on a healthy run.

The faults: a proxy in front of the shared server sends completions of the run's adapters to the base
model; one loads version N from version N-1's folder; one loads a copy with lora_B zeroed (after the
trainer wrote its probe logprobs); and a server of another base model, served under model.name.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lorarl.orchestrator.served_check import TOLERANCE
from tests.conftest import API_KEY, serve_vllm
from tests.integration.helpers import metrics, models_request, rl_config, run_rl, steps_logged, write_config
from tests.integration.vllm_proxy import (
    Rewrite,
    RewritingProxy,
    base_model_for_adapters,
    previous_version_for,
    zeroed_lora_b_for,
)

pytestmark = pytest.mark.integration
CHECK_FAILED = "served-adapter check failed"
STEPS = 3


@pytest.fixture(scope="module")
def other_base_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vLLM server of another tiny model (same shape and tokenizer, another seed) that says it is
    `tiny_model`: /v1/models lists model.name, so only the served logprobs can tell."""
    from lorarl.tiny_model import save_tiny_model

    folder = tmp_path_factory.mktemp("other-base")
    other = save_tiny_model(folder / "tiny-qwen3-seed1", seed=1)
    # By hand: lorarl refuses --served-model-name in inference.extra_args, as it sets the name itself.
    with serve_vllm(other, folder / "inference.log", by_hand=("--served-model-name", str(tiny_model))) as (url, _):
        yield url


@pytest.fixture
def unload_after(vllm_server: str) -> Iterator[list[str]]:
    """The run names a test appends: their adapters are unloaded from the shared server after it (a
    run stopped by the check leaves them loaded, holding slots the next tests need)."""
    run_names: list[str] = []
    yield run_names
    with urllib.request.urlopen(models_request(vllm_server), timeout=10) as r:
        names = [m["id"] for m in json.load(r)["data"] if m.get("parent")]
    for name in names:
        if any(name.startswith(f"{run}-step") for run in run_names):
            body = json.dumps({"lora_name": name}).encode()
            headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
            req = urllib.request.Request(f"{vllm_server}/v1/unload_lora_adapter", body, headers)
            urllib.request.urlopen(req, timeout=30).close()


def run_on(tiny_model: Path, tmp_path: Path, run_name: str, url: str) -> subprocess.CompletedProcess[str]:
    cfg = rl_config(tiny_model, tmp_path, run_name, max_steps=STEPS, **{"inference.urls": [url]})
    return run_rl(write_config(cfg, tmp_path / "rl.json"), timeout=400)


def assert_stopped_at(result: subprocess.CompletedProcess[str], run: Path, url: str, version: int) -> None:
    """`rl` stopped (exit code 2) in one line naming `url` and `version`, before the trainer took a step on
    rollouts of that version (it trains step N+1 on version N's)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if CHECK_FAILED in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert url in lines[0] and re.search(rf"\bversion {version}\b", lines[0]), lines[0]
    trained = steps_logged(run, "trainer") if (run / "metrics.jsonl").exists() else []
    assert max(trained, default=0) <= version, (trained, lines[0])


FAULTS: dict[str, tuple[Callable[[str, str, Path], Rewrite], int]] = {
    # name: (the proxy's rewrite for (run_name, base model, folder for copies), first faulty version)
    # Version 0 is the initial adapter, lora_B zero: the base model, rightly; version 1 differs.
    "base_model": (lambda run, base, _: base_model_for_adapters(run, base), 1),
    "previous_version": (lambda run, _, __: previous_version_for(run, first=2), 2),
    "zeroed_lora_b": (lambda run, _, copies: zeroed_lora_b_for(run, first=1, copies=copies), 1),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_worker_serving_another_policy_stops_the_run_within_one_version(
    fault: str, tiny_model: Path, vllm_server: str, unload_after: list[str], tmp_path: Path
) -> None:
    make_rewrite, version = FAULTS[fault]
    run_name = f"served-{fault.replace('_', '-')}"
    unload_after.append(run_name)
    with RewritingProxy(vllm_server, make_rewrite(run_name, str(tiny_model), tmp_path / "copies")) as proxy:
        result = run_on(tiny_model, tmp_path, run_name, proxy.url)
    assert proxy.rewrites, "the proxy changed no request: the fault was not injected"
    assert_stopped_at(result, tmp_path / run_name, proxy.url, version)


def test_a_server_of_another_base_model_stops_the_run_at_its_first_version(
    tiny_model: Path, other_base_server: str, tmp_path: Path
) -> None:
    """Served under model.name, so the start's check of /v1/models passes; before the served-adapter
    check such a run finished with exit 0, the only hint a |Δlogp| of ~0.24."""
    result = run_on(tiny_model, tmp_path, "served-other-base", other_base_server)
    assert_stopped_at(result, tmp_path / "served-other-base", other_base_server, 0)


def test_a_healthy_run_passes_the_check_of_every_version(tiny_model: Path, vllm_server: str, tmp_path: Path) -> None:
    """Every version's probe matches the trainer's to fp32 precision on the CPU, and differs from the
    base model once trained; the run finishes."""
    result = run_on(tiny_model, tmp_path, "served-healthy", vllm_server)
    assert result.returncode == 0 and CHECK_FAILED not in result.stderr, result.stderr[-3000:]
    run = tmp_path / "served-healthy"
    assert steps_logged(run, "trainer") == list(range(1, STEPS + 1))
    checks = [r for r in metrics(run) if "served/probe_gap" in r]
    assert len(checks) >= STEPS, checks  # versions 0 .. STEPS-1 each checked before their rollouts
    for r in checks:
        assert math.isfinite(r["served/probe_gap"]) and r["served/probe_gap"] < TOLERANCE["float32"], r
        assert r["served/check_s"] >= 0 and "served/vs_base" in r, r
    # a trained version differs from the base
    assert max(r["served/vs_base"] for r in checks) > TOLERANCE["float32"], checks
