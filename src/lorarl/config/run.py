"""The top level of a config: the keys every process of a run reads (`SharedConfig`), `rl`'s whole config
(`RLConfig`: [model], [trainer], [orchestrator], [inference], [cluster] and the sweep's [[variants]]),
and the run-mode flags that are not part of the experiment (`RunMode`: --dry-run, --overwrite, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from lorarl.config.cluster import ClusterConfig
from lorarl.config.common import MIN_WAIT, Section, Seed, UserPath
from lorarl.config.inference import InferenceConfig
from lorarl.config.model import LoraConfig, ModelConfig, check_quantized_base
from lorarl.config.orchestrator import EnvConfig, OrchestratorConfig
from lorarl.config.trainer import TrainerConfig

# A run folder's name, with room for the names lorarl derives from it (adapters `<run_name>-step<N>`),
# within the 255 bytes a file system gives a file name.
_MAX_RUN_NAME = 200


class ResumeConfig(Section):
    step: int | None = Field(None, ge=1)
    """The checkpoint to resume from, checkpoints/step_N (`--resume.step N`); None: the latest (`--resume`)."""


class WandbConfig(Section):
    project: str = "lorarl"
    """The Weights & Biases project the run is logged to, one wandb run per component grouped by run_name."""
    mode: Literal["online", "offline", "disabled"] = "offline"
    """Where wandb data goes: "offline": files in the run folder, for a later `wandb sync`; "online":
    uploaded as the run goes; "disabled": nowhere, as if the table were absent."""


class MonitorConfig(Section):
    jsonl: bool = True
    """Append each component's metrics to metrics.jsonl in the run folder, one JSON object per line;
    false: no metrics file."""
    console: bool = True
    """Show progress on the console: `rl` prints one line per step, `sft` a progress bar with the loss,
    tokens/s and the time left. False: neither (logs still go to logs/)."""
    wandb: WandbConfig | None = None
    """Mirror the metrics to Weights & Biases; absent: no wandb. A [monitor.wandb] table, even empty,
    turns it on."""
    stall_warning: float = Field(300, ge=MIN_WAIT)
    """`rl`: seconds with no new step (in metrics.jsonl) before the console says, in one line, which
    process the run waits on and for how long, with that process's last log line; said again every
    as many seconds while the wait lasts."""
    stall_stop: float | None = Field(3600, ge=MIN_WAIT)
    """`rl`: seconds with no new step before the run is stopped (exit code 1), a frozen process or a
    reward that never returns included. None: never. Both need monitor.jsonl."""

    @model_validator(mode="after")
    def _warned_before_stopped(self) -> Self:
        # A stop at or before the first warning stops the run without the line that says what it waits on.
        if self.stall_stop is not None and self.stall_stop <= self.stall_warning:
            raise ValueError(
                f"stall_stop = {self.stall_stop:g} s is not after stall_warning = {self.stall_warning:g} s: the run "
                "would stop before the console says what it waits on; raise stall_stop, or lower stall_warning"
            )
        return self


class RunFolderConfig(Section):
    """Top-level keys that every command reads: its run folder, sequence length, seed, metrics."""

    seq_len: int = Field(512, ge=16)
    """Most tokens of one sample, prompt plus completion: vLLM's `--max-model-len` in `rl`; in `sft`,
    longer examples are cut or left out (data.truncation). With packing, also the width of a row."""
    output_dir: UserPath = Path("outputs")
    """Folder of run folders: a run writes everything to `<output_dir>/<run_name>/`."""
    run_name: str = Field("default", pattern=r"^[A-Za-z0-9._-]+$")
    """Name of the run folder under output_dir, and in `rl` of its adapters in vLLM (`<run_name>-step<N>`),
    so runs sharing servers never touch each other's adapters. Letters, digits, ".", "_" and "-", at most
    200 of them."""
    seed: Seed = 0
    """Seeds torch in the trainer (a fresh adapter's initial weights) and vLLM's sampling (`--seed`); in
    `sft` also the data order and the eval_fraction hold-out. Examples in `rl` follow orchestrator.seed.
    0 to 2**32 - 1."""
    monitor: MonitorConfig = MonitorConfig()
    """Where metrics go: metrics.jsonl, the console, Weights & Biases."""
    keep_freed_memory: bool = True
    """On a CPU, the trainer and the vLLM workers `rl` starts keep the blocks under 32 MiB that a step
    frees (glibc's malloc neither unmaps nor trims them) for the next step to reuse, instead of faulting
    them in again, which a virtual machine pays dearly for (docs/performance.md); the resident size
    stays at the step's peak plus the heap's fragments, somewhat above the memory plan's figures. False:
    blocks of 128 KiB or more go back to the system when freed, for a resident size that follows the
    live tensors. GLIBC_TUNABLES with glibc.malloc settings in the environment win. Unused on a GPU."""

    @field_validator("run_name", mode="after")
    @classmethod
    def _one_path_component(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError(f"run_name {value!r} would name output_dir or its parent, not a run folder")
        if len(value) > _MAX_RUN_NAME:
            raise ValueError(f"run_name has {len(value)} characters: at most {_MAX_RUN_NAME} (a folder name)")
        return value

    @field_validator("output_dir", mode="before")
    @classmethod
    def _a_folder_for_runs(cls, value: Any) -> Any:
        # A run folder is cleared on --overwrite: it must not be '/' itself, nor the working directory by accident.
        if not isinstance(value, str | Path):
            return value
        try:
            resolved = Path(value).resolve()
        except (RuntimeError, OSError) as e:  # a loop of symbolic links; a name too long
            why = getattr(e, "strerror", None) or e
            raise ValueError(f"{str(value)!r} cannot be resolved ({why})") from None
        if str(value).strip() == "" or resolved == Path("/"):
            raise ValueError(f"output_dir must be a folder for runs, not {str(value)!r}")
        return value

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name


class SharedConfig(RunFolderConfig):
    """Top-level keys that every part of a training run (`rl`, `sft`) reads."""

    max_steps: int = Field(20, ge=1)
    """Optimizer steps to train for: each takes one batch (of rollouts in `rl`, of data samples in `sft`);
    the linear and cosine schedules reach 0 here."""


class RunMode(Section):
    """How one command runs, apart from the experiment it runs: flags given on the command line (or in a
    config file) that are never written into the run folder's configs/, so that a process started from
    those configs (`lorarl-trainer @ configs/trainer.json`) runs the same experiment, not a dry run."""

    overwrite: bool = False
    """Start over in a run folder that holds a previous run, deleting what lorarl wrote there
    (never other files); without it (or `--resume`) such a folder is refused."""
    dry_run: bool = False
    """Make every check, print the memory plan (docs/memory_plan.md) and start nothing; `rl` also writes
    the run folder's configs/ (per-process configs, commands and the placement of every process). False: run."""
    dry_run_devices: int | None = Field(None, ge=0)
    """With dry_run: place the run as if this machine had this many GPUs (0: none), e.g. to see on a
    laptop where each process of an 8-GPU run would go (`--dry-run --dry-run-devices 8`). None: the GPUs
    this machine has."""
    device_memory_gib: float | None = Field(None, gt=0)
    """Memory of each GPU in GiB for the memory plan that `rl` and `sft` check before starting
    (docs/memory_plan.md). None: what torch reports for this machine's GPUs, or 80 where a dry run
    pretends GPUs (dry_run_devices) or a Ray cluster provides them."""

    @model_validator(mode="after")
    def _devices_only_pretend_in_dry_runs(self) -> Self:
        if self.dry_run_devices is not None and not self.dry_run:
            raise ValueError("dry_run_devices only pretends for a dry run: add --dry-run, or leave it out")
        return self


class RLRunMode(RunMode):
    """`rl`'s run-mode flags: those of every command, and how often to resume after a crash."""

    auto_resume: int = Field(0, ge=0)
    """When the trainer or the orchestrator dies, restart both from the latest complete checkpoint
    (`trainer.ckpt.interval` must be set) up to this many times, keeping the vLLM workers. Not when a
    restart would end the same way: the trainer stopped training gone wrong (NaN weights, a gradient
    stuck at 0: exit code 3), the disk is full (exit code 4), or either refused what it found (exit code 2)."""


VARIANT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class VariantModelConfig(Section):
    lora: dict[str, Any] = {}
    """Keys of [model.lora] this variant sets otherwise (e.g. {rank = 4}), each replacing the top-level
    key; the keys left out are the top-level [model.lora]'s. {}: the top-level adapter settings."""


class VariantTrainerConfig(Section):
    optim: dict[str, Any] = {}
    """Keys of [trainer.optim] this variant sets otherwise (e.g. {lr = 1e-4}), key by key as lora."""
    scheduler: dict[str, Any] = {}
    """Keys of [trainer.scheduler] this variant sets otherwise, key by key as lora."""
    loss: dict[str, Any] = {}
    """Keys of [trainer.loss] this variant sets otherwise, key by key as lora."""


class VariantOrchestratorConfig(Section):
    env: list[EnvConfig] | None = None
    """This variant's training environments, replacing the top-level orchestrator.env list as a whole
    (a list, as [[orchestrator.env]]); None: the top-level environments."""


class VariantConfig(Section):
    """One adapter of a sweep trained on the shared base: its name and what differs for it."""

    name: str = Field(pattern=VARIANT_NAME)
    """The variant's name, unique in the run: its folders are broadcasts/<name>/, rollouts/<name>/,
    samples/<name>/ and checkpoints/<name>/, its vLLM adapters `<run_name>-<name>-step<N>`, and its
    metrics rows carry "variant": name. Letters, digits, "_" and "-", not starting with "_" or "-"."""

    @field_validator("name", mode="after")
    @classmethod
    def _fits_a_folder_name(cls, value: str) -> str:
        # Its folders (samples/<name>/step_N.jsonl) and adapter names must fit a file name's 255 bytes.
        if len(value) > _MAX_RUN_NAME:
            raise ValueError(f"variant name has {len(value)} characters: at most {_MAX_RUN_NAME} (a folder name)")
        return value

    model: VariantModelConfig = VariantModelConfig()
    """What differs from the top-level [model]: only lora (the base model is shared)."""
    trainer: VariantTrainerConfig = VariantTrainerConfig()
    """What differs from the top-level [trainer]: optim, scheduler, loss."""
    orchestrator: VariantOrchestratorConfig = VariantOrchestratorConfig()
    """What differs from the top-level [orchestrator]: env."""


class RLConfig(SharedConfig):
    """`rl`: a trainer that updates a LoRA adapter, an orchestrator that samples and scores rollouts
    through vLLM, and the vLLM servers."""

    model: ModelConfig
    """The base model, and the LoRA adapter trained on it."""
    trainer: TrainerConfig = TrainerConfig()
    """The trainer: one optimizer step on each rollout batch, then the new adapter to broadcasts/step_N."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    """The orchestrator: samples rollouts through vLLM, scores them and writes a batch for every step."""
    inference: InferenceConfig = InferenceConfig()
    """The vLLM servers: started by `rl` (`inference` starts one alone), or already running (urls)."""
    cluster: ClusterConfig = ClusterConfig()
    """Where the processes run: this machine, or the nodes of a Ray cluster."""
    variants: list[VariantConfig] = []
    """Several adapters trained at once on one base model and sampled through the same vLLM servers, one
    [[variants]] table each: a sweep in one run. Each variant is the top-level config with its overrides
    applied (model.lora, trainer.optim, trainer.scheduler and trainer.loss key by key, orchestrator.env
    as a whole), and trains on batches of its own with an optimizer of its own; every other key is
    shared. []: one adapter, the top-level [model.lora]."""
    resume: ResumeConfig | None = None
    """Continue from a checkpoint in this run folder, with the same examples as a run that never stopped:
    `--resume` (the latest) or `--resume.step N`. What the run wrote after that step is dropped, and its
    batches and adapters regenerated. Absent: a new run."""

    @model_validator(mode="after")
    def _rl_trains_lora(self) -> RLConfig:
        if self.model.lora is None and not self.model.full_finetune:
            self.model.lora = LoraConfig()
        return self

    @model_validator(mode="after")
    def _warmup_ends_in_the_run(self) -> RLConfig:
        # The learning rate would never reach trainer.optim.lr: the run trains at a fraction of what it says.
        warmup = self.trainer.scheduler.warmup_steps
        if warmup >= self.max_steps:
            raise ValueError(
                f"trainer.scheduler.warmup_steps = {warmup} is not below max_steps = {self.max_steps}: the learning "
                "rate would never reach trainer.optim.lr; lower warmup_steps, or raise max_steps"
            )
        return self

    @model_validator(mode="after")
    def _policy_gap_keeps_adapters(self) -> RLConfig:
        if self.trainer.policy_gap_interval is not None and (self.model.full_finetune or self.trainer.parallel.fsdp):
            what = "model.full_finetune (each version is a whole model)" if self.model.full_finetune else "fsdp"
            raise ValueError(f"trainer.policy_gap_interval keeps the adapter of each version: not with {what}")
        return self

    @model_validator(mode="after")
    def _quantized_base_whole(self) -> RLConfig:
        check_quantized_base(self.model, self.trainer.parallel.fsdp, "trainer.parallel.fsdp")
        return self

    @model_validator(mode="after")
    def _full_finetune_fits(self) -> RLConfig:
        if self.model.full_finetune and self.variants:
            raise ValueError(
                "[[variants]] are adapters on one shared base model: model.full_finetune trains no adapter"
            )
        if self.model.full_finetune and self.trainer.loss.kl_coef > 0:
            # With LoRA the base is the model with its adapter off; full fine-tuning would need a second copy.
            raise ValueError(
                "trainer.loss.kl_coef > 0 needs the base model beside the policy: not with model.full_finetune"
            )
        return self

    @model_validator(mode="after")
    def _variants_resolve(self) -> RLConfig:
        names = [v.name for v in self.variants]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"variants: names must be unique, {dupes} appear more than once")
        if self.variants and self.trainer.parallel.dp > 1:
            # Each variant's step would need its own collective schedule over the ranks: not built yet.
            raise ValueError("variants train in one trainer process: trainer.parallel.dp must be 1 with [[variants]]")
        from lorarl.variants import variant_configs  # the merging is the variants' own logic

        variant_configs(self)  # every variant resolves, or the error names its key
        return self

    @property
    def lora(self) -> LoraConfig:
        assert self.model.lora is not None, "model.full_finetune: no adapter"  # else set by the validator
        return self.model.lora
