"""Checks that `rl` and `sft` make before they clear or start anything, `--dry-run` included.

Each mistake here would otherwise surface minutes later, after vLLM has started (or, worse, after
the previous run's outputs were cleared). Every check raises `PreflightError` with one line that
names the key and the value at fault.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from lorarl.config.models import RLConfig, SFTConfig
from lorarl.inference.health import check_served_model
from lorarl.launcher.bundles import plan_bundles, ray_placement
from lorarl.launcher.memory_plan import AdapterError, MemoryPlan, rl_memory_plan, sft_memory_plan
from lorarl.launcher.placement import Placement, place
from lorarl.orchestrator.envs import EnvArgsError, check_environment
from lorarl.plugins import PluginError, PluginKind, load_function

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[\w.-]+:\d+)$")


class PreflightError(Exception):
    """A config that cannot run; str() is one line for the user."""


def check_rl(cfg: RLConfig, gpus: int) -> Placement:
    """Every check of `rl @ cfg` on a machine with `gpus` GPUs; returns where each process goes."""
    check_model(cfg.model.name)
    check_cluster(cfg)
    try:
        # A server of inference.urls must be vLLM serving model.name (a ServerCheckError is a ValueError).
        for url in cfg.inference.urls:
            check_served_model(url, cfg.model.name, cfg.inference.api_key)
        # On Ray, a dry run shows GPU bundles when this machine has GPUs (or pretends to); a run asks the cluster.
        placement = (
            ray_placement(cfg, plan_bundles(cfg, gpus > 0)) if cfg.cluster.backend == "ray" else place(cfg, gpus)
        )
    except ValueError as e:  # PlacementError too
        raise PreflightError(str(e)) from None
    # The run's adapter, or each variant's (its effective config), named in the message.
    adapters = [(f"variant {name!r}: ", c) for name, c in cfg.variant_configs()] or [("", cfg)]
    for where, adapter_cfg in adapters:
        try:
            check_adapter(adapter_cfg)
        except PreflightError as e:
            raise PreflightError(f"{where}{e}") from None
    if not cfg.inference.urls and cfg.cluster.backend == "local":  # Ray's workers listen on their own nodes
        check_ports(cfg.inference.host, cfg.inference.port, cfg.inference.num_workers)
    check_memory(lambda: rl_memory_plan(cfg, placement))
    return placement


def check_adapter(cfg: RLConfig) -> None:
    """What one adapter of `rl` needs: a LoRA that vLLM can serve (unless model.full_finetune), its
    environments, its user functions."""
    try:
        if not cfg.model.full_finetune:
            cfg.lora.check_for_rl()
    except ValueError as e:
        raise PreflightError(str(e)) from None
    check_environments(cfg)
    check_function(cfg.trainer.loss.loss_fn, "trainer.loss.loss_fn", "loss")
    check_function(cfg.orchestrator.advantage.fn, "orchestrator.advantage.fn", "advantage")


def check_cluster(cfg: RLConfig) -> None:
    """[cluster] asks for something this config and machine can do."""
    cluster, inf = cfg.cluster, cfg.inference
    if cluster.backend == "local":
        for key in ("address", "trainer_resources", "inference_resources"):
            if getattr(cluster, key):
                raise PreflightError(f'cluster.{key} is for cluster.backend = "ray": set that, or leave {key} out')
        if not cluster.shared_fs:
            raise PreflightError(
                'cluster.shared_fs = false is for cluster.backend = "ray": on one machine it is shared'
            )
        return
    if cluster.address is not None and not _RAY_ADDRESS.match(cluster.address):
        raise PreflightError(
            f'cluster.address {cluster.address!r}: give "auto", "host:port" or "ray://host:port", or leave it out '
            "to start a Ray instance on this machine"
        )
    for key, value in (("inference.gpu_ids", inf.gpu_ids), ("trainer.gpu_ids", cfg.trainer.gpu_ids)):
        if value is not None:
            raise PreflightError(f'{key} = {value}: with cluster.backend = "ray", Ray gives each process its GPUs; '
                                 f"leave {key} out")  # fmt: skip
    if inf.colocate_with_trainer:
        raise PreflightError('inference.colocate_with_trainer: with cluster.backend = "ray" each vLLM worker and '
                             "trainer rank has a bundle of its own; leave it out")  # fmt: skip
    if not inf.urls and inf.api_key is None:
        raise PreflightError('inference.api_key is required with cluster.backend = "ray": the vLLM servers rl starts '
                             "listen on their nodes' addresses, reachable from other machines")  # fmt: skip
    if not cluster.shared_fs and (cfg.auto_resume or cfg.resume is not None):
        raise PreflightError(
            f"{'--resume' if cfg.resume is not None else '--auto_resume'}: with cluster.shared_fs = false the "
            "trainer's checkpoints stay on its node; resume needs a shared run folder (cluster.shared_fs = true)"
        )
    if importlib.util.find_spec("ray") is None:
        raise PreflightError('cluster.backend = "ray", but Ray is not installed here (pip install "ray[default]")')


def check_sft(cfg: SFTConfig) -> None:
    check_model(cfg.model.name)
    try:
        if cfg.model.lora is not None:
            cfg.model.lora.check_init_adapter()
    except ValueError as e:
        raise PreflightError(str(e)) from None
    from lorarl.trainer.sft_data import read_sft_data  # loads torch: only once the config is valid

    # Every record parses (format, UTF-8, roles, no blank turns, loss tokens, eval apart): cheap next to
    # training, and a data mistake then stops the run before its folder is touched (DataError).
    # Tokenizing waits for the trainer.
    read_sft_data(cfg.data)
    check_memory(lambda: sft_memory_plan(cfg))


def check_memory(make_plan: Callable[[], MemoryPlan]) -> None:
    """Every process fits its device by the memory plan (memory_plan.py): else one line naming the keys.
    Counting the adapter wraps the model with PEFT (on the meta device): target modules that adapt
    nothing are found here, not when the trainer starts."""
    try:
        problem = make_plan().problem()
    except AdapterError as e:
        raise PreflightError(str(e)) from None
    if problem is not None:
        raise PreflightError(problem)


def check_model(name: str, key: str = "model.name") -> None:
    """`name` (given as `key`) is a model folder with a config.json, or, where a hub may be
    reached, a hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PreflightError(f"{key}: {name} has no config.json (expected a Hugging Face model folder)")
        return
    if path.exists():
        raise PreflightError(f"{key}: {name} is a file, not a model folder")
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _HUB_ID.match(name):
        raise PreflightError(f"{key}: {name} not found (expected a Hugging Face model folder)")


