"""predict, info and models: looking inside a model, into a run, and at the shipped models."""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch

from .. import BadValue, PonderError, PonderWarning, file_problem
from ..checkpoint import file_damage, load_checkpoint, load_model, steps_problem
from ..config import PonderConfig, applies, seed_problems
from ..folders import (BEST, DEFAULT, LAST, LATEST, LOCK_FILE, RUNS_DIR, SHIPPED, Labels, Resolved, is_run_folder,
                       lock_holder, resolve_checkpoint, run_time, runs_under, saved_config, shipped_path, trash_entries,
                       trashed_runs, trashes_under)
from ..model import get_method
from ..registry import TIME_LIMIT
from ..render import Column
from ..runs import (empty_trash, in_a_trash, recorded_run, reproducing_command, restore_run, trash_contents,
                    trash_run)
from ..reports import Report, diff_report, info_report, make_meta, prediction_report, runs_report, trash_report
from ..reports.runs import NUMBER, OTHER_SPELLINGS, RUN_KEYS, SWITCH, TAGS, TEXT, TIME, run_keys
from ..tasks import STDIN, InputOptions, get_task, uniforms as draw_uniforms
from . import check_halting, device_and_amp, evaluation_seed, on_device, resolve_named, steps_run


HERE = Path(".")  # where `ponder runs` looks by default, after runs/: any --out folder below the current one
PLOT_INPUTS = 16  # strips in one --plot figure: more would not be readable


@dataclass(frozen=True)
class PredictOptions:
    """How `ponder predict` reads the inputs and halts."""
    halting: Optional[str] = None  # None: the method's own (api.check_halting)
    seed: Optional[int] = None  # the halting coins' seed; None: the checkpoint's training seed (as eval)
    invert: Optional[bool] = None  # images: None detects a dark digit on a light background
    rotate: Optional[float] = None  # images: degrees, counter-clockwise, before anything else
    steps: bool = False  # each step's figures (top class, probability, lambda_n, p_n, the step's own)
    views: bool = False  # each step's view of the input, for --plot
    device: str = "auto"
    batch_size: int = 256
    max_steps: Optional[int] = None  # steps to run; None: those the checkpoint trained with

    def __post_init__(self) -> None:
        problems = seed_problems(self.seed, "--seed") if self.seed is not None else []
        if self.max_steps is not None and steps_problem(self.max_steps):
            problems.append(steps_problem(self.max_steps))
        # one turn either way: beyond it an angle means nothing more, and past float32's range
        # (1e39) it is no angle at all; NaN fails the comparison too
        if self.rotate is not None and not -360 <= self.rotate <= 360:
            problems.append(f"--rotate must be a number of degrees from -360 to 360 (got {self.rotate:g})")
        if problems:
            raise BadValue(problems[0])


