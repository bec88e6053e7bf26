"""runs, runs rm, models, diff and info: what the run folders and the shipped models hold, read
without torch (folders.peek_checkpoint reads a checkpoint's record and history, not its weights;
folders.read_state checks it as torch.load would); torch only for a file torch must judge, and the
pieces' classes (torch with them) only for a run from before records."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from . import BadValue, PonderError, file_problem
from .config import PonderConfig, applies, start_options, with_defaults
from .folders import (BEST, DEFAULT, LAST, LATEST, LOCK_FILE, RUNS_DIR, SHIPPED, Labels, Resolved, Summary,
                      check_trashable, empty_trash, is_run_folder, lock_holder, peek_checkpoint, read_state,
                      resolve_checkpoint, restore_run, run_of, run_status, run_time, runs_under, saved_config,
                      saved_halting, shipped_path, start_text, trash_contents, trash_run, trashed_runs, trashes_under)
from .render import Column
from .registry import TORCH_SAVED_HALTING, loaded, piece_declaration
from .reports import Report, diff_report, info_report, make_meta, runs_report, trash_report
from .reports.runs import DIFF_LABELS, DIFF_RESULTS, NUMBER, OTHER_SPELLINGS, RUN_KEYS, SWITCH, TAGS, TEXT, TIME, \
    run_keys

HERE = Path(".")  # where `ponder runs` looks by default, after runs/: any --out folder below the current one

MODEL_COLUMNS = [
    Column("name", "name", "s"), Column("what", "what it is", "s", wrap=True),
    Column("val_accuracy", "val accuracy", ".4f"), Column("val_steps", "val steps", ".2f"),
]


def shipped_models(*, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder models`: every shipped model, in its order, described from its checkpoint."""
    buckets = []
    for name in SHIPPED:
        summary = Summary.read(shipped_path(name))
        cfg, best = summary.config, summary.best
        buckets.append({"name": name, "task": cfg["task"], "method": cfg["method"], "step": cfg["step"],
                        "what": SHIPPED[name][1], "file": str(Resolved.shipped(shipped_path(name), "").path),
                        "epochs": summary.epoch, "best_epoch": summary.best_epoch or None,
                        "val_accuracy": best.get("val_accuracy"), "val_steps": best.get("val_steps")})
    distinct = sorted({b["task"] for b in buckets})
    meta = make_meta("models", [b["file"] for b in buckets], [b["method"] for b in buckets],
                     [b["step"] for b in buckets], protocol=None, halting=None, seed=None,
                     task=distinct[0] if len(distinct) == 1 else None, default=DEFAULT)
    return Report(meta=meta, buckets=buckets, columns=MODEL_COLUMNS, title="Shipped models",
                  caption=f"val: the best epoch's validation figures · default: {DEFAULT}\n"
                          "evaluate one by name: ponder eval NAME; more: ponder info NAME")


# runs ------------------------------------------------------------------------------------------

SHOWN_ALREADY = ("task", "method", "step", "epochs")  # settings the table shows in their own columns
# at one place the longest first: `a>=1` is >=, not > "=1"
_COMPARE = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "!=": lambda a, b: a != b,
            "=": lambda a, b: a == b, ">": lambda a, b: a > b, "<": lambda a, b: a < b}
NONE = "none"  # --where KEY=none: the run has no value for KEY (halting_bias: the method's own)


def _key(key: str, option: str) -> tuple[str, str]:
    """A key as given -> the row's key and its kind."""
    kinds = run_keys()
    if key not in kinds:
        raise BadValue(f"{option}: no key {key!r}; the keys are {', '.join(kinds)}")
    return OTHER_SPELLINGS.get(key, key), kinds[key]


def _typed(value, kind: str):
    """A run's value as its kind compares: a time as seconds since the epoch, a switch as
    True/False, no tags as no value; None for no value."""
    if value is None:
        return None
    if kind == TIME:
        return datetime.fromisoformat(value).timestamp()
    if kind == NUMBER:
        return None if isinstance(value, bool) else float(value)
    if kind == TAGS:
        return " ".join(value) or None  # no tags: no value, sorted last
    return value if kind == SWITCH else str(value)


