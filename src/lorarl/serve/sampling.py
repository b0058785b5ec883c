"""Sampling for `lorarl-serve`: the Tinker API's `sample` and `compute_logprobs`, for the base model or
any tenant's sampler adapter, through the vLLM workers of a `WorkerPool`.

Adapters are loaded on a worker when a request first needs them there, checked once (the served-adapter
check, orchestrator/served_check.py, where the folder holds the trainer's probe), and kept while they
are used; a worker holds at most `capacity` of them (serve.max_loras, vLLM's --max-loras): one more
unloads the least recently used adapter that no request is using, or waits until one is free. Unload
only ever takes a name no request is using: vLLM refuses a request for a name it no longer lists.

What vLLM 0.32 does itself (measured on the CPU server, tiny model, --max-loras 2): it registers any
number of adapters (5 loaded, all listed by /v1/models) and serves each correctly, one by one and
concurrently: a batch holds at most --max-loras adapters and the rest wait for the next one, and its
worker keeps --max-cpu-loras (default: --max-loras) adapters in memory, reading an evicted one from its
folder again when a request needs it. Unload only takes the name off the list (the engine keeps the
weights until they are evicted). So vLLM swaps by itself; `capacity` here bounds what it lists and may
read from disk at any step (a folder must stay while its name is listed), keeps the listed adapters
those its cache holds, and never puts more adapters in flight on a worker than a batch can take.

What a sequence holds (vLLM 0.32, /v1/completions with token ids):
* the generated tokens and, always, the logprob of each. lorarl starts vLLM with `--logprobs-mode
  processed_logprobs`: the logprobs of the distribution sampled from (temperature applied, renormalised
  over the tokens top_k / top_p keep), which is what the Tinker API's logprobs are. At temperature 0
  (greedy: vLLM below 1e-5) they are the model's own (temperature 1), every sample the same sequence;
* the token that stopped it: EOS, a stop token id (vLLM returns it whatever include_stop_str_in_output
  says), or the token that completed a stop string (that flag changes the text only). Byte-level
  tokens that end inside a character may carry the sequence a token past the stop string: vLLM sees
  the string only once the text decodes;
* stop_reason "stop" (EOS, a stop token or string) or "length" (max_tokens).
`stop`: None stops at EOS; strings or token ids stop there and at EOS too (vLLM's own stopping, kept);
[] stops nowhere, not even at EOS (vLLM's ignore_eos), and generates max_tokens. max_tokens None: as
many as seq_len leaves after the prompt.

Prompt logprobs are the model's (temperature 1) whatever the request's temperature: vLLM scores prompt
tokens before any sampling parameter applies. Position 0 has none.

A request is checked before it is sent; what the client got wrong is a `BadRequest` in one line naming
the field (vLLM's own 400s become one too); a worker that fails is the pool's to route around.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lorarl.inference.client import InferenceClient, InferenceError, RequestRefused
from lorarl.inference.pool import WorkerPool
from lorarl.orchestrator.served_check import ServedCheckFailed, compare, read_probe_file, served_logprobs
from lorarl.serve.ops import BadRequest

GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature (sampling_params._SAMPLING_EPS)
SEED_RANGE = range(-(2**63), 2**63)  # what vLLM accepts

# vLLM's name of a parameter it refused -> the field of the Tinker API's request.
_FIELDS = {
    "prompt": "prompt",
    "n": "num_samples",
    "prompt_logprobs": "topk_prompt_logprobs",
    **{p: f"sampling_params.{p}" for p in ("max_tokens", "temperature", "top_p", "top_k", "seed")},
    "stop": "sampling_params.stop",
    "stop_token_ids": "sampling_params.stop",
}


@dataclass(frozen=True)
class SamplerAdapter:
    """A sampler's weights: the PEFT folder SaveForSampler wrote, under a vLLM name used for it alone
    (a new folder gets a new name: vLLM reads an evicted adapter from its folder again by name)."""

    name: str
    folder: Path


@dataclass(frozen=True)
class SamplingParams:
    """The Tinker SDK's SamplingParams. `top_k` -1: no limit; `stop`: see the module docstring."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: str | Sequence[str] | Sequence[int] | None = None


@dataclass
class SampledSequence:
    tokens: list[int]  # generated, the stopping token included
    logprobs: list[float]  # of each token, under the distribution sampled from
    stop_reason: Literal["stop", "length"]


