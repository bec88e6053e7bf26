"""One library function per command: load what it needs, run it, return a reports.Report.

The CLI parses options, calls one of these and renders the report; everything here is usable
(and tested) without the CLI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from . import PonderError, brief, distributed
from .calibrate import choose_rule, rule_outcomes
from .checkpoint import load_checkpoint, load_model
from .config import PonderConfig, applies, seed_problems
from .config_file import read_config_file
from .data import resolve_data_dir
from .evaluate import evaluate_buckets
from .folders import BEST, CONFIG_FILE, LAST, LOCK_FILE
from .environment import session, write_environment
from .halting_rules import CALIBRATION_RULES, parse_exit_rule, parse_halting_rule
from .methods import get_method
from .registry import DEFAULT_PROTOCOL
from .render import config_lines, epoch_line
from .reports import (Report, calibration_report, combine_draws, comparison_report, evaluation_report,
                      group_by_configuration, info_report, mean_ci, prediction_report, sweep_report, training_report)
from .runs import (MetricsFile, RunLock, _lock_holder, carry_best_checkpoint, claim_run_dir, plan_training,
                   remove_if_empty_run_dir, resolve_checkpoint, resolve_config, write_run_config)
from .runtime import amp_dtype, resolve_device
from .tasks import InputOptions, get_task
from .train import EpochStats, train


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate: shared by eval, extrapolate and compare."""
    protocol: Optional[str] = None  # how test images are rotated; None: the task's default (MNIST: uniform)
    halting: str = "sample"
    seed: Optional[int] = None  # None: the checkpoint's training seed (compare: the default seed)
    limit: int = 0  # first N test images (0: all)
    batch_size: int = 1000
    data_dir: Optional[Path] = None  # None: data.default_data_dir()
    download: bool = True
    device: str = "auto"
    amp: Optional[bool] = None  # None: on for CUDA, off for the CPU
    detail: bool = False
    repeats: int = 1  # independent draws of rotations and coins (seeds seed, seed + 1, ...)

    def __post_init__(self) -> None:
        problems = seed_problems(self.seed, "--seed") if self.seed is not None else []
        try:
            parse_halting_rule(self.halting)
        except ValueError as exc:
            problems.append(f"--halting: {exc}")
        if not 1 <= self.repeats <= 1000:
            problems.append(f"--repeats must be between 1 and 1000 (got {self.repeats})")
        if problems:
            raise PonderError(problems[0])


def _device_and_amp(device: str, amp: Optional[bool]):

    dev = resolve_device(device)
    return dev, (dev.type == "cuda" if amp is None else amp)


def _test_set(task, options: EvalOptions, device):
    """What the task's buckets are drawn from (MNIST: the test set, its first --limit images)."""
    return task.test_data(options, device)


def _progress_bar(total: int, enabled: bool):
    """One tick per bucket evaluated (per checkpoint and angle), on stderr."""
    from tqdm import tqdm
    return tqdm(total=total, desc="evaluating", unit="bucket", file=sys.stderr, disable=not enabled, leave=False,
                dynamic_ncols=True)


def _bucket_dicts(model, cfg, test, specs: list, options: EvalOptions, seed: int, amp: bool, *,
                  with_loss: bool, on_bucket: Optional[Callable[[], None]] = None):
    """One dict per bucket of the task (means over `options.repeats` draws, seeds seed, seed + 1,
    ...) and Spearman's rho between difficulty and steps (its mean over draws, with a 95% interval
    when there are several). A bucket names its difficulty in the task's terms (MNIST:
    "rotation" and "protocol"; parity: "counts", "lo", "hi")."""

    task = get_task(cfg)
    used = get_method(cfg).halting_label(options.halting)
    draws, rhos = [], []
    for k in range(options.repeats):
        buckets_in = [lambda spec=spec, k=k: task.bucket(test, spec, specs, model.max_steps, seed + k, options.protocol)
                      for spec in specs]
        results, rho = evaluate_buckets(model, buckets_in, cfg, halting=options.halting,
                                        batch_size=options.batch_size, detail=options.detail,
                                        with_loss=with_loss, amp=amp, on_bucket=on_bucket)
        rhos.append(rho)
        buckets = []
        for spec, result in zip(specs, results):
            bucket = {**task.bucket_fields(spec, options.protocol), "halting": used, **result.as_dict()}
            if not with_loss:
                for key in ("loss", "reconstruction", "regularisation"):
                    bucket.pop(key)
            if not options.detail:
                bucket.pop("accuracy_at_step")
            buckets.append(bucket)
        draws.append(buckets)
    combined = [combine_draws([draw[b] for draw in draws]) for b in range(len(specs))]
    rho, rho_ci = (None, None) if None in rhos else mean_ci(rhos)
    return combined, rho, rho_ci


