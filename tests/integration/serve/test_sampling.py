"""`lorarl-serve`'s sampling (serve/sampling.py) against the real vLLM server of the session: the base
model and PEFT adapters written as the trainer engine writes them (a folder with the served-adapter
check's probe), sampled, scored, swapped in and out beyond the worker's capacity."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lorarl.config.run import RLConfig
from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator.served_check import TOLERANCE, ServedCheckFailed
from lorarl.run_folder import PROBE_FILE
from lorarl.serve.ops import BadRequest
from lorarl.serve.sampling import Sampler, SamplerAdapter, SamplingParams
from lorarl.trainer.batching import MicroBatch
from lorarl.trainer.broadcast import write_policy
from lorarl.trainer.loss import token_logprobs
from lorarl.trainer.served_probe import attach_probe
from tests.conftest import API_KEY

pytestmark = pytest.mark.integration

SEQ_LEN = 2048  # the session server's --max-model-len (conftest.serve_vllm)
T = TypeVar("T")


@dataclass
class Written:
    """An adapter as the engine writes it, and the trainer's logprobs of PROMPT under it."""

    folder: Path
    logprobs: list[float]


@dataclass
class Setup:
    url: str
    model: Path
    vocab: int
    eos: int
    prompt: list[int]
    base_logprobs: list[float]
    adapters: list[Written]


def trainer_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """The trainer's log p(token | tokens before it), float32, of every token but the first."""
    tokens = torch.tensor([ids])
    ones = torch.ones_like(tokens[:, 1:], dtype=torch.float32)
    batch = MicroBatch(tokens, torch.ones_like(tokens), ones.bool(), ones * 0, ones * 0, 1.0)
    with torch.no_grad():
        return token_logprobs(model.eval(), batch)[0].tolist()


@pytest.fixture(scope="module")
def setup(tiny_model: Path, vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """Five adapters with random LoRA B (each its own policy), written with their probes."""
    out = tmp_path_factory.mktemp("samplers")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    model = peft.get_peft_model(base, lora)
    attach_probe(model, RLConfig.model_validate({"model": {"name": str(tiny_model)}, "output_dir": str(out)}))
    with model.disable_adapter():
        base_logprobs = trainer_logprobs(model, prompt)
    adapters = []
    for i in range(5):
        torch.manual_seed(i)
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if "lora_B" in name:
                    weight.normal_(0, 0.3)
        write_policy(model, out / f"sampler_{i}")
        adapters.append(Written(out / f"sampler_{i}", trainer_logprobs(model, prompt)))
    yield Setup(vllm_server, tiny_model, len(tokenizer), tokenizer.eos_token_id, prompt, base_logprobs, adapters)
    for name in served_adapters(vllm_server):  # leave the session's server as this module found it
        if name.startswith("sampling-test-"):
            request(vllm_server, "/v1/unload_lora_adapter", {"lora_name": name})


def request(url: str, path: str, body: dict[str, object] | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url + path, data, headers), timeout=30) as answer:
        return json.loads(answer.read() or b"null") if path == "/v1/models" else None


def served_adapters(url: str) -> list[str]:
    models = request(url, "/v1/models")
    assert isinstance(models, dict)
    return [m["id"] for m in models["data"] if m.get("parent")]


def run(setup: Setup, work: Callable[[Sampler], Awaitable[T]], capacity: int = 2, check: bool = True) -> T:
    """`work` with a Sampler of `capacity` over the session's server, in a loop of its own."""

    async def go() -> T:
        pool = WorkerPool([setup.url], api_key=API_KEY, timeout=60.0)
        sampler = Sampler(
            pool, str(setup.model), capacity, SEQ_LEN, setup.vocab, TOLERANCE["float32"] if check else None
        )
        try:
            return await work(sampler)
        finally:
            await pool.close()

    return asyncio.run(go())


def adapter(setup: Setup, i: int, test: str) -> SamplerAdapter:
    return SamplerAdapter(f"sampling-test-{test}-{i}", setup.adapters[i].folder)


