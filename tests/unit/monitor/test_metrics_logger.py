"""`MetricsLogger.log_table` puts rows (a step's samples) into a real offline wandb run as a table,
chats readable, and does nothing without wandb."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorarl.config.run import MonitorConfig, WandbConfig
from lorarl.monitor.metrics import MetricsLogger

SAMPLES = [
    {"env": "reverse_text", "messages": [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}],
     "truncated": False, "reward": 1.0, "lcs_ratio": 1.0},
    {"env": "math", "messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "3"}],
     "truncated": True, "reward": 0.0, "correct": 0, "state": {"turn": 1}},
]  # fmt: skip


@pytest.mark.slow
def test_log_table_writes_a_wandb_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # nothing outside tmp_path
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monitor = MonitorConfig(jsonl=False, wandb=WandbConfig(project="lorarl-test", mode="offline"))
    logger = MetricsLogger(tmp_path / "metrics.jsonl", "orchestrator", monitor, "run")
    logger.log(3, {"reward/mean": 0.5})
    logger.log_table(3, "samples", SAMPLES)
    logger.close()
    (table_file,) = tmp_path.glob("wandb/offline-run-*/files/media/table/orchestrator/samples_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["env", "messages", "truncated", "reward", "lcs_ratio", "correct", "state"]
    assert table["data"] == [
        ["reverse_text", "user: abc\n\nassistant: cba", False, 1.0, 1.0, None, None],
        ["math", "user: 1+1?\n\nassistant: 3", True, 0.0, None, 0, '{"turn": 1}'],
    ]


@pytest.mark.parametrize("wandb", [None, WandbConfig(mode="disabled")])
def test_log_table_without_wandb_does_nothing(tmp_path: Path, wandb: WandbConfig | None) -> None:
    logger = MetricsLogger(tmp_path / "metrics.jsonl", "orchestrator", MonitorConfig(wandb=wandb), "run")
    logger.log_table(1, "samples", SAMPLES)
    logger.close()
    assert list(tmp_path.iterdir()) == []  # no table in metrics.jsonl, no wandb folder


@pytest.mark.slow
def test_a_variants_rows_and_wandb_keys_carry_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monitor = MonitorConfig(wandb=WandbConfig(project="lorarl-test", mode="offline"))
    loggers = [MetricsLogger(tmp_path / "metrics.jsonl", "trainer", monitor, "run", v) for v in ("r1", "r64")]
    for logger in loggers:  # one process: the loggers share its wandb run, the keys stay apart
        logger.log(1, {"loss": 0.5})
        logger.log_table(1, "samples", SAMPLES)
    for logger in loggers:
        logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["variant"], r["component"]) for r in rows] == [("r1", "trainer"), ("r64", "trainer")]
    for variant in ("r1", "r64"):
        assert list(tmp_path.glob(f"wandb/offline-run-*/files/media/table/{variant}/trainer/samples_*.table.json"))