def check_environments(cfg: RLConfig) -> None:
    """Every environment resolves to a declared factory that takes its args (names and types), without
    being built. A user's module is looked up from the working directory, as the orchestrator (started
    there by `rl`) will."""
    if not cfg.orchestrator.env:
        raise PreflightError("[[orchestrator.env]]: no environment given")
    _working_directory_importable()
    for i, env in enumerate(cfg.orchestrator.env):
        try:
            check_environment(env.id, env.args)
        except EnvArgsError as e:
            raise PreflightError(f"orchestrator.env[{i}].{e}") from None
        except (ValueError, TypeError, ImportError, AttributeError) as e:
            raise PreflightError(f"orchestrator.env[{i}] id {env.id!r}: {e}") from None


def check_function(spec: str | None, key: str, kind: PluginKind) -> None:
    """A user function the config names at `key` (a custom loss, an advantage estimator:
    "package.module:function") imports and is declared a `kind` plugin, so that a typo stops `rl` now
    rather than the trainer or orchestrator later, and no undeclared function is ever called. Looked up
    from the working directory, as they (started there by `rl`) will."""
    if spec is None:
        return
    _working_directory_importable()
    try:
        load_function(spec, key, kind)
    except PluginError as e:
        raise PreflightError(str(e)) from None


def _working_directory_importable() -> None:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # console scripts, unlike `python -m`, leave it out


def check_ports(host: str, port: int, count: int) -> None:
    """The ports of the workers `rl` will start are in range and free."""
    if not 1 <= port <= 65535 - (count - 1):
        raise PreflightError(f"inference.port: {port} + {count} workers leaves the range 1..65535")
    for p in range(port, port + count):
        with socket.socket() as s:
            # As vLLM's server binds: the connections of a server that just stopped (TIME_WAIT) do not
            # keep the port from it, only a socket bound there now does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, p))
            except OSError as e:
                raise PreflightError(
                    f"inference.port: {host}:{p} is not free ({e.strerror}); pick another port, or use the "
                    "server there with inference.urls"
                ) from None
