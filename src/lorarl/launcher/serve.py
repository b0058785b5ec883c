"""`lorarl-serve`'s processes: what it starts and how it keeps them, in the run folder `rl` would use.

* vLLM workers, exactly as `rl` starts them (inference/server.py, launcher placement and core split),
  serving serve.max_loras adapters of up to serve.max_rank at once;
* one trainer process (`python -m lorarl.cli.serve_trainer`), which holds the base model once and every
  tenant's adapter, and takes work from the API over an authenticated local connection (rpc.py);
* the Tinker API itself (api.py), in this process, on serve.host:serve.port.

On a Ray cluster (cluster.backend = "ray", with a run folder every node mounts) the workers and the
trainer are placed in bundles on its nodes, as `rl`'s are (ray_cluster.py), and the API stays here:
it reaches the workers and the trainer at their nodes' addresses.

A worker that dies is started again (inference.max_restarts, as in `rl`); while it is out the sampler
routes around it. A trainer that dies ends the server: every tenant's state since its last save is
gone with it, and `lorarl-serve --resume` continues from the saved ones. Ctrl-C or SIGTERM stops every
process (children of children too) and the exit code says why (lorarl.exit_codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import signal
import socket
import sys

from lorarl import exit_codes
from lorarl.config.serve import ServeConfig
from lorarl.cpu.cores import available_cores, trainer_threads
from lorarl.inference.health import wait_until_healthy
from lorarl.inference.server import serve_adapters, vllm_command, vllm_env, worker_urls
from lorarl.launcher.placement import Placement, cuda_visible_devices
from lorarl.launcher.plan import ProcessSpec
from lorarl.launcher.ray_cluster import ClusterError, RayCluster  # imports Ray only once a server uses it
from lorarl.launcher.supervisor import Supervisor
from lorarl.serve.folder import ServeFolder
from lorarl.serve.rpc import AUTHKEY_ENV, HOST_ENV, LOOPBACK
from lorarl.written_files import record_written

log = logging.getLogger("lorarl.serve")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def plan_serve(
    cfg: ServeConfig, folder: ServeFolder, placement: Placement, trainer_port: int | None = None
) -> list[ProcessSpec]:
    """Write configs/trainer.json (the trainer's port resolved: serve.trainer_port, or `trainer_port`, or a
    free one here), commands.txt and placement.txt; return the processes in start order: the vLLM workers,
    then the trainer. Once Ray has placed them, each listens on its node's address."""
    folder.configs.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(deep=True)  # resolved values go to the trainer's config, not the user's object
    if cfg.serve.trainer_port == 0:
        cfg.serve.trainer_port = trainer_port or free_port()
    if not placement.on_gpu and not cfg.inference.urls and cfg.trainer.num_threads is None and not placement.ray:
        cfg.trainer.num_threads = trainer_threads(cfg, len(available_cores()))  # the cores vLLM leaves
    trainer_json = folder.configs / "trainer.json"
    trainer_json.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")

    def gpus(name: str) -> str | None:
        return cuda_visible_devices(placement[name].gpus, None) if placement.on_gpu else None

    adapters, hosts = serve_adapters(cfg), placement.worker_hosts()
    # A tenant's seeded sample with chunked prefill kills vLLM's CPU engine (VLLM_NOTES.md): off on a CPU.
    no_chunks = [] if placement.device_gpus else ["--no-enable-chunked-prefill"]
    specs = [
        ProcessSpec(
            f"inference-{i}",
            [*vllm_command(cfg, adapters, i, hosts[i] if hosts else None, gpus=placement.device_gpus), *no_chunks],
            vllm_env(cfg, gpus(f"inference-{i}"), on_gpu=placement.device_gpus > 0),
            role="inference",
        )
        for i in range(0 if cfg.inference.urls else cfg.inference.num_workers)
    ]
    trainer_env = {"CUDA_VISIBLE_DEVICES": devices} if (devices := gpus("trainer")) else {}
    if (host := placement["trainer"].host) is not None:
        trainer_env[HOST_ENV] = host
    trainer_cmd = [sys.executable, "-m", "lorarl.cli.serve_trainer", "@", str(trainer_json)]
    specs.append(ProcessSpec("trainer", trainer_cmd, trainer_env, role="trainer"))
    (folder.configs / "commands.txt").write_text("".join(f"# {s.name}\n{s.shell()}\n" for s in specs))
    (folder.configs / "placement.txt").write_text(placement.table())
    record_written(*(folder.configs / n for n in ("trainer.json", "commands.txt", "placement.txt")))
    return specs


def serve(cfg: ServeConfig, resume: bool, folder: ServeFolder, specs: list[ProcessSpec], placement: Placement) -> int:
    """Start every process (placed by Ray first, if `placement` says so), serve until stopped or a process
    fails for good; the exit code."""
    supervisor: Supervisor | RayCluster[ServeConfig] = Supervisor(folder.logs)
    try:
        if placement.ray:
            supervisor = RayCluster(cfg, folder)
            log.info("placing the server on Ray (%s)", cfg.cluster.address or "a Ray instance of its own")
            placement = supervisor.open()
            specs = plan_serve(cfg, folder, placement, supervisor.free_port("trainer"))  # at the nodes' addresses
            log.info("placement (%s):\n%s", folder.configs / "placement.txt", placement.table().rstrip())
        return asyncio.run(_serve(cfg, resume, folder, specs, supervisor, placement))
    except ClusterError as e:
        log.error("%s", e)
        return exit_codes.FAILED
    except KeyboardInterrupt:  # while Ray places the processes; once serving, the loop's handler has it
        return exit_codes.for_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cannot leave orphans
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()


