"""The orchestrator loop: `Orchestrator.run`, and `orchestrate`, the `lorarl-orchestrator` process.

Rollouts are sampled in groups (`rollouts_per_example` episodes of one example). Each group is
drawn for one trainer step N and launched as soon as the newest loaded policy v may be used for
it, i.e. policy_lag(N, v) <= max_async_level: with 0 the orchestrator waits for the trainer
before each batch; with more it samples ahead while the trainer trains, keeping vLLM busy. Where
vLLM and the trainer take turns on the same cores or GPU (inference.time_share) the bound is 0:
sampling while the trainer steps would only slow both down.
Each finished group gets its advantages (`GroupAdvantages`: the estimator, overlong shaping and
masking) and goes to the batch assembler (`BatchAssembler`: by default the groups drawn for N; with
`max_off_policy_steps` the first to finish, dropping those grown too old). The step filter
(`StepFilter`) leaves groups with zero advantage out of the batch and, with `fill_informative`, draws
extra groups for the step in their place; the batch is written to rollouts/step_N for the trainer.
With a difficulty filter, draws pass over examples recently always solved or always failed.

The loop's state is the class's attributes; its helpers (advantages, filters, difficulty memory,
rollout conversion, batch metrics, samples, checkpoint) live in modules of their own beside it and
know nothing of the class.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from functools import partial
from typing import Any

from transformers import PreTrainedTokenizerBase

from lorarl.config.run import RLConfig
from lorarl.exit_codes import BAD_INPUT
from lorarl.inference.health import ServerCheckError, check_served_model, wait_until_healthy
from lorarl.inference.pool import WorkerPool
from lorarl.inference.server import worker_urls
from lorarl.monitor.metrics import MetricsLogger
from lorarl.orchestrator import judge
from lorarl.orchestrator.adapters import AdapterWatcher, WeightsWatcher
from lorarl.orchestrator.advantages import GroupAdvantages
from lorarl.orchestrator.batch_assembly import BatchAssembler
from lorarl.orchestrator.batch_metrics import StepCounters, batch_metrics
from lorarl.orchestrator.checkpoint import SamplerCheckpoints, Stateful
from lorarl.orchestrator.difficulty import DifficultyFilter
from lorarl.orchestrator.envs import load_environment
from lorarl.orchestrator.envs.base import Environment, Example
from lorarl.orchestrator.episodes import EpisodeRunner
from lorarl.orchestrator.evals import Evaluator
from lorarl.orchestrator.filters import StepBatch, StepFilter
from lorarl.orchestrator.groups import Group
from lorarl.orchestrator.overlong import overlong_metrics
from lorarl.orchestrator.rollout_conversion import to_rollouts
from lorarl.orchestrator.sampler import ExampleSampler
from lorarl.orchestrator.samples import write_samples
from lorarl.orchestrator.served_check import ServedCheck, tolerance_for
from lorarl.rollouts import Rollout, RolloutBatch, policy_lag
from lorarl.run_folder import RunFolder
from lorarl.variants import variants_of

log = logging.getLogger("lorarl.orchestrator")

POLL = 0.05  # seconds between looks at running groups and at broadcasts/


async def orchestrate(cfg: RLConfig) -> None:
    """The `orchestrator` process: build the loop (one per variant of a sweep, all sampling through
    the same workers), wait for the inference workers, run them to the end."""
    # Imported here: transformers' AutoTokenizer module imports torch and its FSDP (through
    # auto_docstring, the model auto classes and generation), which the loop itself never needs.
    from transformers import AutoTokenizer

    inf, urls = cfg.inference, worker_urls(cfg)
    check_given_servers(cfg, strict=False)  # nothing else runs yet: blocking here delays nothing
    here = str(cfg.run_dir.resolve())
    run_dirs = [(here, there) for there in inf.worker_run_dirs] or None
    pool = WorkerPool(
        urls,
        inf.api_key,
        timeout=inf.request_timeout,
        unavailable_timeout=inf.unavailable_timeout,
        run_dirs=run_dirs,
        tokens_per_s=inf.min_tokens_per_s,
    )
    pool.served_check = served_check(cfg, pool)
    try:
        orchestrators = build_orchestrators(cfg, pool, AutoTokenizer.from_pretrained(cfg.model.name))
        log.info("waiting for %d inference worker(s): %s", len(urls), urls)
        await asyncio.to_thread(wait_until_healthy, urls, cfg.inference.startup_timeout)
        check_given_servers(cfg, strict=True)  # those that were still starting, too
        for orchestrator in orchestrators:
            await orchestrator.watcher.remove_leftovers()
        await run_all(orchestrators)
    finally:
        await pool.close()


def served_check(cfg: RLConfig, pool: WorkerPool) -> ServedCheck | None:
    """The served-adapter check of every version on every worker (served_check.py); None if off, or
    with full fine-tuning (not covered)."""
    inf = cfg.inference
    if inf.served_check == "off" or cfg.model.full_finetune:
        return None
    path, tolerance = RunFolder(cfg.run_dir).metrics, tolerance_for(inf.served_check_tolerance, cfg.model.dtype)
    metrics = partial(MetricsLogger, path, "served", cfg.monitor, cfg.run_name)  # (variant)
    return ServedCheck(inf.served_check, tolerance, metrics, pool.exclude)


def check_given_servers(cfg: RLConfig, strict: bool) -> None:
    """Servers at inference.urls are vLLM serving model.name, or the process stops with one line and exit
    code 2 (`rl` checked them too, before it started). Not `strict`: one where nothing answers yet (still
    starting, or restarting while `rl` restarts this process) is waited for (wait_until_healthy)."""
    for url in cfg.inference.urls:
        try:
            check_served_model(url, cfg.model.name, cfg.inference.api_key)
        except ServerCheckError as e:
            if strict or e.answered:
                print(f"error: {e}", file=sys.stderr)
                raise SystemExit(BAD_INPUT) from None


def build_orchestrators(cfg: RLConfig, pool: WorkerPool, tokenizer: PreTrainedTokenizerBase) -> list[Orchestrator]:
    """The loop of the run's one adapter, or one loop per variant ([[variants]]), each with the
    variant's effective config and its view of the run folder, all sharing `pool`."""
    if not cfg.variants:
        return [Orchestrator(cfg, pool, tokenizer)]
    return [Orchestrator(v.cfg, pool, tokenizer, v.run) for v in variants_of(cfg)]