def predict_inputs(checkpoint: Union[str, Path, None], inputs: list[Union[str, Path]], options: PredictOptions, *,
                   log: Callable[[str], None] = lambda line: None) -> Report:
    """A model on the user's own files: the task reads them (MNIST: images and .npy arrays;
    parity: vectors), every step runs (the full forward pass), and the method picks the
    prediction and halting step under `options.halting` exactly as evaluation does, with the
    halting coins of input i drawn from (`options.seed`, i) (tasks.uniforms). One bucket per input."""

    if not inputs:
        raise PonderError("predict needs at least one INPUT file")
    path = resolve_named(checkpoint, log)
    dev, _ = device_and_amp(options.device, False, log)
    model, cfg, state = load_model(path, dev, options.max_steps)
    ran, trained = cfg.method.max_steps, state.config.method.max_steps
    if ran > trained:  # eval says it in its caption; predict's per-input table has no room
        warnings.warn(f"--max-steps {ran} runs this model past the {trained} step{'s' * (trained > 1)} it trained "
                      f"with: steps {trained + 1}-{ran} were never trained, and its halting is forced at step "
                      f"{ran}", PonderWarning)
    options = replace(options, halting=check_halting(cfg, options.halting))
    task, method = get_task(cfg), get_method(cfg, dev)
    read = task.read_inputs([Path(p) for p in inputs], InputOptions(options.invert, options.rotate,
                                                                    _standard_input(inputs)))
    seed = evaluation_seed(options.seed, cfg)
    count = len(read.names)
    # input i's coins from (seed, i), as evaluation draws them: the same whatever follows it
    uniforms = draw_uniforms(seed, "coins", ("predict",), torch.arange(count), model.max_steps, torch.float32).T
    used = method.halting_label(options.halting)
    whole = not method.needs_all_steps(options.halting)  # whole steps, not the expected rule's sum_n n p_n
    detail = options.steps or options.views
    buckets, views = [], []
    with torch.inference_mode():
        for start in range(0, count, options.batch_size):
            end = min(start + options.batch_size, count)
            traces = [] if detail else None  # every step's own figures, only when they are shown
            out = model(read.x[start:end].to(dev), traces=traces)
            scores, halted = method.predict(out.logits, out.lambda_logits, uniforms[:, start:end].to(dev),
                                            options.halting)
            chosen = method.probabilities(scores, options.halting)
            if detail:
                step_probs = torch.softmax(out.logits.float(), dim=-1)  # (steps, B, classes)
                figures = {"class": step_probs.argmax(-1), "probability": step_probs.amax(-1),
                           "lambda": torch.sigmoid(out.lambda_logits.float()),
                           "p": method.halting_distribution(out.lambda_logits),
                           **{key: torch.stack([t.values[key] for t in traces]).float() for key in traces[0].values}}
                figures = {key: value.cpu().T.tolist() for key, value in figures.items()}  # (B, steps)
            # read from the device once per batch, not once per input
            predictions, probabilities = chosen.argmax(-1).tolist(), chosen.amax(-1).float().tolist()
            halting_steps = halted.tolist()
            for row in range(end - start):
                bucket = {"input": read.names[start + row], "prediction": predictions[row],
                          "probability": probabilities[row], "halting": used,
                          "halting_step": int(halting_steps[row]) if whole else float(halting_steps[row])}
                if detail:
                    bucket["steps"] = [{"step": n + 1, **{key: values[row][n] for key, values in figures.items()}}
                                       for n in range(model.max_steps)]
                buckets.append(bucket)
            if options.views and len(views) < PLOT_INPUTS:
                stacked = torch.stack([t.view for t in traces]).float().cpu()  # (steps, B, ...)
                views += [stacked[:, row].reshape(model.max_steps, -1, stacked.shape[-1]).tolist()
                          for row in range(min(end - start, PLOT_INPUTS - len(views)))]
    if options.views and count > PLOT_INPUTS:
        log(f"--plot draws the first {PLOT_INPUTS} of the {count} inputs")
    view = task.view()
    return on_device(prediction_report(str(path), cfg, buckets, halting=used, seed=seed, steps=options.steps,
                                       views=views, view=view, rotate=options.rotate, invert=options.invert,
                                       **steps_run(cfg, state.config)), dev)


def _standard_input(inputs) -> Optional[str]:
    """The text of standard input when an INPUT is STDIN (`-`), read once; None otherwise."""
    named = sum(str(p) == STDIN for p in inputs)
    if not named:
        return None
    if named > 1:
        raise BadValue(f"{STDIN} (standard input) is named {named} times; it can be read once")
    if sys.stdin is None:
        raise PonderError(f"{STDIN}: there is no standard input to read vectors from")
    try:
        return sys.stdin.read()
    except UnicodeDecodeError:
        raise PonderError(f"{STDIN}: standard input is not text (vectors, one per line)") from None


def _info_file(target: Union[str, Path, None]):
    """What `ponder info` reads: a run folder's last.pt (the whole history), else its best.pt
    (as the shipped models' folders); otherwise as folders.resolve_checkpoint."""
    return resolve_checkpoint(target, file=(LAST, BEST))


