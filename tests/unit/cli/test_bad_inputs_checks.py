"""Bad input that only a look at the files, the machine or the environments finds (issue 34, items 3
and 4): a server open to the network with no key, a model folder or init adapter that would fail to
load, an attention implementation that cannot run here, seeds out of range, malformed urls, `~`
paths, groups of one rollout that train nothing, and prompts longer than seq_len. `--dry-run` finds
each of them, as a start would: exit code 2, one line naming the key or file, nothing written or
deleted (`bad_inputs.assert_refused`).

The broken model folders and adapters are copies of the workspace's tiny model and adapter with one
thing wrong, made once for the session by `broken`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from lorarl.tiny_model import save_tiny_model
from tests.unit.cli.bad_inputs import Case, Workspace, assert_refused, case_ids, rl_args, sft_args

MODEL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _model_copy(w: Workspace, name: str, drop: tuple[str, ...] = (), **files: str | bytes) -> None:
    """The workspace's model under checks/<name>, without the files `drop`, with `files` written over."""
    folder = w.root / "checks" / name
    shutil.copytree(w.model, folder, ignore=shutil.ignore_patterns(*drop))
    for file, text in files.items():
        path = folder / file.replace("__", ".")
        path.write_bytes(text if isinstance(text, bytes) else text.encode())


def _adapter_copy(w: Workspace, name: str, **files: str | bytes) -> None:
    folder = w.root / "checks" / name
    shutil.copytree(w.adapter, folder)
    for file, text in files.items():
        (folder / file.replace("__", ".")).write_bytes(text if isinstance(text, bytes) else text.encode())


def _adapter_on(base: Path, folder: Path, rank: int = 8) -> None:
    lora = peft.LoraConfig(r=rank, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    peft.get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora).save_pretrained(folder)


