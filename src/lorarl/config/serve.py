"""`lorarl-serve`'s config: one base model behind the Tinker API for many tenants, each an adapter of its
own trained by one trainer process and sampled through the same vLLM workers as `rl` starts them.

    [model]      the base model, shared by every tenant (tenants choose their own LoRA rank)
    [trainer]    how the trainer process runs its passes, on which devices (config/trainer.py)
    [inference]  the vLLM workers, as in `rl`
    [cluster]    this machine or a Ray cluster, as in `rl`
    [serve]      the HTTP API: address, keys, how many adapters, timeouts
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from lorarl.addresses import is_loopback
from lorarl.config.cluster import ClusterConfig
from lorarl.config.common import VLLM_LORA_RANKS, Section, UserPath
from lorarl.config.inference import InferenceConfig
from lorarl.config.model import ModelConfig
from lorarl.config.run import RLConfig, RunFolderConfig, RunMode
from lorarl.config.trainer import ForwardPassConfig


class ServeSection(Section):
    host: str = "127.0.0.1"
    """Address the Tinker API listens on. Off a loopback address it serves other machines, and api_key
    (or keys_file) is required."""
    port: int = Field(8000, ge=1, le=65535)
    """Port of the Tinker API (clients set TINKER_BASE_URL=http://<host>:<port>)."""
    api_key: str | None = None
    """The one key a client must send (TINKER_API_KEY; the SDK requires the "tml-" prefix). None (and no
    keys_file): on loopback any "tml-" key is accepted, each a tenant of its own; refused off loopback."""
    keys_file: UserPath | None = None
    """A file of accepted keys, one per line (blank lines and lines starting with "#" ignored), beside or
    instead of api_key. None: api_key alone."""
    max_rank: Annotated[int, Field(ge=1, le=VLLM_LORA_RANKS[-1])] = 32
    """The largest LoRA rank a tenant may ask for (create_lora_training_client(rank=...)); vLLM's
    --max-lora-rank is the smallest value it accepts that holds it. 32: the SDK's default rank."""
    max_loras: int = Field(4, ge=1)
    """Adapters a vLLM worker holds at once (vLLM's --max-loras); sampling clients beyond it are served
    too, their adapters swapped in on demand (least recently used out)."""
    max_tenants: int = Field(64, ge=1)
    """Training clients (adapters on the trainer, each with its optimizer state) held at once; one more is
    refused with a 400 naming this key. A tenant whose session stops sending heartbeats is unloaded
    (its saved states stay) and frees its place."""
    heartbeat_timeout: float = Field(120.0, gt=0)
    """Seconds without a heartbeat (the SDK sends one every 10 s) after which a session's training
    clients and adapters are unloaded; what they saved stays, to load again."""
    long_poll: float = Field(25.0, gt=0, lt=45)
    """Seconds a retrieve_future call waits for its result before it answers "try again" (the SDK's own
    timeout is 45 s, and it asks again at once)."""
    trainer_port: int = Field(0, ge=0, le=65535)
    """Port on which the trainer process takes work from the API (on loopback unless Ray placed it on
    another node); 0: a free one."""

    @field_validator("api_key", mode="after")
    @classmethod
    def _a_key_with_the_sdks_prefix(cls, key: str | None) -> str | None:
        if key is not None and (not key.startswith("tml-") or not key.isprintable() or key != key.strip()):
            raise ValueError("the Tinker SDK sends keys that start with 'tml-' (printable, no spaces at the ends)")
        return key

    @model_validator(mode="after")
    def _open_servers_need_a_key(self) -> ServeSection:
        if not is_loopback(self.host) and self.api_key is None and self.keys_file is None:
            raise ValueError(
                f"serve.api_key (or serve.keys_file) is required when serve.host ({self.host}) is not a loopback "
                "address: any client that reaches it could otherwise train and sample"
            )
        return self


class ServeConfig(RunFolderConfig):
    """`lorarl-serve`: the Tinker API (the stock `tinker` SDK drives it) on one base model, for many
    tenants, each a LoRA adapter with its own optimizer on the trainer and its sampler in vLLM."""

    model: ModelConfig
    """The base model every tenant trains an adapter on (leave out [model.lora]: each tenant chooses
    its rank when it creates its training client)."""
    trainer: ForwardPassConfig = ForwardPassConfig()
    """The trainer process: its forward and backward passes, threads and GPU."""
    inference: InferenceConfig = InferenceConfig(port=8100)
    """The vLLM servers that sample for every tenant, as `rl` starts them (from port 8100: the API has 8000)."""
    cluster: ClusterConfig = ClusterConfig()
    """Where the processes run: this machine, or the nodes of a Ray cluster."""
    serve: ServeSection = ServeSection()
    """The Tinker API: address, keys, adapters held at once, timeouts."""

    @model_validator(mode="after")
    def _tenants_bring_their_adapters(self) -> ServeConfig:
        if self.model.lora is not None or self.model.full_finetune:
            raise ValueError(
                "[model.lora] and model.full_finetune are not for lorarl-serve: each tenant creates its own "
                "adapter (create_lora_training_client(rank=...)); leave them out"
            )
        inf = self.inference
        if not inf.urls and inf.port <= self.serve.port < inf.port + inf.num_workers and inf.host == self.serve.host:
            raise ValueError(
                f"serve.port {self.serve.port} is a port of the vLLM workers (inference.port {inf.port}, "
                f"{inf.num_workers} workers): give them apart"
            )
        taken = {self.serve.port: "serve.port"}
        if not inf.urls:
            taken |= {inf.port + i: "a vLLM worker's port" for i in range(inf.num_workers)}
        if self.serve.trainer_port in taken:
            raise ValueError(
                f"serve.trainer_port {self.serve.trainer_port} is {taken[self.serve.trainer_port]}: give it "
                "another, or 0 for a free one"
            )
        if self.trainer.parallel.dp != 1:
            raise ValueError("trainer.parallel.dp: lorarl-serve runs one trainer process; leave parallel out")
        return self


# The configs whose commands start vLLM workers and a trainer: `rl`'s and `lorarl-serve`'s (the same
# server flags, placement and CPU cores).
WorkersConfig = RLConfig | ServeConfig


class ServeRunMode(RunMode):
    """`lorarl-serve`'s run-mode flags: those of every command, and whether to continue a server's folder."""

    resume: bool = False
    """Continue the server of this run folder (after a stop or a crash): its sessions, training clients,
    checkpoints and finished requests are served again, each training client from its last saved state
    (save_state) before its next request; requests that were pending fail with one line. False: a new
    server (a folder that holds one is refused unless --overwrite)."""