def run_status(state, path: Path) -> tuple[str, str]:
    """How the run whose checkpoint `path` holds `state` went, as a word (finished, stopped
    early, time limit, interrupted, running, best epoch) and as a sentence for `info`."""
    cfg, folder = state.config, path.parent
    patience = cfg.training.patience
    holder = lock_holder(folder / LOCK_FILE)
    resumable = all(getattr(state, key) is not None for key in state.RESUME_KEYS)
    if path.name != LAST and state.epoch == state.best_epoch:
        # a best.pt (the shipped models among them) is a snapshot of the best epoch: it cannot tell
        # how its run went on
        text = f"its run's best epoch (saved after epoch {state.epoch} of {cfg.training.epochs})"
        if (folder / LAST).is_file():
            text += f"; the run's latest state is {folder / LAST}"
        return "best epoch", text
    if holder is not None:
        return "running", f"training now (PID {holder})"
    if state.stopped_early:
        return "stopped early", (f"stopped early after epoch {state.epoch} (no better validation accuracy for "
                                 f"{patience} epochs)")
    if state.epoch < cfg.training.epochs:
        timed = state.stop_reason == TIME_LIMIT
        text = (f"stopped at its time limit after epoch {state.epoch} of {cfg.training.epochs}" if timed else
                f"interrupted after epoch {state.epoch} of {cfg.training.epochs}")
        if resumable:
            text += f"; resume with: ponder train --resume {path}"
        return (TIME_LIMIT if timed else "interrupted"), text
    return "finished", "finished"


def _best(state) -> Optional[dict]:
    return next((h for h in state.history if h.get("epoch") == state.best_epoch), None)


def run_info(target: Union[str, Path, None], *, log: Callable[[str], None] = lambda line: None) -> Report:
    """A checkpoint or a run folder described: its task, method and step, the resolved
    configuration (and where each value came from, when the folder's config.json says), the
    epochs trained, the best epoch's validation figures, whether the run finished, stopped early,
    is training now or was interrupted, and one bucket per epoch of its history."""

    resolved = _info_file(target)
    log(f"using {resolved.path} ({resolved.why})")
    state = load_checkpoint(resolved.path)
    cfg, folder = state.config, resolved.path.parent
    # its name and where it started: the record of the same run, resumed since or not (a best.pt's
    # epochs may be fewer than the folder's run has now); where each value came from only when
    # the record holds this very configuration
    recorded = recorded_run(folder, cfg)
    labels, init_from = Labels.of(recorded), recorded.get("init_from") if recorded else None
    sources = (recorded.get("sources") or {}) if recorded and recorded.get("config") == cfg.to_dict() else {}
    _, status = run_status(state, resolved.path)
    resumable = all(getattr(state, key) is not None for key in state.RESUME_KEYS)
    best = _best(state)
    summary = {"file": str(resolved.path), "status": status, "epochs_trained": state.epoch,
               "epochs_planned": cfg.training.epochs, "best_epoch": state.best_epoch or None,
               "best_val_accuracy": best["val_accuracy"] if best else None,
               "best_val_steps": best["val_steps"] if best else None, "stopped_early": state.stopped_early,
               "resumable": resumable,
               "training_step": (state.history[-1].get("training_step") or None) if state.history else None,
               **labels.to_dict(), "init_from": init_from, "train_command": reproducing_command(cfg, init_from),
               **_saved_halting_summary(folder)}
    return info_report(str(resolved.path), cfg, [dict(h) for h in state.history], summary,
                       shown=cfg.shown_fields(), sources=sources, view=get_task(cfg).view())


