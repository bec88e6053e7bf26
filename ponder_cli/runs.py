"""A run and its folder while it trains: the plan (the settings from the options, a checkpoint
resumed or weights started from, and a folder that is no other run's, no shipped model's and
hides no run), the folder claimed and the files beside its checkpoints (config.json,
config.toml, metrics.csv, TensorBoard events, and environment.json: what it ran on, since the
figures depend on threads and CPU as well as on the seed), `ponder runs label`, and calibrate's
saved halting rule. What is read without torch is folders.py."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from . import BadValue, PonderError, PonderWarning, __version__, brief, file_problem, name_length_problem
from .checkpoint import load_checkpoint, new_model, save_checkpoint
from .config import SECTIONS, PonderConfig, applies, bias_value, inapplicable, render_config, spelled, start_options
from .registry import FORMAT_VERSION
from .folders import (BESIDE_CHECKPOINTS, BEST, CHECKPOINT_FILES, CONFIG_FILE, CONFIG_TOML, ENVIRONMENT_FILE,
                      HALTING_FILE, LAST, METRICS_FILE, SAVED_BY, RESUMABLE_CHANGES, RUNS_DIR, Labels, Resolved, RunLock, Summary, some_of,
                      check_unlocked, enclosing_run, hidden_folder_of, inside_package, is_run_folder, package_dir,
                      package_problem, replace_atomically, resolve_checkpoint, run_files_in, run_of, run_record,
                      runs_under, same_path, same_run, saved_config, saved_halting, shipped_name)
from .listing import run_named
from .render import csv_cell, value_text as spelled_value
from .reports import Report
from .reports.runs import label_report
from .tasks import get_task
from .tasks.mnist import split_seed
from .train import HALTING_HEAD, EpochStats


@dataclass
class TrainingPlan:
    cfg: PonderConfig
    out_dir: Path
    resume: Optional[object] = None  # checkpoint.TrainingState to continue from
    fresh_folder: bool = False  # out_dir is the default runs/ folder: take the next free name if it is taken
    sources: dict = field(default_factory=dict)  # field -> where its value came from (PonderConfig.sources)
    resumed: Optional["Resolved"] = None  # the checkpoint --resume named, and how
    labels: Labels = field(default_factory=Labels)  # its name, tags and note (a resumed run's, then those given)
    init: Optional["StartingWeights"] = None  # --init-from: the weights a fresh run starts from
    init_from: Union[dict, str, None] = None  # where those came from, as its record keeps it (a resumed run's too)


# settings that only set a new model's first weights: the weights --init-from copies override them
INITIALISING = ("halting_bias", "gru_orthogonal", "gru_update_bias")
# what a refit's frozen body never reads: it runs as at evaluation, without dropout
REFIT_UNREAD = ("cnn_dropout", "mlp_dropout", "cnn_dropout_mask")


@dataclass(frozen=True)
class StartingWeights:
    """--init-from: another run's weights, which a fresh run starts from (epoch 1, a fresh
    optimizer, its own folder), the settings it did not give taken from that run."""
    path: Path  # the checkpoint read
    why: str  # how the argument led there (folders.Resolved)
    state: object  # its checkpoint.TrainingState
    record: dict  # as the new run's record keeps it: its file, epoch and weights' digest

    @classmethod
    def read(cls, given: Union[str, Path], expected: Optional[str] = None) -> "StartingWeights":
        """`expected` (--init-weights EPOCH:DIGEST, from a reproduce line or config.toml): those
        must be the very weights, else a source trained on since would start the rerun elsewhere."""
        resolved = resolve_checkpoint(given, file=BEST)
        with warnings.catch_warnings():  # a setting its pieces do not read: said when its settings are taken
            warnings.simplefilter("ignore", PonderWarning)
            state = load_checkpoint(resolved.path)
        digest = weights_digest(state.model)[:16]
        record = {"checkpoint": shipped_name(resolved.path) or str(resolved.path.resolve()), "epoch": state.epoch,
                  "weights": digest}
        if expected is not None and expected != f"{state.epoch}:{digest}":
            raise PonderError(f"--init-from {resolved.path} holds other weights than --init-weights {expected} "
                              f"names (epoch {state.epoch} now, digest {digest}): its run has trained on since, or "
                              f"another was written there; start from a copy of those weights, or leave out "
                              f"--init-weights to start from what it holds now")
        return cls(resolved.path, resolved.why, state, record)

    def settings(self, given: dict) -> dict:
        """Its run's settings that the new run's pieces read, for those not given; not
        --refit-halting, which says how that run trained, not what its model is."""
        saved = self.state.config
        chosen = {kind: given.get(kind, saved.value(kind)) for kind in ("task", "step", "method")}
        self.refuse_overridden(given)
        taken = {key: value for key, value in saved.to_dict().items() if key not in given and key != "refit_halting"
                 and applies(key, chosen, lambda key: given.get(key, saved.value(key))) and value is not None}
        return {**taken, **self.split(given, chosen)}

    def refuse_overridden(self, given: dict) -> None:
        """A setting given that its weights would contradict, refused in one line: one that changes
        what a copied tensor means, one that only sets a new model's first weights, and what a
        refit cannot use."""
        saved, refit = self.state.config, bool(given.get("refit_halting"))

        def value(key):  # as given (--halting-bias: a number or 'prior')
            return given[key] if key != "halting_bias" else bias_value(
                {"halting_bias": given[key], "lambda_p": given.get("lambda_p", saved.method.lambda_p)})
        problems = []
        for key in (key for key in given if key in PonderConfig.field_names() and key != "refit_halting"):
            if value(key) == saved.value(key):
                continue
            ours, theirs = spelled_value(value(key)), spelled_value(saved.value(key))
            option = f"--{key.replace('_', '-')} {ours}"
            if key in ("method", "halting_input") and not refit:
                what = "its halting head was trained as" if key == "method" else "its halting head reads"
                problems.append(f"{option}: {what} {theirs}, and its weights would be read as {ours}'s; refit "
                                f"the head anew (--refit-halting) or keep {theirs}")
            elif key == "align_turn":
                problems.append(f"{option}: its align step learnt turns of at most {theirs} degrees, which its "
                                f"weights would scale to {ours}")
            elif key in INITIALISING and not (refit and key == "halting_bias"):
                problems.append(f"{option} sets a new model's first weights, which the weights it copies override" +
                                ("; --refit-halting starts the halting head anew" if key == "halting_bias" else ""))
            elif key in REFIT_UNREAD and refit:
                problems.append(f"{option}: a refit runs its frozen body as at evaluation, without dropout")
        if refit and "plain" in (saved.method.name, given.get("method")):
            problems.append("--refit-halting: a plain model's one step reads no halting head, there is none to refit")
        if problems:
            raise BadValue(f"--init-from {self.path}: {'; '.join(problems)}")

    def split(self, given: dict, chosen: dict) -> dict:
        """Its held-out split, kept whatever the new --seed, so that the run validates and
        calibrates on no digit the source trained on."""
        saved = self.state.config
        if not (applies("split_seed", saved.chosen()) and applies("split_seed", chosen)):
            return {}
        seed = split_seed(saved)
        problems = []
        if given.get("split_seed", seed) != seed:
            problems.append(f"--split-seed {given['split_seed']} splits the digits anew (its held-out digits are "
                            f"split seed {seed}'s)")
        if given.get("val_size", saved.task.val_size) > saved.task.val_size:
            problems.append(f"--val-size {given['val_size']} holds out more digits than its {saved.task.val_size}, "
                            f"so the rest are digits it trained on")
        if problems:
            raise BadValue(f"--init-from {self.path}: {'; '.join(problems)}; a run from its weights validates on "
                           f"its held-out digits: leave --split-seed out and give --val-size at most "
                           f"{saved.task.val_size}")
        return {} if "split_seed" in given else {"split_seed": seed}

    def weights(self, cfg: PonderConfig) -> dict:
        """The tensors the run `cfg` takes: every one, or under --refit-halting all but the
        halting head's, which the run's own model starts anew (its shape may differ)."""
        refit = cfg.training.refit_halting
        return {name: tensor for name, tensor in self.state.model.items()
                if not (refit and name.startswith(HALTING_HEAD))}

    def check_fits(self, cfg: PonderConfig) -> None:
        """Its tensors load into the model `cfg` builds, or one error naming those that differ."""
        theirs, refit = self.weights(cfg), cfg.training.refit_halting
        model = {name: tensor for name, tensor in new_model(cfg).state_dict().items()
                 if not (refit and name.startswith(HALTING_HEAD))}  # a refit's new head is its own
        differ = [f"{name} {tuple(model[name].shape)} here, {tuple(theirs[name].shape)} there"
                  for name in model if name in theirs and tuple(model[name].shape) != tuple(theirs[name].shape)]
        missing, extra = [n for n in model if n not in theirs], [n for n in theirs if n not in model]
        if not (differ or missing or extra):
            return
        what = "; ".join([*differ[:3], *([f"{len(missing)} tensors of this model not in it ({missing[0]}, ...)"]
                                         if missing else []),
                          *([f"{len(extra)} of its tensors not in this model ({extra[0]}, ...)"] if extra else [])])
        saved = self.state.config
        cause = ", ".join(f"--{key.replace('_', '-')} {spelled_value(cfg.value(key))} (it has "
                          f"{spelled_value(saved.value(key))})" for key in cfg.field_names()
                          if key in SECTIONS["step"] + ("task", "halting_input") and cfg.value(key) != saved.value(key))
        raise BadValue(f"--init-from {self.path}: its weights do not fit this run's model ({what})"
                       + (f", for {cause}" if cause else "") + "; keep the settings that shape the model "
                       f"(step, hidden sizes, task) as that run had them (`ponder info {self.path}` shows them)")


def resolve_config(given: dict, resume: Optional[Path] = None, origins: Optional[dict] = None,
                   init: Optional[StartingWeights] = None):
    """A run's configuration, where each value comes from, and when resuming the checkpoint
    continued and how its name resolved: a resumed run takes the checkpoint's config, options
    that contradict it refused but RESUMABLE_CHANGES. `origins`: --config's file of each setting.
    What a run cannot start from is refused (training and --print-config alike): --init-from with
    --resume, a refit with no model to refit, weights that do not fit (`init`)."""
    if init is not None and resume is not None:
        raise BadValue("--init-from starts a new run from another's weights, --resume continues a run: give one")
    origins = origins or {}
    if resume is None:
        cfg = PonderConfig.of(origins=origins, **given)
        if cfg.training.refit_halting and init is None:
            raise BadValue("--refit-halting refits the halting head of a trained model: name the model with "
                           "--init-from CHECKPOINT")
        if init is not None:
            init.check_fits(cfg)
        return cfg, cfg.sources(given, origins), None, None
    resumed = resolve_checkpoint(resume, file=LAST)
    state = load_checkpoint(resumed.path)
    state.require_resumable(resumed.path)
    saved = state.config
    problems = inapplicable(given, saved.chosen(), lambda key: spelled(key, origins, "--"), saved.value)
    if problems:
        raise BadValue(f"cannot resume {resumed.path} ({saved.method.name}, step {saved.step.name}): "
                       f"{'; '.join(problems)}")
    conflicts = [f"{spelled(k, origins, '--')} {v} (checkpoint: {saved.value(k)})"
                 for k, v in given.items() if k not in RESUMABLE_CHANGES and saved.value(k) != v]
    if conflicts:
        raise BadValue(f"cannot resume {resumed.path} with options that contradict its config: "
                       f"{'; '.join(conflicts)}")
    cfg = saved.replace(**{k: given[k] for k in RESUMABLE_CHANGES if k in given})
    sources = {name: source if name in given else "checkpoint" for name, source in cfg.sources(given, origins).items()}
    return cfg, sources, state, resumed


def plan_training(given: dict, *, resume: Optional[Path] = None, out: Optional[Path] = None,
                  overwrite: bool = False, origins: Optional[dict] = None,
                  labels: Optional[Labels] = None, init: Optional[StartingWeights] = None) -> TrainingPlan:
    """The config and folder of a run (a fresh one under runs/ unless --out names one, a resumed
    run's own), another run's files never replaced unless `overwrite`; writes nothing."""
    too_long = name_length_problem(out) if out is not None else None
    if too_long:
        raise PonderError(f"--out {brief(str(out), 60)} {too_long}: give --out a shorter name")
    if out is not None and out.exists() and not out.is_dir():
        raise PonderError(f"--out {out} {file_problem(out) or 'is a file'}; --out names the folder for best.pt and "
                          f"last.pt")
    problem = package_problem(out, f"--out {out}") if out is not None else None
    if problem:
        raise PonderError(f"{problem}; name a folder outside it, or leave out --out for a fresh folder under "
                          f"{RUNS_DIR}/")
    cfg, sources, state, resumed = resolve_config(given, resume, origins, init)
    labels = labels or Labels()
    if state is None:
        started = dict(sources=sources, labels=labels, init=init, init_from=init.record if init else None)
        folder = out if out is not None else free_run_dir(cfg)
        refuse_hiding(folder, cfg, "--out" if out is not None else None)
        if out is not None:
            check_unlocked(out)
            refuse_foreign_checkpoints(out, overwrite)
        return TrainingPlan(cfg, folder, fresh_folder=out is None, **started)
    # its labels and start: its folder's record, else (one cut short, or none) its checkpoint's
    recorded = run_of(Summary.of(state.to_dict()), resumed.path.parent)
    resume, labels = resumed.path, Labels.of(recorded).updated(labels)
    out_dir = out if out is not None else resume.parent
    check_unlocked(out_dir)
    if state.epoch >= cfg.training.epochs:
        epochs = cfg.training.epochs
        done = (f"is complete ({state.epoch} of {epochs} epochs)" if state.epoch == epochs else
                f"has trained {state.epoch} epochs, more than --epochs {epochs} asks for")
        raise PonderError(f"nothing to do: the run in {resume} {done}; to train it longer, raise --epochs: "
                          f"ponder train --resume {resume} --epochs N (N > {state.epoch})")
    if not same_path(out_dir, resume.parent):  # continuing in another folder: a fresh one
        refuse_hiding(out_dir, cfg, "--out")
        refuse_foreign_checkpoints(out_dir, overwrite)
    elif package_problem(out_dir, str(out_dir)):
        raise PonderError(f"{package_problem(out_dir, str(out_dir))}; continue the run in another folder with "
                          f"--out DIR")
    elif not overwrite:
        _refuse_another_run(state, resume, out_dir)
        _refuse_rewind(state, resume, out_dir / LAST)
    return TrainingPlan(cfg, out_dir, state, sources=sources, resumed=resumed, labels=labels,
                        init_from=recorded.get("init_from"))


def render_run_config(cfg: PonderConfig, sources: dict, record: Optional[dict], fmt: str = "toml") -> str:
    """config.toml (or --print-config's JSON): the settings and, first, what of the run's record
    a rerun needs (start_options): read back, the same run."""
    text, start = render_config(cfg, sources, fmt), start_options(record)
    if fmt == "json":
        return json.dumps({**start, **json.loads(text)}, indent=2) + "\n"
    head, _, rest = text.partition("\n")
    lines = [f"{key} = {json.dumps(value)}" for key, value in start.items()]
    return "\n".join([head, *lines, rest]) if lines else text


# the checks that keep a run out of a folder -----------------------------------------------------

def refuse_hiding(folder: Path, cfg: PonderConfig, option: Optional[str]) -> None:
    """A run folder never hides another (`ponder runs` and `latest` do not look inside one): a
    folder inside a run folder, or one that holds run folders, is refused, --overwrite or not.
    `option`: how the folder was named (None: the default under runs/)."""
    named = f"{option} {folder}" if option else f"the default folder {folder}"
    inside = enclosing_run(folder)
    if inside is not None:
        instead = (f"name a folder outside it, e.g. {option} {inside.parent / f'{inside.name}-{Path(folder).name}'}"
                   if option else "move that run into a folder of its own, or give --out a folder outside it")
        raise PonderError(f"{named} is inside the run folder {inside}, where `ponder runs` and `latest` would "
                          f"never find the new run; {instead}")
    hidden = runs_under(folder, below=True)
    if hidden:
        raise PonderError(f"{named} holds run folders ({some_of(hidden)}): a run written there would hide "
                          f"{'it' if len(hidden) == 1 else 'them'} from `ponder runs` and `latest`; name a new folder "
                          f"for this run, e.g. {option or '--out'} {free_run_dir(cfg, Path(folder))}, or leave out "
                          f"--out for a fresh one under {RUNS_DIR}/")


def refuse_foreign_checkpoints(directory: Path, overwrite: bool) -> None:
    """Nothing of another run's or the user's (any file a run writes) is replaced without
    --overwrite."""
    found = run_files_in(directory)
    if not found or overwrite:
        return
    named = ", ".join(found[:6]) + (f" and {len(found) - 6} more" if len(found) > 6 else "")
    if any(name in CHECKPOINT_FILES for name in found):
        raise PonderError(f"{directory} already holds another run's checkpoints ({named}); leave out --out "
                          f"for a fresh folder under runs/, name another one, continue that run with "
                          f"--resume {directory / 'last.pt'}, or pass --overwrite to replace them")
    raise PonderError(f"{directory} already holds files a run writes ({named}), which training would replace; "
                      f"name another --out (or leave it out for a fresh folder under runs/), or pass --overwrite "
                      f"to replace them")


def _refuse_another_run(state, resume: Path, folder: Path) -> None:
    """Resuming in a run's folder a checkpoint of another run (copied over its last.pt, or named
    by mistake) would make the folder that run's; its config.json is its record."""
    try:
        with warnings.catch_warnings():  # a setting its pieces do not read is said when the checkpoint loads
            warnings.simplefilter("ignore", PonderWarning)
            recorded = PonderConfig.from_dict(saved_config(folder)["config"])
    except (ValueError, TypeError, KeyError, PonderError):
        return  # no record to hold it to (a folder of the user's, a config.json another version wrote)
    theirs, ours = state.config.to_dict(), recorded.to_dict()
    if same_run(ours, theirs):
        return
    differ = [f"{key.replace('_', '-')} {spelled_value(theirs[key])} (the folder's: {spelled_value(ours[key])})"
              for key in ours if key not in RESUMABLE_CHANGES and ours[key] != theirs[key]]

    def described(cfg):
        return f"{cfg.method.name} · step {cfg.step.name} · {cfg.task.name} · seed {cfg.training.seed}"
    raise PonderError(f"{resume} holds another run than the one {folder} records: the checkpoint is "
                      f"{described(state.config)}, {folder / CONFIG_FILE} says {described(recorded)} "
                      f"({'; '.join(differ[:4])}{'; ...' if len(differ) > 4 else ''}); resuming would make the "
                      f"folder that run's. Continue the checkpoint's run in another folder with --out DIR, or pass "
                      f"--overwrite to replace this folder's run")


def _refuse_rewind(state, resume: Path, last: Path) -> None:
    """Resuming an older checkpoint (best.pt, say) of a run would overwrite its newer last.pt."""
    if same_path(resume, last) or not last.is_file():
        return
    try:
        newer = load_checkpoint(last).epoch
    except PonderError:
        return  # an unreadable last.pt holds nothing to lose
    if newer > state.epoch:
        raise PonderError(f"resuming {resume} (epoch {state.epoch}) would rewind the run and overwrite the newer "
                          f"{last} (epoch {newer}); resume from {last}, continue in another folder with --out DIR, "
                          f"or pass --overwrite to go back to epoch {state.epoch}")


# the folder's name, and the files beside the checkpoints ----------------------------------------

def run_dir_name(cfg: PonderConfig) -> str:
    """<task's prefix><method>-<step>-seed<seed> (mnist: no prefix, parity: parity<elems>-)."""
    return f"{get_task(cfg).run_name_prefix()}{cfg.method.name}-{cfg.step.name}-seed{cfg.training.seed}"


def free_run_dir(cfg: PonderConfig, root: Path = RUNS_DIR) -> Path:
    """runs/<run_dir_name>, or the first of -2, -3, ... not taken yet."""
    base = root / run_dir_name(cfg)
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def write_run_config(out_dir: Path, cfg: PonderConfig, sources: dict, record: Optional[dict] = None, **run) -> Path:
    """config.json (the configuration, where each value came from, the record and how the run
    started) and config.toml, which `ponder train --config` reads back into this run."""
    payload = {"format_version": FORMAT_VERSION, "ponder_cli": __version__, "config": cfg.to_dict(),
               "sources": sources, **(record or {}), **run}
    path = out_dir / CONFIG_FILE
    replace_atomically(path, lambda f: f.write(json.dumps(payload, indent=2) + "\n"))
    text = render_run_config(cfg, sources, record)
    replace_atomically(out_dir / CONFIG_TOML, lambda f: f.write(text))
    return path


class MetricsFile:
    """metrics.csv, a row per completed epoch; a resumed run starts it again from its checkpoint's
    history, so that no row is there twice, nor one of an epoch the resume discards."""

    def __init__(self, out_dir: Path, columns: Iterable[str]):
        self.path, self.columns = Path(out_dir) / METRICS_FILE, list(columns)

    def _write(self, f, rows: Iterable[dict], header: bool = False) -> None:
        writer = csv.DictWriter(f, fieldnames=self.columns, restval="", extrasaction="ignore", lineterminator="\n")
        if header:
            writer.writeheader()
        # a list (the halting-step histogram) in one cell, as every CSV of ours holds it: `12;40;3`
        writer.writerows({key: csv_cell(value) for key, value in row.items()} for row in rows)

    def start(self, history: Iterable[dict] = ()) -> None:
        replace_atomically(self.path, lambda f: self._write(f, history, header=True))

    def append(self, row: dict) -> None:
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            self._write(f, [row])

    def close(self) -> None:
        """Nothing held open: every row is appended and closed at once."""


class RunFolder:
    """The run's handle on its folder, claimed once all else is known to be fine (nothing is
    written before); on the way out a folder this run made that holds no epoch is removed, so
    that the next run takes its name. Under torchrun, rank 0 alone claims it."""

    def __init__(self, plan: TrainingPlan, *, device: str, amp: bool, processes: int, tensorboard: bool,
                 log: Callable[[str], None], command: str = "ponder train"):
        self.plan, self.device, self.amp, self.processes = plan, device, amp, processes
        self.tensorboard, self.log, self.command = tensorboard, log, command
        self.saved: list[int] = []  # epochs this run has written to last.pt
        self.lock: Optional[RunLock] = None
        self.made = False  # whether this run created the folder
        self.files: list = []  # metrics.csv, and the TensorBoard events when asked for
        self.copies: list[str] = []  # files copied in when resuming into another folder
        self.launched = time.time()
        self.run = run_record(plan.labels, plan.init_from, amp)

    def claim(self) -> Path:
        plan = self.plan
        self.made = not plan.out_dir.exists() or plan.fresh_folder
        try:  # the default folder with an exclusive mkdir: two runs started at once get -2 and -3
            plan.out_dir.parent.mkdir(parents=True, exist_ok=True)
            while plan.fresh_folder:
                try:
                    plan.out_dir.mkdir()
                    break
                except FileExistsError:
                    plan.out_dir = free_run_dir(plan.cfg, plan.out_dir.parent)
            plan.out_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise PonderError(f"cannot write checkpoints to {plan.out_dir}: {exc.strerror or exc}") from None
        out_dir = plan.out_dir
        self.lock = RunLock.held_on(out_dir) or RunLock(out_dir).acquire()  # a resume's, taken before it read
        hidden = hidden_folder_of(out_dir)
        if hidden is not None:
            self.log(f"{hidden} is a hidden folder, which a bare `ponder runs` passes by: `ponder runs {hidden}` "
                     f"lists this run")
        carried = self._copy_best()
        source = RunLock.held_on(plan.resumed.path.parent) if plan.resumed is not None else None
        if source is not None and source is not self.lock:
            source.release()  # resumed into another folder: the run read is done with
        if carried is not None:
            self.log(f"{carried}: the run's best epoch so far (epoch {plan.resume.best_epoch}), copied from "
                     f"{plan.resumed.path.parent}")
            self.copies.append(carried.name)
        applying = plan.cfg.applying()
        write_run_config(out_dir, plan.cfg, plan.sources, self.run, started=datetime.now(timezone.utc).isoformat(),
                         resumed_from=str(plan.resumed.path) if plan.resumed else None,
                         resumed_after_epoch=plan.resume.epoch if plan.resume else None, device=self.device,
                         processes=self.processes, not_applicable=[name for name in plan.cfg.field_names()
                                                                   if name not in applying])
        # environment.json: this session after the earlier ones of a run resumed in its own folder
        environment, current, earlier = out_dir / ENVIRONMENT_FILE, session(self.device, self.processes), []
        if plan.resume is not None and same_path(out_dir, plan.resumed.path.parent):
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                earlier = list(json.loads(environment.read_text(encoding="utf-8")).get("sessions", []))
        sessions = {"format_version": FORMAT_VERSION, "sessions": [*earlier, current]}
        replace_atomically(environment, lambda f: f.write(json.dumps(sessions, indent=2) + "\n"))
        # a resumed run's rows so far come from its checkpoint's history
        self.files.append(MetricsFile(out_dir, [f.name for f in dataclasses.fields(EpochStats)]))
        self.files[0].start(plan.resume.history if plan.resume else [])
        if self.tensorboard:
            self.files.append(EventLog(out_dir, resumed_after=plan.resume.epoch if plan.resume else None))
        return out_dir

    def _copy_best(self) -> Optional[Path]:
        """Resuming into another folder: the run's best epoch so far copied there as best.pt (the
        checkpoint resumed, else the same run's best.pt beside it), so that the folder names a
        best.pt even when no later epoch beats it."""
        plan = self.plan
        if plan.resume is None or same_path(plan.out_dir, plan.resumed.path.parent):
            return None
        state, source = plan.resume, None
        if state.epoch == state.best_epoch:
            source = plan.resumed.path
        else:
            beside = plan.resumed.path.parent / BEST
            with contextlib.suppress(PonderError, OSError):
                best = load_checkpoint(beside)
                if best.epoch == state.best_epoch and same_run(best.config.to_dict(), state.config.to_dict()):
                    source = beside
        target = plan.out_dir / BEST
        if source is None:
            target.unlink(missing_ok=True)  # another run's, replaced with --overwrite: never reported as this one's
            return None
        replace_atomically(target, lambda f: None, binary_from=source)
        return target

    def record(self, stats: EpochStats) -> None:
        """An epoch saved to last.pt: one row in every metrics file."""
        self.saved.append(stats.epoch)
        for file in self.files:
            file.append(dataclasses.asdict(stats))

    def kept(self) -> Optional[tuple[int, Path]]:
        """The newest epoch on disk and its file (best.pt where last.pt's write failed after it), read
        from disk: an interrupt may land between saving an epoch and recording it."""
        last, best = self.plan.out_dir / LAST, self.plan.out_dir / BEST
        after = self.plan.resume.epoch if self.plan.resume is not None else 0

        def epoch_in(path: Path) -> Optional[int]:
            try:
                return load_checkpoint(path).epoch
            except PonderError:
                return None
        kept = None
        if last.exists() and (self.saved or self.plan.resume is not None or last.stat().st_mtime >= self.launched):
            kept = epoch_in(last)
        if best.exists() and best.stat().st_mtime >= self.launched:  # not an earlier run's, nor a copy
            epoch = epoch_in(best)
            if epoch is not None and epoch > max(after, kept or 0):
                return epoch, best
        if kept is None and self.saved:
            kept = self.saved[-1]
        return (kept, last) if kept is not None else None

    def resume_hint(self) -> str:
        kept = self.kept()
        if kept is None:
            return "no epoch had completed; nothing was saved"
        epoch, path = kept
        return f"epoch {epoch} is saved in {path}; resume with: {self.command} --resume {path}"

    def release(self, finished: bool) -> None:
        if self.lock is not None:
            self.lock.release()
        for file in self.files:
            file.close()
        if not finished and self.made:  # a folder holding nothing of value: the next run takes its name
            folder = self.plan.out_dir
            with contextlib.suppress(OSError):
                names = {p.name for p in folder.iterdir()}
                if not names - {*BESIDE_CHECKPOINTS, *self.copies}:  # only the files beside the checkpoints
                    for name in names:
                        (folder / name).unlink()
                    folder.rmdir()


def session(device: str, processes: int) -> dict:
    """This process's environment; `git`: the commit of the clone whose top folder holds the
    package (None for an installed package, even in a virtual environment inside a clone)."""
    import torch

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package_dir()), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if Path(git("rev-parse", "--show-toplevel")).resolve() == package_dir().parent:
            commit = {"commit": git("rev-parse", "HEAD"),
                      "modified": bool(git("status", "--porcelain", "--untracked-files=no"))}
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": ["ponder", *sys.argv[1:]],
            "ponder_cli": __version__, "package": str(package_dir()), "git": commit,
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "machine": platform.machine(), "processor": platform.processor() or None, "device": device,
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "processes": processes}


