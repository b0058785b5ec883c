"""The orchestrator loop, top to bottom.

For step N: make sure the loaded policy is recent enough (version >= N-1-max_async_level; with 0
this waits for the trainer, otherwise sampling runs ahead of it), sample `batch_size` rollouts
from vLLM as token ids with their logprobs, score them, compute group-normalized advantages, and
write rollouts/step_N for the trainer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import statistics
import time
from dataclasses import dataclass
from itertools import islice

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from lorarl.config.models import RLConfig
from lorarl.inference.client import Completion, WorkerPool
from lorarl.inference.server import worker_urls
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.adapters import AdapterWatcher
from lorarl.orchestrator.advantages import group_advantages
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder
from lorarl.trainer.chat import encode_chat

log = logging.getLogger("lorarl.orchestrator")


@dataclass
class Group:
    """`rollouts_per_example` completions of one example, sampled with one policy version."""

    env: Environment
    example: Example
    prompt_ids: list[int]
    completions: list[Completion]
    scores: list[dict[str, float]]


async def orchestrate(cfg: RLConfig) -> None:
    ocfg = cfg.orchestrator
    run = RunFolder(cfg.run_dir).create()
    metrics = MetricsLogger(run.metrics, "orchestrator", cfg.monitor, cfg.run_name)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    rng = random.Random(ocfg.seed)
    envs = [load_environment(e.id, e.args) for e in ocfg.env]
    streams = [env.examples(random.Random(rng.random())) for env in envs]
    weights = [e.weight for e in ocfg.env]

    pool = WorkerPool(worker_urls(cfg))
    log.info("waiting for %d inference worker(s): %s", len(pool.workers), [w.base_url for w in pool.workers])
    await pool.wait_healthy(cfg.inference.startup_timeout)
    watcher = AdapterWatcher(pool, run, cfg.run_name)

    try:
        for step in range(1, cfg.max_steps + 1):
            t0 = time.perf_counter()
            # The batch for step N may use a policy at most max_async_level versions behind N-1.
            min_version = max(0, step - 1 - ocfg.max_async_level)
            waited = await watcher.wait_for(min_version, ocfg.policy_timeout)
            version, adapter = watcher.version, watcher.name
            assert version is not None
            t_policy = time.perf_counter()

            picks = rng.choices(range(len(envs)), weights, k=ocfg.batch_size // ocfg.rollouts_per_example)
            groups = await asyncio.gather(
                *(sample_group(pool, adapter, envs[i], next(streams[i]), tokenizer, cfg) for i in picks)
            )
            t_sampled = time.perf_counter()

            rollouts = []
            for group in groups:
                rewards = [s["reward"] for s in group.scores]
                advantages = group_advantages(rewards, ocfg.advantage.std_normalize)
                for completion, score, advantage in zip(group.completions, group.scores, advantages, strict=True):
                    rollouts.append(
                        Rollout(
                            prompt_ids=group.prompt_ids,
                            completion_ids=completion.token_ids,
                            completion_logprobs=completion.logprobs,
                            advantage=advantage,
                            reward=score["reward"],
                            policy_version=version,
                            temperature=ocfg.sampling.temperature,
                            env=group.env.name,
                            metrics=score,
                        )
                    )
            RolloutBatch(step, rollouts).write(run.rollouts(step))
            write_samples(run, step, groups, tokenizer, ocfg.num_samples_to_log)
            t_end = time.perf_counter()

            metrics.log(step, batch_metrics(groups, step, version) | {
                "time/wait_for_policy": waited,
                "time/generate": t_sampled - t_policy,
                "time/step": t_end - t0,
                "tokens_per_s": sum(len(r.completion_ids) for r in rollouts) / max(1e-9, t_sampled - t_policy),
            })  # fmt: skip
            log.info("step %d: policy %d, reward %.3f, sampled in %.1f s", step, version,
                     statistics.fmean(r.reward for r in rollouts), t_sampled - t_policy)  # fmt: skip
        # Serve the final policy too: it stays loaded, so a server kept running (inference.urls)
        # answers `<run_name>-step<max_steps>` for evals and chat after the run.
        await watcher.wait_for(cfg.max_steps, ocfg.policy_timeout)
    finally:
        await pool.close()
        metrics.close()


async def sample_group(
    pool: WorkerPool, adapter: str, env: Environment, example: Example,
    tokenizer: PreTrainedTokenizerBase, cfg: RLConfig,
) -> Group:  # fmt: skip
    sampling = cfg.orchestrator.sampling
    prompt_ids = encode_chat(tokenizer, env.prompt(example), add_generation_prompt=True)
    room = cfg.seq_len - len(prompt_ids)
    if room < 1:
        raise ValueError(f"{env.name}: a prompt of {len(prompt_ids)} tokens leaves no room in seq_len {cfg.seq_len}")
    completions = await pool.complete(
        adapter, prompt_ids, cfg.orchestrator.rollouts_per_example,
        temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=min(sampling.max_tokens, room),
    )  # fmt: skip
    scores = [env.score(example, c.text) for c in completions]
    return Group(env, example, prompt_ids, completions, scores)


def batch_metrics(groups: list[Group], step: int, version: int) -> dict[str, float]:
    rewards = [s["reward"] for g in groups for s in g.scores]
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    out = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "completion_len/mean": statistics.fmean(lengths),
        "completion_len/max": max(lengths),
        "truncated_frac": statistics.fmean(c.finish_reason == "length" for g in groups for c in g.completions),
        "policy_version": version,
        "policy_lag": step - 1 - version,
    }
    for env_name in {g.env.name for g in groups}:
        for key in groups[0].scores[0]:
            values = [s[key] for g in groups if g.env.name == env_name for s in g.scores if key in s]
            if values:
                out[f"env/{env_name}/{key}"] = statistics.fmean(values)
    return out


def write_samples(run: RunFolder, step: int, groups: list[Group], tokenizer: PreTrainedTokenizerBase, num: int) -> None:
    if num == 0:
        return
    path = run.samples(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (
        {"env": g.env.name, "prompt": tokenizer.decode(g.prompt_ids), "completion": c.text,
         "finish_reason": c.finish_reason, **s}
        for g in groups for c, s in zip(g.completions, g.scores, strict=True)
    )  # fmt: skip
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in islice(rows, num))
