"""The console line per trainer step, from metrics.jsonl rows as the trainer and orchestrator write them."""

from __future__ import annotations

import json
from pathlib import Path

from lorarl.monitor.console import StepPrinter


def write_rows(path: Path, *rows: dict[str, object]) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_one_line_per_trainer_step_with_the_batch_it_trained_on(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    printer = StepPrinter(path, max_steps=20)
    assert printer.poll() == []  # no file yet
    write_rows(
        path,
        {"component": "orchestrator", "step": 1, "reward/mean": 0.25, "completion_len/mean": 7.0, "dropped/groups": 0},
        {"component": "trainer", "step": 1, "loss": 0.5, "policy_lag/mean": 0.0, "time/step": 1.25},
        {"component": "orchestrator", "step": 2, "reward/mean": 0.5, "dropped/groups": 3},
    )
    with open(path, "a") as f:
        f.write('{"component": "trainer", "st')  # half-written by the trainer: not read yet
    (line,) = printer.poll()
    assert line.startswith("step    1/20 | reward 0.250 | len 7.0 | lag 0.0 | loss +0.5000")
    assert "dropped" not in line and line.endswith("| 1.2 s")
    with open(path, "a") as f:
        f.write('ep": 2, "loss": -0.25}\n')
    (line,) = printer.poll()
    assert "reward 0.500" in line and "loss -0.2500" in line and "| dropped 3 |" in line and "| grad - |" in line


def test_a_replaced_file_and_broken_lines_never_stop_it(tmp_path: Path) -> None:
    """A resumed trainer replaces metrics.jsonl (rows after its checkpoint dropped); a crash can
    leave a cut-short line, and a user can write anything into the file."""
    path = tmp_path / "metrics.jsonl"
    printer = StepPrinter(path, max_steps=4)
    write_rows(path, *({"component": "trainer", "step": s, "loss": 0.1} for s in (1, 2, 3)))
    assert len(printer.poll()) == 3
    tmp = tmp_path / "new"
    tmp.write_text(json.dumps({"component": "trainer", "step": 1, "loss": 0.1}) + "\n{not json\n[1, 2]\n\xff\n")
    tmp.replace(path)  # as the resumed trainer does, atomically
    assert printer.poll() == []  # step 1 was printed before; the rest is not a metrics row
    write_rows(path, {"component": "trainer", "step": 4, "loss": 0.2})
    (line,) = printer.poll()
    assert line.startswith("step    4/4")


def test_a_sweep_gets_a_line_per_variant_and_step_named_by_the_variant(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    printer = StepPrinter(path, max_steps=2)
    write_rows(
        path,
        {"component": "orchestrator", "variant": "r1", "step": 1, "reward/mean": 0.25},
        {"component": "orchestrator", "variant": "r64", "step": 1, "reward/mean": 0.75},
        {"component": "trainer", "variant": "r64", "step": 1, "loss": 0.5},
        {"component": "trainer", "variant": "r1", "step": 1, "loss": 0.25},
    )
    lines = printer.poll()
    assert [line.split(" | ")[:2] for line in lines] == [["r64 step    1/2", "reward 0.750"],
                                                        ["r1 step    1/2", "reward 0.250"]]  # fmt: skip
