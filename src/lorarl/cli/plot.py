"""`lorarl-plot RUN [RUN ...] [--out FOLDER]`: PNG plots of runs from their metrics.jsonl.

Writes overview.png (every panel in one grid) and one PNG per panel (reward, evals, policy lag,
trainer-vLLM mismatch, entropy, loss, step time, throughput; for `sft` runs loss, grad norm, lr,
throughput), each run overlaid in its own colour. A panel no run has data for is left out.
"""

from __future__ import annotations

import argparse

from lorarl.cli.common import ArgumentParser, ctrl_c_in_one_line, exit_with, user_path
from lorarl.exit_codes import BAD_INPUT
from lorarl.monitor.plots import MetricsError, plot_runs


@ctrl_c_in_one_line("lorarl-plot")
def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="lorarl-plot", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "runs", nargs="+", type=user_path, metavar="RUN", help="a run folder (output_dir/run_name) or its metrics.jsonl"
    )
    parser.add_argument("--out", type=user_path, help="the folder to write the PNGs to; default: <first RUN>/plots/")
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.runs, args.out)
    except (MetricsError, OSError, ValueError) as e:
        exit_with(e, BAD_INPUT)
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
