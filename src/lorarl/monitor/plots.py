"""Plots of runs from their metrics.jsonl, so that a run is looked at rather than read line by line.

Each panel (reward, evals, policy lag, mismatch, ...) is one PNG with every run overlaid, and an
overview PNG puts them all in one grid. A panel whose metrics no run has is left out. Colours tell
runs apart; with a single run they tell the panel's metrics apart instead, which then reads better
than line styles. Figures are drawn without pyplot, so no display or backend is involved.

The PNGs go into the folder's record of what lorarl wrote (written_files.py): a plot replaces only a PNG
that lorarl wrote, and a user's file of the same name is refused, naming it, before anything is drawn.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.typing import LineStyleType

from lorarl.file_kinds import NOT_REGULAR, special_file
from lorarl.run_folder import METRICS, RunFolder, unwritable
from lorarl.written_files import is_link, link_in_way, link_refusal, record, record_root, written_files

OVERVIEW = "overview.png"
# Line styles tell a panel's metrics apart when colours tell runs apart.
_LINE_STYLES: tuple[LineStyleType, ...] = ("-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1)), (0, (8, 3)))
# Points are marked on short series (evals, a few steps), where a bare line hides where the data is;
# on longer ones marks would hide the line styles.
_MARK_UP_TO = 12
# Steps above this are no longer exact as the floats matplotlib draws with (and no run gets there).
_MAX_STEP = 2**53
# Values beyond this overflow matplotlib's axis ticks (and a band's mean +- std); no metric gets there.
_MAX_VALUE = 1e100


class MetricsError(Exception):
    """A run cannot be read; str() is one line naming the file (and line) for the user."""


@dataclass
class Run:
    """One run's metrics: component -> metric -> step -> value (null values left out)."""

    label: str
    metrics: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)

    def series(self, component: str, metric: str) -> tuple[list[int], list[float]]:
        points = sorted(self.metrics.get(component, {}).get(metric, {}).items())
        return [step for step, _ in points], [value for _, value in points]


@dataclass(frozen=True)
class Source:
    """The metrics of one component whose names fully match `pattern`, one line each, named in the
    legend by `label`, else by the pattern's group `name`, else by the metric itself. `band` is a
    metric of the same component drawn as a +- band around the line (a standard deviation)."""

    component: str
    pattern: str
    label: str | None = None
    band: str | None = None


@dataclass(frozen=True)
class Line:
    """One line of a panel: `metric` of `component`, called `name` in the legend."""

    name: str
    component: str
    metric: str
    band: str | None


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file name, without .png
    title: str
    ylabel: str
    sources: tuple[Source, ...]
    xlabel: str = "step"
    log_y: bool = False  # for values spanning decades (mismatch: ~1e-7 on-policy, ~1 off)

    def lines(self, run: Run) -> list[Line]:
        """The lines `run` has metrics for in this panel; none: the panel is not drawn for it."""
        lines = []
        for source in self.sources:
            # In the order the run logs them, e.g. the phases of a step in the order they happen.
            for metric in run.metrics.get(source.component, {}):
                match = re.fullmatch(source.pattern, metric)
                if match:
                    name = source.label or match.groupdict().get("name") or metric
                    lines.append(Line(name, source.component, metric, source.band))
        return lines


