"""What train, predict and info report: a run, a model's predictions, a checkpoint."""

from __future__ import annotations

import shlex
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from .. import durations
from ..config import default_halting
from ..render import Column, cell_text, value_text
from ..registry import AT_CHANCE, FORMAT_VERSION, TIME_LIMIT
from . import Report, TaskView, describe_model, make_meta

# train -----------------------------------------------------------------------------------------

TRAIN_COLUMNS = [
    Column("epochs", "epochs"), Column("best_epoch", "best epoch"), Column("val_accuracy", "val accuracy", ".4f"),
    Column("val_steps", "val steps", ".2f"), Column("stopped_early", "stopped early"),
    Column("seconds", "seconds", ".1f"),
]


def training_report(cfg, result, seconds: float, view: TaskView) -> Report:
    """The summary of a run; its buckets are the epochs (the JSON and CSV give all of them)."""
    epochs = [asdict(h) for h in result.history]
    best = next((h for h in epochs if h["epoch"] == result.best_epoch), None)
    summary = {"epochs": result.last_epoch, "best_epoch": result.best_epoch, "val_accuracy": result.best_accuracy,
               "val_steps": best["val_steps"] if best else None, "stopped_early": result.stopped_early,
               "stop_reason": result.stop_reason, "seconds": seconds, "out_dir": str(result.out_dir),
               "training_step": epochs[-1].get("training_step") or None if epochs else None}
    best_file = result.best_path
    meta = make_meta("train", [str(best_file)] if best_file else [], [cfg.method.name], [cfg.step.name],
                     protocol=view.protocol, halting=default_halting(cfg), seed=cfg.training.seed, task=view.name, **view.meta,
                     **summary, config=cfg.to_dict())
    return Report(meta=meta, buckets=epochs, columns=TRAIN_COLUMNS, table_rows=[summary],
                  title=(f"{cfg.method.name} training (step {cfg.step.name}"
                         f"{', ' + view.name if view.named_in_titles else ''})"),
                  footer=(f"best checkpoint: {best_file}" if best_file else
                          f"no best checkpoint in {result.out_dir}: no epoch of this run beat epoch "
                          f"{result.best_epoch}, whose weights were not found beside the checkpoint resumed")
                  + _step_line(summary["training_step"], "\n")
                  # a run that did not simply finish or stop early says why (its line on stderr says more)
                  + (f"\nstopped: {result.stop_reason}" if result.stop_reason in (TIME_LIMIT, AT_CHANCE) else ""))


# How a run's training batches ran (train.BatchStep.path): said where it is news, on a GPU
# ("captured", or eager and why); on the CPU every batch runs eagerly.
ON_THE_CPU = "eager: on the CPU"


def _step_line(path: Optional[str], before: str = "") -> str:
    return f"{before}training batches: {path}" if path and path != ON_THE_CPU else ""


def epoch_record(stats) -> dict:
    """An epoch as `ponder train -f jsonl` streams it when the epoch ends: the figures of the
    JSON's `buckets` entry for it, marked `"record": "epoch"`."""
    return {"format_version": FORMAT_VERSION, "record": "epoch", "command": "train", **asdict(stats)}


def stopped_record(why: str, epoch: Optional[int], checkpoint, message: str) -> dict:
    """The last record of `ponder train -f jsonl` when training stops short: why (interrupted,
    terminated, error), the epoch saved and its checkpoint (null: none), and the message that
    ends the command on stderr (for an interrupt, the resume hint)."""
    return {"format_version": FORMAT_VERSION, "record": "stopped", "command": "train", "why": why, "epoch": epoch,
            "checkpoint": None if checkpoint is None else str(checkpoint), "message": message}


# predict ---------------------------------------------------------------------------------------

PREDICT_COLUMNS = [Column("input", "input", "s", wrap=True), Column("prediction", "prediction"),
                   Column("probability", "probability", ".4f"),
                   Column("halting_step", "halting step", text=lambda row: cell_text(
                       row["halting_step"], "d" if isinstance(row["halting_step"], int) else ".2f"))]


def _step_rows(buckets: list[dict]) -> tuple[list[dict], list[str]]:
    """The per-step table's rows (the input named on its first step only) and the step
    function's own keys (align: turn_deg)."""
    rows, own = [], []
    for bucket in buckets:
        for step in bucket["steps"]:
            own += [key for key in step if key not in ("step", "class", "probability", "lambda", "p")
                    and key not in own]
            halts = isinstance(bucket["halting_step"], int) and step["step"] == bucket["halting_step"]
            rows.append({**step, "input": bucket["input"] if step["step"] == 1 else "", "halts": "◀" if halts else ""})
    return rows, own