@pytest.fixture(scope="session", autouse=True)
def broken(ws: Workspace) -> None:
    """Model folders and adapters with one thing wrong each, under checks/ (made before any case)."""
    weights = (ws.model / MODEL_WEIGHTS).read_bytes()
    config = json.loads((ws.model / "config.json").read_text())
    _model_copy(ws, "config-empty", config__json="")
    _model_copy(ws, "config-garbage", config__json="{model_type: qwen3")
    _model_copy(ws, "config-list", config__json="[1, 2]")
    _model_copy(ws, "config-no-type", config__json=json.dumps({"hidden_size": 64}))
    _model_copy(ws, "config-unknown-type", config__json=json.dumps({**config, "model_type": "no_such_arch"}))
    sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    _model_copy(ws, "config-no-sizes", config__json=json.dumps({k: v for k, v in config.items() if k not in sizes}))
    _model_copy(ws, "config-other-model", config__json=json.dumps({**config, "intermediate_size": 96}))
    _model_copy(ws, "no-weights", drop=(MODEL_WEIGHTS,))
    _model_copy(ws, "header-cut", drop=(MODEL_WEIGHTS,), model__safetensors=weights[:40])
    _model_copy(ws, "tensors-cut", drop=(MODEL_WEIGHTS,), model__safetensors=weights[:-100])
    _model_copy(ws, "header-garbage", drop=(MODEL_WEIGHTS,), model__safetensors=b"\xff" * 64)
    index = {"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    _model_copy(ws, "index-missing-shard", model__safetensors__index__json=json.dumps(index))
    _model_copy(ws, "index-garbage", model__safetensors__index__json="{weight_map")
    _model_copy(ws, "tokenizer-missing", drop=("tokenizer.json",))
    _model_copy(ws, "tokenizer-garbage", tokenizer__json="{oops")
    # Adapters: trained on another base, edited, or cut short.
    other = save_tiny_model(ws.root / "checks" / "other-base", hidden_size=32, num_layers=2)
    _adapter_on(other, ws.root / "checks" / "adapter-other-base")
    deeper = save_tiny_model(ws.root / "checks" / "deeper-base", hidden_size=64, num_layers=4)
    _adapter_on(deeper, ws.root / "checks" / "adapter-deeper-base")
    _adapter_on(ws.model, ws.root / "checks" / "adapter-rank4", rank=4)
    saved = json.loads((ws.root / "checks" / "adapter-rank4" / "adapter_config.json").read_text())
    (ws.root / "checks" / "adapter-rank4" / "adapter_config.json").write_text(json.dumps({**saved, "r": 8}))
    gpt2_names = {"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight": torch.zeros(8, 64)}
    _adapter_copy(ws, "adapter-gpt2-names")
    save_file(gpt2_names, str(ws.root / "checks" / "adapter-gpt2-names" / ADAPTER_WEIGHTS))
    _adapter_copy(ws, "adapter-config-garbage", adapter_config__json="{r: 8")
    _adapter_copy(ws, "adapter-config-empty", adapter_config__json="")
    _adapter_copy(ws, "adapter-config-list", adapter_config__json="[8]")
    _adapter_copy(ws, "adapter-config-latin1", adapter_config__json=b'{"r": 8, "note": "caf\xe9"}')
    adapter_weights = (ws.adapter / ADAPTER_WEIGHTS).read_bytes()
    _adapter_copy(ws, "adapter-cut", adapter_model__safetensors=adapter_weights[:-64])
    _adapter_copy(ws, "adapter-no-weights")
    (ws.root / "checks" / "adapter-no-weights" / ADAPTER_WEIGHTS).unlink()


def on(model: str, *args: str) -> Callable[[Workspace], list[str]]:
    """rl --dry-run on the broken model folder checks/<model>."""
    return rl_args("--model.name", f"{{w.root}}/checks/{model}", *args)


def sft_on(model: str, *args: str) -> Callable[[Workspace], list[str]]:
    return sft_args("--model.name", f"{{w.root}}/checks/{model}", "--dry-run", *args)


def init(adapter: str, *args: str) -> Callable[[Workspace], list[str]]:
    return rl_args("--model.lora.init_adapter", f"{{w.root}}/checks/{adapter}", *args)


def sft_init(adapter: str, *args: str) -> Callable[[Workspace], list[str]]:
    adapter_flag = ("--model.lora.init_adapter", f"{{w.root}}/checks/{adapter}")
    return sft_args("--model.lora", "{}", *adapter_flag, "--dry-run", *args)


def home(rest: str) -> str:
    return str(Path.home() / rest)


KEY_REQUIRED = "inference.api_key is required when inference.host"
OTHER_BASE = "the adapter was trained on another model"
GROUPS_OF_ONE = "rollouts_per_example = 1 with advantage.type"

CASES: list[Case] = [
    # No network without a key: an empty or blank key is no key.
    ("rl", rl_args("--inference.host", "0.0.0.0", "--inference.api_key="), f"{KEY_REQUIRED} (0.0.0.0)"),
    ("rl", rl_args("--inference.host", "0.0.0.0", "--inference.api_key", "   "), f"{KEY_REQUIRED} (0.0.0.0)"),
    ("rl", rl_args("--inference.host", "192.168.1.20", "--inference.api_key="), f"{KEY_REQUIRED} (192.168.1.20)"),
    ("rl", rl_args("--inference.host", "10.0.0.7", "--inference.api_key=\t"), f"{KEY_REQUIRED} (10.0.0.7)"),
    ("rl", rl_args("--inference.host", "::", "--inference.api_key="), f"{KEY_REQUIRED} (::)"),
    ("rl", rl_args("--inference.host", "my-box.lan", "--inference.api_key= "), f"{KEY_REQUIRED} (my-box.lan)"),
    ("rl", rl_args("--inference.api_key", " secret "), "inference.api_key: has spaces at its ends"),
    ("rl", rl_args("--inference.api_key", "sec\nret"), "inference.api_key: has spaces at its ends"),
    ("rl", rl_args("--cluster.backend", "ray", "--inference.api_key="), "inference.api_key is required with cluster"),
    # The model folder: config.json, weights, tokenizer.
    ("rl", on("config-empty"), "config-empty/config.json is not a model config"),
    ("rl", on("config-garbage"), "config-garbage/config.json is not a model config"),
    ("rl", on("config-list"), "config-list/config.json is not a model config"),
    ("rl", on("config-no-type"), "config-no-type/config.json is not a model config"),
    ("rl", on("config-unknown-type"), "config-unknown-type/config.json is not a model config"),
    ("rl", on("config-no-sizes"), "config.json and the weights are of different models"),
    ("sft", sft_on("config-other-model"), "config.json and the weights are of different models"),
    ("sft", sft_on("config-garbage"), "config-garbage/config.json is not a model config"),
    ("rl", on("no-weights"), "no-weights has no weights"),
    ("sft", sft_on("no-weights"), "no-weights has no weights"),
    ("rl", on("header-cut"), "header-cut/model.safetensors is not a whole safetensors file"),
    ("rl", on("tensors-cut"), "tensors-cut/model.safetensors is not a whole safetensors file"),
    ("sft", sft_on("header-garbage"), "header-garbage/model.safetensors is not a whole safetensors file"),
    ("rl", on("index-missing-shard"), "names weight files that are not there: model-00002-of-00002.safetensors"),
    ("rl", on("index-garbage"), "model.safetensors.index.json is not a readable JSON file"),
    ("rl", on("tokenizer-missing"), "model.name: the tokenizer in"),
    ("sft", sft_on("tokenizer-garbage"), "model.name: the tokenizer in"),
    # The init adapter: its config file named, its tensors against the base's modules.
    ("rl", init("adapter-other-base"), OTHER_BASE),
    ("sft", sft_init("adapter-other-base"), OTHER_BASE),
    ("rl", init("adapter-deeper-base"), "adapts model.layers.2.self_attn.q_proj, which the base model lacks"),
    ("rl", init("adapter-gpt2-names"), "adapts transformer.h.0.attn.c_attn, which the base model lacks"),
    (
        "rl",
        init("adapter-rank4"),
        "holds tensors of rank 4 (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight), but",
    ),
    ("rl", init("adapter-config-garbage"), "adapter-config-garbage/adapter_config.json is not a readable JSON"),
    ("sft", sft_init("adapter-config-empty"), "adapter-config-empty/adapter_config.json is not a readable JSON"),
    ("rl", init("adapter-config-list"), "adapter-config-list/adapter_config.json holds a list"),
    ("rl", init("adapter-config-latin1"), "adapter-config-latin1/adapter_config.json is not a readable JSON"),
    ("rl", init("adapter-cut"), "adapter-cut/adapter_model.safetensors is not a whole safetensors file"),
    ("rl", init("adapter-no-weights"), "adapter-no-weights has no adapter_model.safetensors"),
    ("sft", sft_init("adapter-config-garbage", "--model.lora.alpha", "32"), "adapter_config.json is not a readable"),
    (
        "rl",
        rl_args("--model.lora.init_adapter", "{w.adapter}", "--model.lora.alpha", "32"),
        "has lora_alpha=16, but [model.lora] says 32.0",
    ),
    # The attention implementation: installed, and trainable on this machine's devices.
    ("rl", rl_args("--model.attn_implementation", "flash_attention_2"), "'flash_attention_2' trains on GPUs only"),
    (
        "rl",
        rl_args("--model.attn_implementation", "flash_attention_2", "--dry-run-devices", "2"),
        "model.attn_implementation = 'flash_attention_2': FlashAttention2 has been toggled on",
    ),
    ("sft", sft_args("--model.attn_implementation", "flash_attention_3", "--dry-run"), "'flash_attention_3' trains"),
    (
        "sft",
        sft_args("--model.attn_implementation", "flash_attention_3", "--dry-run", "--dry-run-devices", "1"),
        "model.attn_implementation = 'flash_attention_3': FlashAttention3 has been toggled on",
    ),
    ("rl", rl_args("--model.attn_implementation", "flex_attention"), "'flex_attention' trains on GPUs only"),
    ("sft", sft_args("--model.attn_implementation", "flex_attention", "--dry-run"), "'flex_attention' trains on"),
    ("rl", rl_args("--model.attn_implementation", "paged_attention"), "model.attn_implementation: Input should be"),
    # Seeds every consumer takes (numpy's 0 .. 2**32 - 1).
    ("rl", rl_args("--seed", "-1"), "seed: Input should be greater than or equal to 0"),
    ("rl", rl_args("--seed", str(2**64)), "seed: Input should be less than 4294967296"),
    ("rl", rl_args("--orchestrator.seed", "-5"), "orchestrator.seed: Input should be greater than or equal to 0"),
    ("rl", rl_args("--orchestrator.eval", '{"seed": 4294967296}'), "orchestrator.eval.seed: Input should be less"),
    ("sft", sft_args("--seed", "-1", "--dry-run"), "seed: Input should be greater than or equal to 0"),
    ("sft", sft_args("--seed", str(2**32)), "seed: Input should be less than 4294967296"),
    # The urls of running servers.
    ("rl", rl_args("--inference.urls", "127.0.0.1:8000"), "'127.0.0.1:8000' does not start with http://"),
    ("rl", rl_args("--inference.urls", "http://127.0.0.1:99999"), "'http://127.0.0.1:99999' has a port that is not"),
    ("rl", rl_args("--inference.urls", "http://127.0.0.1:port"), "'http://127.0.0.1:port' has a port that is not"),
    ("rl", rl_args("--inference.urls", '["http://my server:8000"]'), "'http://my server:8000' has spaces"),
    ("rl", rl_args("--inference.urls", "ftp://127.0.0.1:8000"), "'ftp://127.0.0.1:8000' does not start with"),
    ("rl", rl_args("--inference.urls", "http://:8000"), "'http://:8000' names no host"),
    ("rl", rl_args("--inference.urls", "http://127.0.0.1:0"), "'http://127.0.0.1:0' has port 0"),
    ("rl", rl_args("--inference.urls", '["http://127.0.0.1:8000", "localhost:8001"]'), "'localhost:8001' does"),
    # `~` in a path: expanded (the message names the expanded path).
    ("rl", lambda w: rl_args("--model.name", home("lorarl-no-such-model"))(w), f"{home('lorarl-no-such-model')}"),
    ("rl", rl_args("--model.lora.init_adapter", "~/lorarl-no-adapter"), home("lorarl-no-adapter/adapter_config")),
    ("sft", sft_args(data="~/lorarl-no-data.jsonl"), f"{home('lorarl-no-data.jsonl')}: no such file"),
    ("sft", sft_args("--data.eval_path", "~/lorarl-no-eval.jsonl"), f"{home('lorarl-no-eval.jsonl')}: no such"),
    # Groups of one rollout with a group-relative estimator: every advantage 0.
    ("rl", rl_args("--orchestrator.rollouts_per_example", "1", "--orchestrator.batch_size", "8"), GROUPS_OF_ONE),
    (
        "rl",
        rl_args("--orchestrator.rollouts_per_example", "1", "--orchestrator.advantage.type", "rloo"),
        f'{GROUPS_OF_ONE} = "rloo"',
    ),
    (
        "rl",
        rl_args("--orchestrator.rollouts_per_example", "1", "--orchestrator.advantage.type", "dr_grpo"),
        f'{GROUPS_OF_ONE} = "dr_grpo"',
    ),
    (
        "rl",
        rl_args("--orchestrator.rollouts_per_example", "1", "--orchestrator.advantage.type", "grpo"),
        f'{GROUPS_OF_ONE} = "grpo"',
    ),
    # Prompts longer than seq_len, measured on the environment's examples.
    ("rl", rl_args("--seq_len", "32"), "seq_len = 32: orchestrator.env[0] 'reverse_text' has prompts of"),
    ("rl", rl_args("--seq_len", "128", "--orchestrator.env", '[{"id": "math"}]'), "'math' has prompts of"),
    (
        "rl",
        rl_args("--orchestrator.env", '[{"id": "reverse_text"}, {"id": "alphabet_sort"}]', "--seq_len", "160"),
        "orchestrator.env[1] 'alphabet_sort' has prompts of",
    ),
    ("rl", rl_args("--orchestrator.env", '[{"id": "search"}]'), "seq_len = 512: orchestrator.env[0] 'search'"),
    (
        "rl",
        rl_args("--seq_len", "128", "--variants", '[{"name": "a", "orchestrator": {"env": [{"id": "unscramble"}]}}]'),
        "variant 'a': seq_len = 128: orchestrator.env[0] 'unscramble' has prompts of",
    ),
    ("rl", rl_args("--seq_len", "16", "--orchestrator.env", '[{"id": "reasoning_gym:gcd"}]'), "'reasoning_gym:gcd'"),
]


@pytest.mark.parametrize(("command", "args", "names"), CASES, ids=case_ids(CASES))
def test_what_a_start_would_find_the_dry_run_finds(
    ws: Workspace, capsys: pytest.CaptureFixture[str], command: str, args: Callable[[Workspace], list[str]], names: str
) -> None:
    assert_refused(ws, capsys, command, args(ws), names)