ORCH, TRAINER, SFT = "orchestrator", "trainer", "sft"
# fmt: off
PANELS = (
    Panel("reward", "Reward (mean ± std over the batch)", "reward",
          (Source(ORCH, "reward/mean", band="reward/std"),)),
    # env/<env>/<reward fn> and env/<env>/reward (their weighted sum); reward_errors is a count.
    Panel("reward_by_function", "Reward per environment and function", "mean score",
          (Source(ORCH, r"env/(?P<name>[^/]+/(?!reward_errors$)[^/]+)"),)),
    Panel("eval", "Evals on held-out examples", "reward",
          (Source("eval", r"eval/(?P<name>.+/(avg|pass)@\d+)"),), xlabel="policy version"),
    Panel("policy_lag", "Policy lag of the batch", "versions behind",
          (Source(ORCH, r"policy_lag/(?P<name>mean|max)"),)),
    Panel("mismatch", "Trainer vs vLLM logprobs", "mismatch",
          (Source(TRAINER, r"mismatch/(?P<name>logprob_abs_diff|kl)"),), log_y=True),
    # The served-adapter check (served_check.py): worker vs trainer, and worker vs base, per version.
    Panel("served_check", "Served adapter vs trainer (probe, max |Δlogp|)", "max |Δlogp|",
          (Source("served", r"served/(?P<name>probe_gap|vs_base)"),), xlabel="policy version", log_y=True),
    Panel("entropy", "Policy entropy", "nats per token", (Source(TRAINER, "entropy"),)),
    Panel("grad_norm", "Gradient norm", "grad norm", (Source(TRAINER, "grad_norm"),)),
    Panel("loss", "Loss", "loss", (Source(TRAINER, "loss"),)),
    Panel("step_time", "Trainer step time", "seconds",
          (Source(TRAINER, r"time/(?P<name>(?!step$).+)"), Source(TRAINER, "time/step", label="whole step"))),
    Panel("throughput", "Throughput", "tokens/s",
          (Source(TRAINER, "tokens_per_s", label="trainer"), Source(ORCH, "tokens_per_s", label="orchestrator"))),
    Panel("sft_loss", "SFT loss", "loss",
          (Source(SFT, "loss", label="train"), Source(SFT, "eval/loss", label="eval"))),
    Panel("sft_grad_norm", "SFT gradient norm", "grad norm", (Source(SFT, "grad_norm"),)),
    Panel("sft_lr", "SFT learning rate", "learning rate", (Source(SFT, "lr"),)),
    Panel("sft_throughput", "SFT throughput", "tokens/s", (Source(SFT, "tokens_per_s"),)),
)
# fmt: on


def metrics_file(path: Path) -> Path:
    """A run folder's metrics.jsonl, or `path` itself when it is the file (or a FIFO, refused by name)."""
    return path if path.is_file() or special_file(path) else RunFolder(path).metrics


