"""Bad input that was accepted silently or hung (issue 49): data that is not a regular file (a FIFO,
which `open()` would wait on forever), an IcePop band of no width (every token masked, loss 0),
`--auto_resume` with no checkpoint to resume from, a variant name no folder can have, and TOML's
`true` where a number is meant (pydantic took it for 1: `top_k = true` sampled greedily) and a string
where true or false is (`packing = "false"` was false, `"yes"` true), a seq_len
beyond the model's max_position_embeddings, a quoted "false" in chat_template_kwargs (true for a
template), vLLM flags that lorarl sets repeated in inference.extra_args, and an inference.host that
is not this machine's. Each is refused in one line, nothing written (`bad_inputs.assert_refused`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lorarl.run_folder import RunFolder
from tests.unit.cli.bad_inputs import (
    COMMANDS,
    Case,
    Workspace,
    assert_refused,
    case_ids,
    rl_args,
    serve_args,
    sft_args,
)


@pytest.fixture(scope="module", autouse=True)
def fifo(ws: Workspace) -> None:
    path = ws.root / "inputs" / "pipe.jsonl"
    if not path.exists():
        os.mkfifo(path)
        (ws.root / "inputs" / "fifo-run").mkdir()
        os.mkfifo(ws.root / "inputs" / "fifo-run" / "metrics.jsonl")
    ws.write("top-k-true.toml", "[orchestrator.sampling]\ntop_k = true\n")
    ws.write("lr-false.toml", "[trainer.optim]\nlr = false\n")
    ws.write("target-modules-5.toml", "[model.lora]\ntarget_modules = 5\n")
    ws.write("rank-true.toml", "[model.lora]\nrank = true\n")
    ws.write("workers-true.toml", "[inference]\nnum_workers = true\n")
    ws.write("timeout-false.toml", "[inference]\nrequest_timeout = false\n")
    ws.write("keep-true.toml", "[trainer.ckpt]\nkeep_last = true\n")
    ws.write("packing-string.toml", '[trainer]\npacking = "false"\n')
    ws.write("rslora-string.json", '{"model": {"lora": {"use_rslora": "yes"}}}')
    ws.write("sft-packing-string.toml", "packing = '0'\n")
    ws.write("surrogate.json", '{"orchestrator": {"env": [{"id": "reverse_text", "args": {"words": ["ab\\udc00"]}}]}}')
    # Fourth pass (a probe of new values): config files that are no file, or no file a reader can take.
    if not (ws.root / "inputs" / "pipe.toml").exists():
        os.mkfifo(ws.root / "inputs" / "pipe.toml")
        (ws.root / "inputs" / "zeros.toml").symlink_to("/dev/zero")
        (ws.root / "loop-a").symlink_to(ws.root / "loop-b")
        (ws.root / "loop-b").symlink_to(ws.root / "loop-a")
    if not (ws.root / "dangling").is_symlink():
        (ws.root / "dangling").symlink_to(ws.root / "not-there")
    ws.write("deep.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n")
    ws.write("bom.toml", "\ufeffmax_steps = 3\n")
    ws.write("keys-without-prefix.txt", "# the team's keys\nabc123\n")
    ws.write("keys-none.txt", "# no key yet\n\n")
    sft_run = RunFolder(ws.out / "an-sft-run")
    if not sft_run.marker.exists():
        sft_run.prepare("sft", {}, resume=False, overwrite=False)


def icepop(*more: str) -> tuple[str, ...]:
    return "--trainer.loss.mismatch_correction", "icepop", *more


LONG = "/tmp/" + "x" * 5000  # a path no file system takes (ENAMETOOLONG)
CASES: list[Case] = [
    # Fourth pass: a FIFO waited for a writer, /dev/zero was read until killed, the rest were tracebacks.
    ("rl", rl_args("@", "{w.root}/inputs/pipe.toml"), "pipe.toml: not a regular file (a FIFO, socket or device)"),
    ("rl", rl_args("@", "{w.root}/inputs/zeros.toml"), "zeros.toml: not a regular file (a FIFO, socket or device)"),
    ("rl", rl_args("@", "{w.root}/inputs/deep.toml"), "deep.toml: nested too deeply to read"),
    ("rl", rl_args("@", "{w.root}/inputs/bom.toml"), "bom.toml: starts with a byte-order mark (BOM)"),
    ("rl", lambda w: [*rl_args()(w), "--output_dir", str(w.root / "loop-a")], "loop-a' cannot be resolved (Symlink"),
    ("rl", lambda w: [*rl_args()(w), "--model.name", LONG], "model.name: /tmp/xxx"),
    ("sft", sft_args("--dry-run", data=LONG), "/tmp/xxxx"),
    # An adapter scaled by zero (it never changes the model) or negatively was taken.
    ("rl", rl_args("--model.lora.alpha", "0"), "model.lora.alpha: Input should be greater than 0"),
    ("sft", sft_args("--model.lora.alpha", "-16", "--dry-run"), "model.lora.alpha: Input should be greater than 0"),
    # lorarl-serve's keys file was read once vLLM was up (a traceback), and its trainer port never checked.
    ("lorarl-serve", serve_args("--serve.keys_file", "{w.root}/inputs/nothing.txt"), "keys_file"),
    ("lorarl-serve", serve_args("--serve.keys_file", "{w.root}/inputs/pipe.toml"), "pipe.toml: not a regular file"),
    ("lorarl-serve", serve_args("--serve.keys_file", "{w.root}/inputs/keys-none.txt"), "keys-none.txt: no key in it"),
    ("lorarl-serve", serve_args("--serve.keys_file", "{w.root}/inputs/keys-without-prefix.txt"), "without the SDK's"),
    ("lorarl-serve", serve_args("--serve.trainer_port", "8000"), "serve.trainer_port 8000 is serve.port"),
    # Unclear: an empty model.name was reported as ".", a dangling output_dir as "File exists".
    ("rl", rl_args("--model.name", ""), "model.name: an empty path"),
    ("rl", lambda w: [*rl_args()(w), "--output_dir", str(w.root / "dangling")], "dangling is a symbolic link to"),
    # The trainer alone wrote its starting adapter into an sft run's folder and its record.
    (
        "lorarl-trainer",
        lambda w: ["--model.name", str(w.model), "--output_dir", str(w.out), "--run_name", "an-sft-run"],
        "an-sft-run holds an `sft` run, not an `rl` run",
    ),
    ("sft", sft_args(data="{w.root}/inputs/pipe.jsonl"), "pipe.jsonl: not a regular file"),
    ("sft", sft_args("--dry-run", data="{w.root}/inputs/pipe.jsonl"), "pipe.jsonl: not a regular file"),
    # A value that fits no member of a union was a line per member ("target_modules.list[str]: ...").
    (
        "rl",
        rl_args("@", "{w.root}/inputs/target-modules-5.toml"),
        "model.lora.target_modules = 5: none of the kinds it takes (list[str]: Input should be a valid list; str:",
    ),
    # A run folder whose metrics.jsonl is a FIFO was "no metrics.jsonl"; the FIFO named itself, the same.
    ("lorarl-plot", lambda w: [f"{w.root}/inputs/fifo-run"], "fifo-run/metrics.jsonl: not a regular file (a FIFO"),
    ("lorarl-plot", lambda w: [f"{w.root}/inputs/pipe.jsonl"], "inputs/pipe.jsonl: not a regular file (a FIFO"),
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
    # Third pass (issue 49, new values). TOML's booleans for numbers, in other sections.
    ("rl", rl_args("@", "{w.root}/inputs/rank-true.toml"), "rank = true: rank takes a number"),
    ("rl", rl_args("@", "{w.root}/inputs/workers-true.toml"), "num_workers = true: num_workers takes a number"),
    ("rl", rl_args("@", "{w.root}/inputs/timeout-false.toml"), "request_timeout = false: request_timeout takes"),
    ("rl", rl_args("@", "{w.root}/inputs/keep-true.toml"), "keep_last = true: keep_last takes a number"),
    # Strings where true or false is meant: pydantic read "false", "no" and "0" as false.
    ("rl", rl_args("@", "{w.root}/inputs/packing-string.toml"), 'packing = "false": packing takes true or false, not'),
    ("rl", rl_args("@", "{w.root}/inputs/rslora-string.json"), 'model.lora: use_rslora = "yes": use_rslora takes'),
    ("rl", rl_args("--trainer", '{"packing": "no"}'), 'packing = "no": packing takes true or false, not a string'),
    ("rl", rl_args("--variants", '[{"name": "a", "model": {"lora": {"use_rslora": "1"}}}]'), 'use_rslora = "1"'),
    (
        "sft",
        sft_args("@", "{w.root}/inputs/sft-packing-string.toml"),
        'packing = "0": packing takes true or false, not a string: write it without quotes (from /',
    ),
    # Strings where a template takes a switch: any string is true there.
    ("rl", rl_args("--orchestrator.chat_template_kwargs", '{"enable_thinking": "no"}'), "enable_thinking = 'no'"),
    ("rl", rl_args("--orchestrator.chat_template_kwargs", '{"thinking": "off"}'), "thinking = 'off' is a string"),
    (
        "rl",
        rl_args("--orchestrator.chat_template_kwargs", '{"add_generation_prompt": " False "}'),
        "add_generation_prompt = ' False ' is a string",
    ),
    # Keys that do nothing in the chosen mode.
    ("rl", rl_args("--trainer.loss.mismatch_low", "0.25"), "mismatch_low = 0.25 does nothing with mismatch_corr"),
    ("rl", rl_args("--trainer.loss.mismatch_cap", "4"), "mismatch_cap = 4.0 does nothing with mismatch_correction"),
    (
        "rl",
        rl_args("--trainer.loss.mismatch_correction", "tis", "--trainer.loss.mismatch_low", "0.8"),
        'mismatch_low = 0.8 does nothing with mismatch_correction = "tis"',
    ),
    ("rl", rl_args("--trainer.loss.norm_constant", "512"), 'norm_constant = 512.0 does nothing with norm = "token"'),
    (
        "rl",
        rl_args("--inference.served_check", "off", "--inference.served_check_tolerance", "0.5"),
        'served_check_tolerance = 0.5 does nothing with served_check = "off"',
    ),
    ("rl", rl_args("--cluster.placement_timeout", "60"), 'cluster.placement_timeout is for cluster.backend = "ray"'),
    ("rl", rl_args("--cluster.node_dir", "{w.root}/nodes"), 'cluster.node_dir is for cluster.backend = "ray"'),
    # Timeouts no request, start or step can meet, and combinations that cannot be meant.
    ("rl", rl_args("--inference.request_timeout", "1e-6"), "inference.request_timeout: Input should be greater"),
    ("rl", rl_args("--inference.startup_timeout", "0.001"), "inference.startup_timeout: Input should be greater"),
    ("rl", rl_args("--inference.unavailable_timeout", "0.5"), "inference.unavailable_timeout: Input should be"),
    ("rl", rl_args("--orchestrator.policy_timeout", "1e-3"), "orchestrator.policy_timeout: Input should be"),
    ("rl", rl_args("--monitor.stall_stop", "0.01"), "monitor.stall_stop: Input should be greater than or equal"),
    ("rl", rl_args("--monitor.stall_warning", "600", "--monitor.stall_stop", "120"), "stall_stop = 120 s is not after"),
    ("rl", rl_args("--trainer.scheduler.warmup_steps", "25"), "warmup_steps = 25 is not below max_steps = 20"),
    (
        "rl",
        rl_args("--max_steps", "5", "--trainer.scheduler.warmup_steps", "5"),
        "warmup_steps = 5 is not below max_steps = 5",
    ),
    (
        "rl",
        rl_args(*icepop("--trainer.loss.mismatch_low", "1", "--trainer.loss.mismatch_cap", "1.0")),
        "masks every token",
    ),
    # vLLM flags lorarl sets, in another spelling or not yet listed.
    ("rl", rl_args("--inference.extra_args", '["--max_model_len", "1024"]'), "--max-model-len is set by lorarl"),
    ("rl", rl_args("--inference.extra_args=--gpu_memory_utilization=0.3"), "--gpu-memory-utilization is set by"),
    ("rl", rl_args("--inference.extra_args", '["--enable-lora"]'), "--enable-lora is set by lorarl"),
    ("rl", rl_args("--inference.extra_args", '["--served-model-name", "x"]'), "--served-model-name is set by lorarl"),
    ("rl", rl_args("--inference.extra_args", '["--tokenizer=/tmp"]'), "inference.extra_args: --tokenizer is set by"),
    ("rl", rl_args("--inference.extra_args", '["--max_loras", "1"]'), "inference.extra_args sets --max-loras 1"),
    # Lone surrogates (JSON escapes of half a character): accepted, then a traceback where encoded.
    ("rl", rl_args("@", "{w.root}/inputs/surrogate.json"), "orchestrator.env.0.args.words.0: 'ab\\udc00' holds a lone"),
    (
        "rl",
        rl_args("--orchestrator.chat_template_kwargs", '{"persona": "\\ud83d"}'),
        "orchestrator.chat_template_kwargs.persona: '\\ud83d' holds a lone surrogate",
    ),
    ("sft", sft_args("--data.split", "tr\udcffain"), "data.split: 'tr\\udcffain' holds a lone surrogate"),
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
    ("role", "flags", "waiting"),
    [
        # It waited inference.startup_timeout (600 s) for inference.urls that answer nothing, ignoring Ctrl-C.
        ("orchestrator", ["--inference.urls", '["http://127.0.0.1:9"]'], "waiting for 1 inference worker"),
        # It waits trainer.batch_timeout for a batch no orchestrator makes; Ctrl-C was a traceback.
        ("trainer", [], "wrote the starting adapter"),
    ],
)
def test_a_role_alone_stops_on_ctrl_c_in_one_line_while_it_waits(
    tmp_path: Path, ws: Workspace, role: str, flags: list[str], waiting: str
) -> None:
    RunFolder(tmp_path / "r").prepare("rl", {}, resume=False, overwrite=False)
    args = ["--model.name", str(ws.model), "--output_dir", str(tmp_path), "--run_name", "r", *flags]
    proc = subprocess.Popen([sys.executable, "-m", f"lorarl.cli.{role}", *args], stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        # Sent once it says it waits, not after a fixed time, which a busy machine can spend importing.
        deadline = time.monotonic() + 120
        while proc.poll() is None and not any(waiting in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and any(waiting in line for line in lines), "".join(lines)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == 128 + signal.SIGINT
    finally:
        proc.kill()  # a no-op once it has stopped
    reader.join(timeout=5)
    err = "".join(lines)
    assert f"{role}: stopped by SIGINT" in err and "Traceback" not in err, err[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["rl", "sft"])
def test_ctrl_c_during_the_checks_is_one_line(tmp_path: Path, ws: Workspace, command: str) -> None:
    """Ctrl-C during a dry run's checks (torch loaded, before any handler of its own) was a
    KeyboardInterrupt's traceback. Sent once torch is mapped, not after a fixed time: on a busy machine
    3 s fell into Python's start-up, before the command's main (whose Ctrl-C is Python's own)."""
    args = ["--model.name", str(ws.model), "--output_dir", str(tmp_path), "--run_name", "r", "--dry-run"]
    args += ["--data.path", str(ws.data)] if command == "sft" else []
    proc = subprocess.Popen([sys.executable, "-m", f"lorarl.cli.{command}", *args], stderr=subprocess.PIPE, text=True)
    try:
        maps = Path(f"/proc/{proc.pid}/maps")
        deadline = time.monotonic() + 120
        while proc.poll() is None and "libtorch" not in maps.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 128 + signal.SIGINT
    finally:
        proc.kill()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert f"{command}: stopped by SIGINT" in err and "Traceback" not in err, err[-2000:]