async def _serve(
    cfg: ServeConfig,
    resume: bool,
    folder: ServeFolder,
    specs: list[ProcessSpec],
    supervisor: Supervisor | RayCluster[ServeConfig],
    placement: Placement,
) -> int:
    # The serving parts load only for a real start (aiohttp, the SDK's protobuf module, the trainer's client).
    from aiohttp import web

    from lorarl.inference.pool import WorkerPool
    from lorarl.orchestrator.served_check import tolerance_for
    from lorarl.serve.api import app
    from lorarl.serve.auth import Keys
    from lorarl.serve.rpc import connect
    from lorarl.serve.sampling import Sampler
    from lorarl.serve.service import Service
    from lorarl.serve.store import Store

    stop = asyncio.Event()
    stopped_by: list[int] = []
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        stopped_by.append(signum)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    authkey = secrets.token_bytes(32)
    workers = [s for s in specs if s.role == "inference"]
    trainer = next(s for s in specs if s.role == "trainer")
    for spec in workers:
        supervisor.start(spec)
    trainer.env[AUTHKEY_ENV] = authkey.hex()  # not in commands.txt: the trainer takes work from its holder only
    supervisor.start(trainer)
    urls = worker_urls(cfg, placement.worker_hosts())
    log.info("waiting for vLLM at %s and the trainer", ", ".join(urls))
    alive = lambda: supervisor.failed() is None and not stop.is_set()  # noqa: E731
    try:
        await asyncio.to_thread(wait_until_healthy, urls, cfg.inference.startup_timeout, alive)
        trainer_cfg = json.loads((folder.configs / "trainer.json").read_text())
        address = (placement["trainer"].host or LOOPBACK, int(trainer_cfg["serve"]["trainer_port"]))
        engine = await asyncio.to_thread(connect, address, authkey, cfg.inference.startup_timeout, alive)
    except (RuntimeError, TimeoutError) as e:  # EngineError is a RuntimeError
        if stopped_by:
            return exit_codes.for_signal(stopped_by[0])
        failed = supervisor.failed()
        tail = f"; last lines of {supervisor.log_path(failed[0])}:\n{supervisor.tail(failed[0])}" if failed else ""
        log.error("%s%s", e, tail)
        return exit_codes.FAILED
    store = Store(folder.database)
    record_written(*(folder.database.with_name(folder.database.name + s) for s in ("", "-wal", "-shm")))
    pool = WorkerPool(
        urls,
        cfg.inference.api_key,
        timeout=cfg.inference.request_timeout,
        unavailable_timeout=cfg.inference.unavailable_timeout,
        tokens_per_s=cfg.inference.min_tokens_per_s,
    )
    vocab = _vocab_size(cfg.model.name)
    tolerance = (
        None
        if cfg.inference.served_check == "off"
        else tolerance_for(cfg.inference.served_check_tolerance, cfg.model.dtype)
    )
    sampler = Sampler(pool, cfg.model.name, serve_adapters(cfg).slots, cfg.seq_len, vocab, tolerance)
    service = Service(cfg, store, folder, engine, sampler, vocab)
    if resume:
        log.info("resumed: %d requests that were still pending failed", service.resume())
    service.start()
    runner = web.AppRunner(app(service, Keys(cfg.serve)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.serve.host, cfg.serve.port).start()
    print(
        f"lorarl-serve: the Tinker API at http://{cfg.serve.host}:{cfg.serve.port} "
        f"(TINKER_BASE_URL), serving {cfg.model.name}; Ctrl-C stops it",
        flush=True,
    )
    try:
        return await _watch(cfg, supervisor, workers, stop, stopped_by)
    finally:
        await runner.cleanup()
        await pool.close()
        engine.close()
        store.close()


async def _watch(
    cfg: ServeConfig,
    supervisor: Supervisor | RayCluster[ServeConfig],
    workers: list[ProcessSpec],
    stop: asyncio.Event,
    stopped_by: list[int],
) -> int:
    """Keep the workers up (restarting one that died, inference.max_restarts times); end when stopped or
    when the trainer, or a worker out of restarts, is gone."""
    restarts: dict[str, int] = {}
    while not stop.is_set():
        if failed := supervisor.failed():
            name, code = failed
            if name.startswith("inference-") and restarts.get(name, 0) < cfg.inference.max_restarts:
                restarts[name] = restarts.get(name, 0) + 1
                log.warning("%s exited with code %d; restart %d of %d (inference.max_restarts)",
                            name, code, restarts[name], cfg.inference.max_restarts)  # fmt: skip
                supervisor.start(next(s for s in workers if s.name == name))
            else:
                log.error("%s exited with code %d; stopping. Last lines of %s:\n%s",
                          name, code, supervisor.log_path(name), supervisor.tail(name))  # fmt: skip
                return exit_codes.FAILED
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return exit_codes.for_signal(stopped_by[0]) if stopped_by else exit_codes.OK


def _vocab_size(model: str) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    return int(getattr(config, "vocab_size", 0) or config.get_text_config().vocab_size)
