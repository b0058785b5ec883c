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

from transformers import AutoTokenizer

from lorarl.config.models import RLConfig
from lorarl.inference.client import WorkerPool
from lorarl.inference.server import worker_urls
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.adapters import AdapterWatcher
from lorarl.orchestrator.advantages import group_advantages
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import EpisodeRunner, PlayedEpisode
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.orchestrator")


@dataclass
class Group:
    """`rollouts_per_example` episodes of one example, played with one policy version."""

    env: Environment
    episodes: list[PlayedEpisode]
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
    runner = EpisodeRunner(pool, tokenizer, ocfg.sampling, cfg.seq_len)
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
                *(play_group(runner, adapter, envs[i], next(streams[i]), ocfg.rollouts_per_example) for i in picks)
            )
            t_sampled = time.perf_counter()

            rollouts = []
            for group in groups:
                rewards = [score["reward"] for score in group.scores]
                advantages = group_advantages(rewards, ocfg.advantage.std_normalize)
                for played, score, advantage in zip(group.episodes, group.scores, advantages, strict=True):
                    rollouts += [
                        Rollout(
                            prompt_ids=sample.prompt_ids,
                            completion_ids=sample.completion_ids,
                            completion_logprobs=sample.completion_logprobs,
                            completion_mask=sample.completion_mask,
                            advantage=advantage,
                            reward=score["reward"],
                            policy_version=version,
                            temperature=ocfg.sampling.temperature,
                            env=group.env.name,
                            metrics=score,
                        )
                        for sample in played.samples
                    ]
            RolloutBatch(step, rollouts).write(run.rollouts(step))
            write_samples(run, step, groups, ocfg.num_samples_to_log)
            t_end = time.perf_counter()

            metrics.log(step, batch_metrics(groups, step, version) | {
                "time/wait_for_policy": waited,
                "time/generate": t_sampled - t_policy,
                "time/step": t_end - t0,
                "tokens_per_s": sum(len(r.completion_ids) for r in rollouts) / max(1e-9, t_sampled - t_policy),
            })  # fmt: skip
            log.info("step %d: policy %d, %d rollouts, sampled in %.1f s", step, version, len(rollouts),
                     t_sampled - t_policy)  # fmt: skip
        # Serve the final policy too: it stays loaded, so a server kept running (inference.urls)
        # answers `<run_name>-step<max_steps>` for evals and chat after the run.
        await watcher.wait_for(cfg.max_steps, ocfg.policy_timeout)
    finally:
        await pool.close()
        metrics.close()


async def play_group(runner: EpisodeRunner, adapter: str, env: Environment, example: Example, n: int) -> Group:
    episodes = await runner.play(adapter, env, example, n)
    scores = list(await asyncio.gather(*(env.score(e.episode) for e in episodes)))
    return Group(env, episodes, scores)


def batch_metrics(groups: list[Group], step: int, version: int) -> dict[str, float]:
    scores = [score for g in groups for score in g.scores]
    episodes = [e for g in groups for e in g.episodes]
    lengths = [e.model_tokens for e in episodes]
    out = {
        "reward/mean": statistics.fmean(s["reward"] for s in scores),
        "reward/std": statistics.pstdev(s["reward"] for s in scores),
        "reward_errors": sum(s["reward_errors"] for s in scores),
        "completion_len/mean": statistics.fmean(lengths),
        "completion_len/max": max(lengths),
        "turns/mean": statistics.fmean(len(e.episode.turns) for e in episodes),
        "truncated_frac": statistics.fmean(e.truncated for e in episodes),
        "policy_version": version,
        "policy_lag": step - 1 - version,
    }
    # Per environment: its share of the batch, and the mean of each of its reward functions.
    for env_name in sorted({g.env.name for g in groups}):
        env_scores = [score for g in groups if g.env.name == env_name for score in g.scores]
        for key in env_scores[0]:
            out[f"env/{env_name}/{key}"] = statistics.fmean(score[key] for score in env_scores)
    return out


def write_samples(run: RunFolder, step: int, groups: list[Group], num: int) -> None:
    if num == 0:
        return
    path = run.samples(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (
        {"env": g.env.name, "messages": e.episode.messages, "truncated": e.truncated, **score}
        for g in groups for e, score in zip(g.episodes, g.scores, strict=True)
    )  # fmt: skip
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in islice(rows, num))