def _resolve(checkpoint, log: Callable[[str], None]):
    """The file a CHECKPOINT argument names (runs.resolve_checkpoint), saying which on stderr."""

    resolved = resolve_checkpoint(checkpoint)
    log(f"using {resolved.path} ({resolved.why})")
    return resolved.path


def _load_one(checkpoint, options: EvalOptions, log: Callable[[str], None]):
    """The model a CHECKPOINT argument names (default: the shipped reference model) and its device."""

    path = _resolve(checkpoint, log)
    dev, amp = _device_and_amp(options.device, options.amp)
    model, cfg, _ = load_model(path, dev)
    return path, dev, amp, model, cfg


def evaluate_checkpoint(command: str, checkpoint: Union[str, Path, None], angles: Optional[list[float]],
                        options: EvalOptions, *, counts: Optional[list[str]] = None,
                        log: Callable[[str], None] = lambda line: None, progress: bool = False) -> Report:
    """eval (with the loss) and extrapolate: one checkpoint, one bucket per angle (MNIST) or per
    non-zero-count range (parity: `counts`, "LO-HI" texts); None: the task's default buckets for
    the command. `checkpoint` is a CHECKPOINT argument (a file, a run folder, `latest`, a shipped
    model's name; None: the shipped reference model); a "using ..." line says which file;
    progress: a bar on stderr, one tick per bucket."""

    path, dev, amp, model, cfg = _load_one(checkpoint, options, log)
    _check_halting(cfg, options.halting)
    task = get_task(cfg)
    options = _with_protocol(task, options)
    specs = task.parse_buckets(angles, counts, command)
    with _progress_bar(len(specs) * options.repeats, progress) as bar:
        test = _test_set(task, options, dev)
        seed = cfg.seed if options.seed is None else options.seed
        with_loss = command == "eval"
        buckets, rho, rho_ci = _bucket_dicts(model, cfg, test, specs, options, seed, amp, with_loss=with_loss,
                                             on_bucket=bar.update)
    return evaluation_report(command, str(path), cfg, buckets, rho, protocol=_protocol(cfg, options),
                             halting=buckets[0]["halting"], seed=seed, with_loss=with_loss, detail=options.detail,
                             rho_ci=rho_ci, view=task.view())


def _check_halting(cfg, rule: str) -> None:
    """Refuse a rule the checkpoint's method cannot halt by (compare instead shows each method's own)."""

    problem = get_method(cfg).halting_problem(rule)
    if problem is not None:
        raise PonderError(problem)


def _with_protocol(task, options: EvalOptions) -> EvalOptions:
    """The options with the task's default protocol filled in; a protocol given to a task whose
    buckets have none (parity) is refused rather than silently ignored."""
    if task.uses_protocol:
        return options if options.protocol is not None else replace(options, protocol=DEFAULT_PROTOCOL)
    if options.protocol is not None:
        raise PonderError(f"--protocol applies to mnist checkpoints (how test images are rotated); this one is a "
                          f"{task.name} model, whose buckets are --counts")
    return options


def _protocol(cfg, options: EvalOptions) -> Optional[str]:
    """The rotation protocol where the task has one (MNIST); null for parity."""
    return options.protocol if get_task(cfg).uses_protocol else None


