"""Plots of evaluation results (matplotlib, an optional extra). Knows nothing of torch."""

from __future__ import annotations

import os
from pathlib import Path

from . import PonderError, file_problem
from .folders import package_problem

INSTALL_HINT = "--plot needs matplotlib: pip install matplotlib"


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PonderError(INSTALL_HINT) from None


def _pyplot():
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    return plt


def check_destination(path: Path | str) -> Path:
    """Refuse --plot before any work: matplotlib missing, a format it cannot write, a folder that
    cannot be written. Returns the path to write (.png added where it has no extension)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(path)
    if path.is_dir():  # before a suffix is added: DIR is no name for DIR.png beside it
        raise PonderError(f"--plot {path} is a directory; name a file, such as {path / 'plot.png'}")
    problem = file_problem(path) if path.exists() else None
    if problem is not None:  # /dev/null: no name for /dev/null.png beside it either
        raise PonderError(f"--plot {path} {problem}; name a file, such as plot.png")
    if not path.suffix:
        path = path.with_suffix(".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise PonderError(f"--plot {path}: matplotlib cannot write {path.suffix} files; "
                          f"use one of {', '.join('.' + f for f in sorted(formats))}")
    folder = path.parent
    problem = package_problem(path, f"--plot {path}")
    if problem:
        raise PonderError(f"{problem}; name a file outside it")
    if path.is_dir():  # DIR.png
        raise PonderError(f"--plot {path} is a directory")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise PonderError(f"--plot {path}: cannot write to {folder}" +
                          (" (no such directory)" if not folder.exists() else ""))
    return path


def plot_report(report, path: Path | str) -> Path:
    """The figure of a reports.Report."""
    series, title = report.plot_series, report.title
    if report.plot_kind == "sweep":
        return plot_sweep(report.buckets, report.meta["fit"], path, title=title)
    if report.plot_kind == "predict":
        return plot_strips(series["inputs"], path, title=title)
    if report.plot_kind == "history":
        return plot_history(series["history"], series["best"][0]["epoch"], path, title=title)
    return plot_buckets(series, path, title=title)


def _x(row: dict) -> float:
    """A bucket's place on the x axis: its rotation, or the middle of its count range."""
    return row["rotation"] if "rotation" in row else (row["lo"] + row["hi"]) / 2


def _name(row: dict) -> str:
    return f"±{row['rotation']:g}°" if "rotation" in row else f"counts {row['counts']}"