# TensorBoard event files beside metrics.csv (`ponder train --tensorboard`; the optional
# `tensorboard` extra), from the same EpochStats row: every figure as a scalar per epoch, and
# the validation halting-step histogram.

HISTOGRAM = "val_halting_histogram"  # EpochStats' field: validation images halting at step 1, 2, ...


def require_tensorboard() -> None:
    """Fail before any work when --tensorboard was asked for but cannot be written."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise PonderError("--tensorboard needs the tensorboard package: pip install tensorboard (or pip install "
                          "'ponder_cli[tensorboard]')") from None


def scalar_tag(name: str) -> str:
    """train_loss -> train/loss, val_accuracy -> val/accuracy: TensorBoard groups by the prefix."""
    for prefix in ("train_", "val_"):
        if name.startswith(prefix):
            return prefix[:-1] + "/" + name[len(prefix):]
    return name


class EventLog:
    """Event files in the run folder, begun with the first epoch written; a resumed run hides
    the events of the epochs it is about to redo."""

    def __init__(self, out_dir: Path, resumed_after: Optional[int] = None):
        self.out_dir = Path(out_dir)
        self.purge_step = None if resumed_after is None else resumed_after + 1
        self.writer = None

    def append(self, row: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self.writer is None:
            self.writer = SummaryWriter(log_dir=str(self.out_dir), purge_step=self.purge_step)
        epoch = row["epoch"]
        for name, value in row.items():
            if name != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(scalar_tag(name), value, epoch)
        counts = list(row.get(HISTOGRAM) or ())
        if sum(counts) > 0:
            steps = range(1, len(counts) + 1)
            present = [n for n, c in zip(steps, counts) if c]
            self.writer.add_histogram_raw(
                scalar_tag(HISTOGRAM).replace("_histogram", "_step"), min=min(present), max=max(present),
                num=sum(counts), sum=sum(n * c for n, c in zip(steps, counts)),
                sum_squares=sum(n * n * c for n, c in zip(steps, counts)),
                bucket_limits=[n + 0.5 for n in steps], bucket_counts=counts, global_step=epoch)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def label_runs(runs: Sequence[Union[str, Path]], labels: Labels, untag: Sequence[str] = (), *,
               log: Callable[[str], None] = lambda line: None) -> Report:
    """`ponder runs label RUN...`: labels changed in each run's config.json and checkpoints (a
    copy of its best.pt keeps them), each run locked meanwhile; nothing else of it changes."""
    if not runs:
        raise BadValue("name the runs to label (`ponder runs` lists them)")
    if labels == Labels() and not untag:
        raise BadValue("give the labels to change: --name, --tag, --untag or --note")
    named = list(dict.fromkeys(run_named(run, log) for run in runs))
    for run in named:  # all of them fit before any changes
        if not run.is_dir() or not is_run_folder(run):
            raise PonderError(f"{run} is not a run folder (`ponder runs` lists them); nothing was labelled")
    rows = []
    for folder in named:
        with RunLock(folder):  # refused, naming its PID, when a live run holds the folder
            states = [(path, load_checkpoint(path)) for path in (folder / LAST, folder / BEST) if path.is_file()]
            record = run_of(Summary.of(states[0][1].to_dict()) if states else None, folder)
            new = Labels.of(record).updated(labels, tuple(untag))
            for path, state in states:  # a checkpoint from before records gets one
                kept = state.run or {key: record.get(key) for key in ("init_from", "amp")}
                state.run = {**kept, "labels": new.to_dict()}
                save_checkpoint(state, path)
            saved = saved_config(folder)
            if saved is not None:
                saved["labels"] = new.to_dict()
                replace_atomically(folder / CONFIG_FILE, lambda f: f.write(json.dumps(saved, indent=2) + "\n"))
        rows.append({"run": str(folder), **new.to_dict()})
    return label_report(rows)


# A run's saved halting rule: `ponder calibrate --save` writes the rule it chose into the run
# folder as halting.json; `eval`, `extrapolate` and `sweep` halt by it where --halting is not
# given, and `info` shows it. It names the checkpoint file calibrated on and a digest of its
# weights: a rule calibrated on other weights (trained on since, or another run written over
# the folder) is not used.

def weights_digest(weights: dict) -> str:
    """A digest of a state dict's tensors (on the host), key by key in sorted order."""
    import hashlib

    digest = hashlib.sha1()
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(weights[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def saved_halting_for(path: Path) -> tuple[Optional[dict], Optional[str]]:
    """The saved rule of checkpoint `path`'s run folder and, where it was not calibrated on these
    very weights, why it does not apply; (None, None) where nothing is saved."""
    record = saved_halting(Path(path).parent)
    if record is None:
        return None, None
    if record.get("checkpoint") != Path(path).name:
        return record, f"calibrated on {record.get('checkpoint')}, not {Path(path).name}"
    try:
        same = record.get("weights") == weights_digest(load_checkpoint(path).model)
    except PonderError:
        same = False
    return (record, None) if same else (record, f"calibrated on other weights of {Path(path).name} (training went "
                                                f"on since, or another run was written over the folder)")


def halting_save_problem(path: Path) -> None:
    """Refuse --save where the rule cannot go: a shipped model, a checkpoint outside a run folder,
    a run training now, or a halting.json of the user's own."""
    folder = Path(path).parent
    if inside_package(path):
        raise PonderError(f"--save writes into a run folder, and {path} is a shipped model, not a run: calibrate "
                          f"without --save and pass the rule to --halting, or refit it into a run of your own "
                          f"(ponder train --init-from ...)")
    if not is_run_folder(folder):
        raise PonderError(f"--save writes into the run folder of the checkpoint, and {folder} is not a run folder "
                          f"(no run of ponder's wrote it): pass the rule to --halting instead")
    check_unlocked(folder)
    if (folder / HALTING_FILE).exists() and saved_halting(folder) is None:
        raise PonderError(f"{folder / HALTING_FILE} exists and is not a rule calibrate saved: move it away first, "
                          f"nothing of yours is overwritten")


def save_halting(path: Path, record: dict) -> tuple[Path, Optional[str]]:
    """Write `record` (the chosen rule and how it was chosen) as the run's saved rule, naming
    checkpoint `path` and its weights; returns the file and the rule it replaced (None: none)."""
    halting_save_problem(path)
    target = Path(path).parent / HALTING_FILE
    before = saved_halting(target.parent)
    payload = {"format_version": FORMAT_VERSION, "saved_by": SAVED_BY, **record, "checkpoint": Path(path).name,
               "weights": weights_digest(load_checkpoint(path).model),
               "saved": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    replace_atomically(target, lambda f: f.write(json.dumps(payload, indent=2) + "\n"))
    return target, before["halting"] if before else None