def sweep_checkpoint(checkpoint: Union[str, Path, None], start: Optional[float], stop: Optional[float],
                     every: Optional[float], options: EvalOptions, *,
                     log: Callable[[str], None] = lambda line: None, progress: bool = False) -> Report:
    """MNIST: the test set rotated by exactly each angle from `start` to `stop` every `every`
    degrees (default 0 to 180 every 5); parity: vectors of exactly each non-zero count (default 1
    to elems). Accuracy and mean steps per bucket, and the least-squares slope of steps."""

    path, dev, amp, model, cfg = _load_one(checkpoint, options, log)
    _check_halting(cfg, options.halting)
    task = get_task(cfg)
    specs = task.sweep_specs(start, stop, every)
    fixed = replace(options, protocol="fixed")
    with _progress_bar(len(specs) * options.repeats, progress) as bar:
        test = _test_set(task, options, dev)
        seed = cfg.seed if options.seed is None else options.seed
        buckets, rho, _ = _bucket_dicts(model, cfg, test, specs, fixed, seed, amp, with_loss=False,
                                        on_bucket=bar.update)
    return sweep_report(str(path), cfg, buckets, rho, halting=buckets[0]["halting"], seed=seed, view=task.view())


def calibrate_checkpoint(checkpoint: Union[str, Path, None], angles: Optional[list[float]], options: EvalOptions, *,
                         counts: Optional[list[str]] = None, tolerance: float = 0.005,
                         rules: Optional[list[str]] = None, log: Callable[[str], None] = lambda line: None,
                         progress: bool = False) -> Report:
    """calibrate: every candidate exit rule (default halting_rules.CALIBRATION_RULES) on the
    task's validation data (MNIST: the held-out training images, rotated as in training, or by
    `angles` under options.protocol; parity: the validation vectors of the training range, or of
    `counts`), and the cheapest rule that agrees with the last step on at least 1 - tolerance of
    them (calibrate.choose_rule). options.repeats draws (seeds seed, seed + 1, ...) are pooled."""

    if not (math.isfinite(tolerance) and 0 <= tolerance < 1):
        raise PonderError(f"--tolerance must be at least 0 and below 1 (got {tolerance:g})")
    subject = "calibrate" if rules is None else f"--rules {' '.join(map(str, rules))}"
    try:
        rules = [parse_exit_rule(rule).spelling for rule in (CALIBRATION_RULES if rules is None else rules)]
    except ValueError as exc:
        raise PonderError(f"--rules: {exc}") from None
    path, dev, amp, model, cfg = _load_one(checkpoint, options, log)
    if model.max_steps == 1:
        raise PonderError(f"{path} runs one step: every rule halts there, there is nothing to calibrate")
    if any(get_method(cfg).halting_label(rule) != rule for rule in rules):
        raise PonderError(f"{subject} applies to pondernet checkpoints; this one is {cfg.method}, which halts by its "
                          f"own rule")
    task = get_task(cfg)
    options = _with_protocol(task, options)
    specs = task.parse_buckets(angles, counts, "calibrate")
    seed = cfg.seed if options.seed is None else options.seed
    with _progress_bar(len(specs) * options.repeats, progress) as bar:
        data = task.validation_data(options, dev)

        def buckets():
            for k in range(options.repeats):
                for spec in specs:
                    yield task.bucket(data, spec, specs, model.max_steps, seed + k, options.protocol)
                    bar.update()
        outcomes = rule_outcomes(model, buckets(), rules, batch_size=options.batch_size, amp=amp)
    return calibration_report(str(path), cfg, outcomes, choose_rule(outcomes, tolerance), tolerance=tolerance,
                              sets=[task.bucket_fields(spec, options.protocol) for spec in specs],
                              protocol=_protocol(cfg, options), seed=seed, repeats=options.repeats, view=task.view())


