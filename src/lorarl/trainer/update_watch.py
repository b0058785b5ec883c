"""`UpdateWatch`: the trainer's guard against training gone wrong beyond repair, in one object that
`Trainer` (trainer.py) holds, so the loops and the optimizer step carry none of its state.

It stops the run (`TrainingStopped`) on an update that made a weight NaN or infinite, on too many
non-finite gradients in a row (each such step is skipped: no weight changes), and on a gradient that
stays exactly 0 on steps that had something to learn from (saturated weights). Whether the weights
are finite is one reduction on the device per step (`largest_weight`), read with the next step's
gradient norm, or by `check_weights` before anything reads the weights out: no wait for the device
that the step did not make already, and no adapter, checkpoint or result written from non-finite
weights.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from lorarl.trainer.distributed import DataParallel

log = logging.getLogger("lorarl.trainer")


class TrainingStopped(RuntimeError):
    """The run cannot go on, and writes nothing more; str() is one line: the step, what went wrong,
    the key to change. The console scripts print it and exit with 3."""


@dataclass
class UpdateWatch:
    max_skipped_steps: int
    # Where the config keeps the optimizer's keys, for messages: "optim" (SFT) or "trainer.optim" (RL).
    optim_key: str = "optim"
    skipped_steps: int = 0  # steps whose gradient was not finite, so no update
    skipped_in_a_row: int = 0
    # The last update's step, lr and largest |weight| (a device tensor), until read (`check_weights`).
    unchecked: tuple[int, float, torch.Tensor] | None = None
    largest_weight: float = 0.0  # the largest |weight| after the last update that was read
    had_gradient: bool = False  # some step with a loss to learn from had a gradient (`_watch_for_collapse`)
    zero_in_a_row: int = 0  # steps in a row whose gradient was exactly 0 although they had a loss to learn from
    warned_zero: bool = False

    def read_with_last_update(self, grad_norm: torch.Tensor) -> float:
        """The gradient norm as a number, and in the same wait for the device the last update's check."""
        if isinstance(grad_norm, DTensor):  # with fsdp: the norm over every rank's shards
            grad_norm = grad_norm.full_tensor()
        if self.unchecked is None:
            return grad_norm.item()
        step, lr, largest = self.unchecked
        self.unchecked = None
        norm, largest_value = torch.stack([grad_norm.float(), largest.float().to(grad_norm.device)]).tolist()
        self._stop_if_not_finite(step, lr, largest_value)
        return float(norm)

    def finite_gradient(self, step: int, grad_norm: float, lr: float) -> bool:
        """Whether step `step` may update the weights. A NaN or infinite gradient (a non-finite loss
        gives one) may not: the step is skipped, counted in `skipped_steps`, and `max_skipped_steps` of
        them in a row stop the run."""
        if math.isfinite(grad_norm):
            self.skipped_in_a_row = 0
            return True
        self.skipped_steps += 1
        self.skipped_in_a_row += 1
        log.warning("step %d: gradient norm %s: step skipped (%d in a row)", step, grad_norm, self.skipped_in_a_row)
        if self.skipped_in_a_row >= self.max_skipped_steps:
            raise TrainingStopped(
                f"step {step}: the loss or gradient was NaN or infinite {self.skipped_in_a_row} steps in a row "
                f"({self.optim_key}.max_skipped_steps), no weight changed since step "
                f"{step - self.skipped_in_a_row}; lower {self.optim_key}.lr (now {lr:g}) or check the data "
                "and model.dtype; what was written so far is finite"
            )
        return False

    def updated(self, step: int, lr: float, largest: torch.Tensor, grad_norm: float, signal: bool) -> None:
        """The optimizer stepped: `largest` (largest_weight, not yet read) is checked with the next
        gradient norm or by `check_weights`. `signal`: the step had something to learn from."""
        self.unchecked = (step, lr, largest)
        self._watch_for_collapse(step, grad_norm, lr, signal)

    def check_weights(self) -> None:
        """Stop the run if the last update made a weight NaN or infinite."""
        if self.unchecked is not None:
            step, lr, largest = self.unchecked
            self.unchecked = None
            self._stop_if_not_finite(step, lr, largest.item())

    def _stop_if_not_finite(self, step: int, lr: float, largest: float) -> None:
        self.largest_weight = largest
        if not math.isfinite(largest):
            raise TrainingStopped(
                f"step {step}: the update made weights NaN or infinite (lr {lr:g}); lower {self.optim_key}.lr "
                f"and start again; nothing was written from these weights"
            )

    def _watch_for_collapse(self, step: int, grad_norm: float, lr: float, signal: bool) -> None:
        """A gradient of exactly 0 on a step with something to learn from, after steps whose gradient
        was not 0: saturated weights, a learning rate far too high (at lr 1e6 SFT's gradient is 0 from
        step 2 on). Said once; `max_skipped_steps` such steps in a row stop the run, as no later step
        could teach the model anything and a run that ends well would pass its useless adapter on. A
        single one may be sound (RL: every token's ratio clipped), so the first is only a warning."""
        if not signal:
            return
        if grad_norm > 0:
            self.had_gradient, self.zero_in_a_row = True, 0
            return
        if not self.had_gradient:
            return
        self.zero_in_a_row += 1
        if not self.warned_zero:
            self.warned_zero = True
            log.warning(
                "step %d: gradient norm exactly 0 although the step had a loss to learn from: weights saturated? "
                "(lower %s.lr if it lasts)",
                step,
                self.optim_key,
            )
        if self.zero_in_a_row >= self.max_skipped_steps:
            self.check_weights()  # the largest weight, for the message (and NaN, if it came to that)
            raise TrainingStopped(
                f"step {step}: the gradient norm was exactly 0 for {self.zero_in_a_row} steps in a row although "
                f"they had a loss to learn from ({self.optim_key}.max_skipped_steps): the weights are saturated "
                f"(largest |weight| {self.largest_weight:.3g}) and learn nothing more; lower {self.optim_key}.lr "
                f"(now {lr:g}) and start again"
            )


def largest_weight(params: list[torch.nn.Parameter], dp: DataParallel) -> torch.Tensor:
    """The largest |weight| of `params`, infinite if any weight is NaN or infinite: one reduction on the
    device, not waited for. With `fsdp` each rank holds shards: the largest over the ranks."""
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    # The max-norm keeps a NaN; as infinity it also survives the max over ranks (NCCL's max drops NaN).
    largest = torch.nn.utils.get_total_norm(local, math.inf)
    largest = torch.where(largest.isnan(), math.inf, largest)
    if dp.fsdp:
        torch.distributed.all_reduce(largest, op=torch.distributed.ReduceOp.MAX)
    return largest
