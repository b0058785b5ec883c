"""Config rules of issue 34 that accept as well as refuse: a blank api_key is no key (open only on
loopback), urls of servers, seeds, groups of one rollout, and `~` expanded once in every path key."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorarl.config.loader import ConfigError, load_config
from lorarl.config.run import RLConfig
from lorarl.config.sft import SFTConfig

MODEL = ["--model.name", "m"]


@pytest.mark.parametrize("key", ["", " ", "\t"])
def test_a_blank_api_key_is_no_key_on_loopback(key: str) -> None:
    assert load_config(RLConfig, [*MODEL, f"--inference.api_key={key}"]).inference.api_key is None


def test_an_open_host_with_a_real_key_is_accepted() -> None:
    cfg = load_config(RLConfig, [*MODEL, "--inference.host", "0.0.0.0", "--inference.api_key", "s3cret"])
    assert cfg.inference.api_key == "s3cret"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "https://vllm.example.org", "http://[::1]:8000/", "http://node-3:65535"]
)
def test_server_urls_are_accepted(url: str) -> None:
    assert load_config(RLConfig, [*MODEL, "--inference.urls", url]).inference.urls == [url]


@pytest.mark.parametrize("seed", [0, 2**32 - 1])
def test_seeds_at_the_ends_of_the_range(seed: int) -> None:
    cfg = load_config(RLConfig, [*MODEL, "--seed", str(seed), "--orchestrator.seed", str(seed)])
    assert cfg.seed == cfg.orchestrator.seed == seed


def test_groups_of_one_are_left_to_a_custom_estimator() -> None:
    args = [*MODEL, "--orchestrator.rollouts_per_example", "1", "--orchestrator.advantage.type", "custom"]
    args += ["--orchestrator.advantage.fn", "mine:adv"]
    assert load_config(RLConfig, args).orchestrator.rollouts_per_example == 1
    with pytest.raises(ConfigError, match='rollouts_per_example = 1 with advantage.type = "grpo"'):
        load_config(RLConfig, [*MODEL, "--orchestrator.rollouts_per_example", "1"])


def test_tilde_is_expanded_in_every_path_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    rl = load_config(
        RLConfig, ["--model.name", "~/model", "--output_dir", "~/runs", "--model.lora.init_adapter", "~/a"]
    )
    assert rl.model.name == str(tmp_path / "model")
    assert (rl.output_dir, rl.lora.init_adapter) == (tmp_path / "runs", tmp_path / "a")
    sft = load_config(SFTConfig, ["--model.name", "~/m", "--data.path", "~/d.jsonl", "--data.eval_path", "~/e.jsonl"])
    assert (sft.data.path, sft.data.eval_path) == (tmp_path / "d.jsonl", tmp_path / "e.jsonl")
    # A hub id is left alone, and so is a path without "~".
    assert load_config(RLConfig, ["--model.name", "Qwen/Qwen3-0.6B"]).model.name == "Qwen/Qwen3-0.6B"
