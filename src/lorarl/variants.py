"""The variants of a sweep ([[variants]] in an `rl` config), as the trainer, the orchestrator and
the launcher each see them: a name, the effective config, and the run folder's view for it.

One place resolves them, so that every process agrees on each variant's config and on the step a
resumed sweep continues from: the latest whose checkpoint is complete for every variant (a crash
between two variants' checkpoints leaves the newest step incomplete for some). A variant's config is
the top-level one with its overrides applied key by key (model.lora, trainer.optim, trainer.scheduler,
trainer.loss), orchestrator.env as a whole; a loss override that picks another type keeps only the
keys every loss type shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from lorarl.config.algorithms import LossBase, LossConfig, LossTypes, upgrade_loss
from lorarl.config.loader import key_and_message
from lorarl.config.run import ResumeConfig, RLConfig, VariantConfig
from lorarl.run_folder import RunFolder

_LOSS: TypeAdapter[LossBase] = TypeAdapter(LossConfig)


@dataclass(frozen=True)
class Variant:
    name: str
    cfg: RLConfig  # the top-level config with the variant's overrides (`variant_configs`)
    run: RunFolder  # the run folder's view for this variant (RunFolder.for_variant)


def variants_of(cfg: RLConfig) -> list[Variant]:
    """The variants of `cfg`, in config order, each resuming (with `resume`) from the sweep's common
    checkpoint step. Raises RunFolderError when no step is complete for all of them."""
    run = RunFolder(cfg.run_dir)
    names = [v.name for v in cfg.variants]
    step = run.resume_step(cfg.resume.step, names) if cfg.resume is not None else None
    variants = []
    for name, variant_cfg in variant_configs(cfg):
        if step is not None:
            variant_cfg.resume = ResumeConfig(step=step)
        variants.append(Variant(name, variant_cfg, run.for_variant(name)))
    return variants


def variant_configs(cfg: RLConfig) -> list[tuple[str, RLConfig]]:
    """Each variant's name and effective config: `cfg` with the variant's overrides applied and no
    variants of its own. Computed afresh on each call, so a change to `cfg` (such as the launcher's
    resolved values) reaches every variant. Raises ValueError naming the key at fault."""
    return [(v.name, _variant_config(cfg, i, v)) for i, v in enumerate(cfg.variants)]


def _variant_config(cfg: RLConfig, i: int, variant: VariantConfig) -> RLConfig:
    def merged(section: BaseModel, overrides: dict[str, Any], key: str) -> Any:
        try:
            if isinstance(section, LossBase):
                return _LOSS.validate_python(_loss_overrides(section, overrides))
            return type(section).model_validate({**section.model_dump(), **overrides})
        except ValidationError as e:
            where, msg = key_and_message(LossTypes if isinstance(section, LossBase) else type(section), e.errors()[0])
            raise ValueError(f"variants[{i}].{key}{'.' if where else ''}{where}: {msg}") from None
        except ValueError as e:  # an old key that does not fit (upgrade_loss)
            raise ValueError(f"variants[{i}].{key}: {e}") from None

    out = cfg.model_copy(deep=True, update={"variants": []})
    out.model.lora = merged(cfg.lora, variant.model.lora, "model.lora")
    out.trainer.optim = merged(cfg.trainer.optim, variant.trainer.optim, "trainer.optim")
    out.trainer.scheduler = merged(cfg.trainer.scheduler, variant.trainer.scheduler, "trainer.scheduler")
    out.trainer.loss = merged(cfg.trainer.loss, variant.trainer.loss, "trainer.loss")
    if variant.orchestrator.env is not None:
        out.orchestrator.env = variant.orchestrator.env
    return out


def _loss_overrides(loss: LossBase, overrides: dict[str, Any]) -> dict[str, Any]:
    """The loss section a variant asks for: `loss` with `overrides` applied key by key, or, where they
    pick another type, only the keys every type shares."""
    overrides = upgrade_loss(overrides, default=None)
    base = loss.model_dump()
    if overrides.get("type", base["type"]) != base["type"]:
        base = {k: v for k, v in base.items() if k in LossBase.model_fields}
    return {**base, **overrides}
