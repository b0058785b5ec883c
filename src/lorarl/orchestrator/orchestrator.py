"""The orchestrator loop, top to bottom.

Rollouts are sampled in groups (`rollouts_per_example` episodes of one example). Each group is
drawn for one trainer step N and launched as soon as the newest loaded policy may be used for
it, i.e. its version v >= N-1-max_async_level: with 0 the orchestrator waits for the trainer
before each batch; with more it samples ahead while the trainer trains, keeping vLLM busy.
Finished groups are assembled into batches (`BatchAssembler`: by default the groups drawn for N;
with `max_off_policy_steps` the first to finish, dropping those grown too old); each batch's
rewards become group-normalized advantages and it is written to rollouts/step_N for the trainer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import dataclass
from itertools import islice
from typing import Any

from transformers import AutoTokenizer

from lorarl.config.models import RLConfig
from lorarl.inference.health import wait_until_healthy
from lorarl.inference.pool import WorkerPool
from lorarl.inference.server import worker_urls
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.adapters import AdapterWatcher
from lorarl.orchestrator.advantages import group_advantages
from lorarl.orchestrator.batch_assembly import BatchAssembler
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import EpisodeRunner, PlayedEpisode
from lorarl.orchestrator.evals import Evaluator
from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.rollouts import Rollout, RolloutBatch
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.orchestrator")


@dataclass
class Group:
    """`rollouts_per_example` episodes of one example, played with one policy version."""

    env: Environment
    version: int
    episodes: list[PlayedEpisode]
    scores: list[dict[str, float]]


async def orchestrate(cfg: RLConfig) -> None:
    ocfg = cfg.orchestrator
    run = RunFolder(cfg.run_dir).create()
    metrics = MetricsLogger(run.metrics, "orchestrator", cfg.monitor, cfg.run_name)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    envs = [load_environment(e.id, e.args) for e in ocfg.env]
    sampler = ExampleSampler(envs, [e.weight for e in ocfg.env], ocfg.seed)
    groups_per_step = ocfg.batch_size // ocfg.rollouts_per_example
    step = 1
    if cfg.resume is not None:  # continue after the trainer's checkpoint, with the same examples
        resumed = run.resume_step(cfg.resume.step)
        sampler.load_state_dict(json.loads((run.orchestrator_checkpoint(resumed) / "state.json").read_text()))
        step = resumed + 1
        log.info("resuming at step %d", step)

    pool = WorkerPool(worker_urls(cfg), cfg.inference.api_key, unavailable_timeout=cfg.inference.unavailable_timeout)
    runner = EpisodeRunner(pool, tokenizer, ocfg.sampling, cfg.seq_len)
    log.info("waiting for %d inference worker(s): %s", len(pool.workers), [w.base_url for w in pool.workers])
    await asyncio.to_thread(wait_until_healthy, worker_urls(cfg), cfg.inference.startup_timeout)
    watcher = AdapterWatcher(pool, run, cfg.run_name, delete_unloaded=ocfg.delete_old_broadcasts)

    async def play_group(env: Environment, example: Example, n: int, version: int) -> Group:
        """Played with `version`, which the caller holds (`watcher.acquire`) until this ends."""
        episodes = await runner.play(watcher.adapter_name(version), env, example, n)
        scores = list(await asyncio.gather(*(env.score(e.episode) for e in episodes)))
        return Group(env, version, episodes, scores)

    evaluated_before = step - 1 if cfg.resume else -1  # a resumed run evaluated its versions so far
    evaluator = Evaluator(ocfg.eval, envs, cfg.max_steps, evaluated_before) if ocfg.eval else None
    eval_metrics = MetricsLogger(run.metrics, "eval", cfg.monitor, cfg.run_name) if ocfg.eval else None
    eval_tasks: set[asyncio.Task[None]] = set()

    async def evaluate(version: int) -> None:
        assert evaluator is not None and eval_metrics is not None

        async def rewards(env: Environment, example: Example, n: int) -> list[float]:
            return [score["reward"] for score in (await play_group(env, example, n, version)).scores]

        try:
            results = await evaluator.run(version, rewards)
        finally:
            await watcher.release(version)
        eval_metrics.log(version, results)
        log.info("eval of policy %d: %s", version, ", ".join(f"{k} {v:.3f}" for k, v in results.items()))

    def start_due_eval() -> None:
        if evaluator is not None and watcher.version is not None and evaluator.claim(watcher.version):
            version, _ = watcher.acquire()  # the whole eval plays this version, even once a newer one loads
            eval_tasks.add(asyncio.create_task(evaluate(version)))

    in_flight: dict[asyncio.Task[Group], tuple[int, int]] = {}  # task -> (step it was drawn for, version)
    assembler: BatchAssembler[Group] = BatchAssembler(groups_per_step, ocfg.max_off_policy_steps)
    # Groups launched and not dropped: the first groups_per_step are for step 1, and so on.
    live = (step - 1) * groups_per_step
    dropped = 0  # groups dropped as too old since the last batch
    # The sampler's state once the last group of a step was drawn: a checkpoint of that step saves it.
    sampler_states: dict[int, dict[str, Any]] = {}
    ckpt_interval = cfg.trainer.ckpt.interval
    waited = 0.0  # time with nothing to do but wait for a newer policy, since the last batch
    idle_since = time.monotonic()
    t_step, busy_at_step = time.perf_counter(), pool.busy_seconds()
    try:
        while step <= cfg.max_steps:
            await watcher.refresh()
            start_due_eval()
            # Launch every group whose step may use the newest policy (version >= step-1-max_async_level).
            while (target := live // groups_per_step + 1) <= cfg.max_steps and (
                watcher.version is not None and watcher.version >= target - 1 - ocfg.max_async_level
            ):
                env, example = sampler.draw()
                version, _ = watcher.acquire()
                task = asyncio.create_task(play_group(env, example, ocfg.rollouts_per_example, version))
                in_flight[task] = (target, version)
                live += 1
                if ckpt_interval is not None and target % ckpt_interval == 0 and live % groups_per_step == 0:
                    sampler_states[target] = sampler.state_dict()

            # Groups too old for this batch are too old for every later one: stop those still running.
            stale = [task for task, (_, version) in in_flight.items() if assembler.is_stale(version, step)]
            for task in stale:
                task.cancel()
            await asyncio.gather(*stale, return_exceptions=True)
            for task in stale:
                await watcher.release(in_flight.pop(task)[1])
            newly_dropped = len(stale) + assembler.drop_stale(step)
            live, dropped = live - newly_dropped, dropped + newly_dropped

            if (groups := assembler.take(step)) is not None:
                rollouts = to_rollouts(groups, ocfg.advantage.std_normalize, ocfg.sampling.temperature)
                RolloutBatch(step, rollouts).write(run.rollouts(step))
                if step in sampler_states:
                    save_orchestrator_checkpoint(run, step, sampler_states.pop(step))
                write_samples(run, step, groups, ocfg.num_samples_to_log)
                now, busy = time.perf_counter(), pool.busy_seconds()
                metrics.log(step, batch_metrics(groups, step) | {
                    "dropped/groups": dropped,
                    "dropped/rollouts": dropped * ocfg.rollouts_per_example,
                    "time/wait_for_policy": waited,
                    "time/step": now - t_step,
                    "inference/busy_frac": (busy - busy_at_step) / max(1e-9, (now - t_step) * len(pool.workers)),
                    "inference/groups_in_flight": len(in_flight),
                    "tokens_per_s": sum(len(r.completion_ids) for r in rollouts) / max(1e-9, now - t_step),
                })  # fmt: skip
                versions = sorted({g.version for g in groups})
                log.info("step %d: %d rollouts written (policy versions %s, %d groups dropped as too old)",
                         step, len(rollouts), versions, dropped)  # fmt: skip
                step, dropped, waited, t_step, busy_at_step = step + 1, 0, 0.0, now, busy
                continue

            if in_flight:
                done, _ = await asyncio.wait(in_flight, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    drawn_for, version = in_flight.pop(task)
                    await watcher.release(version)
                    assembler.add(drawn_for, task.result())
                idle_since = time.monotonic()
            else:
                # Everything launched has finished: only a newer policy lets sampling go on.
                if time.monotonic() - idle_since > ocfg.policy_timeout:
                    raise no_new_policy(run, ocfg.policy_timeout)
                t0 = time.perf_counter()
                await asyncio.sleep(0.05)
                waited += time.perf_counter() - t0
        # Serve the final policy too: it stays loaded, so a server kept running (inference.urls)
        # answers `<run_name>-step<max_steps>` for evals and chat after the run.
        deadline = time.monotonic() + ocfg.policy_timeout
        while watcher.version != cfg.max_steps:
            if time.monotonic() > deadline:
                raise no_new_policy(run, ocfg.policy_timeout)
            await asyncio.sleep(0.05)
            await watcher.refresh()
        start_due_eval()
        await asyncio.gather(*eval_tasks)
    finally:
        pending: list[asyncio.Task[Any]] = [*in_flight, *eval_tasks]
        for task in pending:
            task.cancel()
        await pool.close()
        metrics.close()
        if eval_metrics is not None:
            eval_metrics.close()


def save_orchestrator_checkpoint(run: RunFolder, step: int, sampler_state: dict[str, Any]) -> None:
    """Beside the trainer's checkpoint of the same step: the examples drawn up to that batch."""
    run.write_checkpoint_half(step, "orchestrator", lambda d: (d / "state.json").write_text(json.dumps(sampler_state)))