def max_gap(served: list[float | None], trainer: list[float]) -> float:
    assert served[0] is None and len(served) == len(trainer) + 1
    return max(abs(s - t) for s, t in zip(served[1:], trainer, strict=True) if s is not None)


def test_samples_have_a_logprob_per_token_and_a_stop_reason(setup: Setup) -> None:
    params = SamplingParams(max_tokens=8, seed=5, temperature=0.7)

    async def work(sampler: Sampler) -> tuple[list[list[int]], list[list[int]]]:
        base = await sampler.sample(None, setup.prompt, 3, params)
        tuned = await sampler.sample(adapter(setup, 0, "shapes"), setup.prompt, 3, params)
        for result in (base, tuned):
            assert len(result.sequences) == 3 and result.prompt_logprobs is result.topk_prompt_logprobs is None
            for s in result.sequences:
                assert len(s.tokens) == len(s.logprobs) and all(lp <= 0 for lp in s.logprobs)
                ended_at_eos = s.stop_reason == "stop" and s.tokens[-1] == setup.eos
                assert ended_at_eos or (s.stop_reason, len(s.tokens)) == ("length", 8)
        return [s.tokens for s in base.sequences], [s.tokens for s in tuned.sequences]

    base, tuned = run(setup, work)
    assert len({tuple(t) for t in base}) == 3  # n distinct samples
    assert base != tuned  # the adapter's policy, not the base's


def test_stop_token_ids_and_stop_strings_end_a_sequence_and_stay_in_it(setup: Setup) -> None:
    tokenizer = AutoTokenizer.from_pretrained(setup.model)

    async def work(sampler: Sampler) -> None:
        async def sample(seed: int, stop: list[str] | list[int]) -> tuple[list[int], str]:
            params = SamplingParams(max_tokens=30, seed=seed, stop=stop)
            sequence = (await sampler.sample(None, setup.prompt, 1, params)).sequences[0]
            return sequence.tokens, sequence.stop_reason

        free, reason = await sample(0, [])
        assert (len(free), reason) == (30, "length")
        at = next(i for i in range(3, len(free)) if free[i] not in free[:i])
        assert await sample(0, [free[at]]) == (free[: at + 1], "stop")
        # A stop string: the text of two printable one-character tokens, first seen there.
        for seed in range(20):
            free, _ = await sample(seed, [])
            pieces = [tokenizer.decode([t]) for t in free]
            for at in range(2, len(free)):
                stop, text = pieces[at - 1] + pieces[at], tokenizer.decode(free[: at + 1])
                if plain(pieces[at - 1]) and plain(pieces[at]) and text.find(stop) == len(text) - 2:
                    assert await sample(seed, [stop]) == (free[: at + 1], "stop")
                    return
        pytest.fail("no seed of 20 generated two printable characters in a row")

    run(setup, work)


def plain(piece: str) -> bool:
    return len(piece) == 1 and piece.isascii() and piece.isprintable()


def test_no_stop_at_all_generates_max_tokens_through_eos(setup: Setup) -> None:
    async def work(sampler: Sampler) -> None:
        at_eos = await sampler.sample(None, setup.prompt, 4, SamplingParams(max_tokens=150, seed=0))
        ended = [s for s in at_eos.sequences if s.stop_reason == "stop"]
        assert ended and all(s.tokens[-1] == setup.eos and s.tokens.count(setup.eos) == 1 for s in ended)
        through = await sampler.sample(None, setup.prompt, 4, SamplingParams(max_tokens=150, seed=0, stop=[]))
        for stopped, free in zip(at_eos.sequences, through.sequences, strict=True):
            assert (len(free.tokens), free.stop_reason) == (150, "length")
            assert free.tokens[: len(stopped.tokens)] == stopped.tokens  # the same draws, on past EOS

    run(setup, work)


