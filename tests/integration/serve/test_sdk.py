"""`lorarl-serve` driven by the stock `tinker` SDK (0.38, unmodified), as a researcher's loop drives it:
training, sampling, several tenants at once, retries, ownership, bad requests, a kill and --resume."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sqlite3
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import tinker
from tinker import types
from tinker.proto import request_conv

from lorarl.orchestrator.served_check import TOLERANCE
from tests.integration.serve.conftest import KEY, OTHER_KEY, Server, running_server, serve_config

pytestmark = [pytest.mark.integration]

SPECS = ((4, 1), (8, 2), (16, 3))  # (rank, seed) of the three tenants


def datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    """A supervised datum of `tokens`: every next token a target, weighted 1 (or by `weights`)."""
    weights = weights if weights is not None else [1.0] * (len(tokens) - 1)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def batch(seed: int, n: int = 8, length: int = 12) -> list[types.Datum]:
    rng = random.Random(seed)
    return [datum([rng.randrange(10, 200) for _ in range(length)]) for _ in range(n)]


def train(client: tinker.TrainingClient, data: list[types.Datum], steps: int, lr: float = 1e-2) -> list[float]:
    """Losses per target token of `steps` supervised steps on `data`."""
    losses = []
    targets = sum(len(d.loss_fn_inputs["target_tokens"].tolist()) for d in data)
    for _ in range(steps):
        result = client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=lr)).result()
        losses.append(result.result().metrics["loss:sum"] / targets)
    return losses


def logprobs_of(client: tinker.TrainingClient, data: list[types.Datum]) -> list[list[float]]:
    out = client.forward(data, "cross_entropy").result()
    return [o["logprobs"].tolist() for o in out.loss_fn_outputs]


def test_a_supervised_loop_learns_and_its_outputs_are_the_sdks(server: Server) -> None:
    service = server.client()
    [model] = service.get_server_capabilities().supported_models
    client = service.create_lora_training_client(base_model=model.model_name, rank=8, seed=1).result()
    data = batch(0)
    losses = train(client, data, steps=10)
    assert losses[-1] < 0.8 * losses[0], losses
    forward = client.forward(data, "cross_entropy").result()
    assert len(forward.loss_fn_outputs) == len(data)
    first = forward.loss_fn_outputs[0]
    assert len(first["logprobs"].tolist()) == len(data[0].loss_fn_inputs["target_tokens"].tolist())
    # The loss is the sum of -weight * logprob (Tinker's cross_entropy), as the outputs say.
    total = -sum(sum(o["logprobs"].tolist()) for o in forward.loss_fn_outputs)
    assert math.isclose(forward.metrics["loss:sum"], total, rel_tol=1e-4)
    assert client.get_tokenizer() is not None  # the SDK loads it from the path get_info names


def test_three_tenants_at_once_each_train_as_alone(server: Server) -> None:
    """Interleaved on one base, three adapters end where each ends trained alone (float noise)."""
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    tenants = [service.create_lora_training_client(base_model=base, rank=r, seed=s).result() for r, s in SPECS]
    data = [batch(10 + i) for i in range(3)]
    for _ in range(3):  # in turn, each request answered before the next tenant's
        for tenant, d in zip(tenants, data, strict=True):
            tenant.forward_backward(d, "cross_entropy")
            tenant.optim_step(types.AdamParams(learning_rate=1e-2))
    together = [logprobs_of(t, d) for t, d in zip(tenants, data, strict=True)]
    for (rank, seed), d, mixed in zip(SPECS, data, together, strict=True):
        alone = service.create_lora_training_client(base_model=base, rank=rank, seed=seed).result()
        train(alone, d, steps=3)
        solo = logprobs_of(alone, d)
        assert max(abs(a - b) for ra, rb in zip(solo, mixed, strict=True) for a, b in zip(ra, rb, strict=True)) < 1e-5


def test_trainer_and_sampler_logprobs_agree_and_sampling_answers_as_the_sdk_expects(server: Server) -> None:
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    client = service.create_lora_training_client(base_model=base, rank=8, seed=4).result()
    data = batch(20, n=2)
    train(client, data, steps=2)
    sampler = client.save_weights_and_get_sampling_client().result()
    tokens = data[0].model_input.to_ints() + [data[0].loss_fn_inputs["target_tokens"].tolist()[-1]]
    served = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
    trained = logprobs_of(client, data[:1])[0]
    assert served[0] is None and len(served) == len(tokens)
    assert max(abs(s - t) for s, t in zip(served[1:], trained, strict=True)) <= TOLERANCE["float32"]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    result = sampler.sample(types.ModelInput.from_ints(tokens[:5]), 3, params).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) <= 6 and seq.stop_reason in ("stop", "length")
    again = sampler.sample(types.ModelInput.from_ints(tokens[:5]), 3, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # the seed
    scored = sampler.sample(
        types.ModelInput.from_ints(tokens), 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=2
    ).result()
    assert scored.prompt_logprobs is not None and scored.topk_prompt_logprobs is not None
    assert scored.prompt_logprobs[0] is None and scored.prompt_logprobs[1:] == pytest.approx(served[1:], abs=1e-4)
    for logprob, top in zip(scored.prompt_logprobs[1:], scored.topk_prompt_logprobs[1:], strict=True):
        assert top is not None and len(top) == 2 and top[0][1] >= top[1][1] and top[0][1] >= logprob - 1e-4


def _post(server: Server, path: str, body: bytes, key: str = KEY, proto: bool = False) -> tuple[int, dict]:
    headers = {"X-API-Key": key, "Content-Type": "application/x-protobuf" if proto else "application/json"}
    request = urllib.request.Request(f"{server.url}/api/v1/{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_retried_request_is_applied_once(server: Server) -> None:
    """The SDK sends a request again (the same seq_id) when it did not get the answer: one update."""
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    once, twice = (service.create_lora_training_client(base_model=base, rank=8, seed=5).result() for _ in range(2))
    data = batch(30, n=3)
    body_of = {}
    for client in (once, twice):
        model_id = client.model_id
        request = types.ForwardBackwardRequest(
            model_id=model_id,
            seq_id=1000,
            forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"),
        )
        body_of[model_id] = request_conv.forward_backward_request_to_proto(request).SerializeToString()
    answers = [_post(server, "forward_backward", body_of[twice.model_id], proto=True) for _ in range(2)]
    assert answers[0] == answers[1] and answers[0][0] == 200  # the same request id: applied once
    _post(server, "forward_backward", body_of[once.model_id], proto=True)
    for client in (once, twice):
        step = {"model_id": client.model_id, "seq_id": 1001, "adam_params": {"learning_rate": 1e-2}}
        _post(server, "optim_step", json.dumps(step).encode())
    assert logprobs_of(once, data) == logprobs_of(twice, data)


def test_another_key_cannot_touch_a_tenant(server: Server) -> None:
    owner = server.client()
    base = owner.get_server_capabilities().supported_models[0].model_name
    client = owner.create_lora_training_client(base_model=base, rank=8, seed=6).result()
    path = client.save_state("mine").result().path
    other = server.client(OTHER_KEY)
    with pytest.raises(tinker.NotFoundError):
        other.create_training_client_from_state(path).result()
    status, answer = _post(server, "get_info", json.dumps({"model_id": client.model_id}).encode(), key=OTHER_KEY)
    assert status == 404 and "not found" in answer["detail"]
    assert tinker.RestClient(base_url=server.url, api_key=OTHER_KEY).list_user_checkpoints().result().checkpoints == []


@pytest.mark.parametrize(
    ("tokens", "loss_fn", "message"),
    [
        ([5, 6, 7, 99999], "cross_entropy", "outside the vocabulary"),
        (list(range(10, 150)), "cross_entropy", "seq_len"),
        ([5, 6, 7, 8], "dro", "loss_fn"),
    ],
)
def test_a_bad_request_is_one_line_naming_the_field(
    server: Server, tokens: list[int], loss_fn: str, message: str
) -> None:
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    client = service.create_lora_training_client(base_model=base, rank=8).result()
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError)) as e:
        client.forward_backward([datum(tokens)], loss_fn).result()  # type: ignore[arg-type]
    assert message in str(e.value) and "\n" not in str(e.value).strip()
    advantages = {"target_tokens": [6, 7], "logprobs": [0.0, 0.0], "advantages": [1.0, math.nan]}
    bad = types.Datum(model_input=types.ModelInput.from_ints([5, 6]), loss_fn_inputs=advantages)
    with pytest.raises(tinker.BadRequestError, match="advantages"):
        client.forward_backward([bad], "importance_sampling").result()
    assert train(client, batch(40, n=2), steps=1)  # the tenant goes on


def test_a_killed_server_resumes_its_futures_and_tenants(tiny_model: Path, tmp_path: Path) -> None:
    config = serve_config(tiny_model, tmp_path, "killed")
    data = batch(50, n=4)
    with running_server(config) as server:
        service = server.client()
        base = service.get_server_capabilities().supported_models[0].model_name
        client = service.create_lora_training_client(base_model=base, rank=8, seed=7).result()
        losses = train(client, data, steps=3)
        saved = client.save_state("before-kill").result().path
        expected = logprobs_of(client, data)
        children = psutil.Process(server.proc.pid).children(recursive=True)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
    # Its vLLM worker and trainer stop without it (parent-death signal): none left to slow what follows.
    gone, left = psutil.wait_procs(children, timeout=60)
    assert children and not left, [p.cmdline() for p in left]
    with sqlite3.connect(server.run_dir / "serve.sqlite") as db:
        finished = [r[0] for r in db.execute("SELECT id FROM requests WHERE status = 'done' AND kind = 'forward'")]
    with running_server(config, "--resume") as server:
        service = server.client()
        resumed = service.create_training_client_from_state_with_optimizer(saved).result()
        assert sum(logprobs_of(resumed, data), []) == pytest.approx(sum(expected, []), abs=1e-6)
        after = train(resumed, data, steps=1)
        assert after[0] < losses[-1]  # the loss goes on from where it was
        # A future finished before the kill is still answered, with its result.
        request = urllib.request.Request(
            f"{server.url}/api/v1/retrieve_future",
            data=json.dumps({"request_id": finished[-1]}).encode(),
            headers={"X-API-Key": KEY, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.headers["Content-Type"].startswith("application/x-protobuf") and answer.read()


def rl_rewards(service: tinker.ServiceClient, base: str, lr: float, steps: int = 10) -> list[float]:
    """The mean reward of each step of a cookbook-style RL loop (sample a group per prompt from the
    current weights, score, centre by the group's mean, train with importance_sampling): each
    completion token is rewarded 1 if it is a lowercase ASCII letter (bytes 97-122 of the tiny
    model's byte vocabulary, about a tenth of it); a completion's reward is its share of them."""
    client = service.create_lora_training_client(base_model=base, rank=8, seed=9).result()
    rng = random.Random(0)
    params = types.SamplingParams(max_tokens=12, temperature=1.0)
    means = []
    for _ in range(steps):
        sampler = client.save_weights_and_get_sampling_client().result()
        prompts = [[rng.randrange(10, 200) for _ in range(6)] for _ in range(4)]
        futures = [sampler.sample(types.ModelInput.from_ints(p), 8, params) for p in prompts]
        data, rewards = [], []
        for prompt, future in zip(prompts, futures, strict=True):
            group = future.result().sequences
            scores = [sum(97 <= t <= 122 for t in s.tokens) / max(len(s.tokens), 1) for s in group]
            rewards += scores
            mean = sum(scores) / len(scores)
            for seq in group:
                tokens = prompt + seq.tokens
                inputs = {
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * (len(prompt) - 1) + list(seq.logprobs),
                    "advantages": [0.0] * (len(prompt) - 1) + [float(97 <= t <= 122) - mean for t in seq.tokens],
                }
                data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs))
        client.forward_backward(data, "importance_sampling").result()
        client.optim_step(types.AdamParams(learning_rate=lr)).result()
        means.append(sum(rewards) / len(rewards))
    return means


def test_an_rl_loop_raises_its_reward_against_a_control(server: Server) -> None:
    """The same loop with learning rate 0 samples the same way and learns nothing: the trained one's
    reward rises above it."""
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    trained, control = rl_rewards(service, base, lr=3e-2), rl_rewards(service, base, lr=0.0)
    last = slice(-3, None)
    assert sum(trained[last]) / 3 > sum(control[last]) / 3 + 0.1, (trained, control)
    assert sum(trained[last]) / 3 > trained[0] + 0.1, trained


def test_forward_backward_custom_trains_as_the_same_loss_built_in(server: Server) -> None:
    """The SDK computes a custom loss on the logprobs of a forward pass and sends its gradient back as
    per-token weights of cross_entropy: written as cross entropy with weights of both signs, it must
    move the adapter exactly as the built-in one does."""
    service = server.client()
    base = service.get_server_capabilities().supported_models[0].model_name
    built_in, custom = (service.create_lora_training_client(base_model=base, rank=8, seed=8).result() for _ in "ab")
    rng = random.Random(60)
    data = [
        datum(t, [1.0 if i % 2 else -0.5 for i in range(11)])
        for t in ([rng.randrange(10, 200) for _ in range(12)] for _ in range(3))
    ]

    def cross_entropy(data: list[types.Datum], logprobs: list) -> tuple:  # type: ignore[type-arg]
        loss = -sum((lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs, strict=True))
        return loss, {}

    ours = custom.forward_backward_custom(data, cross_entropy).result()
    theirs = built_in.forward_backward(data, "cross_entropy").result()
    assert math.isclose(ours.metrics["loss:sum"], theirs.metrics["loss:sum"], rel_tol=1e-5)
    for client in (built_in, custom):
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = [sum(logprobs_of(c, data), []) for c in (built_in, custom)]
    assert after[0] == pytest.approx(after[1], abs=1e-5)