def plot_sweep(buckets: list[dict], fit: dict, path: Path | str, *, title: str = "") -> Path:
    """Mean ponder steps (with the least-squares line) and accuracy against the exact angle."""
    plt = _pyplot()
    angles = [_x(b) for b in buckets]
    parity = "rotation" not in buckets[0]
    fig, (ax_steps, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax_steps.plot(angles, [b["mean_steps"] for b in buckets], "o", label="mean steps")
    for key, style, label in (("steps_correct", "^", "correct"), ("steps_wrong", "v", "wrong")):
        points = [(a, b[key]) for a, b in zip(angles, buckets) if b[key] is not None]
        if points:
            ax_steps.plot(*zip(*points), style, markersize=4, alpha=0.6,
                          label=f"on {label} {'answers' if parity else 'digits'}")
    slope = fit["steps_per_count"] if parity else fit["steps_per_10_degrees"]
    if slope is not None:  # undefined through a single difficulty (reports.least_squares)
        slope = slope if parity else slope / 10
        ax_steps.plot([angles[0], angles[-1]], [fit["steps_at_0"] + slope * a for a in (angles[0], angles[-1])], "-",
                      label=f"{slope:+.3f} steps per count" if parity else f"{10 * slope:+.3f} steps per 10°")
    xlabel, against = ("non-zero count (exact)", "count") if parity else ("|rotation| (degrees, exact)", "angle")
    ax_steps.set(xlabel=xlabel, ylabel="ponder steps", title=f"Steps against {against}")
    ax_acc.plot(angles, [b["accuracy"] for b in buckets], "o-")
    ax_acc.set(xlabel=xlabel, ylabel="accuracy", title=f"Accuracy against {against}", ylim=(0, 1))
    return _finish(fig, plt, (ax_steps, ax_acc), (ax_steps,), title, path)


def _finish(fig, plt, axes, legend_axes, title: str, path: Path | str) -> Path:
    """Grids, legends and the title, then the file."""
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in legend_axes:
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(fig, plt, path)


def _save(fig, plt, path: Path | str) -> Path:
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise PonderError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path


def plot_buckets(series: dict[str, list[dict]], path: Path | str, *, title: str = "") -> Path:
    """Accuracy and mean ponder steps (error bars: one standard deviation) against the rotation
    angle, one line per series, and the halting-step distribution of every bucket."""
    plt = _pyplot()
    import matplotlib.ticker

    fig, (ax_acc, ax_steps, ax_hist) = plt.subplots(1, 3, figsize=(16, 4.8))
    styles = ["-", "--", ":", "-."]
    for i, (name, rows) in enumerate(series.items()):
        angles = [_x(row) for row in rows]
        ax_acc.plot(angles, [row["accuracy"] for row in rows], marker="o", label=name)
        ax_steps.errorbar(angles, [row["mean_steps"] for row in rows], yerr=[row["std_steps"] for row in rows],
                          marker="o", capsize=4, label=name)
        cmap = plt.get_cmap("viridis")
        for j, row in enumerate(rows):
            total = sum(row["histogram"]) or 1
            share = [count / total for count in row["histogram"]]
            ax_hist.plot(range(1, len(share) + 1), share, styles[i % len(styles)], marker=".",
                         color=cmap(j / max(len(rows) - 1, 1)),
                         label=_name(row) + (f" {name}" if len(series) > 1 else ""))
    first = next(iter(series.values()))[0]
    xlabel = "test rotation (± degrees)" if "rotation" in first else "non-zero count (middle of the bucket)"
    ax_acc.set(xlabel=xlabel, ylabel="accuracy", title="Accuracy")
    ax_steps.set(xlabel=xlabel, ylabel="ponder steps", title="Mean ponder steps (± 1 sd)")
    ax_hist.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole halting steps
    ax_hist.set(xlabel="halting step", ylabel="share of inputs", title="Halting-step distribution")
    return _finish(fig, plt, (ax_acc, ax_steps, ax_hist), (ax_acc, ax_steps, ax_hist), title, path)


def plot_strips(inputs: list[dict], path: Path | str, *, title: str = "") -> Path:
    """`ponder predict --plot`: a strip per input, what the model saw at each step with the step's
    class, probability and λ_n beneath, the halting step framed in red; at its end each step's
    probability of the final prediction, λ_n and p_n."""
    plt = _pyplot()
    steps = len(inputs[0]["steps"])
    vector = len(inputs[0]["views"][0]) == 1  # (1, elems): a vector drawn as one row of cells
    height = 0.9 if vector else 1.55
    fig, axes = plt.subplots(len(inputs), steps + 1, squeeze=False,
                             figsize=(1.2 * steps + 2.6, height * len(inputs) + 0.6),
                             gridspec_kw={"width_ratios": [1] * steps + [2.2]})
    for row, item in zip(axes, inputs):
        views = item["views"]
        low = min(min(min(line) for line in view) for view in views)
        high = max(max(max(line) for line in view) for view in views)
        halting = item["halting_step"] if isinstance(item["halting_step"], int) else None
        for n, (ax, view, step) in enumerate(zip(row, views, item["steps"]), 1):
            ax.imshow(view, cmap="gray", vmin=low, vmax=high, aspect="auto" if vector else "equal")
            ax.set_xticks([])
            ax.set_yticks([])
            # the step's own values after it (align: "turn → -29°", the turn the next step reads at)
            turn = next((f"\n{key.removesuffix('_deg')} → {value:+.0f}°" if key.endswith("_deg") else f"\n{key} {value:.2g}"
                         for key, value in step.items() if key not in ("step", "class", "probability", "lambda", "p")),
                        "")
            ax.set_xlabel(f"{step['class']} {step['probability']:.2f}\nλ {step['lambda']:.2f}{turn}", fontsize=7)
            if n == 1:
                ax.set_ylabel(_short(item["input"]), fontsize=7, rotation=0, ha="right", va="center")
            if row is axes[0]:
                ax.set_title(f"step {n}", fontsize=8)
            if n == halting:
                for spine in ax.spines.values():
                    spine.set(color="red", linewidth=2.5)
        chart = row[-1]
        numbers = range(1, steps + 1)
        chart.plot(numbers, [s["probability"] if s["class"] == item["prediction"] else 0.0 for s in item["steps"]],
                   "o-", markersize=3, label=f"P(top = {item['prediction']})")
        chart.plot(numbers, [s["lambda"] for s in item["steps"]], "s--", markersize=3, label="λ_n")
        chart.bar(numbers, [s["p"] for s in item["steps"]], alpha=0.3, color="gray", label="p_n")
        if halting is not None:
            chart.axvline(halting, color="red", linewidth=1)
        chart.set_ylim(0, 1.05)
        chart.tick_params(labelsize=6)
        chart.set_title(f"→ {item['prediction']} ({item['probability']:.2f}), halts at "
                        f"{item['halting_step']:g}", fontsize=7)
    axes[0][-1].legend(fontsize=6, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, plt, path)


def _short(name: str, width: int = 18) -> str:
    """An input's name for a label: the file name, cut from the left when long."""
    name = Path(name.split("[")[0]).name + ("[" + name.split("[", 1)[1] if "[" in name else "")
    return name if len(name) <= width else "…" + name[-(width - 1):]


def plot_history(history: list[dict], best, path: Path | str, *, title: str = "") -> Path:
    """`ponder info --plot`: loss, accuracy and ponder steps per epoch, the best epoch marked."""
    plt = _pyplot()
    import matplotlib.ticker

    if not history:
        raise PonderError("--plot: this checkpoint holds no per-epoch history to draw")
    epochs = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, ylabel, name, lines in zip(axes, ("loss", "accuracy", "mean ponder steps"),
                                       ("Training loss", "Accuracy", "Ponder steps"),
                                       ([("train_loss", "o-", "training loss"),
                                         ("train_reconstruction", "--", "reconstruction (task) part")],
                                        [("train_accuracy", "o-", "training"), ("val_accuracy", "o-", "validation")],
                                        [("train_steps", "o-", "training"), ("val_steps", "o-", "validation")])):
        for key, style, label in lines:
            ax.plot(epochs, [h[key] for h in history], style, markersize=3, label=label)
        ax.set(xlabel="epoch", ylabel=ylabel, title=name)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if best:
            ax.axvline(best, color="gray", linestyle=":", label=f"best epoch {best}" if ax is axes[1] else None)
    return _finish(fig, plt, axes, axes, title, path)