def test_a_seed_reproduces_samples_and_greedy_gives_one_sequence(setup: Setup) -> None:
    async def work(sampler: Sampler) -> None:
        name = adapter(setup, 1, "seed")

        async def tokens(params: SamplingParams) -> list[list[int]]:
            return [s.tokens for s in (await sampler.sample(name, setup.prompt, 2, params)).sequences]

        first = await tokens(SamplingParams(max_tokens=10, seed=7))
        assert await tokens(SamplingParams(max_tokens=10, seed=7)) == first
        assert await tokens(SamplingParams(max_tokens=10, seed=8)) != first
        greedy = await sampler.sample(name, setup.prompt, 3, SamplingParams(max_tokens=10, temperature=0.0))
        assert len(greedy.sequences) == 3 and all(s == greedy.sequences[0] for s in greedy.sequences)

    run(setup, work)


def test_prompt_logprobs_and_their_top_k(setup: Setup) -> None:
    async def work(sampler: Sampler) -> None:
        name = adapter(setup, 2, "prompt")
        params = SamplingParams(max_tokens=2, temperature=0.5)
        result = await sampler.sample(name, setup.prompt, 1, params, prompt_logprobs=True, topk_prompt_logprobs=3)
        assert result.prompt_logprobs is not None and result.topk_prompt_logprobs is not None
        assert len(result.prompt_logprobs) == len(result.topk_prompt_logprobs) == len(setup.prompt)
        assert result.topk_prompt_logprobs[0] is None
        for top, own in zip(result.topk_prompt_logprobs[1:], result.prompt_logprobs[1:], strict=True):
            assert top is not None and own is not None and len(top) == 3
            assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True) and top[-1][1] >= own - 1e-6
        # The model's logprobs whatever the temperature: compute_logprobs' (temperature 1) and the trainer's.
        assert max_gap(result.prompt_logprobs, setup.adapters[2].logprobs) < TOLERANCE["float32"]
        assert result.prompt_logprobs == await sampler.compute_logprobs(name, setup.prompt)

    run(setup, work)


def test_compute_logprobs_agrees_with_the_trainer(setup: Setup) -> None:
    async def work(sampler: Sampler) -> list[float]:
        base = await sampler.compute_logprobs(None, setup.prompt)
        tuned = await sampler.compute_logprobs(adapter(setup, 3, "logprobs"), setup.prompt)
        return [max_gap(base, setup.base_logprobs), max_gap(tuned, setup.adapters[3].logprobs)]

    assert max(run(setup, work)) < TOLERANCE["float32"]
    assert max(abs(a - b) for a, b in zip(setup.adapters[3].logprobs, setup.base_logprobs, strict=True)) > 0.1


def test_more_adapters_than_capacity_are_each_served_as_trained(setup: Setup) -> None:
    seen: list[int] = []

    async def watch() -> None:
        while True:
            names = await asyncio.to_thread(served_adapters, setup.url)
            seen.append(sum(n.startswith("sampling-test-swap-") for n in names))
            await asyncio.sleep(0.05)

    async def work(sampler: Sampler) -> list[float]:
        watcher = asyncio.create_task(watch())
        names = [adapter(setup, i, "swap") for i in range(5)]
        gaps = []
        try:
            for _ in range(2):  # in turn: each load evicts the least recently used
                for i, name in enumerate(names):
                    gaps.append(max_gap(await sampler.compute_logprobs(name, setup.prompt), setup.adapters[i].logprobs))
            together = await asyncio.gather(*(sampler.compute_logprobs(n, setup.prompt) for n in names * 3))
            gaps += [max_gap(lp, setup.adapters[i % 5].logprobs) for i, lp in enumerate(together)]
            samples = await asyncio.gather(
                *(sampler.sample(n, setup.prompt, 2, SamplingParams(max_tokens=6, seed=1)) for n in names)
            )
            assert all(len(s.sequences) == 2 for s in samples)
            assert len(sampler.loaded(sampler.pool.workers[0])) == 2
        finally:
            watcher.cancel()
        return gaps

    gaps = run(setup, work)
    assert len(gaps) == 25 and max(gaps) < TOLERANCE["float32"]
    assert seen and max(seen) <= 2


