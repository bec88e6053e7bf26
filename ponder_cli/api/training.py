"""train: a run planned, its folder claimed and locked, trained, reported."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from .. import BadValue, PonderError, SigTerm, brief, distributed, durations, keeping
from ..checkpoint import CheckpointNotSaved
from ..config import START_KEYS, Origin, PonderConfig, default_halting, read_config_file
from ..tasks.mnist import resolve_data_dir
from ..folders import Labels, resumed_lock
from ..registry import DEFAULT_HALTING, TIME_LIMIT
from ..render import config_lines, epoch_line
from ..reports import Report, epoch_record, stopped_record, training_report
from ..runs import RunFolder, StartingWeights, plan_training, require_tensorboard, resolve_config
from ..model import amp_dtype
from ..tasks import get_task
from ..train import require_compiler, train
from . import device_and_amp, device_line, on_device


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
    tensorboard: bool = False  # TensorBoard event files in the run folder too (runs.py)
    config_file: Optional[Path] = None  # settings read from a file (config.read_config_file); `given` overrides them
    deterministic: bool = False  # only deterministic kernels (deterministic_kernels): a training option, not a model's
    cuda_graphs: bool = True  # on CUDA, capture the training batch once and replay it (train.BatchStep)
    # end after the last epoch that fits in this long (seconds, or a duration as --time-limit
    # spells it: "9m"), counted from when training starts in this process (train.TimeLimit)
    time_limit: Union[float, str, None] = None
    labels: Labels = Labels()  # the run's name, tags and note (folders.Labels): kept in config.json, no setting
    init_from: Union[str, Path, None] = None  # a CHECKPOINT whose weights a new run starts from (runs.StartingWeights)
    init_weights: Optional[str] = None  # EPOCH:DIGEST: init_from must hold these very weights (a rerun's)


@contextlib.contextmanager
def deterministic_kernels(on: bool):
    """While training: torch.use_deterministic_algorithms(True) (an operation without a
    deterministic kernel then fails rather than varies), and on CUDA the cuBLAS workspace that
    makes its sums reproducible, set before cuBLAS starts (it stays: cuBLAS reads it once)."""
    was = torch.are_deterministic_algorithms_enabled()
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        if on:
            torch.use_deterministic_algorithms(was)


def _settings(given: dict, options: TrainOptions) -> tuple[dict, dict, Optional[StartingWeights], TrainOptions]:
    """The settings of a run: --init-from's run's (those its pieces read), overridden by the
    file's, overridden by the options given; the file (or checkpoint) that gave each setting no
    option overrode; the weights to start from (a refit, --refit-halting, is one of these); and
    the options with what the file gives of them (init_from, init_weights, amp) where not given."""
    config_file = options.config_file
    from_file = read_config_file(config_file) if config_file is not None else {}
    start = {key: from_file.pop(key) for key in START_KEYS if key in from_file}
    if options.init_from is not None:  # another start than the file's: its weights' check is not for it
        start.pop("init_weights", None)
    options = dataclasses.replace(options, **{key: value for key, value in start.items()
                                              if getattr(options, key) is None})
    if options.init_weights is not None and options.init_from is None:
        raise BadValue("--init-weights names the weights --init-from must hold: give --init-from CHECKPOINT too")
    settings, origins = {**from_file, **given}, {name: str(config_file) for name in from_file if name not in given}
    init = StartingWeights.read(options.init_from, options.init_weights) if options.init_from is not None else None
    if init is not None:
        taken = init.settings(settings)
        settings = {**taken, **settings}
        origins = {**dict.fromkeys(taken, Origin(init.path, "--init-from")), **origins}
    return settings, origins, init, options


def training_config(given: dict, options: TrainOptions) -> tuple[PonderConfig, dict, dict]:
    """What `ponder train` would train with, where each value comes from and the run's record as
    far as it is known (its start, --amp), without training (`--print-config`): the resumed run's
    configuration with --resume."""
    settings, origins, init, options = _settings(given, options)
    cfg, sources, state, _ = resolve_config(settings, options.resume, origins, init)  # refused as training would
    start = init.record if init else (state.run or {}).get("init_from") if state else None
    return cfg, sources, {"init_from": start, "amp": bool(options.amp)}


def train_run(given: dict, options: TrainOptions, log: Callable[[str], None] = lambda line: None,
              records: Optional[Callable[[dict], None]] = None) -> Optional[Report]:
    """Train with the options the user gave (see runs.plan_training) and report the run;
    `records` gets each epoch's record as it ends, and a last one when training stops short.
    The run folder is locked while training; an interrupt stops it with the last completed
    epoch in last.pt, saying how to resume (ponder_cli.keeping).

    Under torchrun every process calls this alike and checks everything before the process
    group starts; rank 0 alone claims the folder, logs, writes and returns the report (the
    others None). After an error the group is left as it is: leave with distributed.leave_now.
    """
    if options.tensorboard:
        require_tensorboard()
    if isinstance(options.time_limit, str):
        options = dataclasses.replace(options, time_limit=durations.parse(options.time_limit))
    elif options.time_limit is not None and not options.time_limit > 0:
        raise PonderError(f"time_limit must be a number of seconds > 0 (got {options.time_limit!r})")
    where = distributed.launch()  # torchrun's RANK, LOCAL_RANK, WORLD_SIZE; None for a plain process
    main = where is None or where.main
    # a resume locks its run before reading it (under torchrun, rank 0 locks when it claims the folder)
    with deterministic_kernels(options.deterministic), resumed_lock(None if where else options.resume):
        if not main:
            log = lambda line: None  # noqa: E731  rank 0 alone speaks
        settings, origins, init, options = _settings(given, options)
        plan = plan_training(settings, resume=options.resume, out=options.out, overwrite=options.overwrite,
                             origins=origins, labels=options.labels, init=init)
        cfg = plan.cfg
        if plan.resumed is not None:
            log(f"using {plan.resumed.path} ({plan.resumed.why})")
        if init is not None:
            refit = "; every weight frozen but a new halting head's" if cfg.training.refit_halting else ""
            log(f"starting from the weights of {init.path} ({init.why}), epoch {init.state.epoch}{refit}")
        if where is not None and cfg.training.batch_size % where.world_size:
            raise PonderError(f"--batch-size {cfg.training.batch_size} is the global batch and must be divisible "
                              f"by the {where.world_size} processes torchrun started (each takes an equal share)")
        dev, amp = device_and_amp(options.device, options.amp)
        dev = distributed.device_for(dev, where)
        if cfg.training.compile:  # before a folder is claimed
            if dev.type != "cpu" or where is not None:
                # measured on one CPU process alone; on CUDA the captured graph already removes
                # the per-operator overhead the compiler fuses away
                raise PonderError(f"--compile trains in one process on the CPU (here: {dev.type}"
                                  f"{f', {where.world_size} processes' if where else ''}); train without it")
            require_compiler()
        for line in config_lines(cfg.to_dict(), plan.sources, shown=cfg.shown_fields()):
            log(line)
        folder = RunFolder(plan, device=str(dev), amp=amp, processes=where.world_size if where else 1,
                           tensorboard=options.tensorboard, log=log,
                           command="torchrun ... -m ponder_cli train" if where else "ponder train")

        def on_epoch(stats) -> None:
            folder.record(stats)
            log(epoch_line(stats, cfg.training.epochs))
            if records is not None and main:
                records(epoch_record(stats))

        finished = False
        with keeping(folder.resume_hint), _said_when_stopped(records if main else None, folder):
            try:
                task = get_task(cfg)
                train_set, val_set = task.load_training(resolve_data_dir(options.data_dir), options.download)
                distributed.setup(dev, where)  # the process group, under torchrun only: every rank is ready
                plan.out_dir = distributed.on_main(folder.claim)
                log(f"writing checkpoints to {plan.out_dir}/")
                train_set, val_set = task.to_device(train_set, dev), task.to_device(val_set, dev)
                # what is trained on what, the device as every command says it (device_line)
                rule = default_halting(cfg)  # what the validation figures halt by, where not the paper's coins
                log(f"training {cfg.method.name} (step {cfg.step.name}) {task.describe(train_set, val_set)}"
                    f"{f' (halting by {rule})' if rule != DEFAULT_HALTING else ''}, {device_line(dev, options.device)}"
                    f"{', amp ' + str(amp_dtype(dev)).removeprefix('torch.') if amp else ''}"
                    f"{f', {where.world_size} processes, global batch {cfg.training.batch_size}' if where else ''}"
                    f"{', resuming after epoch ' + str(plan.resume.epoch) if plan.resume else ''}")
                started = time.perf_counter()
                result = train(cfg, train_set, val_set, device=dev, out_dir=plan.out_dir, amp=amp, resume=plan.resume,
                               on_epoch=on_epoch, progress=options.progress and main, log=log,
                               cuda_graphs=options.cuda_graphs, time_limit=options.time_limit,
                               init=init.weights(cfg) if init is not None else None, run=folder.run)
                if result.stop_note:  # a time limit (with how to go on) or a run at chance: one line
                    log(f"{result.stop_note}; {folder.resume_hint()} --time-limit {durations.exact(options.time_limit)}"
                        if result.stop_reason == TIME_LIMIT else result.stop_note)
                finished = True
            except CheckpointNotSaved as exc:  # a full or read-only disk: what the run has, how to go on
                raise PonderError(f"{exc.problem}; {folder.resume_hint()}") from None
            except BrokenPipeError:  # stdout's reader left: an interrupt (keeping)
                raise
            except OSError as exc:  # the same under metrics.csv, in the CLI's words for an OSError
                raise PonderError(f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}; "
                                  f"{folder.resume_hint()}") from None
            except RuntimeError as exc:
                if not distributed.lost_peer(exc):
                    raise
                # Another rank died or stalled: the collective this rank was in failed instead of hanging.
                raise PonderError(f"training stopped: another process of the run failed or stopped answering "
                                  f"({brief(exc)}); {folder.resume_hint()}") from None
            finally:
                folder.release(finished)
        distributed.teardown()
        return on_device(training_report(cfg, result, time.perf_counter() - started, view=task.view()), dev) \
            if main else None


@contextlib.contextmanager
def _said_when_stopped(records: Optional[Callable[[dict], None]], folder: RunFolder):
    """Training that stops short ends its stream of records with one saying why and what the run
    kept; not where the stream itself is gone (BrokenPipeError), nor where it can no longer be
    written."""
    try:
        yield
    except (KeyboardInterrupt, PonderError) as exc:
        if records is not None:
            why = ("terminated" if isinstance(exc, SigTerm) else "interrupted" if isinstance(exc, KeyboardInterrupt)
                   else "error")
            kept = folder.kept()
            with contextlib.suppress(OSError, ValueError):  # the reader left too (Ctrl-C in a pipeline)
                records(stopped_record(why, *(kept or (None, None)),
                                       folder.resume_hint() if why != "error" else str(exc)))
        raise