def prediction_report(checkpoint: str, cfg, buckets: list[dict], *, halting: str, seed: int, steps: bool,
                      views: list, view: TaskView, **extra) -> Report:
    """predict: one bucket per input (its prediction, probability and halting step; with
    `steps`, each step's figures); `views` (per input: each step's view, nested lists) feed --plot."""
    meta = make_meta("predict", [checkpoint], [cfg.method.name], [cfg.step.name], protocol=None, halting=halting,
                     seed=seed, task=view.name, **view.meta, **extra, inputs=len(buckets))
    sampled = halting == "sample"
    report = Report(meta=meta, buckets=buckets if steps else [{k: v for k, v in b.items() if k != "steps"}
                                                              for b in buckets],
                    columns=PREDICT_COLUMNS, title=f"{cfg.method.name} predictions ({checkpoint})",
                    caption=f"{describe_model(cfg, view)}\nhalting {halting}" + (f" · seed {seed}" if sampled else ""),
                    plot_series={"inputs": [{**b, "views": v} for b, v in zip(buckets, views)]}, plot_kind="predict")
    if steps:
        rows, own = _step_rows(buckets)
        columns = [Column("input", "input", "s", wrap=True), Column("step", "step"), Column("class", "class"),
                   Column("probability", "probability", ".4f"), Column("lambda", "λ_n", ".4f"),
                   Column("p", "p_n", ".4f"), *[Column(key, key, "+.1f") for key in own],
                   Column("halts", "halts", "s")]
        report.detail = ("Each step: its top class and probability, the halting probability λ_n and the halting "
                         "distribution p_n", rows, columns)
    return report


# info ------------------------------------------------------------------------------------------

HISTORY_COLUMNS = [
    Column("epoch", "epoch"), Column("train_loss", "train loss", ".4f"), Column("train_accuracy", "train acc", ".4f"),
    Column("train_steps", "train steps", ".2f"), Column("val_accuracy", "val acc", ".4f"),
    Column("val_steps", "val steps", ".2f"), Column("lr", "lr", ".0e"), Column("seconds", "secs", ".0f"),
    Column("best", "best", "s"),
]


def info_report(checkpoint: str, cfg, history: list[dict], summary: dict, *, shown: list[str], sources: dict,
                view: TaskView) -> Report:
    """info: what a checkpoint holds, as a table of facts, and its history, one bucket per epoch."""
    meta = make_meta("info", [checkpoint], [cfg.method.name], [cfg.step.name], protocol=view.protocol, halting=None,
                     seed=cfg.training.seed, task=view.name, **view.meta, **summary, config=cfg.to_dict(),
                     sources=sources)
    values = cfg.to_dict()
    configuration = " · ".join(f"{name.replace('_', '-')} {value_text(values[name])}"
                               + ("" if sources.get(name, "default") == "default" else f" ({sources[name]})")
                               for name in shown)
    best = summary["best_epoch"]
    facts = [("task", view.name + (f" ({view.trained_on})" if view.trained_on else "")),
             ("method", cfg.method.name), ("step", cfg.step.name), ("status", summary["status"]),
             ("epochs", f"{summary['epochs_trained']} of {summary['epochs_planned']}"),
             ("best epoch", "-" if best is None else
              f"{best}: val accuracy {cell_text(summary['best_val_accuracy'], '.4f')}, "
              f"val steps {cell_text(summary['best_val_steps'], '.2f')}"),
             ("configuration", configuration)]
    labels = [("name", summary.get("name")), ("tags", " ".join(summary.get("tags") or ())),
              ("note", summary.get("note")), ("initialised from", summary.get("init_from"))]
    facts[1:1] = [(what, value) for what, value in labels if value]  # what the researcher called it, first
    if summary.get("amp"):
        facts.insert(-1, ("amp", "on: trained with --amp (mixed precision)"))
    if summary.get("saved_halting"):
        facts.insert(-1, ("halting rule", saved_halting_text(summary["saved_halting"])))
    path = history[-1].get("training_step") if history else None
    if _step_line(path):
        facts.insert(-1, ("training batches", path))
    rows = [{"what": what, "value": value} for what, value in facts]
    table = [{**h, "best": "★" if h.get("epoch") == best else ""} for h in history]
    facts_columns = [Column("what", "", "s"), Column("value", "", "s", wrap=True)]  # no headers: no header row
    return Report(meta=meta, buckets=history, columns=facts_columns, table_rows=rows, title=checkpoint,
                  detail=("History", table, HISTORY_COLUMNS) if history else None,
                  footer="\n".join(([] if history else ["no per-epoch history in this checkpoint"])
                                    + [shell_lines("reproduce:", summary["train_command"])]),
                  plot_series={"history": history, "best": [{"epoch": best}]}, plot_kind="history")