def load_runs(path: Path, label: str) -> list[Run]:
    """The run at `path`; of a sweep ([[variants]]), each variant as a run of its own, `label/variant`."""
    runs: dict[str | None, Run] = {}  # by variant, in the order they first appear
    for where, row in _rows(path):
        if bad := next((key for key, value in row.items() if not _drawable(value)), None):
            raise MetricsError(f"{where}: {bad} is not a finite number up to 1e100: no plot can draw it")
        variant = row.get("variant")
        run = runs.setdefault(variant, Run(label if variant is None else f"{label}/{variant}"))
        metrics = run.metrics.setdefault(row["component"], {})
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
                metrics.setdefault(key, {})[row["step"]] = float(value)
    return list(runs.values()) or [Run(label)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of the run folder's metrics.jsonl (or of `path`, the file), as written, NaN included:
    the one reader of the file for the scripts that tabulate runs (summaries, benchmarks, reports).
    MetricsError, naming file and line, for a line that is not a metrics row."""
    return [row for _, row in _rows(path)]


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each row of the run's metrics.jsonl with where it stands (file:line)."""
    file = metrics_file(path)
    if special_file(file):
        raise MetricsError(f"{file}: {NOT_REGULAR}")
    if not file.is_file():
        raise MetricsError(f"{path}: no {METRICS} (give a run folder or its {METRICS})")
    with open(file, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield f"{file}:{number}", metrics_row(line, f"{file}:{number}")


def metrics_row(line: bytes, where: str) -> dict[str, Any]:
    """One line of metrics.jsonl as a row; MetricsError naming `where` (file:line) if it is not one."""
    try:
        row = json.loads(line)
    except UnicodeDecodeError:
        raise MetricsError(f"{where}: not UTF-8 text") from None
    except ValueError:  # a number too large for a float included
        raise MetricsError(f"{where}: not a JSON object") from None
    step = row.get("step") if isinstance(row, dict) else None
    if not (isinstance(row, dict) and type(step) is int and isinstance(row.get("component"), str)):
        raise MetricsError(f"{where}: not a metrics row (an object with an integer step and a component)")
    if not 0 <= step <= _MAX_STEP:
        shown = str(step) if abs(step) < 10**18 else f"of {len(str(abs(step)))} digits"
        raise MetricsError(f"{where}: step {shown} is not a step of a run (0 to 2**53)")
    if not isinstance(row.get("variant"), str | None):
        raise MetricsError(f"{where}: variant is not a name (a string)")
    return row


def _drawable(value: object) -> bool:
    """False for a number that no plot can draw: inf, nan (JSON's 1e400 reads as inf), or one so large
    that an axis around it overflows; True for anything else (non-numbers are not drawn)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return True
    return abs(value) <= _MAX_VALUE  # False for nan too


def run_labels(paths: Sequence[Path]) -> list[str]:
    """Each run's folder name, or the paths as given when two runs share a folder name."""
    names = [metrics_file(path).resolve().parent.name for path in paths]
    return names if len(set(names)) == len(names) else [str(path) for path in paths]


def default_out(first_run: Path) -> Path:
    return RunFolder(metrics_file(first_run).parent).plots


def plot_runs(paths: Sequence[Path], out: Path | None = None) -> list[Path]:
    """Write overview.png and one PNG per panel that some run has data for into `out` (default:
    the first run's plots/); return the paths written, the overview first."""
    runs = [run for path, label in zip(paths, run_labels(paths), strict=True) for run in load_runs(path, label)]
    panels = [panel for panel in PANELS if any(panel.lines(run) for run in runs)]
    if not panels:
        raise MetricsError(f"nothing to plot: no known metrics in {', '.join(str(metrics_file(p)) for p in paths)}")
    out = out or default_out(paths[0])
    targets = [out / OVERVIEW, *(out / f"{panel.name}.png" for panel in panels)]
    root = check_out(out, targets)
    out.mkdir(parents=True, exist_ok=True)
    written = [save(overview(panels, runs), targets[0], root)]
    for panel, target in zip(panels, targets[1:], strict=True):
        figure = Figure(figsize=(7, 4.5), layout="constrained")
        draw(figure.add_subplot(), panel, runs, legend_runs=True)
        written.append(save(figure, target, root))
    return written


def check_out(out: Path, targets: Sequence[Path]) -> Path:
    """The folder whose record the PNGs go into (`out`'s run folder, or `out`), once `out` can be
    written and none of `targets` is a file that lorarl did not write; MetricsError if not."""
    if problem := unwritable(out):
        raise MetricsError(f"--out {out}: {problem}")
    if (link := link_in_way(out)) is not None:
        raise MetricsError(f"--out {out}: {link_refusal(link)}")
    root = record_root(out) or out
    if links := [t for t in targets if is_link(t)]:
        raise MetricsError(f"--out {out}: {link_refusal(links[0])}")
    mine = written_files(root)
    if theirs := [t for t in targets if t.exists() and t not in mine]:
        raise MetricsError(
            f"--out {out}: {theirs[0].name} there was not written by lorarl-plot and would be replaced: it is "
            "left untouched; choose another --out"
        )
    return root


def overview(panels: Sequence[Panel], runs: Sequence[Run]) -> Figure:
    """All panels in one grid, the runs named once at the top instead of in every panel."""
    columns = min(len(panels), 2 if len(panels) <= 4 else 3)  # 4 panels: 2 x 2, not 3 + 1
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(6.5 * columns, 3.8 * rows + 0.6), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    for ax, panel in zip(grid.flat, panels, strict=False):
        draw(ax, panel, runs, legend_runs=False)
    for ax in grid.flat[len(panels) :]:
        ax.set_visible(False)
    if len(runs) == 1:
        figure.suptitle(runs[0].label, fontsize="x-large")
    else:
        handles = [Line2D([], [], color=run_color(i)) for i in range(len(runs))]
        figure.legend(
            handles, [run.label for run in runs], loc="outside upper center", ncols=min(len(runs), 6), fontsize="large"
        )
    return figure


def run_color(index: int) -> str:
    return f"C{index % 10}"


def draw(ax: Axes, panel: Panel, runs: Sequence[Run], legend_runs: bool) -> None:
    """Draw every run's lines of `panel` on `ax`, with a legend of the metrics (when several) and,
    with `legend_runs`, of the runs drawn."""
    names = list(dict.fromkeys(line.name for run in runs for line in panel.lines(run)))
    # A run keeps its colour in every panel, even where an earlier run has no line.
    several_runs = len(runs) > 1
    drawn: dict[int, str] = {}  # run index -> label, of the runs with lines here
    positive = True
    for run_index, run in enumerate(runs):
        for line in panel.lines(run):
            index = names.index(line.name)
            color = run_color(run_index) if several_runs else run_color(index)
            style = _LINE_STYLES[index % len(_LINE_STYLES)] if several_runs else "-"
            steps, values = run.series(line.component, line.metric)
            marker = "o" if len(steps) <= _MARK_UP_TO else None
            ax.plot(steps, values, color=color, linestyle=style, marker=marker, markersize=3, linewidth=1.5)
            positive = positive and all(value > 0 for value in values)
            if line.band:
                draw_band(ax, run, line, color)
            drawn[run_index] = run.label
    if panel.log_y and positive:  # a zero or negative value has no place on a log axis
        ax.set_yscale("log")
    ax.set_title(panel.title)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = legend_entries(names, drawn if legend_runs else {}, several_runs)
    # One run's metrics are told apart by colour, so the run itself is named in the legend's title.
    title = runs[0].label if legend_runs and not several_runs and len(names) > 1 else None
    if handles:
        # Beside the axes, where it never covers a line.
        ax.legend(
            handles,
            labels,
            title=title,
            fontsize="small",
            title_fontsize="small",
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            borderaxespad=0,
        )


def draw_band(ax: Axes, run: Run, line: Line, color: str) -> None:
    """Shade line +- its band metric at the steps that have both."""
    assert line.band is not None
    centre = dict(zip(*run.series(line.component, line.metric), strict=True))
    spread = dict(zip(*run.series(line.component, line.band), strict=True))
    steps = [step for step in centre if step in spread]
    lower = [centre[step] - spread[step] for step in steps]
    upper = [centre[step] + spread[step] for step in steps]
    ax.fill_between(steps, lower, upper, color=color, alpha=0.2, linewidth=0)


def legend_entries(names: list[str], runs: dict[int, str], several_runs: bool) -> tuple[list[Line2D], list[str]]:
    """`runs` (index -> label) by colour when there are several, or the panel has a single line; then
    the metrics, when more than one: by line style (several runs) or by colour (one run)."""
    handles: list[Line2D] = []
    labels: list[str] = []
    if runs and (several_runs or len(names) == 1):
        handles += [Line2D([], [], color=run_color(index)) for index in runs]
        labels += runs.values()
    if len(names) > 1:
        for index, name in enumerate(names):
            if several_runs:
                handles.append(Line2D([], [], color="0.3", linestyle=_LINE_STYLES[index % len(_LINE_STYLES)]))
            else:
                handles.append(Line2D([], [], color=run_color(index)))
            labels.append(name)
    return handles, labels


def save(figure: Figure, path: Path, root: Path) -> Path:
    """Write `figure` to `path` whole (a temporary file renamed) and record it in `root`'s record."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    figure.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    record(root, [path])
    return path