def _saved_halting_summary(folder: Path) -> dict:
    """What `info` says of the rule calibrate saved in the run folder: `halting_rule`, the rule
    eval and extrapolate halt by (None: none saved, or saved for other weights), and
    `saved_halting`, the record as saved with whether it applies (`current`, `why_not`)."""
    from ..runs import saved_halting, saved_halting_for

    record = saved_halting(folder)
    if record is None:
        return {"halting_rule": None, "saved_halting": None}
    _, why_not = saved_halting_for(folder / str(record.get("checkpoint")))
    return {"halting_rule": None if why_not else record["halting"],
            "saved_halting": {**record, "current": why_not is None, "why_not": why_not}}


# `ponder models`: the models shipped inside the package, one bucket each: its name (what a
# CHECKPOINT argument takes), task, method, step, what it is, its file and its best epoch's
# validation figures, read from the checkpoint itself.

MODEL_COLUMNS = [
    Column("name", "name", "s"), Column("what", "what it is", "s", wrap=True),
    Column("val_accuracy", "val accuracy", ".4f"), Column("val_steps", "val steps", ".2f"),
]


def model_bucket(name: str) -> dict:
    """One shipped model, described from its checkpoint."""
    state = load_checkpoint(shipped_path(name))
    cfg = state.config
    best = next((h for h in state.history if h.get("epoch") == state.best_epoch), None)
    return {"name": name, "task": cfg.task.name, "method": cfg.method.name, "step": cfg.step.name,
            "what": SHIPPED[name][1],
            "file": str(Resolved.shipped(shipped_path(name), "").path), "epochs": state.epoch,
            "best_epoch": state.best_epoch or None, "val_accuracy": best["val_accuracy"] if best else None,
            "val_steps": best["val_steps"] if best else None}


def shipped_models(*, log: Callable[[str], None] = lambda line: None) -> Report:
    """Every shipped model (folders.SHIPPED), in its order; `ponder eval NAME` reads one."""
    buckets = [model_bucket(name) for name in SHIPPED]
    distinct = sorted({b["task"] for b in buckets})
    meta = make_meta("models", [b["file"] for b in buckets], [b["method"] for b in buckets],
                     [b["step"] for b in buckets], protocol=None, halting=None, seed=None,
                     task=distinct[0] if len(distinct) == 1 else None, default=DEFAULT)
    return Report(meta=meta, buckets=buckets, columns=MODEL_COLUMNS, title="Shipped models",
                  caption=f"val: the best epoch's validation figures · default: {DEFAULT}\n"
                          "evaluate one by name: ponder eval NAME; more: ponder info NAME")


# runs ------------------------------------------------------------------------------------------

SHOWN_ALREADY = ("task", "method", "step", "epochs")  # settings the table shows in their own columns
_OPERATORS = (">=", "<=", "!=", "=", ">", "<")  # at one place the longest first: `a>=1` is >=, not > "=1"
_ORDERED = (">", "<", ">=", "<=")
_COMPARE = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
            ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b}
NONE = "none"  # --where KEY=none: the run has no value for KEY (halting_bias: the method's own)


def _key(key: str, option: str) -> tuple[str, str]:
    """A key as given -> the row's key and its kind (one PonderError naming the option)."""
    kinds = run_keys()
    if key not in kinds:
        raise BadValue(f"{option}: no key {key!r}; the keys are {', '.join(kinds)}")
    return OTHER_SPELLINGS.get(key, key), kinds[key]


def _typed(value, kind: str):
    """A run's value as its kind compares: numbers as numbers, a time as seconds since the epoch
    (from its UTC text), a switch as True/False, text as text; None for no value."""
    if value is None:
        return None
    if kind == TIME:
        return datetime.fromisoformat(value).timestamp()
    if kind == NUMBER:
        return None if isinstance(value, bool) else float(value)
    if kind == TAGS:
        return " ".join(value) or None  # no tags: no value, sorted last
    return value if kind == SWITCH else str(value)