def saved_halting_text(saved: dict) -> str:
    """info's line for the rule calibrate saved: the rule, how it was chosen, and whether the
    evaluating commands use it."""
    rule, file = saved["halting"], saved.get("checkpoint")
    if saved.get("criterion") == "risk":
        how = (f"loss ≤ {cell_text(saved.get('bound'), '.4f')} at risk {saved.get('risk')} "
               f"(--max-loss {saved.get('max_loss')})")
    else:
        how = f"agreement ≥ {cell_text(saved.get('bound'), '.4f')} (--tolerance {saved.get('tolerance')})"
    where = f"on {saved.get('images')} {saved.get('data')} inputs of {file}, {cell_text(saved.get('mean_steps'), '.2f')} steps"
    if not saved.get("current"):
        return f"{rule}, saved by calibrate but not used: {saved.get('why_not')}"
    return f"{rule} (calibrate --save: {how} {where}); eval, extrapolate and sweep halt by it"


def shell_lines(prefix: str, command: str, width: int = 80) -> str:
    """`prefix` and a long shell command over lines of `width` at most, each but the last ending
    in ` \\`: the command's lines pasted into a shell run it whole. An option stays with its value."""
    pieces: list[str] = []
    for word in shlex.split(command):
        quoted = shlex.quote(word)
        if pieces and pieces[-1].startswith("-") and " " not in pieces[-1] and not word.startswith("-"):
            pieces[-1] += " " + quoted
        else:
            pieces.append(quoted)
    lines = [prefix]
    for piece in pieces:
        if len(lines[-1]) > len(prefix) and len(lines[-1]) + 1 + len(piece) > width - 2:
            lines[-1] += " \\"
            lines.append("  " + piece)
        else:
            lines[-1] += " " + piece
    return "\n".join(lines)


# runs ------------------------------------------------------------------------------------------

# What `ponder runs --where` and `--sort` name, each key with its kind, which says how a value
# given for it is read and compared: a run's own keys (its JSON's), any setting (config.TYPES),
# and a few other spellings (a table header with _ for its spaces; `tag`, one of a run's tags).
# Here, without torch: a shell completing --sort asks for them.
NUMBER, TIME, TEXT, TAGS, SWITCH = "a number", "a time", "text", "a tag", "true or false"
RUN_KEYS = {"run": TEXT, "name": TEXT, "task": TEXT, "method": TEXT, "step": TEXT, "status": TEXT, "epoch": NUMBER,
            "epochs": NUMBER, "best_epoch": NUMBER, "best_val_accuracy": NUMBER, "best_val_steps": NUMBER,
            "checkpoint": TEXT, "when": TIME, "tags": TAGS, "note": TEXT, "folder": TEXT, "init_from": TEXT,
            "amp": SWITCH}
OTHER_SPELLINGS = {"started": "when", "best_val_acc": "best_val_accuracy", "status_at_epoch": "status", "tag": "tags"}


def run_keys() -> dict[str, str]:
    """Every key --where and --sort take, with its kind: the runs' own, the settings, the other
    spellings."""
    from ..config import TYPES

    settings = {key: SWITCH if kind is bool else TEXT if kind is str else NUMBER for key, kind in TYPES.items()}
    keys = {**RUN_KEYS, **{key: kind for key, kind in settings.items() if key not in RUN_KEYS}}
    return {**keys, **{other: keys[key] for other, key in OTHER_SPELLINGS.items()}}


def age(when: Optional[str], now: Optional[datetime] = None) -> str:
    """An ISO time as a table shows it: how long ago (5 min ago, 3 h ago, 2 days ago), its date
    once two months old; "-" for none."""
    if not when:
        return "-"
    then = datetime.fromisoformat(when).astimezone()  # a date in the reader's own zone
    seconds = ((now or datetime.now(then.tzinfo)) - then).total_seconds()
    return then.date().isoformat() if seconds >= 61 * 86400 else durations.ago(seconds)


def _meta(command: str, rows: Sequence[dict] = (), checkpoints: Sequence = (), **extra) -> dict:
    """The shared metadata of the commands on runs: task, method and step where every run listed
    shares one (else null), nothing of evaluation."""
    tasks = {row["task"] for row in rows}
    return make_meta(command, list(checkpoints), [row["method"] for row in rows], [row["step"] for row in rows],
                     protocol=None, halting=None, seed=None, task=tasks.pop() if len(tasks) == 1 else None, **extra)