def test_an_adapter_unloaded_behind_its_back_is_loaded_again(setup: Setup) -> None:
    async def work(sampler: Sampler) -> float:
        name = adapter(setup, 4, "reload")
        await sampler.compute_logprobs(name, setup.prompt)
        await sampler.pool.workers[0].unload_adapter(name.name)  # as a worker that restarted would have it
        return max_gap(await sampler.compute_logprobs(name, setup.prompt), setup.adapters[4].logprobs)

    assert run(setup, work) < TOLERANCE["float32"]


def test_an_adapter_that_fails_the_served_check_is_an_error_and_not_kept(setup: Setup, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for file in setup.adapters[0].folder.iterdir():
        (wrong / file.name).write_bytes(file.read_bytes())
    (wrong / PROBE_FILE).write_text((setup.adapters[1].folder / PROBE_FILE).read_text())  # another's probe
    name = SamplerAdapter("sampling-test-wrong-0", wrong)

    async def work(sampler: Sampler) -> None:
        with pytest.raises(ServedCheckFailed, match="sampling-test-wrong-0.*serves other weights") as failed:
            await sampler.sample(name, setup.prompt, 1, SamplingParams(max_tokens=2))
        assert "\n" not in str(failed.value)
        assert "sampling-test-wrong-0" not in served_adapters(setup.url)
        assert sampler.loaded(sampler.pool.workers[0]) == []
        await sampler.sample(adapter(setup, 0, "after-wrong"), setup.prompt, 1, SamplingParams(max_tokens=2))

    run(setup, work)
    run(setup, lambda sampler: sampler.sample(name, setup.prompt, 1, SamplingParams(max_tokens=2)), check=False)


PROMPT = list(range(5, 15))
FOUR = SamplingParams(max_tokens=4)


@pytest.mark.parametrize(
    ("prompt", "num_samples", "params", "topk", "field"),
    [
        ([], 1, FOUR, 0, "prompt: no tokens"),
        ([1, 2, 10_000], 1, FOUR, 0, "prompt: token 10000 (position 2)"),
        (PROMPT, 0, FOUR, 0, "num_samples: 0"),
        (
            PROMPT,
            1,
            SamplingParams(max_tokens=2040),
            0,
            "sampling_params.max_tokens: prompt (10 tokens) + max_tokens (2040) exceeds seq_len 2048",
        ),
        (PROMPT, 1, SamplingParams(max_tokens=0), 0, "sampling_params.max_tokens: 0"),
        (PROMPT, 1, SamplingParams(max_tokens=4, temperature=-0.5), 0, "sampling_params.temperature: -0.5"),
        (PROMPT, 1, SamplingParams(max_tokens=4, top_p=0.0), 0, "sampling_params.top_p: 0.0"),
        (PROMPT, 1, SamplingParams(max_tokens=4, top_k=-3), 0, "sampling_params.top_k: -3"),
        (PROMPT, 1, SamplingParams(max_tokens=4, seed=2**64), 0, "sampling_params.seed"),
        (PROMPT, 1, SamplingParams(max_tokens=4, stop=[1, 10_000]), 0, "sampling_params.stop: token 10000"),
        (PROMPT, 1, FOUR, -1, "topk_prompt_logprobs: -1"),
        (PROMPT, 1, FOUR, 30, "topk_prompt_logprobs: Requested prompt logprobs of 30"),  # vLLM's own 400
    ],
)
def test_bad_requests_name_their_field(
    setup: Setup, prompt: list[int], num_samples: int, params: SamplingParams, topk: int, field: str
) -> None:
    async def work(sampler: Sampler) -> None:
        with pytest.raises(BadRequest) as refused:
            await sampler.sample(None, prompt, num_samples, params, topk_prompt_logprobs=topk)
        assert str(refused.value).startswith(field) and "\n" not in str(refused.value)

    run(setup, work)