def _given(text: str, key: str, kind: str, op: str, value: str):
    """A --where value read as its key's kind; one PonderError saying what it must be."""
    def refused(why: str) -> PonderError:
        return BadValue(f"--where {text!r}: {why}")
    if kind in (TEXT, TAGS, SWITCH) and op in _ORDERED:
        raise refused(f"{key} is {kind}, compared only with = or != (e.g. --where {key}=VALUE); numbers and "
                       f"times take >, <, >= and <=")
    if value == NONE and op in ("=", "!=") and kind != TAGS:
        return None
    try:
        if kind == NUMBER:
            number = float(value)
            if number != number:
                raise ValueError
            return number
        if kind == TIME:
            when = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
            return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()
        if kind == SWITCH:
            return {"true": True, "false": False}[value.lower()]
    except (ValueError, KeyError):
        example = {NUMBER: "0.9", TIME: "2026-11-28 or 2026-11-28T09:30 (UTC unless it names its zone, as in "
                                        "2026-11-28T09:30+01:00)", SWITCH: "true or false"}[kind]
        raise refused(f"{key} is {kind}; {value!r} is not {'one' if kind != SWITCH else 'either'} (e.g. {example})") \
            from None
    if not value:
        raise refused(f"give a value after {op} ({key}={NONE}: runs without one)")
    return value


@dataclass(frozen=True)
class Condition:
    """One --where: `key op value`, the value read as the key's kind (_given)."""
    key: str
    kind: str
    op: str
    value: object  # a float (numbers, times), True/False, text; None: no value (KEY=none)

    def holds(self, row: dict) -> bool:
        if self.kind == TAGS:  # tag=x: x among the run's tags
            return (self.value in (row.get("tags") or [])) == (self.op == "=")
        have = _typed(row.get(self.key), self.kind)
        if have is None or self.value is None:
            same = have is None and self.value is None
            return {"=": same, "!=": not same}.get(self.op, False)  # no value is neither above nor below one
        return _COMPARE[self.op](have, self.value)


def parse_condition(text: str) -> Condition:
    """`step=align`, `best_val_accuracy>0.9`, `tag=baseline`, `when>=2026-11-28` (one PonderError
    naming --where for anything else: an unknown key, an order on text, a value not of its kind)."""
    at = next((i for i, char in enumerate(text) if char in "<>=!"), None)
    op = next((op for op in _OPERATORS if at is not None and text.startswith(op, at)), None)
    if op is None or at == 0:
        raise BadValue(f"--where {text!r}: write KEY=VALUE, KEY!=VALUE, KEY>V, KEY<V, KEY>=V or KEY<=V "
                          f"(e.g. --where step=align --where 'best_val_accuracy>0.9')")
    named = text[:at].strip()
    key, kind = _key(named, "--where")
    return Condition(key, kind, op, _given(text, named, kind, op, text[at + len(op):].strip()))


def _sorted(rows: list[dict], key: str, kind: str, reverse: bool) -> list[dict]:
    """Figures and times from the highest and newest, text from a to z (`reverse`: the other
    way); a run without the value last either way. Each value as its key's kind (_typed)."""
    descending = kind in (NUMBER, TIME)
    present = sorted((row for row in rows if _typed(row.get(key), kind) is not None),
                     key=lambda row: _typed(row[key], kind), reverse=descending != reverse)
    return present + [row for row in rows if _typed(row.get(key), kind) is None]


def _applying(config: Optional[dict]) -> dict:
    """A run's settings that its task, step and method read (config.applies): a parity run has no
    rotation to differ in."""
    config = config or {}
    chosen = {kind: config.get(kind) for kind in ("task", "step", "method")}
    # every value, an older run's too (one saved before a setting existed holds its default)
    recorded = {key: config.get(key, PonderConfig.default(key)) for key in PonderConfig.field_names()}
    return {key: value for key, value in config.items() if applies(key, chosen, recorded.get)}