# narrow enough for 80 columns with a parity run's 32-character name: the epochs go with the
# status, the best epoch with its figure, the time as an age (the JSON has each on its own)
RUNS_COLUMNS = [
    # its folder below the one it was found under, which the title names (the JSON: its path)
    Column("folder", "run", "s", wrap=True),
    Column("model", "method step task", text=lambda row: " ".join(
        p for p in (row["method"], row["step"], row["task"]) if p) or "-", wrap=True),
    Column("status", "status at epoch", text=lambda row: row["status"] if row["epoch"] is None else
           f"{row['status']} at {row['epoch']}/{row['epochs']}", wrap=True),
    Column("best_val_accuracy", "best val acc", text=lambda row: "-" if row["best_epoch"] is None else
           f"{cell_text(row['best_val_accuracy'], '.4f')} (epoch {row['best_epoch']})", wrap=True),
    Column("when", "started", text=lambda row: age(row["when"]), wrap=True),
]


# what `ponder train --name/--tag/--note` gave, a column each where a run listed has any
LABEL_COLUMNS = [Column("name", "name", text=lambda row: row["name"] if row["name"] != row["folder"] else "-",
                        wrap=True),
                 Column("tags", "tags", text=lambda row: " ".join(row.get("tags") or ()) or "-", wrap=True),
                 Column("note", "note", text=lambda row: row.get("note") or "-", wrap=True)]


def runs_report(rows: list[dict], folders: list[str], settings: list[str], conditions: list[str],
                sort: Optional[str], reverse: bool) -> Report:
    """runs: one bucket per run folder (listing.list_runs), chosen by the --where `conditions`,
    ordered by --sort (oldest first without); `settings`: those that differ between them, a
    column each (JSON and CSV: a key each)."""
    meta = _meta("runs", rows, [row["checkpoint"] for row in rows if row["checkpoint"]], folders=folders,
                 runs=len(rows), settings=settings, where=conditions, sort=sort, reverse=reverse)
    here = folders == ["runs", "."]  # the default: runs/, then any other run folder here
    where = " and ".join(f"{folder}/" for folder in folders)
    chosen = " · ".join([*(f"where {text}" for text in conditions),
                         *([f"sorted by {sort}{' (reversed)' if reverse else ''}"] if sort else [])])
    if rows:
        footer = ""
    elif conditions:
        footer = f"no run under {where} meets {' and '.join(conditions)}"
    else:
        footer = f"no run under {where} yet" + (": `ponder train` writes one under runs/" if here else "")
    labels = [column for column in LABEL_COLUMNS if any(column.text(row) != "-" for row in rows)]
    keys = [key for key in dict.fromkeys(key for row in rows for key in row) if key not in settings] + settings
    # a setting that differs between the runs listed, under its option's name (`lambda-p`)
    differing = [Column(key, key.replace("_", "-"), text=lambda row, key=key: value_text(row.get(key))
                        if key in row else "-") for key in settings]
    return Report(meta=meta, buckets=rows, columns=RUNS_COLUMNS + labels + differing,
                  title=f"Runs under {where}", caption=chosen, footer=footer, keys=keys)


def label_report(rows: list[dict]) -> Report:
    """runs label: one bucket per run labelled, with its labels now."""
    meta = _meta("runs label", runs=len(rows))
    columns = [Column("run", "run", "s", wrap=True), Column("name", "name", "s", wrap=True), LABEL_COLUMNS[1],
               LABEL_COLUMNS[2]]
    return Report(meta=meta, buckets=rows, columns=columns, title="Labelled")


TRASH_TITLES = {"removed": "Moved to the trash", "restored": "Restored from the trash",
                "deleted": "Deleted from the trash"}


def size_text(size: Optional[int]) -> str:
    """Bytes as a person reads them: 812 B, 3.4 KB, 12.0 MB (powers of 1000)."""
    if size is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000