TopK = list[tuple[int, float]]  # (token, logprob), most likely first


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None  # per prompt token, None at position 0
    topk_prompt_logprobs: list[TopK | None] | None = None  # per prompt token, None at position 0


@dataclass
class _Slot:
    """An adapter on one worker: its load (and check), and the requests that hold it."""

    ready: asyncio.Task[None]
    in_flight: int = 1


@dataclass
class _Worker:
    """The adapters a worker holds (least recently used first), and the lock that orders its loads
    and unloads (an unload of a name must not overtake a later load of it)."""

    slots: OrderedDict[str, _Slot] = field(default_factory=OrderedDict)
    registry: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sampler:
    """Samples for every tenant of one `lorarl-serve` through `pool`'s workers."""

    def __init__(
        self, pool: WorkerPool, base_model: str, capacity: int, seq_len: int, vocab_size: int, tolerance: float | None
    ) -> None:
        """`base_model`: vLLM's name of it (--model); `capacity`: adapters a worker holds at once
        (serve.max_loras); `seq_len`: vLLM's --max-model-len; `vocab_size`: the model's; `tolerance`:
        the served-adapter check's (served_check.tolerance_for), None: no check."""
        if capacity < 1:
            raise ValueError("capacity: a worker must hold at least one adapter")
        self.pool, self.base_model, self.capacity = pool, base_model, capacity
        self.seq_len, self.vocab_size, self.tolerance = seq_len, vocab_size, tolerance
        self._workers: dict[InferenceClient, _Worker] = {}
        self._freed = asyncio.Event()  # set when a slot may have become free

    async def sample(
        self,
        adapter: SamplerAdapter | None,
        prompt: list[int],
        num_samples: int,
        params: SamplingParams,
        prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> SampleResult:
        """`num_samples` sequences after `prompt` from `adapter` (None: the base model), with the
        prompt's logprobs and its top-k alternatives where asked."""
        max_tokens = check_request(prompt, num_samples, params, topk_prompt_logprobs, self.seq_len, self.vocab_size)
        greedy = params.temperature < GREEDY_BELOW
        body = completion_body(prompt, 1 if greedy else num_samples, max_tokens, params)
        if prompt_logprobs or topk_prompt_logprobs:
            body["prompt_logprobs"] = topk_prompt_logprobs
        answer = await self._complete(adapter, body)
        result = read_answer(answer, prompt, prompt_logprobs, topk_prompt_logprobs)
        if greedy:  # vLLM samples greedily once (it refuses n > 1); every sample is that sequence
            one = result.sequences[0]
            result.sequences = [
                SampledSequence(list(one.tokens), list(one.logprobs), one.stop_reason) for _ in range(num_samples)
            ]
        return result

    async def compute_logprobs(self, adapter: SamplerAdapter | None, prompt: list[int]) -> list[float | None]:
        """log p(each prompt token | the tokens before it) under `adapter`; None at position 0."""
        result = await self.sample(adapter, prompt, 1, SamplingParams(max_tokens=1), prompt_logprobs=True)
        assert result.prompt_logprobs is not None
        return result.prompt_logprobs

    def loaded(self, worker: InferenceClient) -> list[str]:
        """The adapters held on `worker`, least recently used first."""
        return list(self._workers[worker].slots) if worker in self._workers else []

    async def _complete(self, adapter: SamplerAdapter | None, body: dict[str, Any]) -> dict[str, Any]:
        model = self.base_model if adapter is None else adapter.name
        try:
            return await self.pool.route(lambda worker: self._on(worker, adapter, {**body, "model": model}), model)
        except RequestRefused as e:
            if e.status == 400:  # vLLM's pydantic errors name "body.<field>" and run over many lines
                name = _FIELDS.get((e.param or "").removeprefix("body."), "sample")
                raise BadRequest(f"{name}: {e.message.strip().splitlines()[0][:300]}") from None
            raise

    async def _on(self, worker: InferenceClient, adapter: SamplerAdapter | None, body: dict[str, Any]) -> Any:
        """The completion on `worker`, with `adapter` loaded there and held while it runs."""
        if adapter is None:
            return await worker.completions(body)
        for attempt in range(2):
            slot = await self._hold(worker, adapter)
            try:
                await asyncio.shield(slot.ready)  # one load for every request waiting on it
                return await worker.completions(body)
            except BaseException as e:
                # Not served although loaded: the worker restarted, or came back to the pool without it
                # (WorkerPool._bring_back unloads what the pool itself did not load). Load it again, once.
                unknown = isinstance(e, RequestRefused) and e.status == 404 and e.param == "model"
                if unknown or failed(slot.ready):  # a failed load or check: the next request tries afresh
                    self._drop(worker, adapter.name, slot)
                if not unknown or attempt == 1:
                    raise
            finally:
                slot.in_flight -= 1
                self._freed.set()
        raise AssertionError("unreachable")

    async def _hold(self, worker: InferenceClient, adapter: SamplerAdapter) -> _Slot:
        """The adapter's slot on `worker`, held (in_flight counted): the one there, or a new one loading
        it, once the worker has room."""
        state = self._workers.setdefault(worker, _Worker())
        while (slot := self._claim(worker, state, adapter)) is None:
            self._freed.clear()
            await self._freed.wait()
        return slot

    def _claim(self, worker: InferenceClient, state: _Worker, adapter: SamplerAdapter) -> _Slot | None:
        """Synchronous, so that no other request changes the slots in between."""
        slots = state.slots
        if (slot := slots.get(adapter.name)) is not None:
            slots.move_to_end(adapter.name)
            slot.in_flight += 1
            return slot
        victim = None
        if len(slots) >= self.capacity:
            victim = next((n for n, s in slots.items() if s.in_flight == 0 and s.ready.done()), None)
            if victim is None:
                return None  # every adapter there is in use
            del slots[victim]
        slot = _Slot(asyncio.create_task(self._load(worker, state, adapter, victim)))
        slot.ready.add_done_callback(failed)  # its error is retrieved even if every request waiting on it left
        slots[adapter.name] = slot
        return slot

    def _drop(self, worker: InferenceClient, name: str, slot: _Slot) -> None:
        slots = self._workers[worker].slots
        if slots.get(name) is slot:
            del slots[name]

    async def _load(self, worker: InferenceClient, state: _Worker, adapter: SamplerAdapter, victim: str | None) -> None:
        async with state.registry:
            if victim is not None:
                await worker.unload_adapter(victim)
            # replace: the name is this server's alone; one a worker kept from before is reloaded from its folder.
            await worker.load_adapter(adapter.name, str(adapter.folder), replace=True)
        try:
            await self._check(worker, adapter)
        except ServedCheckFailed:
            async with state.registry:
                await worker.unload_adapter(adapter.name)
            raise

    async def _check(self, worker: InferenceClient, adapter: SamplerAdapter) -> None:
        """The served-adapter check: the trainer's probe, scored by `worker` through the adapter, must
        match the trainer's logprobs of it (where the folder holds a probe and checks are on)."""
        probe = read_probe_file(adapter.folder) if self.tolerance is not None else None
        if probe is None or self.tolerance is None:
            return
        served = await served_logprobs(worker, adapter.name, probe["sequences"])
        gaps = compare(served, probe["logprobs"], probe["base"])
        if (problem := gaps.problem(self.tolerance)) is not None:
            raise ServedCheckFailed(
                f"served-adapter check failed: {worker.base_url} serving {adapter.name} from {adapter.folder}: "
                f"{problem}: {gaps.figures()}, tolerance {self.tolerance:g}"
            )


def failed(task: asyncio.Task[None]) -> bool:
    """Whether `task` ended without success (its exception retrieved)."""
    return task.done() and (task.cancelled() or task.exception() is not None)


def check_request(
    prompt: list[int], num_samples: int, params: SamplingParams, topk_prompt_logprobs: int, seq_len: int, vocab: int
) -> int:
    """The tokens to generate (max_tokens, or what seq_len leaves after the prompt); BadRequest naming
    the field if the request cannot be served as given."""
    if not prompt:
        raise BadRequest("prompt: no tokens")
    if bad := next(((i, t) for i, t in enumerate(prompt) if not 0 <= t < vocab), None):
        raise BadRequest(f"prompt: token {bad[1]} (position {bad[0]}) is not in the vocabulary (0 to {vocab - 1})")
    if num_samples < 1:
        raise BadRequest(f"num_samples: {num_samples}; at least 1")
    if topk_prompt_logprobs < 0:
        raise BadRequest(f"topk_prompt_logprobs: {topk_prompt_logprobs}; 0 (none) or more")
    max_tokens = seq_len - len(prompt) if params.max_tokens is None else params.max_tokens
    if params.max_tokens is not None and max_tokens < 1:
        raise BadRequest(f"sampling_params.max_tokens: {max_tokens}; at least 1")
    if len(prompt) + max(max_tokens, 1) > seq_len:
        given = f"max_tokens ({max_tokens})" if params.max_tokens is not None else "one token to generate"
        raise BadRequest(
            f"sampling_params.max_tokens: prompt ({len(prompt)} tokens) + {given} exceeds seq_len {seq_len}"
        )
    if not (math.isfinite(params.temperature) and params.temperature >= 0):
        raise BadRequest(f"sampling_params.temperature: {params.temperature}; 0 (greedy) or more")
    if not (math.isfinite(params.top_p) and 0 < params.top_p <= 1):
        raise BadRequest(f"sampling_params.top_p: {params.top_p}; more than 0, at most 1")
    if params.top_k < -1:
        raise BadRequest(f"sampling_params.top_k: {params.top_k}; -1 (no limit) or at least 1")
    if params.seed is not None and params.seed not in SEED_RANGE:
        raise BadRequest(f"sampling_params.seed: {params.seed}; a signed 64-bit integer")
    stop = params.stop
    if isinstance(stop, Sequence) and not isinstance(stop, str):
        if any(isinstance(s, str) and not s for s in stop):
            raise BadRequest("sampling_params.stop: an empty stop string")
        if not (all(isinstance(s, str) for s in stop) or all(isinstance(s, int) for s in stop)):
            raise BadRequest("sampling_params.stop: either stop strings or stop token ids, not both")
        if bad_id := next((s for s in stop if isinstance(s, int) and not 0 <= s < vocab), None):
            raise BadRequest(f"sampling_params.stop: token {bad_id} is not in the vocabulary (0 to {vocab - 1})")
    elif stop == "":
        raise BadRequest("sampling_params.stop: an empty stop string")
    return max_tokens


def completion_body(prompt: list[int], n: int, max_tokens: int, params: SamplingParams) -> dict[str, Any]:
    """vLLM's /v1/completions request (the model name aside) for `params`, tokens and logprobs back."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "n": n,
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": 0,
        "return_token_ids": True,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    stop = params.stop
    if isinstance(stop, str):
        body["stop"] = [stop]
    elif stop is not None and len(stop) == 0:
        body["ignore_eos"] = True  # [] : no stop at all, not even EOS
    elif stop is not None and all(isinstance(s, int) for s in stop):
        body["stop_token_ids"] = list(stop)
    elif stop is not None:
        body["stop"] = list(stop)
    return body


def read_answer(answer: dict[str, Any], prompt: list[int], prompt_logprobs: bool, topk: int) -> SampleResult:
    """vLLM's completion answer as a SampleResult."""
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    sequences = []
    for choice in choices:
        reason = choice["finish_reason"]
        if reason not in ("stop", "length"):
            raise InferenceError(f"vLLM ended a sequence with finish_reason {reason!r}")
        tokens, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        sequences.append(SampledSequence(list(tokens), [float(x) for x in logprobs], reason))
    result = SampleResult(sequences)
    if prompt_logprobs or topk:
        scored = choices[0]["prompt_logprobs"]
        if len(scored) != len(prompt):
            raise InferenceError(f"vLLM scored {len(scored)} prompt positions of {len(prompt)}")
    if prompt_logprobs:
        pairs = zip(scored[1:], prompt[1:], strict=True)
        result.prompt_logprobs = [None, *(float(entry[str(token)]["logprob"]) for entry, token in pairs)]
    if topk:
        result.topk_prompt_logprobs = [None, *(top_k(entry, topk) for entry in scored[1:])]
    return result


def top_k(entry: dict[str, dict[str, Any]], k: int) -> TopK:
    """vLLM's prompt logprobs at one position (the prompt token and the k most likely) as the k most
    likely (token, logprob), most likely first."""
    ranked = sorted((v["rank"], int(t), float(v["logprob"])) for t, v in entry.items() if v["rank"] <= k)
    return [(token, logprob) for _, token, logprob in ranked]
