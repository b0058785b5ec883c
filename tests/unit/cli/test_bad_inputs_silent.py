"""Bad input that was accepted silently or hung (issue 49): data that is not a regular file (a FIFO,
which `open()` would wait on forever), an IcePop band of no width (every token masked, loss 0),
`--auto_resume` with no checkpoint to resume from, a variant name no folder can have, and TOML's
`true` where a number is meant (pydantic took it for 1: `top_k = true` sampled greedily), a seq_len
beyond the model's max_position_embeddings, a quoted "false" in chat_template_kwargs (true for a
template), vLLM flags that lorarl sets repeated in inference.extra_args, and an inference.host that
is not this machine's. Each is refused in one line, nothing written (`bad_inputs.assert_refused`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lorarl.run_folder import RunFolder
from tests.unit.cli.bad_inputs import COMMANDS, Case, Workspace, assert_refused, case_ids, rl_args, sft_args


@pytest.fixture(scope="module", autouse=True)
def fifo(ws: Workspace) -> None:
    path = ws.root / "inputs" / "pipe.jsonl"
    if not path.exists():
        os.mkfifo(path)
    ws.write("top-k-true.toml", "[orchestrator.sampling]\ntop_k = true\n")
    ws.write("lr-false.toml", "[trainer.optim]\nlr = false\n")


CASES: list[Case] = [
    ("sft", sft_args(data="{w.root}/inputs/pipe.jsonl"), "pipe.jsonl: not a regular file"),
    ("sft", sft_args("--dry-run", data="{w.root}/inputs/pipe.jsonl"), "pipe.jsonl: not a regular file"),
    (
        "rl",
        rl_args(
            "--trainer.loss.mismatch_correction",
            "icepop",
            "--trainer.loss.mismatch_low",
            "1",
            "--trainer.loss.mismatch_cap",
            "1",
        ),  # fmt: skip
        "mismatch_low 1.0 = mismatch_cap 1.0 masks every token",
    ),
    ("rl", rl_args("@", "{w.root}/inputs/top-k-true.toml"), "top_k = true: top_k takes a number"),
    ("rl", rl_args("@", "{w.root}/inputs/lr-false.toml"), "lr = false: lr takes a number"),
    ("rl", rl_args("--auto_resume", "2"), "--auto_resume 2 restarts from the latest checkpoint"),
    ("rl", rl_args("--variants", '[{"name": "' + "v" * 300 + '"}]'), "variant name has 300 characters"),
    # Longer than the model's positions (the tiny model's 2048): vLLM would not start, sft would train on
    # positions the model never saw.
    ("rl", rl_args("--seq_len", "4096"), "seq_len 4096: "),
    # A host no server here can listen on was "not free; pick another port" (192.0.2.1: TEST-NET-1, no one's).
    *(
        ("rl", rl_args("--inference.host", host, "--inference.api_key", "k" * 16), f"inference.host: {host} is not")
        for host in ("192.0.2.1", "nosuchhost.invalid")
    ),
    ("rl", rl_args("--inference.extra_args", '["--max-model-len", "4096"]'), "--max-model-len is set by lorarl from"),
    ("rl", rl_args("--inference.extra_args", '["--port=9000"]'), "inference.extra_args: --port is set by lorarl"),
    (
        "rl",
        rl_args("--orchestrator.chat_template_kwargs", '{"enable_thinking": "false"}'),
        "orchestrator.chat_template_kwargs: enable_thinking = 'false' is a string",
    ),
    ("sft", sft_args("--seq_len", "2049"), "handles at most 2048 positions (max_position_embeddings"),
]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_silent_or_hanging_input_is_refused_in_one_line(
    ws: Workspace, capsys: pytest.CaptureFixture[str], case: Case
) -> None:
    command, args, names = case
    assert_refused(ws, capsys, command, args(ws), names)


@pytest.mark.parametrize("command", ["lorarl-trainer", "lorarl-orchestrator"])
def test_a_role_run_alone_honours_dry_run(ws: Workspace, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """`--dry-run` checks the run folder and starts nothing (it was not a flag of theirs: refused)."""
    before = ws.snapshot()
    args = ["--model.name", str(ws.model), "--output_dir", str(ws.out), "--run_name", "previous", "--dry-run"]
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS[command](args)
    assert exit_info.value.code == 0 and "dry run" in capsys.readouterr().out
    assert ws.snapshot() == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("role", "flags"),
    [
        # It waited inference.startup_timeout (600 s) for inference.urls that answer nothing, ignoring Ctrl-C.
        ("orchestrator", ["--inference.urls", '["http://127.0.0.1:9"]']),
        # It waits trainer.batch_timeout for a batch no orchestrator makes; Ctrl-C was a traceback.
        ("trainer", []),
    ],
)
def test_a_role_alone_stops_on_ctrl_c_in_one_line_while_it_waits(
    tmp_path: Path, ws: Workspace, role: str, flags: list[str]
) -> None:
    RunFolder(tmp_path / "r").prepare("rl", {}, resume=False, overwrite=False)
    args = ["--model.name", str(ws.model), "--output_dir", str(tmp_path), "--run_name", "r", *flags]
    proc = subprocess.Popen([sys.executable, "-m", f"lorarl.cli.{role}", *args], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(15)  # its imports, then the wait
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 128 + signal.SIGINT
    finally:
        proc.kill()  # a no-op once it has stopped
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert f"{role}: stopped by SIGINT" in err and "Traceback" not in err, err[-2000:]
