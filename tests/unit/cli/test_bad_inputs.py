"""Bad input to `rl`, `sft` and `lorarl-merge`, the table's first part: the command line, config files, the
model, trainer, run folder, environments, inference, placement, sft data and merge. Each case is
refused with exit code 2 and one line that names the key, file or line at fault, no traceback, and no
file written or deleted anywhere (see `bad_inputs.assert_refused`).

`rl` cases run with `--dry-run`, which makes every check a real run makes: a case that slipped
through would exit 0 instead of starting vLLM. Most cases call the commands' `main` in-process
(fast); `test_the_installed_commands_refuse_alike` runs a few through the console scripts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, merge_args, refused, rl_args, sft_args

CASES: list[Case] = [
    # The command line and config files.
    ("rl", rl_args("--nope", "1"), "unrecognized arguments: --nope"),
    ("rl", rl_args("--trainer.optim.lrr", "1"), "unrecognized arguments: --trainer.optim.lrr"),
    ("rl", lambda w: ["@", str(w.root / "missing.toml")], "config file not found"),
    ("rl", lambda w: ["@", str(w.write("bad.toml", "[trainer\nx = 1"))], "bad.toml: invalid TOML"),
    ("rl", lambda w: ["@", str(w.write("latin1.toml", b'run_name = "caf\xe9"\n'))], "latin1.toml: not UTF-8"),
    ("rl", lambda w: ["@", str(w.write("cfg.yaml", "a: 1"))], "cfg.yaml: config files must end in .toml or .json"),
    ("rl", lambda w: ["@", str(w.write("list.json", "[1, 2]"))], "list.json: the top level must be a table"),
    ("rl", lambda w: ["@"], "expected a config file after '@'"),
    (
        "rl",
        lambda w: ["@", str(w.write("typo.toml", "[trainer]\nlrr = 1\n")), "--model.name", str(w.model)],
        "trainer.lrr: unknown key (from",
    ),  # fmt: skip
    ("rl", lambda w: ["--dry-run"], "model.name: required"),
    # The model and the adapter.
    ("rl", rl_args("--model.name", "{w.root}/no-model"), "model.name: "),
    ("rl", rl_args("--model.name", "{w.data}"), "model.name: "),
    ("rl", rl_args("--model.name", "{w.user}"), "has no config.json"),
    ("rl", rl_args("--model.dtype", "float8"), "model.dtype"),
    ("rl", rl_args("--model.lora.rank", "0"), "model.lora.rank"),
    ("rl", rl_args("--model.lora.rank", "1000"), "model.lora.rank"),
    ("rl", rl_args("--model.lora.dropout", "1.5"), "model.lora.dropout"),
    ("rl", rl_args("--model.lora.target_modules", '["q_proj*", "v_proj"]'), "model.lora.target_modules"),
    ("rl", rl_args("--model.lora.target_modules", "(unclosed"), "not a valid regular expression"),
    # Names the model lacks: found by the memory plan's count of the adapter, before anything starts.
    (
        "rl",
        rl_args("--model.lora.target_modules", '["no_such_module"]'),
        "target_modules = ['no_such_module'] adapts no",
    ),
    ("rl", rl_args("--model.lora.modules_to_save", '["lm_head"]'), "modules_to_save"),
    ("rl", rl_args("--model.lora.init_adapter", "{w.root}/no-adapter"), "model.lora.init_adapter"),
    ("rl", rl_args("--model.lora.init_adapter", "{w.adapter}", "--model.lora.rank", "16"), "has r=8"),
    # The trainer.
    ("rl", rl_args("--trainer.optim.lr", "0"), "trainer.optim.lr"),
    ("rl", rl_args("--trainer.optim.lr", "-1e-4"), "trainer.optim.lr"),
    ("rl", rl_args("--trainer.optim.lr", "inf"), "trainer.optim.lr: Input should be a finite number"),
    ("rl", rl_args("--trainer.optim.lr", "nan"), "trainer.optim.lr"),
    ("rl", rl_args("--trainer.optim.betas", "[0.9, 1.5]"), "trainer.optim.betas"),
    # It said "trainer.optim.betas.1: required, ... or with --trainer.optim.betas.1", a flag that is none.
    ("rl", rl_args("--trainer.optim.betas", "[0.9]"), "trainer.optim.betas: too few values (item 1 is missing)"),
    ("rl", rl_args("--trainer.optim.weight_decay", "-0.1"), "trainer.optim.weight_decay"),
    ("rl", rl_args("--trainer.optim.max_norm", "0"), "trainer.optim.max_norm"),
    ("rl", rl_args("--trainer.scheduler.type", "exponential"), "trainer.scheduler.type"),
    ("rl", rl_args("--trainer.scheduler.warmup_steps", "-1"), "trainer.scheduler.warmup_steps"),
    ("rl", rl_args("--trainer.loss.ratio_low", "-0.1"), "trainer.loss.ratio_low"),
    ("rl", rl_args("--trainer.loss.norm", "constant"), "norm_constant"),
    ("rl", rl_args("--trainer.loss.kl_coef", "-1"), "trainer.loss.kl_coef"),
    ("rl", rl_args("--trainer.micro_batch_size", "0"), "trainer.micro_batch_size"),
    (
        "rl",
        rl_args("--trainer.loss.type", "custom", "--trainer.loss.fn", "no_such_module:my_loss"),
        "trainer.loss.fn 'no_such_module:my_loss'",
    ),
    ("rl", rl_args("--trainer.loss.type", "custom", "--trainer.loss.fn", "os:sep"), "is a str, not a function"),
    (
        "rl",
        rl_args("--orchestrator.advantage.type", "custom", "--orchestrator.advantage.fn", "no_such_module:adv"),
        "orchestrator.advantage.fn 'no_such_",
    ),
    ("rl", rl_args("--trainer.parallel.fsdp"), "needs dp >= 2"),
    ("rl", rl_args("--trainer.parallel.dp", "0"), "trainer.parallel.dp"),
    ("rl", rl_args("--trainer.ckpt.interval", "0"), "trainer.ckpt.interval"),
    ("rl", rl_args("--max_steps", "0"), "max_steps"),
    ("rl", rl_args("--seq_len", "8"), "seq_len"),
    # The run folder.
    ("rl", rl_args(run_name=".."), "run_name"),
    ("rl", rl_args(run_name="."), "run_name"),
    ("rl", rl_args(run_name="a/b"), "run_name"),
    ("rl", lambda w: ["--model.name", str(w.model), "--output_dir", "/", "--dry-run"], "output_dir"),
    ("rl", lambda w: ["--model.name", str(w.model), "--output_dir", "", "--dry-run"], "output_dir"),
    ("rl", rl_args(run_name="previous"), "holds a previous rl run"),
    # A missing checkpoint of a run that resumes as it started: test_bad_inputs_resume.py (`previous` here
    # holds a metrics.jsonl lorarl did not write, which a resume names first).
    ("rl", rl_args("--resume", run_name="new"), "outputs/new holds no run to resume"),
    ("rl", rl_args("--resume", "--overwrite", run_name="previous"), "give one of them"),
    # A sweep ([[variants]]): the variant's key, or the variant, is named.
    ("rl", rl_args("--variants", '[{"name": "a", "model": {"lora": {"rank": 0}}}]'), "variants[0].model.lora.rank"),
    (
        "rl",
        rl_args("--variants", '[{"name": "a", "orchestrator": {"env": [{"id": "nope"}]}}]'),
        "variant 'a': orchestrator.env[0] id 'nope'",
    ),
    ("rl", rl_args("--overwrite", run_name="mine"), "was not written by lorarl"),
    (
        "rl",
        lambda w: [
            "--model.name",
            str(w.model),
            "--output_dir",
            str(w.root),
            "--run_name",
            "thesis",
            "--overwrite",
            "--dry-run",
        ],
        "was not written by lorarl",
    ),  # fmt: skip
    # The orchestrator and its environments.
    ("rl", rl_args("--orchestrator.batch_size", "10"), "must be a multiple of rollouts_per_example"),
    (
        "rl",
        rl_args("--orchestrator.max_off_policy_steps", "0", "--orchestrator.max_async_level", "1"),
        "max_off_policy_steps (0) < max_async_level (1)",
    ),  # fmt: skip
    ("rl", rl_args("--orchestrator.sampling.temperature", "0"), "orchestrator.sampling.temperature"),
    ("rl", rl_args("--orchestrator.sampling.top_p", "1.5"), "orchestrator.sampling.top_p"),
    ("rl", rl_args("--orchestrator.sampling.max_tokens", "0"), "orchestrator.sampling.max_tokens"),
    ("rl", rl_args("--orchestrator.env", '[{"id": "nope"}]'), "unknown environment 'nope'"),
    ("rl", rl_args("--orchestrator.env", '[{"id": "no_such_module:make"}]'), "No module named 'no_such_module'"),
    (
        "rl",
        rl_args("--orchestrator.env", '[{"id": "os:system", "args": {"command": "touch {w.root}/pwned"}}]'),
        "not an Environment class",
    ),  # fmt: skip
    ("rl", rl_args("--orchestrator.env", '[{"id": "reverse_text", "args": {"nope": 1}}]'), "args do not fit"),
    (
        "rl",
        rl_args("--orchestrator.env", '[{"id": "reasoning_gym:leg_countin"}]'),
        "orchestrator.env[0] id 'reasoning_gym:leg_countin': unknown reasoning-gym task 'leg_countin'",
    ),  # fmt: skip
    (
        "rl",
        rl_args("--orchestrator.env", '[{"id": "reasoning_gym:gcd", "args": {"config": {"max_value": 0}}}]'),
        "task 'gcd': bad config",
    ),  # fmt: skip
    ("rl", rl_args("--orchestrator.env", '[{"id": "reverse_text", "weight": 0}]'), "orchestrator.env.0.weight"),
    ("rl", rl_args("--orchestrator.env", "[]"), "no environment given"),
    ("rl", rl_args("--orchestrator.eval", '{"num_examples": 0}'), "orchestrator.eval.num_examples"),
    # Advantages and filters.
    (
        "rl",
        rl_args("--orchestrator.advantage.type", "custom", "--orchestrator.advantage.fn", "mypkg.mod"),
        "orchestrator.advantage.fn: 'mypkg.mod' is not of the form 'package.module:function'",
    ),
    (
        "rl",
        rl_args("--trainer.loss.type", "importance_sampling", "--trainer.loss.ratio_low", "0.1"),
        "trainer.loss.ratio_low: unknown key of type 'importance_sampling'",
    ),
    ("rl", rl_args("--trainer.loss.type", "clip"), "trainer.loss: Input tag 'clip' found using 'type' does not match"),
    (
        "rl",
        rl_args("--orchestrator.advantage.type", "rloo", "--orchestrator.advantage.eps", "0.1"),
        "orchestrator.advantage.eps: unknown key of type 'rloo'",
    ),  # fmt: skip
    (
        "rl",
        rl_args("--orchestrator.fill_informative", "--no-orchestrator.skip_zero_advantage"),
        "set skip_zero_advantage = true too",
    ),  # fmt: skip
    ("rl", rl_args("--orchestrator.overlong.buffer", "500"), "longer than sampling.max_tokens"),
    ("rl", rl_args("--orchestrator.difficulty_filter", '{"min_pass": 0.5, "max_pass": 0.5}'), "must be below"),
    # Inference.
    ("rl", rl_args("--inference.port", "70000"), "inference.port"),
    ("rl", rl_args("--inference.num_workers", "0"), "inference.num_workers"),
    ("rl", rl_args("--inference.host", "0.0.0.0"), "inference.api_key is required"),
    ("rl", rl_args("--inference.kv_cache_gib", "0.5"), "inference.kv_cache_gib"),
    ("rl", rl_args("--inference.extra_args=--max-loras", "--inference.extra_args=1"), "raise --max-loras"),
    ("rl", rl_args("--inference.extra_args=--max-loras=many"), "inference.extra_args: --max-loras takes a whole"),
    # Placement on GPUs (--dry-run-devices: as if the machine had that many).
    ("rl", rl_args("--dry-run-devices", "1"), "set inference.colocate_with_trainer = true"),
    (
        "rl",
        rl_args("--dry-run-devices", "4", "--trainer.parallel.dp", "2", "--trainer.gpu_ids", "[1]"),
        "trainer.parallel.dp = 2: one GPU per rank",
    ),  # fmt: skip
    ("rl", rl_args("--dry-run-devices", "2", "--inference.gpu_ids", "[1]", "--trainer.gpu_ids", "[1]"), "share gpu 1"),
    ("rl", rl_args("--dry-run-devices", "0", "--inference.gpu_ids", "[0]"), "inference.gpu_ids = [0], but this"),
    ("rl", rl_args("--dry-run-devices", "2", "--trainer.gpu_ids", "[2]"), "trainer.gpu_ids = [2]: gpu 2 does not"),
    ("rl", lambda w: ["--model.name", str(w.model), "--dry-run-devices", "2"], "dry_run_devices only pretends"),
    # sft.
    ("sft", sft_args(data="{w.root}/no-data.jsonl"), "no-data.jsonl: no such file"),
    ("sft", sft_args("--model.lora.target_modules", '["no_such_module"]'), "adapts no module of the model"),
    # PEFT warned in two lines and trained every module the user meant to leave out.
    ("sft", sft_args("--model.lora.exclude_modules", '["no_such_module"]'), "leaves out none of the modules"),
    ("sft", sft_args(data="{w.user}/chapter1.tex"), "expected a .jsonl or .parquet file"),
    ("sft", sft_args(data="{w.root}/inputs/broken.jsonl"), "broken.jsonl:2: malformed record"),
    ("sft", sft_args(data="{w.root}/inputs/latin1.jsonl"), "latin1.jsonl:1: not UTF-8"),
    ("sft", sft_args(data="{w.root}/inputs/roles.jsonl"), "roles.jsonl:1: malformed record: 'messages' has"),
    ("sft", sft_args("--data.eval_fraction", "0.1", "--data.eval_path", "{w.data}"), "not both"),
    ("sft", sft_args("--data.loss_on", "everything"), "data.loss_on"),
    ("sft", sft_args("--batch_size", "0"), "batch_size"),
    ("sft", sft_args(run_name="previous"), "holds a previous rl run"),
    ("sft", sft_args("--resume", run_name="previous"), "holds an rl run, not an sft run"),
    ("sft", sft_args("--model.name", "{w.root}/no-model"), "model.name: "),
    # merge.
    ("lorarl-merge", merge_args(out="{w.model}"), "overlaps --base"),
    ("lorarl-merge", merge_args(out="{w.adapter}/merged"), "overlaps --adapter"),
    ("lorarl-merge", merge_args(out="{w.root}"), "overlaps"),
    ("lorarl-merge", merge_args(out="{w.user}"), "is not empty and is not an earlier merge output"),
    ("lorarl-merge", merge_args(out="{w.earlier_merge}"), "add --overwrite to replace it"),
    ("lorarl-merge", merge_args(out="{w.data}"), "is a file"),
    ("lorarl-merge", merge_args(adapter="{w.user}"), "--adapter"),
    ("lorarl-merge", merge_args(base="{w.root}/no-model"), "--base"),
]


@pytest.fixture(scope="session", autouse=True)
def data_files(ws: Workspace) -> None:
    ws.write("broken.jsonl", json.dumps({"prompt": "a", "completion": "b"}) + "\n{oops\n")
    ws.write("latin1.jsonl", b'{"prompt": "caf\xe9", "completion": "b"}\n')
    ws.write("roles.jsonl", json.dumps({"messages": [{"role": "narrator", "content": "x"}]}) + "\n")


@pytest.fixture
def port_taken(ws: Workspace) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_bad_input_is_refused_in_one_line_and_touches_nothing(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    assert_refused(ws, capsys, command, args(ws), names)


def test_a_port_in_use_is_named(ws: Workspace, port_taken: int, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused("rl", rl_args("--inference.port", str(port_taken))(ws), capsys)
    assert f"inference.port: 127.0.0.1:{port_taken} is not free" in err


@pytest.mark.slow  # over 20 s: out of the fast lane
def test_the_installed_commands_refuse_alike(ws: Workspace) -> None:
    """Through the console scripts users run, from another folder: one line, exit code 2."""
    bin_dir = Path(sys.executable).parent
    chosen = ("unrecognized arguments: --nope", "holds a previous rl run", "not an Environment class",
              "broken.jsonl:2: malformed record", "overlaps --base")  # fmt: skip
    for command, args, names in (c for c in CASES if c[2] in chosen):
        result = subprocess.run([str(bin_dir / command), *args(ws)], capture_output=True, text=True, cwd=ws.user)
        assert result.returncode == 2 and names in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