@dataclass(frozen=True)
class Condition:
    """One --where: `key op value`, the value read as the key's kind."""
    key: str
    kind: str
    op: str
    value: object  # a float (numbers, times), True/False, text; None: no value (KEY=none)

    @classmethod
    def parse(cls, text: str) -> "Condition":
        """`step=align`, `best_val_accuracy>0.9`, `tag=baseline`, `when>=2026-11-28`; one error
        naming --where for an unknown key, an order on text, a value not of its kind."""
        at = next((i for i, char in enumerate(text) if char in "<>=!"), None)
        op = next((op for op in _COMPARE if at is not None and text.startswith(op, at)), None)
        if op is None or at == 0:
            raise BadValue(f"--where {text!r}: write KEY=VALUE, KEY!=VALUE, KEY>V, KEY<V, KEY>=V or KEY<=V "
                           f"(e.g. --where step=align --where 'best_val_accuracy>0.9')")
        named, value = text[:at].strip(), text[at + len(op):].strip()
        key, kind = _key(named, "--where")

        def refused(why: str) -> PonderError:
            return BadValue(f"--where {text!r}: {why}")
        if kind in (TEXT, TAGS, SWITCH) and op not in ("=", "!="):
            raise refused(f"{named} is {kind}, compared only with = or != (e.g. --where {named}=VALUE); numbers "
                          f"and times take >, <, >= and <=")
        if value == NONE and op in ("=", "!=") and kind != TAGS:
            return cls(key, kind, op, None)
        try:
            if kind == NUMBER:
                number = float(value)
                if number != number:
                    raise ValueError
                return cls(key, kind, op, number)
            if kind == TIME:
                when = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
                return cls(key, kind, op, (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp())
            if kind == SWITCH:
                return cls(key, kind, op, {"true": True, "false": False}[value.lower()])
        except (ValueError, KeyError):
            example = {NUMBER: "0.9", TIME: "2026-11-28 or 2026-11-28T09:30 (UTC unless it names its zone, as in "
                                            "2026-11-28T09:30+01:00)", SWITCH: "true or false"}[kind]
            raise refused(f"{named} is {kind}; {value!r} is not {'one' if kind != SWITCH else 'either'} (e.g. "
                          f"{example})") from None
        if not value:
            raise refused(f"give a value after {op} ({named}={NONE}: runs without one)")
        return cls(key, kind, op, value)

    def holds(self, row: dict) -> bool:
        if self.kind == TAGS:  # tag=x: x among the run's tags
            return (self.value in (row.get("tags") or [])) == (self.op == "=")
        have = _typed(row.get(self.key), self.kind)
        if have is None or self.value is None:
            same = have is None and self.value is None
            return {"=": same, "!=": not same}.get(self.op, False)  # no value is neither above nor below one
        return _COMPARE[self.op](have, self.value)


def _applying(config: Optional[dict], unread: Optional[list] = None) -> dict:
    """A run's settings that its pieces read (a parity run has no rotation to differ in):
    `unread`, those its record says they leave unread; else config.applies decides (a run from
    before records: the pieces' classes are imported, torch with them)."""
    config = config or {}
    if unread is not None:
        return {key: value for key, value in config.items() if key not in unread}
    chosen = {kind: config.get(kind) for kind in ("task", "step", "method")}
    # every value, an older run's too (one saved before a setting existed holds its default)
    return {key: value for key, value in config.items() if applies(key, chosen, with_defaults(config).get)}


def differing_settings(rows: list[dict], unread_differs: bool = False,
                       shown: Sequence[str] = SHOWN_ALREADY) -> list[str]:
    """The settings whose values differ between the runs they apply to, in the configuration's
    order whatever the rows' order, but those the table shows already. `unread_differs`: a run
    that does not read a setting differs from one that does (diff)."""
    configs = [_applying(row["config"], row.get("not_applicable")) for row in rows if row.get("config")]
    found = {key for config in configs for key in config}
    keys = [key for key in PonderConfig.field_names() if key in found] + sorted(found - set(PonderConfig.field_names()))
    return [key for key in keys if key not in shown
            and len({json.dumps(c[key]) if key in c else None for c in configs if unread_differs or key in c}) > 1]


def list_runs(folders: Sequence[Union[str, Path]] = (), *, where: Sequence[str] = (), sort: Optional[str] = None,
              reverse: bool = False, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder runs`: every run folder under the current folder (or each of `folders`), oldest
    first, filtered by `where` and ordered by `sort` (figures and times highest first, text a
    to z, no value last); the settings that differ between them get a column each."""
    conditions = [Condition.parse(text) for text in where]
    sort, kind = _key(sort, "--sort") if sort is not None else (None, None)
    roots = [Path(f) for f in folders] or [RUNS_DIR, HERE]
    found: dict[Path, str] = {}  # each run folder -> its name below the folder it was found under
    for root in roots:
        problem = file_problem(root)
        if not folders and problem == "does not exist":
            continue  # no runs/ here yet
        if problem != "is a directory":
            raise PonderError(f"{root} {problem or 'is a file'}; name a folder of runs (default: {RUNS_DIR}/ and "
                              f"the current folder) or a run folder")
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
        present = sorted((row for row in rows if _typed(row.get(sort), kind) is not None),
                         key=lambda row: _typed(row[sort], kind), reverse=(kind in (NUMBER, TIME)) != reverse)
        rows = present + [row for row in rows if _typed(row.get(sort), kind) is None]
    differing = differing_settings(rows)
    # a setting's column shows it for the runs whose pieces read it ("-" for the others: an ACT run has no prior)
    rows = [{key: value for key, value in row.items()
             if key in RUN_KEYS or (key in differing and key in _applying(row.get("config"), row.get("not_applicable")))}
            for row in rows]
    return runs_report(rows, [str(root) for root in roots], differing, list(where), sort, reverse)


def remove_runs(runs: Sequence[Union[str, Path]] = (), *, restore: bool = False, empty: bool = False,
                confirm: Optional[Callable[[list[dict]], bool]] = None,
                log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder runs rm`: move run folders to the trash beside them, bring them back (`restore`),
    or delete what the trash of each folder holds (`empty`, the one deletion, after `confirm`);
    every run named is checked before any moves."""
    if empty:
        roots = [Path(f) for f in runs] or [RUNS_DIR, HERE]
        rows = trash_contents(root for root in roots if root.is_dir())
        if rows and confirm is not None and not confirm(rows):
            return trash_report([], "deleted", [str(r) for r in roots], declined=True)
        deleted = empty_trash(rows)
        elsewhere = [str(trash) for trash in trashes_under(roots)]  # --empty FOLDER reaches each of them
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
    named = list(dict.fromkeys(run_named(run, log) for run in runs))
    for run in named:  # all of them fit before any moves
        check_trashable(run)
    return trash_report([trash_run(run) for run in named], "removed", [])


def run_named(run: Union[str, Path], log: Callable[[str], None]) -> Path:
    """A run folder as named, or for `latest` (where no such folder is here) the newest run under
    runs/, the one `ponder info latest` and `--resume latest` read."""
    if str(run) != LATEST or os.path.lexists(run):
        return Path(run)
    folder = resolve_checkpoint(LATEST, file=LAST).path.parent
    log(f"{LATEST}: {folder}, the newest run under {RUNS_DIR}/")
    return folder


def _run_row(folder: Path, stamp: Optional[float], name: Optional[str] = None, path: Optional[Path] = None) -> dict:
    """One run folder as a row (RUN_KEYS, and its config), from its last.pt (else best.pt; `path`:
    that checkpoint) read without its weights, or its config.json when it holds no checkpoint yet;
    `name`: the folder's below the one listed."""
    path = path or next((folder / file for file in (LAST, BEST) if (folder / file).is_file()), None)
    summary, status = None, "empty"
    if path is not None:
        try:
            summary = Summary.read(path)
        except PonderError:
            status = "unreadable"
    elif lock_holder(folder / LOCK_FILE) is not None:
        status = "running"
    record = run_of(summary, folder)
    config = summary.config if summary is not None else record.get("config")  # else what its config.json says
    config = config if isinstance(config, dict) else {}
    labels, folder_name = Labels.of(record), name or folder.name or str(folder)
    row = {"run": str(folder), "name": labels.name or folder_name, "folder": folder_name, "given_name": labels.name,
           **{key: config.get(key) for key in ("task", "method", "step")}, "status": status, "epoch": None,
           "epochs": config.get("epochs"), "best_epoch": None, "best_val_accuracy": None, "best_val_steps": None,
           "checkpoint": None if path is None else str(path),
           "when": None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds"),
           "init_from": start_text(record.get("init_from")), "amp": bool(record.get("amp")), "tags": list(labels.tags),
           "note": labels.note, "config": config or None, "not_applicable": record.get("not_applicable")}
    if summary is None:
        return row
    row.update(epoch=summary.epoch, status=run_status(summary, path)[0], best_epoch=summary.best_epoch or None,
               best_val_accuracy=summary.best.get("val_accuracy"), best_val_steps=summary.best.get("val_steps"))
    if path.name == LAST and (folder / BEST).is_file():
        try:  # its best model lost (cut short, its record failing its checksum), however the run went; its
            peek_checkpoint(folder / BEST)  # weights' checksums are checked when it is read (info, eval)
        except PonderError:
            row["status"] = "damaged"
    return row


def diff_runs(targets: Sequence[Union[str, Path]], *, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder diff`: two or more runs (anything a CHECKPOINT can be), only what differs: one
    bucket each, `key`, `kind` (label, setting or result), `values` (one per run) and for a
    setting `reads` (a run that does not read one differs from one that does)."""
    if len(targets) < 2:
        raise BadValue("ponder diff compares two or more runs: name another (`ponder runs` lists them)")
    rows, seen = [], {}
    for target in targets:
        folder = Path(target)
        if folder.is_dir() and is_run_folder(folder):
            row = _run_row(folder, run_time(folder))
            log(f"using {row['checkpoint'] or folder} (run folder {folder})")
            read = Path(row["checkpoint"] or folder)
        else:
            resolved = resolve_checkpoint(target, file=(LAST, BEST))
            log(f"using {resolved.path} ({resolved.why})")
            read = resolved.path
            row = _run_row(read.parent, run_time(read.parent), path=read)
        if read.resolve() in seen:
            raise BadValue(f"{seen[read.resolve()]} and {target} name the same run ({read}): name different runs")
        seen[read.resolve()] = target
        rows.append(row)
    missing = next((target for target, row in zip(targets, rows) if not row["config"]), None)
    if missing is not None:
        raise PonderError(f"{missing} holds no configuration to compare (no readable checkpoint or config.json)")

    def differ(key: str) -> bool:
        return len({json.dumps(row[key]) for row in rows}) > 1
    applying = [_applying(row["config"], row.get("not_applicable")) for row in rows]
    buckets = [{"key": key, "kind": "label", "values": [row[key] for row in rows]} for key in DIFF_LABELS
               if differ(key)]
    buckets += [{"key": key, "kind": "setting", "values": [read.get(key) for read in applying],
                 "reads": [key in read for read in applying]}
                for key in differing_settings(rows, unread_differs=True, shown=())]
    if differ("amp"):  # no setting of the model, but it changes the figures
        buckets.append({"key": "amp", "kind": "setting", "values": [row["amp"] for row in rows],
                        "reads": [True] * len(rows)})
    buckets += [{"key": key, "kind": "result", "values": [row[key] for row in rows]} for key in DIFF_RESULTS
                if differ(key)]
    return diff_report([str(target) for target in targets], buckets, rows)


# info -------------------------------------------------------------------------------------------

def run_info(target: Union[str, Path, None], *, log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder info`: a checkpoint or a run folder (its last.pt, else its best.pt) described, one
    bucket per epoch; read without torch (folders.read_state) but for a file or a saved halting
    rule torch must judge."""
    resolved = resolve_checkpoint(target, file=(LAST, BEST))
    log(f"using {resolved.path} ({resolved.why})")
    state = read_state(resolved.path)
    cfg, folder, summary = state.config, resolved.path.parent, Summary.of(state.to_dict())
    record, saved = run_of(summary, folder), saved_config(folder) or {}
    sources = (saved.get("sources") or {}) if saved.get("config") == cfg.to_dict() else {}
    info = {"file": str(resolved.path), "status": run_status(summary, resolved.path)[1], "epochs_trained": state.epoch,
            "epochs_planned": cfg.training.epochs, "best_epoch": state.best_epoch or None,
            "best_val_accuracy": summary.best.get("val_accuracy"), "best_val_steps": summary.best.get("val_steps"),
            "stopped_early": state.stopped_early, "resumable": summary.resumable,
            "training_step": (state.history[-1].get("training_step") or None) if state.history else None,
            **Labels.of(record).to_dict(), "init_from": start_text(record.get("init_from")),
            "amp": bool(record.get("amp")), "start": record.get("init_from"),
            "train_command": reproducing_command(cfg, record), **saved_halting_summary(folder)}
    return info_report(str(resolved.path), cfg, [dict(h) for h in state.history], info,
                       shown=cfg.shown_fields(), sources=sources,
                       view=piece_declaration("task", cfg.task.name)(cfg).view())  # the task as declared: no torch


def saved_halting_summary(folder: Path) -> dict:
    """What `info` says of it: `halting_rule`, the one the evaluating commands halt by (None: none
    saved, or saved for other weights), and `saved_halting`, the record with `current`, `why_not`."""
    record = saved_halting(folder)
    if record is None:
        return {"halting_rule": None, "saved_halting": None}
    # whether it was calibrated on these very weights: a digest of them, torch's to read
    _, why_not = loaded(TORCH_SAVED_HALTING)(Path(folder) / str(record.get("checkpoint")))
    return {"halting_rule": None if why_not else record["halting"],
            "saved_halting": {**record, "current": why_not is None, "why_not": why_not}}


# the reproduce line -------------------------------------------------------------------------------

def reproducing_command(cfg: PonderConfig, record: Optional[dict] = None) -> str:
    """The `ponder train` command that trains this configuration again, with only what a fresh
    run would not take by itself, in the configuration's order; then from its record --amp and
    the weights it started from."""
    given: dict = {}
    for kind in ("task", "step", "method"):
        if PonderConfig.of(**given).value(kind) != cfg.value(kind):
            given[kind] = cfg.value(kind)
    chosen, applying = cfg.chosen(), cfg.applying()
    for _ in range(3):  # a setting given can change what another derives (parity's counts from --elems)
        fresh = PonderConfig.of(**given)
        more = {key: cfg.value(key) for key in applying if key not in given and cfg.value(key) != fresh.value(key)}
        if not more:
            break
        given.update(more)

    def same(settings: dict) -> bool:
        try:
            fresh = PonderConfig.of(**settings)
        except PonderError:
            return False
        return all(fresh.value(key) == cfg.value(key) for key in applying)
    for key in [key for key in given if key not in chosen]:  # what another setting derives goes unsaid
        fewer = {k: v for k, v in given.items() if k != key}
        if same(fewer):
            given = fewer
    words = ["ponder", "train"]
    for key in (key for key in cfg.field_names() if key in given):
        option, value = "--" + key.replace("_", "-"), given[key]
        if isinstance(value, bool):
            words.append(option if value else "--no-" + option[2:])
        else:
            words += [option, repr(value) if isinstance(value, float) else str(value)]
    words += [word for key, value in start_options(record).items()
              for word in (["--amp"] if key == "amp" else ["--" + key.replace("_", "-"), value])]
    return " ".join(shlex.quote(word) for word in words)

