"""The orchestrator loop, top to bottom.

Rollouts are sampled in groups (`rollouts_per_example` episodes of one example). Each group is
drawn for one trainer step N and launched as soon as the newest loaded policy may be used for
it, i.e. its version v >= N-1-max_async_level: with 0 the orchestrator waits for the trainer
before each batch; with more it samples ahead while the trainer trains, keeping vLLM busy.
Finished groups are assembled into batches (`BatchAssembler`: by default the groups drawn for N;
with `max_off_policy_steps` the first to finish, dropping those grown too old); each batch's
rewards become group-normalized advantages and it is written to rollouts/step_N for the trainer.

Its helpers (rollout conversion, batch metrics, samples, checkpoint) live in modules of their own
beside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from lorarl.config.models import RLConfig
from lorarl.inference.client import WorkerPool
from lorarl.inference.health import wait_until_healthy
from lorarl.inference.server import worker_urls
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator.adapters import AdapterWatcher
from lorarl.orchestrator.batch_assembly import BatchAssembler
from lorarl.orchestrator.batch_metrics import batch_metrics
from lorarl.orchestrator.checkpoint import SamplerCheckpoints
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.orchestrator.evals import Evaluator
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.rollout_conversion import to_rollouts
from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.orchestrator.samples import write_samples
from lorarl.rollouts import RolloutBatch, policy_lag
from lorarl.run_folder import RunFolder

log = logging.getLogger("lorarl.orchestrator")


async def orchestrate(cfg: RLConfig) -> None:
    # Imported here: transformers' AutoTokenizer module imports torch and its FSDP (through
    # auto_docstring, the model auto classes and generation), which the loop itself never needs.
    from transformers import AutoTokenizer

    ocfg = cfg.orchestrator
    run = RunFolder(cfg.run_dir).create()
    metrics = MetricsLogger(run.metrics, "orchestrator", cfg.monitor, cfg.run_name)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.name)
    envs = [load_environment(e.id, e.args) for e in ocfg.env]
    sampler = ExampleSampler(envs, [e.weight for e in ocfg.env], ocfg.seed)
    checkpoints = SamplerCheckpoints(run, sampler, cfg.trainer.ckpt.interval)
    groups_per_step = ocfg.batch_size // ocfg.rollouts_per_example
    step = 1
    if cfg.resume is not None:  # continue after the trainer's checkpoint, with the same examples
        resumed = run.resume_step(cfg.resume.step)
        checkpoints.restore(resumed)
        step = resumed + 1
        log.info("resuming at step %d", step)

    pool = WorkerPool(worker_urls(cfg))
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
    waited = 0.0  # time with nothing to do but wait for a newer policy, since the last batch
    idle_since = time.monotonic()
    t_step, busy_at_step = time.perf_counter(), pool.busy_seconds()
    try:
        while step <= cfg.max_steps:
            await watcher.refresh()
            start_due_eval()
            # Launch every group whose step may use the newest policy (its lag within max_async_level).
            while (target := live // groups_per_step + 1) <= cfg.max_steps and (
                watcher.version is not None and policy_lag(target, watcher.version) <= ocfg.max_async_level
            ):
                env, example = sampler.draw()
                version, _ = watcher.acquire()
                task = asyncio.create_task(play_group(env, example, ocfg.rollouts_per_example, version))
                in_flight[task] = (target, version)
                live += 1
                if live % groups_per_step == 0:
                    checkpoints.step_drawn(target)

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
                checkpoints.save(step)
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


def no_new_policy(run: RunFolder, timeout: float) -> TimeoutError:
    return TimeoutError(f"no new adapter in {run.broadcast(0).parent} after {timeout:.0f} s (is the trainer alive?)")