def no_new_policy(run: RunFolder, timeout: float) -> TimeoutError:
    return TimeoutError(f"no new adapter in {run.broadcast(0).parent} after {timeout:.0f} s (is the trainer alive?)")


def to_rollouts(groups: list[Group], std_normalize: bool, temperature: float) -> list[Rollout]:
    rollouts = []
    for group in groups:
        advantages = group_advantages([score["reward"] for score in group.scores], std_normalize)
        for played, score, advantage in zip(group.episodes, group.scores, advantages, strict=True):
            rollouts += [
                Rollout(
                    prompt_ids=sample.prompt_ids,
                    completion_ids=sample.completion_ids,
                    completion_logprobs=sample.completion_logprobs,
                    completion_mask=sample.completion_mask,
                    advantage=advantage,
                    reward=score["reward"],
                    policy_version=group.version,
                    temperature=temperature,
                    env=group.env.name,
                    metrics=score,
                )
                for sample in played.samples
            ]
    return rollouts


def batch_metrics(groups: list[Group], step: int) -> dict[str, float]:
    scores = [score for g in groups for score in g.scores]
    lags = [step - 1 - g.version for g in groups]
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
        "policy_version": min(g.version for g in groups),
        "policy_lag/mean": statistics.fmean(lags),
        "policy_lag/max": max(lags),
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