def trash_report(rows: list[dict], action: str, folders: list[str], elsewhere: Sequence[str] = (),
                 declined: bool = False) -> Report:
    """runs rm: one bucket per run `action` (removed, restored, deleted: with its size);
    `elsewhere`: the trashes below the folders emptied that still hold runs."""
    meta = _meta("runs rm", action=action, runs=len(rows))
    if action == "deleted":
        meta["bytes"] = sum(row.get("bytes") or 0 for row in rows)
    if action == "removed":
        footer = (f"restore with: ponder runs rm --restore {' '.join(shlex.quote(row['run']) for row in rows)}\n"
                  f"delete for good: ponder runs rm --empty")
    elif action == "deleted" and declined:
        footer = "nothing deleted"
    elif action == "deleted" and not rows:
        footer = f"no trash under {' and '.join(f'{folder}/' for folder in folders)}: nothing deleted"
    elif action == "deleted":
        footer = f"{len(rows)} run{'s' if len(rows) != 1 else ''} deleted, {size_text(meta['bytes'])}"
    else:
        footer = ""
    if elsewhere:  # --empty empties the trash of the folders named, never one below them
        parents = " ".join(shlex.quote(str(Path(trash).parent)) for trash in elsewhere)
        footer += (f"\n{', '.join(elsewhere)} still hold{'s' if len(elsewhere) == 1 else ''} runs (below the folders "
                   f"emptied): ponder runs rm --empty {parents}")
    where = "in the trash" if action == "removed" else "was in"
    columns = [Column("run", "run", "s", wrap=True), Column("trash", where, "s", wrap=True)]
    if action == "deleted":
        columns.append(Column("bytes", "size", text=lambda row: size_text(row.get("bytes"))))
    return Report(meta=meta, buckets=rows, columns=columns, title=TRASH_TITLES[action], footer=footer.strip("\n"))


# diff ------------------------------------------------------------------------------------------

# What `ponder diff` compares besides the settings, as its rows say them: what each run is labelled
# (its name heads its column) and where its weights started, then how each went
DIFF_LABELS = {"tags": "tags", "note": "note", "init_from": "initialised from"}
DIFF_RESULTS = {"status": "status", "epoch": "epochs trained", "best_epoch": "best epoch",
                "best_val_accuracy": "best val accuracy", "best_val_steps": "best val steps"}
NOT_READ = "-"  # a setting the run does not read, as `ponder runs` shows it


def _diff_value(bucket: dict, i: int) -> str:
    """Run i's value: a setting as the user types it (none: the method's own; - for one it does
    not read), a result as `info` shows it."""
    value, key = bucket["values"][i], bucket["key"]
    if bucket["kind"] == "setting":
        return value_text(value) if bucket["reads"][i] else NOT_READ
    if bucket["kind"] == "label":
        return " ".join(value) if key == "tags" and value else value if value else NOT_READ
    return cell_text(value, ".2f" if key == "best_val_steps" else ".4f" if isinstance(value, float) else "")


class DiffReport(Report):
    """CSV: a column per run, as the table (the JSON: `values`, one per run)."""

    def csv_rows(self) -> list[dict]:
        scalars = {k: v for k, v in self.meta.items() if not isinstance(v, dict)}
        labels = [column.header for column in self.columns[1:]]
        return [{**scalars, "key": bucket["key"], "kind": bucket["kind"],
                 **{label: value if bucket.get("reads", [True] * len(labels))[i] else None
                    for i, (label, value) in enumerate(zip(labels, bucket["values"]))}}
                for bucket in self.buckets]


def diff_report(runs: list[str], buckets: list[dict], rows: list[dict]) -> Report:
    """diff: one bucket per difference between the runs (listing.diff_runs), the settings
    first, then how each run went; none when they differ in nothing but their folders."""
    meta = _meta("diff", rows, [row["checkpoint"] for row in rows], runs=runs, differences=len(buckets))
    # each run's column under its name (`train --name`, else its folder's; the title gives them as
    # named), as named where two share one
    names = [row.get("given_name") or Path(run).name or run for run, row in zip(runs, rows)]
    names = names if len(set(names)) == len(names) else runs
    said = {**DIFF_LABELS, **DIFF_RESULTS}
    columns = [Column("what", "", "s", text=lambda row: said.get(row["key"], row["key"].replace("_", "-")), wrap=True),
               *(Column(f"run{i}", name, "s", text=lambda row, i=i: _diff_value(row, i), wrap=True)
                 for i, name in enumerate(names))]
    labels = sum(bucket["kind"] == "label" for bucket in buckets)
    settings = sum(bucket["kind"] == "setting" for bucket in buckets)
    results = len(buckets) - labels - settings
    named = ", ".join(runs[:-1]) + f" and {runs[-1]}"
    return DiffReport(meta=meta, buckets=buckets, columns=columns, title=" against ".join(runs),
                      caption=(f"{labels} label{'s' * (labels != 1)}, " if labels else "")
                              + f"{settings} setting{'s' * (settings != 1)} and {results} "
                              f"result{'s' * (results != 1)} differ"
                              + (f" · {NOT_READ}: a setting the run does not read" if any(
                                  not all(b.get("reads", [True])) for b in buckets) else "") if buckets else "",
                      footer="" if buckets else f"{named}: the same settings and results")