def differing_settings(rows: list[dict], unread_differs: bool = False,
                       shown: Sequence[str] = SHOWN_ALREADY) -> list[str]:
    """The settings whose values differ between the runs they apply to, in the configuration's
    order, but those the table shows already (`shown`), in one order whatever the rows' order.
    `unread_differs`: a run that does not read a setting differs from one that does (diff:
    PonderNet's lambda-p against ACT's tau, whatever both store)."""
    configs = [_applying(row["config"]) for row in rows if row.get("config")]
    found = {key for config in configs for key in config}
    # one order whatever the rows' order (--sort, --reverse): the configuration's, then any other by name
    keys = [key for key in PonderConfig.field_names() if key in found] + sorted(found - set(PonderConfig.field_names()))
    return [key for key in keys if key not in shown
            and len({json.dumps(c[key]) if key in c else None for c in configs if unread_differs or key in c}) > 1]


def list_runs(folders: Sequence[Union[str, Path]] = (), *, where: Sequence[str] = (), sort: Optional[str] = None,
              reverse: bool = False, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder runs`: every run folder under the current folder (or under each of `folders`, or
    each of them that is itself a run folder: folders.runs_under), oldest first: its task,
    method and step, status (finished, stopped early, time limit, interrupted, running, empty: no
    checkpoint, unreadable; best epoch: only a best.pt), the epochs trained and planned, the best
    epoch and its validation figures, when it started, and the settings that differ between
    the runs listed. `where`: conditions a run must meet (parse_condition: all of them); `sort`:
    a key to order by (_sorted; `reverse` turns the order)."""

    conditions = [parse_condition(text) for text in where]
    sort, kind = _key(sort, "--sort") if sort is not None else (None, None)

    roots = [Path(f) for f in folders] or [RUNS_DIR, HERE]
    found: dict[Path, str] = {}  # each run folder -> its name below the folder it was found under
    for root in roots:
        problem = file_problem(root)
        if not folders and problem == "does not exist":
            continue  # no runs/ here yet
        if problem is not None and problem != "is a directory":
            raise PonderError(f"{root} {problem}; name a folder of runs (default: {RUNS_DIR}/ and the current "
                              f"folder) or a run folder")
        if problem is None:
            raise PonderError(f"{root} is a file; name a folder of runs (default: {RUNS_DIR}/ and the current "
                              f"folder) or a run folder")
        for run in runs_under(root):
            found.setdefault(run, str(run.relative_to(root)) if run != root else run.name or str(run))
    # by when each started (the time itself: the text of a local time can change its offset)
    written = {folder: run_time(folder) for folder in found}
    rows = [_run_row(folder, written[folder], found[folder])
            for folder in sorted(written, key=lambda f: (written[f] or 0, str(f)))]
    # each run's settings as keys of its own, to filter on; the table and JSON keep those that differ
    rows = [{**row, **{k: v for k, v in (row["config"] or {}).items() if k not in row}} for row in rows]
    rows = [row for row in rows if all(condition.holds(row) for condition in conditions)]
    if sort is not None:
        rows = _sorted(rows, sort, kind, reverse)
    differing = differing_settings(rows)
    # a setting's column shows it for the runs whose pieces read it ("-" for the others: an ACT
    # run has no prior)
    rows = [{key: value for key, value in row.items()
             if key in RUN_KEYS or (key in differing and key in _applying(row.get("config")))} for row in rows]
    return runs_report(rows, [str(root) for root in roots], settings=differing,
                       selection={"where": list(where), "sort": sort, "reverse": reverse})


def remove_runs(runs: Sequence[Union[str, Path]] = (), *, restore: bool = False, empty: bool = False,
                confirm: Optional[Callable[[list[dict]], bool]] = None,
                log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder runs rm`: move run folders to the trash beside them (runs.trash_run; `latest`: the
    newest run under runs/, as other commands read it), bring them back (`restore`:
    runs.restore_run), or delete what the trash of each folder in `runs` holds, default runs/ and
    the current folder, never a trash below them nor through a link (`empty`: runs.empty_trash,
    the one deletion; `confirm` gets what would go, each with its size, and says whether to).
    Every run named is checked before any moves: a folder that is no run, or one being trained,
    moves nothing."""
    if empty:
        roots = [Path(f) for f in runs] or [RUNS_DIR, HERE]
        rows = trash_contents(root for root in roots if root.is_dir())
        if rows and confirm is not None and not confirm(rows):
            return trash_report([], "deleted", [str(r) for r in roots], declined=True)
        deleted = empty_trash(rows)
        elsewhere = [str(trash) for trash in dict.fromkeys(trash for root in roots if root.is_dir()
                                                           for trash in trashes_under(root))
                     if trash_entries(trash)]  # --empty FOLDER reaches each of them
        return trash_report(deleted, "deleted", [str(r) for r in roots], elsewhere=elsewhere)
    if not runs and restore:  # the trash's runs are in no listing: name what it holds
        held = trashed_runs([RUNS_DIR, HERE])
        raise BadValue("name the runs to restore, by the path each had: " + (
            f"the trash here holds {', '.join(held)}" if held else
            f"no trash under {RUNS_DIR}/ or ./ holds any run"))
    if not runs:
        raise BadValue("name the runs to move to the trash (`ponder runs` lists them), or give --empty to delete "
                       "what the trash holds")
    if restore:
        return trash_report([restore_run(run) for run in dict.fromkeys(Path(run) for run in runs)], "restored", [])
    named = list(dict.fromkeys(_run_named(run, log) for run in runs))
    for run in named:  # all of them fit before any moves
        if run.is_dir() and is_run_folder(run) and lock_holder(run / LOCK_FILE) is not None:
            raise PonderError(f"{run} is being trained (PID {lock_holder(run / LOCK_FILE)}): stop that run first "
                              f"(Ctrl-C, or kill -TERM PID), then remove it; nothing was moved")
        if os.path.islink(run) or not run.is_dir() or not is_run_folder(run) or in_a_trash(run):
            trash_run(run)  # says what it is instead
    return trash_report([trash_run(run) for run in named], "removed", [])


def _run_named(run: Union[str, Path], log: Callable[[str], None]) -> Path:
    """The run folder `ponder runs rm` takes: as named, or for `latest` (where no such folder is
    here) the newest run under runs/, the one `ponder info latest` and `--resume latest` read."""
    if str(run) != LATEST or os.path.lexists(run):
        return Path(run)
    folder = resolve_checkpoint(LATEST, file=LAST).path.parent
    log(f"{LATEST}: {folder}, the newest run under {RUNS_DIR}/")
    return folder


def _run_row(folder: Path, stamp: Optional[float], name: Optional[str] = None, path: Optional[Path] = None) -> dict:
    """One run folder as a row of `ponder runs`, from its last.pt (else its best.pt; `path`: that
    checkpoint), or its config.json when it holds no checkpoint yet; its name (the one `ponder
    train --name` gave, else `name`: the folder's below the one listed), tags and note from its
    config.json."""
    saved = saved_config(folder)
    labels = Labels.of(saved)
    row = {"run": str(folder), "name": labels.name or name or folder.name or str(folder), "task": None,
           "method": None, "step": None, "status": "empty", "epoch": None, "epochs": None, "best_epoch": None,
           "best_val_accuracy": None, "best_val_steps": None, "checkpoint": None, "when": None,
           "tags": list(labels.tags), "note": labels.note, "config": None}
    if stamp is not None:
        row["when"] = datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")
    config = saved.get("config") if saved is not None and isinstance(saved.get("config"), dict) else {}
    row.update({key: config.get(key) for key in ("task", "method", "step")})
    row["epochs"] = config.get("epochs")
    row["config"] = config or None
    path = path or next((folder / file for file in (LAST, BEST) if (folder / file).is_file()), None)
    if path is None:
        if lock_holder(folder / LOCK_FILE) is not None:
            row["status"] = "running"
        return row
    row["checkpoint"] = str(path)
    try:
        with warnings.catch_warnings():  # a model whose weights are not finite is listed all the same
            warnings.simplefilter("ignore", PonderWarning)
            state = load_checkpoint(path)
    except PonderError:
        row["status"] = "unreadable"
        return row
    cfg, best = state.config, _best(state)
    row.update(task=cfg.task.name, method=cfg.method.name, step=cfg.step.name, epoch=state.epoch,
               epochs=cfg.training.epochs, status=run_status(state, path)[0], best_epoch=state.best_epoch or None,
               best_val_accuracy=best["val_accuracy"] if best else None,
               best_val_steps=best["val_steps"] if best else None, config=cfg.to_dict())
    if path.name == LAST and (folder / BEST).is_file() and file_damage(folder / BEST) is not None:
        row["status"] = "damaged"  # its best model is lost, however the run went (`ponder info` says how)
    return row


# diff ------------------------------------------------------------------------------------------

# What `ponder diff` compares of the runs besides their settings: what each is labelled (its name
# heads its column) and where its weights started, then how each went
DIFF_LABELS = ("tags", "note", "init_from")
DIFF_RESULTS = ("status", "epoch", "best_epoch", "best_val_accuracy", "best_val_steps")


def _diff_row(target: Union[str, Path], log: Callable[[str], None]) -> tuple[dict, Path]:
    """A run as `ponder runs` lists it (_run_row), from anything a CHECKPOINT can be (a run
    folder: its last.pt, else best.pt, else its config.json), and the file (or folder) read."""
    folder = Path(target)
    if folder.is_dir() and is_run_folder(folder):
        held = next((folder / name for name in (LAST, BEST) if (folder / name).is_file()), None)
        log(f"using {held or folder} (run folder {folder})")
        row, read = _run_row(folder, run_time(folder), path=held), held or folder
    else:
        resolved = _info_file(target)
        log(f"using {resolved.path} ({resolved.why})")
        folder, read = resolved.path.parent, resolved.path
        row = _run_row(folder, run_time(folder), path=resolved.path)
    saved = saved_config(folder) or {}
    row["init_from"] = saved.get("init_from")  # where its weights started
    row["given_name"] = Labels.of(saved).name  # `train --name`'s, which heads its column
    return row, read


def diff_runs(targets: Sequence[Union[str, Path]], *, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder diff`: two or more runs (run folders, checkpoint files, `latest`, shipped models'
    names), a column each, only what differs: the settings each reads (as `ponder runs` shows them:
    a run that does not read a setting has none, and differs from one that does), then how each
    went (status, epochs trained, best epoch and its validation figures), after its labels (tags,
    note, the checkpoint its weights started from: --init-from). One bucket per difference:
    `key`, `kind` (label, setting or result), `values` (one per run, in order) and, for a
    setting, `reads` (whether each run reads it)."""
    if len(targets) < 2:
        raise BadValue("ponder diff compares two or more runs: name another (`ponder runs` lists them)")
    rows, seen = [], {}
    for target in targets:
        row, read = _diff_row(target, log)
        if read.resolve() in seen:
            raise PonderError(f"{seen[read.resolve()]} and {target} name the same run ({read}): name different runs")
        seen[read.resolve()] = target
        rows.append(row)
    missing = next((target for target, row in zip(targets, rows) if not row["config"]), None)
    if missing is not None:
        raise PonderError(f"{missing} holds no configuration to compare (no readable checkpoint or config.json)")
    applying = [_applying(row["config"]) for row in rows]
    buckets = [{"key": key, "kind": "label", "values": [row[key] for row in rows]}
               for key in DIFF_LABELS if len({json.dumps(row[key]) for row in rows}) > 1]
    buckets += [{"key": key, "kind": "setting", "values": [read.get(key) for read in applying],
                 "reads": [key in read for read in applying]}
                for key in differing_settings(rows, unread_differs=True, shown=())]
    buckets += [{"key": key, "kind": "result", "values": [row[key] for row in rows]}
                for key in DIFF_RESULTS if len({json.dumps(row[key]) for row in rows}) > 1]
    return diff_report([str(target) for target in targets], buckets, rows)
