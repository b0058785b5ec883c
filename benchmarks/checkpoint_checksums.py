"""What the SHA-256 in checkpoint manifests costs: writing and verifying a real-sized LoRA checkpoint.

Writes a trainer checkpoint half like `save_checkpoint` does (adapter/adapter_model.safetensors of
--adapter-mb, optimizer.pt of twice that: Adam's two moments), with the file sizes only (as before
checksums) and with SHA-256, then times `manifest_problem` with and without checksums (what
`--resume` pays per checkpoint it looks at). Medians of --repeats, the two kinds in turns, in seconds. The table is in
docs/data_safety.md.

    .venv/bin/python benchmarks/checkpoint_checksums.py --adapter-mb 150 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import save_file

from lorarl.run_folder import write_folder_atomically
from lorarl.written_files import manifest_problem
from runner import markdown_head, markdown_row


def checkpoint_writer(adapter_mb: int) -> Callable[[Path], None]:
    weights = {"lora": torch.randn(adapter_mb * 2**20 // 4)}  # float32

    def write(folder: Path) -> None:
        (folder / "adapter").mkdir()
        save_file(weights, str(folder / "adapter" / "adapter_model.safetensors"))
        torch.save({"exp_avg": weights["lora"], "exp_avg_sq": weights["lora"].clone()}, folder / "optimizer.pt")

    return write


def alternating_medians(repeats: int, actions: dict[bool, Callable[[], object]]) -> dict[bool, float]:
    """Median time of each action, run in turns (ABAB...) so that the disk's and the machine's drift
    falls on both alike."""
    times: dict[bool, list[float]] = {key: [] for key in actions}
    for _ in range(repeats):
        for key, action in actions.items():
            start = time.perf_counter()
            action()
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter-mb", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    write = checkpoint_writer(args.adapter_mb)
    with tempfile.TemporaryDirectory(dir=".") as tmp:  # the disk runs are written to, not a tmpfs
        folder = Path(tmp) / "trainer"
        folder.mkdir()
        written = alternating_medians(
            args.repeats, {c: partial(write_folder_atomically, folder, write, checksums=c) for c in (False, True)}
        )
        verified = alternating_medians(args.repeats, {c: partial(manifest_problem, folder, c) for c in (False, True)})
        total_mb = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20
    print(f"checkpoint of {total_mb:.0f} MiB (adapter {args.adapter_mb} MiB + optimizer), median of {args.repeats}")
    print(markdown_head(["manifest", "write (s)", "verify (s)"]))
    for checksums in (False, True):
        name = "sizes + SHA-256" if checksums else "sizes only"
        print(markdown_row([name, f"{written[checksums]:.2f}", f"{verified[checksums]:.3f}"]))


if __name__ == "__main__":
    main()