def _weights_digest(state_dict: dict) -> str:
    digest = hashlib.sha1()
    for key in sorted(state_dict):
        digest.update(key.encode())
        digest.update(state_dict[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def compare_checkpoints(checkpoints: list[Union[str, Path]], angles: Optional[list[float]], options: EvalOptions, *,
                        counts: Optional[list[str]] = None, log: Callable[[str], None] = lambda line: None,
                        progress: bool = False) -> Report:
    """Several checkpoints on the same buckets (same inputs, same coin flips); checkpoints that
    differ only in the seed are one method, reported as mean ± sd over its distinct models. They
    must be of one task (parity: of one vector size); buckets as evaluate_checkpoint's."""

    dev, amp = _device_and_amp(options.device, options.amp)
    seed = options.seed if options.seed is not None else _default_seed()
    models, seen = {}, {}
    paths = [_resolve(checkpoint, log) for checkpoint in checkpoints]  # every name checked before loading
    for path in paths:  # load every file first: a bad one fails before any evaluation
        model, cfg, _ = load_model(path, dev)
        digest = _weights_digest(model.state_dict())
        if digest in seen:
            log(f"{path}: the same model as {seen[digest]}, counted once")
            continue
        seen[digest] = path
        models[str(path)] = (model, cfg)
    kinds = sorted({f"{cfg.task}" + (f" with --elems {cfg.elems}" if cfg.task == "parity" else "")
                    for _, cfg in models.values()})
    if len(kinds) > 1:
        raise PonderError(f"compare needs checkpoints of one task, evaluated on the same inputs (got {', '.join(kinds)})")
    first = next(iter(models.values()))[1]
    task = get_task(first)
    options = _with_protocol(task, options)
    angles = task.parse_buckets(angles, counts, "compare")
    with _progress_bar(len(models) * len(angles) * options.repeats, progress) as bar:
        test = _test_set(task, options, dev)
        groups = group_by_configuration([(path, cfg) for path, (_, cfg) in models.items()])
        results = [[_bucket_dicts(models[path][0], cfg, test, angles, options, seed, amp, with_loss=False,
                                  on_bucket=bar.update)[0]
                    for path, cfg in group.members] for group in groups]
    return comparison_report(groups, results, angles, protocol=_protocol(first, options), halting=options.halting,
                             seed=seed, repeats=options.repeats, view=task.view())


def _default_seed() -> int:
    return PonderConfig.default("seed")


@dataclass(frozen=True)
class TrainOptions:
    resume: Union[str, Path, None] = None  # a CHECKPOINT argument (runs.resolve_checkpoint; folders: last.pt)
    out: Optional[Path] = None  # None: a fresh runs/<method>-<step>-seed<seed> (or the resumed run's folder)
    data_dir: Optional[Path] = None
    download: bool = True
    device: str = "auto"
    amp: Optional[bool] = None
    progress: bool = True
    overwrite: bool = False  # write into a folder that holds another run's checkpoints (or the shipped ones)
    tensorboard: bool = False  # TensorBoard event files in the run folder too (tensorboard_log.py)
    config_file: Optional[Path] = None  # settings read from a file (config_file.py); `given` overrides them


def _settings(given: dict, config_file: Optional[Path]) -> tuple[dict, dict]:
    """The settings of a run: the file's, overridden by the options given; and the file's source
    label for each setting it gave that no option overrode."""
    from_file = read_config_file(config_file) if config_file is not None else {}
    return {**from_file, **given}, {name: f"file {config_file}" for name in from_file if name not in given}


def training_config(given: dict, options: TrainOptions) -> tuple[PonderConfig, dict]:
    """What `ponder train` would train with, and where each value comes from, without training
    (`--print-config`): the resumed run's configuration with --resume."""
    settings, file_sources = _settings(given, options.config_file)
    cfg, sources, _, _ = resolve_config(settings, options.resume)
    return cfg, {**sources, **file_sources}


def train_run(given: dict, options: TrainOptions, log: Callable[[str], None] = lambda line: None) -> Optional[Report]:
    """Train with the options the user gave (see runs.plan_training) and report the run.

    The run folder is locked while training (runs.RunLock). SIGTERM stops training like Ctrl-C:
    the last completed epoch is in last.pt and the error says how to resume.

    Under torchrun (distributed.launch) every process calls this with the same arguments and
    trains on its share of every global batch of --batch-size images, on cuda:LOCAL_RANK on
    CUDA. All of them check everything before the process group starts; then rank 0 alone claims
    and locks the run folder (and tells the others which it is), logs, writes the checkpoints
    and returns the report, the others return None. A peer lost mid-run is one PonderError with
    the resume hint. After an interrupt or any other error the process group is left as it is
    (its shutdown can abort when peers are gone): leave at once with distributed.leave_now, as
    the CLI's error boundary does.
    """

    if options.tensorboard:
        from .tensorboard_log import require_tensorboard
        require_tensorboard()
    where = distributed.launch()  # torchrun's RANK, LOCAL_RANK, WORLD_SIZE; None for a plain process
    main = where is None or where.main
    if not main:
        log = lambda line: None  # noqa: E731  rank 0 alone speaks
    settings, file_sources = _settings(given, options.config_file)
    plan = plan_training(settings, resume=options.resume, out=options.out, overwrite=options.overwrite)
    plan.sources.update(file_sources)
    cfg = plan.cfg
    if plan.resumed is not None:
        log(f"using {plan.resumed.path} ({plan.resumed.why})")
    distributed.check_batch_size(cfg.batch_size, where)
    dev, amp = _device_and_amp(options.device, options.amp)
    dev = distributed.device_for(dev, where)
    for line in config_lines(cfg.to_dict(), plan.sources, shown=cfg.shown_fields()):
        log(line)
    saved: list[int] = []  # epochs this run has written to last.pt
    lock: list = []  # rank 0's RunLock, once taken
    made: list[Path] = []  # the run folder, when this run created it
    metrics: list = []  # rank 0's MetricsFile (and EventLog with --tensorboard), once the folder is claimed
    copies: list[str] = []  # files copied into the folder when resuming into another (carry_best_checkpoint)

    def on_epoch(stats) -> None:
        saved.append(stats.epoch)
        for file in metrics:  # metrics.csv, and the TensorBoard events when asked for: one row, one source
            file.append(dataclasses.asdict(stats))
        log(epoch_line(stats, cfg.epochs))

    launched = time.time()

    def saved_epoch(last: Path) -> Optional[int]:
        """The epoch last.pt holds: read from disk, since the interrupt may land between saving
        an epoch and reporting it (on_epoch), in either order of the two."""
        if last.exists() and (saved or plan.resume is not None or last.stat().st_mtime >= launched):
            try:
                return load_checkpoint(last).epoch
            except PonderError:
                pass
        return saved[-1] if saved else None

    def resume_hint() -> str:
        last = plan.out_dir / LAST
        epoch = saved_epoch(last)
        if epoch is not None:
            command = "torchrun ... -m ponder_cli train" if where else "ponder train"
            return f"epoch {epoch} is saved in {last}; resume with: {command} --resume {last}"
        return "no epoch had completed; nothing was saved"

    def claim() -> Path:
        existed = plan.out_dir.exists() and not plan.fresh_folder
        out_dir = claim_run_dir(plan)
        if not existed:
            made.append(out_dir)
        lock.append(RunLock(out_dir).acquire())
        carried = carry_best_checkpoint(plan)
        if carried is not None:
            log(f"{carried}: the run's best epoch so far (epoch {plan.resume.best_epoch}), copied from "
                f"{plan.resumed.path.parent}")
            copies.append(carried.name)
        # beside the checkpoints, readable without torch: the resolved configuration, and one
        # row per epoch (a resumed run's rows so far come from its checkpoint's history)
        write_run_config(out_dir, cfg, plan.sources, resumed_from=str(plan.resumed.path) if plan.resumed else None,
                         resumed_after_epoch=plan.resume.epoch if plan.resume else None, device=str(dev),
                         amp=amp, processes=where.world_size if where else 1,
                         not_applicable=[name for name in cfg.field_names() if not applies(name, cfg.chosen())])
        write_environment(out_dir, session(str(dev), where.world_size if where else 1),
                          keep_earlier=plan.resume is not None and _same_folder(out_dir, plan.resumed.path.parent))
        metrics.append(MetricsFile(out_dir, [f.name for f in dataclasses.fields(EpochStats)]))
        metrics[0].start(plan.resume.history if plan.resume else [])
        if options.tensorboard:
            from .tensorboard_log import EventLog
            metrics.append(EventLog(out_dir, resumed_after=plan.resume.epoch if plan.resume else None))
        return out_dir

    finished = False
    with _sigterm_as_interrupt(torchrun=where is not None):
        try:
            task = get_task(cfg)
            train_set, val_set = task.load_training(resolve_data_dir(options.data_dir), options.download)
            distributed.setup(dev, where)  # the process group, under torchrun only: every rank is ready
            # only once everything else is known to be fine: nothing written before
            plan.out_dir = distributed.on_main(claim)
            log(f"writing checkpoints to {plan.out_dir}/")
            train_set, val_set = task.to_device(train_set, dev), task.to_device(val_set, dev)
            log(f"training {cfg.method} (step {cfg.step}) {task.describe(train_set, val_set)}, device {dev}"
                f"{', amp ' + str(amp_dtype(dev)).removeprefix('torch.') if amp else ''}"
                f"{f', {where.world_size} processes, global batch {cfg.batch_size}' if where else ''}"
                f"{', resuming after epoch ' + str(plan.resume.epoch) if plan.resume else ''}")
            started = time.perf_counter()
            result = train(cfg, train_set, val_set, device=dev, out_dir=plan.out_dir, amp=amp, resume=plan.resume,
                           on_epoch=on_epoch, progress=options.progress and main, log=log)
            finished = True
        except KeyboardInterrupt as exc:
            raise (Terminated if isinstance(exc, _SigTerm) else Interrupted)(resume_hint()) from None
        except RuntimeError as exc:
            if not distributed.lost_peer(exc):
                raise
            _ignore_signals()  # torchrun's SIGTERM follows: this rank is on its way out already
            # Another rank died or stalled: the collective this rank was in failed instead of hanging.
            raise PonderError(f"training stopped: another process of the run failed or stopped answering "
                              f"({brief(exc)}); {resume_hint()}") from None
        finally:
            for held in lock:
                held.release()
            for file in metrics:
                file.close()
            if not finished:
                for folder in made:  # a run that saved no epoch leaves no folder behind: the next takes its name
                    remove_if_empty_run_dir(folder, carried=copies)
    distributed.teardown()
    return training_report(cfg, result, time.perf_counter() - started, view=get_task(cfg).view()) if main else None


def _same_folder(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


class Interrupted(PonderError):
    """Training stopped by Ctrl-C: the last completed epoch is saved."""
    exit_code = 130
    headline = "Interrupted"
    run_wide = True  # under torchrun every rank stops; rank 0 alone says where the run is saved


class Terminated(Interrupted):
    """Training stopped by SIGTERM (kill, a job scheduler, a container stopping): as Ctrl-C,
    with the shell's exit status for that signal, 128 + 15."""
    exit_code = 143
    headline = "Terminated"


class _SigTerm(KeyboardInterrupt):
    """SIGTERM raised where the training loop is, so that it unwinds as it does for Ctrl-C."""


def _raise_sigterm(signum, frame) -> None:
    raise _SigTerm()


def _ignore(signum, frame) -> None:
    pass


def _ignore_signals() -> None:
    # A Python handler that does nothing, not SIG_IGN: a signal that arrived while this runs
    # would otherwise surface later as "OSError: Signal 15 ignored due to race condition".
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _ignore)
        signal.signal(signal.SIGTERM, _ignore)


def _interrupt_once(signum, frame) -> None:
    # Under torchrun a Ctrl-C reaches every rank and torchrun follows it with SIGTERM, and it
    # sends SIGTERM to the remaining ranks as soon as one exits with an error: the first signal
    # interrupts, later ones are ignored (a second interrupt while unwinding would be a
    # traceback). torchrun sends SIGKILL 30 s later to anything still running.
    _ignore_signals()
    raise _SigTerm() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def _sigterm_as_interrupt(torchrun: bool = False):
    """While training, SIGTERM interrupts like Ctrl-C instead of ending the process on the spot
    with no message (signal handlers can only be set from the main thread).

    Under torchrun (see _interrupt_once) only the first SIGINT or SIGTERM counts, and once
    training has failed this process is on its way out: signals stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGINT) if torchrun else (signal.SIGTERM,)
    previous = {sig: signal.signal(sig, _interrupt_once if torchrun else _raise_sigterm) for sig in signals}
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        if failed and torchrun:
            _ignore_signals()
        else:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


# predict and info: looking inside a model -----------------------------------------------------

PLOT_INPUTS = 16  # strips in one --plot figure: more would not be readable


@dataclass(frozen=True)
class PredictOptions:
    """How `ponder predict` reads the inputs and halts."""
    halting: str = "sample"
    seed: Optional[int] = None  # the halting coins' seed; None: the checkpoint's training seed (as eval)
    invert: Optional[bool] = None  # images: None detects a dark digit on a light background
    rotate: Optional[float] = None  # images: degrees, counter-clockwise, before anything else
    steps: bool = False  # each step's figures (top class, probability, lambda_n, p_n, the step's own)
    views: bool = False  # each step's view of the input, for --plot
    device: str = "auto"
    batch_size: int = 256

    def __post_init__(self) -> None:
        problems = seed_problems(self.seed, "--seed") if self.seed is not None else []
        if self.rotate is not None and not math.isfinite(self.rotate):
            problems.append(f"--rotate must be a finite number of degrees (got {self.rotate})")
        if problems:
            raise PonderError(problems[0])


def predict_inputs(checkpoint: Union[str, Path, None], inputs: list[Union[str, Path]], options: PredictOptions, *,
                   log: Callable[[str], None] = lambda line: None) -> Report:
    """A model on the user's own files: the task reads them (MNIST: images and .npy arrays;
    parity: vectors), every step runs (the full forward pass), and the method picks the
    prediction and halting step under `options.halting` exactly as evaluation does, with the
    halting coins drawn from a generator seeded by `options.seed`. One bucket per input."""


    if not inputs:
        raise PonderError("predict needs at least one INPUT file")
    path = _resolve(checkpoint, log)
    dev, _ = _device_and_amp(options.device, False)
    model, cfg, _ = load_model(path, dev)
    _check_halting(cfg, options.halting)
    task, method = get_task(cfg), get_method(cfg)
    read = task.read_inputs([Path(p) for p in inputs], InputOptions(options.invert, options.rotate))
    seed = cfg.seed if options.seed is None else options.seed
    count = len(read.names)
    uniforms = torch.rand(model.max_steps, count, generator=torch.Generator().manual_seed(seed))
    used = method.halting_label(options.halting)
    whole = not method.needs_all_steps(options.halting)  # whole steps, not the expected rule's sum_n n p_n
    buckets, views = [], []
    with torch.inference_mode():
        for start in range(0, count, options.batch_size):
            end = min(start + options.batch_size, count)
            traces: list = []
            out = model(read.x[start:end].to(dev), traces=traces)
            scores, halted = method.predict(out.logits, out.lambda_logits, uniforms[:, start:end].to(dev),
                                            options.halting)
            chosen = method.probabilities(scores, options.halting)
            step_probs = torch.softmax(out.logits.float(), dim=-1)  # (steps, B, classes)
            figures = {"class": step_probs.argmax(-1), "probability": step_probs.amax(-1),
                       "lambda": torch.sigmoid(out.lambda_logits.float()),
                       "p": method.halting_distribution(out.lambda_logits),
                       **{key: torch.stack([t.values[key] for t in traces]).float() for key in traces[0].values}}
            figures = {key: value.cpu().T.tolist() for key, value in figures.items()}  # (B, steps)
            for row in range(end - start):
                bucket = {"input": read.names[start + row], "prediction": int(chosen[row].argmax()),
                          "probability": float(chosen[row].max()), "halting": used,
                          "halting_step": int(halted[row]) if whole else float(halted[row])}
                if options.steps or options.views:
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
    return prediction_report(str(path), cfg, buckets, halting=used, seed=seed, steps=options.steps, views=views,
                             view=view, rotate=options.rotate, invert=options.invert)


def _info_file(target: Union[str, Path, None]):
    """What `ponder info` reads: a run folder's last.pt (the whole history; best.pt when the
    folder has no last.pt, as the shipped models' folders), else as runs.resolve_checkpoint."""

    folder = Path(target) if target is not None else None
    if folder is not None and folder.is_dir() and not any((folder / name).is_file() for name in (LAST, BEST)):
        raise PonderError(f"{folder} holds no {LAST} or {BEST}: name a run folder, a checkpoint file, "
                          f"latest or a shipped model")
    file = BEST if folder is not None and folder.is_dir() and not (folder / LAST).is_file() else LAST
    return resolve_checkpoint(target, file=file)


def run_info(target: Union[str, Path, None], *, log: Callable[[str], None] = lambda line: None) -> Report:
    """A checkpoint or a run folder described: its task, method and step, the resolved
    configuration (and where each value came from, when the folder's config.json says), the
    epochs trained, the best epoch's validation figures, whether the run finished, stopped early,
    is training now or was interrupted, and one bucket per epoch of its history."""


    resolved = _info_file(target)
    log(f"using {resolved.path} ({resolved.why})")
    state = load_checkpoint(resolved.path)
    cfg, folder = state.config, resolved.path.parent
    sources = {}
    if (folder / CONFIG_FILE).is_file():
        try:
            saved = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
            if saved.get("config") == cfg.to_dict():  # the same run's record, not a stale one
                sources = saved.get("sources") or {}
        except (OSError, ValueError, AttributeError):
            pass
    stopped_early = bool(cfg.patience) and state.epochs_without_improvement >= cfg.patience
    holder = _lock_holder(folder / LOCK_FILE)
    resumable = all(getattr(state, key) is not None for key in state.RESUME_KEYS)
    if resolved.path.name != LAST and state.epoch == state.best_epoch:
        # a best.pt (the shipped models among them) is a snapshot of the best epoch: it cannot tell
        # how its run went on
        status = f"its run's best epoch, saved after epoch {state.epoch} of {cfg.epochs}"
        if (folder / LAST).is_file():
            status += f"; the run's latest state is {folder / LAST}"
    elif holder is not None:
        status = f"training now (PID {holder})"
    elif stopped_early:
        status = f"stopped early after epoch {state.epoch} (no better validation accuracy for {cfg.patience} epochs)"
    elif state.epoch < cfg.epochs:
        status = f"interrupted after epoch {state.epoch} of {cfg.epochs}"
        if resumable:
            status += f"; resume with: ponder train --resume {resolved.path}"
    else:
        status = "finished"
    best = next((h for h in state.history if h.get("epoch") == state.best_epoch), None)
    summary = {"file": str(resolved.path), "status": status, "epochs_trained": state.epoch,
               "epochs_planned": cfg.epochs, "best_epoch": state.best_epoch or None,
               "best_val_accuracy": best["val_accuracy"] if best else None,
               "best_val_steps": best["val_steps"] if best else None, "stopped_early": stopped_early,
               "resumable": resumable}
    return info_report(str(resolved.path), cfg, [dict(h) for h in state.history], summary,
                       shown=cfg.shown_fields(), sources=sources, view=get_task(cfg).view())
