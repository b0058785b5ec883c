"""The variants of a sweep ([[variants]] in an `rl` config), as the trainer, the orchestrator and
the launcher each see them: a name, the effective config, and the run folder's view for it.

One place resolves them, so that every process agrees on each variant's config and on the step a
resumed sweep continues from: the latest whose checkpoint is complete for every variant (a crash
between two variants' checkpoints leaves the newest step incomplete for some).
"""

from __future__ import annotations

from dataclasses import dataclass

from lorarl.config.models import ResumeConfig, RLConfig
from lorarl.run_folder import RunFolder


@dataclass(frozen=True)
class Variant:
    name: str
    cfg: RLConfig  # the top-level config with the variant's overrides (RLConfig.variant_configs)
    run: RunFolder  # the run folder's view for this variant (RunFolder.for_variant)


def variants_of(cfg: RLConfig) -> list[Variant]:
    """The variants of `cfg`, in config order, each resuming (with `resume`) from the sweep's common
    checkpoint step. Raises RunFolderError when no step is complete for all of them."""
    run = RunFolder(cfg.run_dir)
    names = [v.name for v in cfg.variants]
    step = run.resume_step(cfg.resume.step, names) if cfg.resume is not None else None
    variants = []
    for name, variant_cfg in cfg.variant_configs():
        if step is not None:
            variant_cfg.resume = ResumeConfig(step=step)
        variants.append(Variant(name, variant_cfg, run.for_variant(name)))
    return variants