async def run_all(orchestrators: list[Orchestrator]) -> None:
    """Run the loops side by side on this event loop; the first to fail stops the others."""
    async with asyncio.TaskGroup() as group:
        for orchestrator in orchestrators:
            group.create_task(orchestrator.run())


class Orchestrator:
    """Samples groups for the trainer's steps through `pool`, with the newest policy the launch bound
    allows, and writes one batch per step; `run` is the loop, each stage a method."""

    # Set by `run`: the clocks start when the loop does, not when it is built.
    counters: StepCounters  # the current step's; a fresh one with each batch
    stalls_logged: int  # WorkerPool.stalls when the current step started
    idle_since: float  # time.monotonic() when a group last ran: the policy timeout counts from it

    def __init__(
        self, cfg: RLConfig, pool: WorkerPool, tokenizer: PreTrainedTokenizerBase, run_folder: RunFolder | None = None
    ) -> None:
        """`run_folder`: a variant's view of the run folder (RunFolder.for_variant), whose adapters,
        batches, samples, checkpoints and metrics rows are the variant's; None: the run's own. The
        caller owns `pool` and closes it."""
        self.cfg, self.ocfg, self.pool = cfg, cfg.orchestrator, pool
        # How many versions sampling may run ahead of the trainer: none while they take turns.
        self.sample_ahead = 0 if cfg.inference.time_share else self.ocfg.max_async_level
        self.run_folder = (run_folder or RunFolder(cfg.run_dir)).create()
        variant = self.run_folder.variant
        self.metrics = MetricsLogger(self.run_folder.metrics, "orchestrator", cfg.monitor, cfg.run_name, variant)
        judge.use_fleet(pool, cfg.model.name)  # judges ask the base model by default: no adapter, no extra server
        envs = [load_environment(e.id, e.args) for e in self.ocfg.env]
        for env, env_cfg in zip(envs, self.ocfg.env, strict=True):
            if env_cfg.episode_timeout is not None:
                env.episode_timeout = env_cfg.episode_timeout
            env.reward_timeout = self.ocfg.reward_timeout
        weights = [e.weight for e in self.ocfg.env]
        self.sampler = ExampleSampler(envs, weights, self.ocfg.seed)
        # Extra groups (fill_informative) come from a stream of their own: the first stays as without them.
        self.extra_sampler = (
            ExampleSampler(envs, weights, f"{self.ocfg.seed}:extra") if self.ocfg.fill_informative else None
        )
        difficulty = self.ocfg.difficulty_filter
        self.difficulty = DifficultyFilter(difficulty, self.ocfg.max_async_level) if difficulty else None
        parts = {"extra_sampler": self.extra_sampler, "difficulty": self.difficulty}
        at_batch: dict[str, Stateful] = {name: part for name, part in parts.items() if part is not None}
        self.checkpoints = SamplerCheckpoints(self.run_folder, self.sampler, cfg.trainer.ckpt.interval, at_batch)
        self.step = 1  # the trainer step whose batch comes next
        if cfg.resume is not None:  # continue after the trainer's checkpoint, with the same examples
            self.step = self.run_folder.resume_step(cfg.resume.step) + 1
            self.checkpoints.restore(self.step - 1)
            log.info("resuming at step %d", self.step)
        self.runner = EpisodeRunner(pool, tokenizer, self.ocfg.sampling, cfg.seq_len, self.ocfg.chat_template_kwargs)
        for env in envs:
            self.runner.check(env)
        # A variant's adapters are `<run_name>-<variant>-step<N>`: the variants share the workers.
        adapter_prefix = cfg.run_name if variant is None else f"{cfg.run_name}-{variant}"
        delete = self.ocfg.delete_old_broadcasts
        self.watcher = (
            WeightsWatcher(pool, self.run_folder, cfg.model.name, delete_unloaded=delete)
            if cfg.model.full_finetune
            else AdapterWatcher(pool, self.run_folder, adapter_prefix, delete_unloaded=delete)
        )
        self.groups_per_step = self.ocfg.batch_size // self.ocfg.rollouts_per_example
        self.advantages = GroupAdvantages(self.ocfg)  # imports advantage.fn, if any, now: errors show at start
        self.assembler: BatchAssembler[Group] = BatchAssembler(self.groups_per_step, self.ocfg.max_off_policy_steps)
        self.filter = StepFilter.for_config(self.ocfg, self.groups_per_step)
        self.in_flight: dict[asyncio.Task[Group], tuple[int, int]] = {}  # -> (step it was drawn for, version)
        # Groups launched and not dropped: the first groups_per_step are for step 1, and so on.
        self.live_groups = (self.step - 1) * self.groups_per_step
        evaluated_through = self.step - 1 if cfg.resume else -1  # a resumed run evaluated its versions so far
        self.evaluator = Evaluator(self.ocfg.eval, envs, cfg.max_steps, evaluated_through) if self.ocfg.eval else None
        self.eval_metrics = (
            MetricsLogger(self.run_folder.metrics, "eval", cfg.monitor, cfg.run_name, variant)
            if self.ocfg.eval
            else None
        )
        self.eval_tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Write the batch of every step through `max_steps`, then serve the final policy."""
        self.counters = StepCounters(time.perf_counter(), self.pool.busy_seconds(), self.pool.outages)
        self.stalls_logged = self.pool.stalls  # workers found stalled before this step (inference/stalls)
        self.idle_since = time.monotonic()
        try:
            while self.step <= self.cfg.max_steps:
                await self.refresh_policy()
                self.launch_due_groups()
                await self.drop_stale_groups()
                if (batch := self.next_batch()) is not None:
                    self.write_batch(batch)
                elif self.in_flight:
                    await self.collect_finished_groups()
                else:
                    await self.wait_for_policy()
            await self.serve_final_policy()
            self.start_due_eval()
            await asyncio.gather(*self.eval_tasks)
        finally:
            await self.close()

    async def refresh_policy(self) -> None:
        """Load the newest broadcast adapter, and start its eval if it is due one."""
        await self.watcher.refresh()
        self.start_due_eval()

    def launch_due_groups(self) -> None:
        """Launch every group whose step may use the newest policy (its lag within the bound)."""
        while (step := self.live_groups // self.groups_per_step + 1) <= self.cfg.max_steps and self.may_sample(step):
            self.launch(*self.draw(self.sampler, step), step)
            self.live_groups += 1
            if self.live_groups % self.groups_per_step == 0:
                self.checkpoints.step_drawn(step)

    def draw(self, sampler: ExampleSampler, step: int) -> tuple[Environment, Example]:
        """The next example of `sampler` for a group of `step`, past those the difficulty filter skips."""
        return sampler.draw() if self.difficulty is None else self.difficulty.draw(sampler, step)

    def launch(self, env: Environment, example: Example, step: int) -> None:
        """Start a group of `example` for `step` with the newest policy."""
        version, _ = self.watcher.acquire()
        task = asyncio.create_task(self.play_group(env, example, self.ocfg.rollouts_per_example, version))
        self.in_flight[task] = (step, version)

    def may_sample(self, step: int) -> bool:
        """Whether the newest loaded policy is recent enough for a group of `step`."""
        version = self.watcher.version
        return version is not None and policy_lag(step, version) <= self.sample_ahead

    async def play_group(self, env: Environment, example: Example, n: int, version: int) -> Group:
        """Played with `version`, which the caller holds (`watcher.acquire`) until this ends."""
        episodes = await self.runner.play(self.watcher.adapter_name(version), env, example, n)
        scores = list(await asyncio.gather(*(env.score(e.episode) for e in episodes)))
        return Group(env, version, episodes, scores)

    async def drop_stale_groups(self) -> None:
        """Groups too old for this step's batch are too old for every later one: stop those still
        running, forget those finished; fresh groups are drawn in their place."""
        stale = [task for task, (_, version) in self.in_flight.items() if self.assembler.is_stale(version, self.step)]
        for task in stale:
            task.cancel()
        await asyncio.gather(*stale, return_exceptions=True)
        for task in stale:
            await self.watcher.release(self.in_flight.pop(task)[1])
        dropped = len(stale) + self.assembler.drop_stale(self.step)
        self.live_groups -= dropped
        self.counters.dropped_groups += dropped

    def next_batch(self) -> StepBatch | None:
        """The batch of this step once its groups are in, or None: still running, or (fill_informative)
        short of informative groups, in which case extra ones are drawn for it."""
        if (groups := self.assembler.take(self.step, self.filter.wanted)) is None:
            return None
        self.filter.add(groups)
        if extra := self.filter.extra_to_draw():
            assert self.extra_sampler is not None  # fill_informative made one
            self.filter.drawing(extra)
            for _ in range(extra):
                self.launch(*self.draw(self.extra_sampler, self.step), self.step)
            return None
        return self.filter.finish()

    def write_batch(self, batch: StepBatch) -> None:
        """Hand the trainer this step's batch (with its checkpoint, samples and metrics); next step."""
        rollouts = to_rollouts(batch.trained, self.ocfg.sampling.temperature)
        if self.difficulty is not None:  # every group played is an attempt, trained on or not
            self.difficulty.record(self.step, batch.groups)
        # The checkpoint half first: the trainer writes its half only after this batch, so a
        # checkpoint with a trainer half always has this one too.
        self.checkpoints.save(self.step)
        RolloutBatch(self.step, rollouts).write(self.run_folder.rollouts(self.step))
        write_samples(self.run_folder, self.step, batch.groups, self.ocfg.num_samples_to_log, self.metrics)
        self.end_step(batch, rollouts)

    def end_step(self, batch: StepBatch, rollouts: list[Rollout]) -> None:
        """Log the batch's metrics and the step's counters; the next step starts at the same instant."""
        now, busy = time.perf_counter(), self.pool.busy_seconds()
        step_metrics = self.counters.metrics(
            now,
            busy,
            workers=len(self.pool.workers),
            rollouts_per_example=self.ocfg.rollouts_per_example,
            groups_in_flight=len(self.in_flight),
            completion_tokens=sum(len(r.completion_ids) for r in rollouts),
            outages=self.pool.outages,
        )
        step_metrics |= batch.metrics() | overlong_metrics(batch.groups, self.ocfg.overlong)
        step_metrics["inference/stalls"], self.stalls_logged = self.pool.stalls - self.stalls_logged, self.pool.stalls
        if self.difficulty is not None:
            step_metrics |= self.difficulty.step_metrics()
        if live := self.watcher.take_live_latencies():
            # Trainer's optimizer step -> that version loaded on every worker, the slowest since the last step.
            step_metrics["perf/adapter_live_s"] = max(live)
        self.metrics.log(self.step, batch_metrics(batch.groups, self.step) | step_metrics)
        versions = sorted({g.version for g in batch.groups})
        zero = sum(g.zero_advantage for g in batch.groups)
        log.info(
            "step %d: %d rollouts written (policy versions %s; %d of %d groups had zero advantage; "
            "%d groups dropped as too old)",
            self.step,
            len(rollouts),
            versions,
            zero,
            len(batch.groups),
            self.counters.dropped_groups,
        )
        self.step, self.counters = self.step + 1, StepCounters(now, busy, self.pool.outages)

    async def collect_finished_groups(self) -> None:
        """Wait a moment for running groups; hand those that finished to the batch assembler."""
        done, _ = await asyncio.wait(self.in_flight, timeout=POLL, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            drawn_for, version = self.in_flight.pop(task)
            await self.watcher.release(version)
            self.assembler.add(drawn_for, self.advantages(task.result()))
        self.idle_since = time.monotonic()

    async def wait_for_policy(self) -> None:
        """Everything launched has finished: only a newer policy lets sampling go on."""
        if time.monotonic() - self.idle_since > self.ocfg.policy_timeout:
            raise self.no_new_policy()
        t0 = time.perf_counter()
        await asyncio.sleep(POLL)
        self.counters.waited_for_policy += time.perf_counter() - t0

    async def serve_final_policy(self) -> None:
        """Load the final policy too: it stays loaded, so a server kept running (inference.urls)
        answers `<run_name>-step<max_steps>` for evals and chat after the run."""
        deadline = time.monotonic() + self.ocfg.policy_timeout
        while self.watcher.version != self.cfg.max_steps:
            if time.monotonic() > deadline:
                raise self.no_new_policy()
            await asyncio.sleep(POLL)
            await self.watcher.refresh()

    def no_new_policy(self) -> TimeoutError:
        """The error for a trainer that stopped publishing adapters."""
        broadcasts = self.run_folder.broadcast(0).parent
        return TimeoutError(
            f"no new adapter in {broadcasts} after {self.ocfg.policy_timeout:.0f} s (is the trainer alive?)"
        )

    def start_due_eval(self) -> None:
        """Evaluate the newest policy in the background if it is due (evals.Evaluator.claim)."""
        evaluator, metrics, version = self.evaluator, self.eval_metrics, self.watcher.version
        if evaluator is not None and metrics is not None and version is not None and evaluator.claim(version):
            self.watcher.acquire()  # the whole eval plays this version, even once a newer one loads
            self.eval_tasks.add(asyncio.create_task(self.evaluate(evaluator, metrics, version)))

    async def evaluate(self, evaluator: Evaluator, metrics: MetricsLogger, version: int) -> None:
        """Runs with `version` held (`start_due_eval`), and releases it."""

        async def rewards(env: Environment, example: Example, n: int) -> list[float]:
            return [score["reward"] for score in (await self.play_group(env, example, n, version)).scores]

        start = time.monotonic()
        try:
            results = await evaluator.run(version, rewards)
        finally:
            await self.watcher.release(version)
        seconds = time.monotonic() - start
        metrics.log(version, results | {"time/eval": seconds})
        scores = ", ".join(f"{k} {v:.3f}" for k, v in results.items())
        log.info("eval of policy %d: %s (%.1f s)", version, scores, seconds)

    async def close(self) -> None:
        """Stop what still runs (after an error, or groups sampled beyond the last step) and close."""
        pending: list[asyncio.Task[Any]] = [*self.in_flight, *self.eval_tasks]
        for task in pending:
            task.cancel()
        self.metrics.close()
        if self.eval_metrics is not None:
            self.eval_metrics.close()
