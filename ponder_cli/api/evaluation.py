"""eval, extrapolate, sweep, compare and calibrate: a model (or several) on the task's buckets,
one report each."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from .. import BadValue, PonderError
from ..checkpoint import load_model, steps_problem
from ..config import default_halting, problems_of
from .. import evaluate
from ..evaluate import CONTROLS, LOSSES, choose_rule, risk_controlled_rule, rule_outcomes, spearman, uncertainty
from ..model import get_method
from ..registry import CALIBRATION_RULES, DEFAULT_PROTOCOL, THRESHOLD_CALIBRATION_RULES, parse_exit_rule, parse_halting_rule
from ..reports import Report, calibration_report, combine_draws, comparison_report, evaluation_report, \
    group_by_configuration, mean_ci, sweep_report
from ..reports.evaluation import confidence_text
from ..runs import HALTING_FILE, halting_save_problem, save_halting, saved_halting_for, weights_digest
from ..tasks import BUCKETS, derived_seed, get_task, task_names
from . import check_halting, device_and_amp, evaluation_seed, load_one, on_device, resolve_named, steps_run


@dataclass(frozen=True)
class EvalOptions:
    """How to evaluate (eval, extrapolate, sweep, compare, calibrate) or predict (PredictOptions)."""
    protocol: Optional[str] = None  # how test images are rotated; None: the task's default (MNIST: uniform)
    halting: Optional[str] = None  # None: the method's own (api.check_halting)
    seed: Optional[int] = None  # None: the checkpoint's training seed (evaluation_seed)
    limit: int = 0  # first N test images (0: all)
    batch_size: int = 1000
    data_dir: Optional[Path] = None  # None: tasks.mnist.default_data_dir()
    download: bool = True
    device: str = "auto"
    amp: Optional[bool] = None  # None: off, float32 (device_and_amp)
    detail: bool = False
    repeats: int = 1  # independent draws of rotations and coins (seeds seed, seed + 1, ...)
    max_steps: Optional[int] = None  # steps to run; None: those the checkpoint trained with
    # predict's alone: how it reads images, and what it shows of each step
    invert: Optional[bool] = None  # None detects a dark digit on a light background
    rotate: Optional[float] = None  # degrees, counter-clockwise, before anything else
    steps: bool = False  # each step's figures (top class, probability, lambda_n, p_n, the step's own)
    views: bool = False  # each step's view of the input, for --plot

    def __post_init__(self) -> None:
        problems = problems_of("seed", self.seed, "--seed") if self.seed is not None else []  # as training's
        if self.max_steps is not None and steps_problem(self.max_steps):
            problems.append(steps_problem(self.max_steps))
        try:
            if self.halting is not None:
                parse_halting_rule(self.halting)
        except ValueError as exc:
            problems.append(f"--halting: {exc}")
        if not 1 <= self.repeats <= 1000:
            problems.append(f"--repeats must be between 1 and 1000 (got {self.repeats})")
        # one turn either way: beyond it an angle means nothing more, and past float32's range
        # (1e39) it is no angle at all; NaN fails the comparison too
        if self.rotate is not None and not -360 <= self.rotate <= 360:
            problems.append(f"--rotate must be a number of degrees from -360 to 360 (got {self.rotate:g})")
        if problems:
            raise BadValue(problems[0])


# The buckets as the user spelled them: {option: texts} ({"--angles": ["0", "45"]}; None: not
# given), or a list of the task's own bucket specs (what --buckets takes), or None: the command's
# default buckets. The task reads them (Task.parse_buckets).
Buckets = Union[Mapping[str, Optional[Sequence]], Sequence, None]


def _specs(task, buckets: Buckets, command: str, options: EvalOptions, log) -> tuple[list, EvalOptions]:
    """The buckets' specs and the options with the task's default protocol filled in; a protocol
    given to a task without one (parity) is refused."""
    if task.uses_protocol:
        options = options if options.protocol is not None else replace(options, protocol=DEFAULT_PROTOCOL)
    elif options.protocol is not None:
        owners = ", ".join(task_names(lambda other: other.uses_protocol))
        own = task.bucket_options[0] if task.bucket_options else BUCKETS
        raise BadValue(f"--protocol applies to {owners} checkpoints (how test images are rotated); this one is "
                       f"{task.article} {task.name} model, whose buckets are {own}")
    spelled = {} if buckets is None else dict(buckets) if isinstance(buckets, Mapping) else {BUCKETS: list(buckets)}
    return task.parse_buckets(spelled, command, options.protocol, log), options


PROGRESS_EVERY = 5.0  # seconds between progress lines where stderr is no terminal


class _Ticker:
    """Progress where stderr is a log or a pipe: a line every PROGRESS_EVERY seconds (`evaluating:
    3 of 8 buckets, 15 s, about 25 s to go`), the last when all are done; none for a quick one."""

    def __init__(self, total: int, log: Callable[[str], None]):
        self.total, self.log, self.done = total, log, 0
        self.started = self.said = time.perf_counter()

    def update(self, count: int = 1) -> None:
        self.done += count
        now = time.perf_counter()
        if now - self.said < PROGRESS_EVERY and not (self.done == self.total and self.said > self.started):
            return
        self.said, elapsed = now, now - self.started
        left = elapsed / self.done * (self.total - self.done)
        self.log(f"evaluating: {self.done} of {self.total} buckets, {elapsed:.0f} s"
                 + (f", about {left:.0f} s to go" if self.done < self.total else ", done"))


def _progress_bar(total: int, enabled: bool, log: Callable[[str], None]):
    """A tick per bucket: a bar on a terminal (`enabled`), else lines through `log`."""
    from tqdm import tqdm
    return tqdm(total=total, desc="evaluating", unit="bucket", file=sys.stderr, leave=False,
                dynamic_ncols=True) if enabled else contextlib.nullcontext(_Ticker(total, log))  # nothing to close


def _bucket_dicts(model, cfg, test, specs: list, options: EvalOptions, seed: int, amp: bool, *,
                  with_loss: bool, on_bucket: Callable[[], None]):
    """One dict per bucket (the mean over options.repeats draws, seeds seed, seed + 1, ...),
    Spearman's rho of difficulty and steps (95% interval over draws), and whether the difficulty
    varied at all (else rho was never a question: `eval` at 0°)."""
    task = get_task(cfg)
    used = get_method(cfg).halting_label(options.halting)
    drop = (() if with_loss else LOSSES) + (() if options.detail else ("accuracy_at_step", *CONTROLS))
    draws, rhos, samples, varied = [], [], [[] for _ in specs], False
    for k in range(options.repeats):
        results = []
        for spec in specs:  # each bucket built when its turn comes
            bucket = task.bucket(test, spec, specs, model.max_steps, seed + k, options.protocol, draw=k)
            results.append(evaluate.evaluate_bucket(model, bucket, cfg, halting=options.halting, amp=amp,
                                                    batch_size=options.batch_size, detail=options.detail,
                                                    with_loss=with_loss))
            on_bucket()
        difficulty = torch.cat([r.samples.difficulty for r in results])
        rho = spearman(difficulty, torch.cat([r.samples.steps for r in results]))
        rhos.append(rho)
        if rho is None and not varied:  # undefined: for want of differences in difficulty, or in steps?
            varied = bool(difficulty.numel() and (difficulty != difficulty[0]).any())
        for pooled, result in zip(samples, results):
            pooled.append(result.samples)
        draws.append([{**task.bucket_fields(spec, options.protocol, specs), "halting": used,
                       **{key: value for key, value in result.as_dict().items() if key not in drop},
                       **({"loss_halting": used} if with_loss else {})}  # the rule `loss` is taken under
                      for spec, result in zip(specs, results)])
    combined = [{**combine_draws([draw[b] for draw in draws]), **uncertainty(samples[b])} for b in range(len(specs))]
    rho, rho_ci = (None, None) if None in rhos else mean_ci(rhos)
    return combined, rho, rho_ci, varied or rho is not None


def evaluate_checkpoint(command: str, checkpoint: Union[str, Path, None], buckets: Buckets, options: EvalOptions,
                        *, log: Callable[[str], None] = lambda line: None, progress: bool = False) -> Report:
    """eval (with the loss), extrapolate and sweep (buckets: its from, to and every): one
    checkpoint (a CHECKPOINT argument; None: the shipped reference model), one bucket per spec."""
    path, dev, amp, model, cfg, trained = load_one(checkpoint, options, log)
    options = replace(options, halting=check_halting(cfg, options.halting or saved_rule(path, cfg, log)))
    task = get_task(cfg)
    if command == "sweep":
        specs, options = task.sweep_specs(*buckets), replace(options, protocol="fixed")
    else:
        specs, options = _specs(task, buckets, command, options, log)
    with _progress_bar(len(specs) * options.repeats, progress, log) as bar:
        test = task.test_data(options, dev)
        seed = evaluation_seed(options.seed, cfg)
        with_loss = command == "eval"
        buckets, rho, rho_ci, varied = _bucket_dicts(model, cfg, test, specs, options, seed, amp,
                                                     with_loss=with_loss, on_bucket=bar.update)
    if command == "sweep":
        return on_device(sweep_report(str(path), cfg, buckets, rho, seed=seed, view=task.view(),
                                      difficulty_varies=varied, steps=steps_run(cfg, trained)), dev)
    return on_device(evaluation_report(command, str(path), cfg, buckets, rho, protocol=options.protocol,
                                       seed=seed, with_loss=with_loss, difficulty_varies=varied,
                                       detail=options.detail, rho_ci=rho_ci, view=task.view(),
                                       steps=steps_run(cfg, trained)), dev)


def sweep_checkpoint(checkpoint: Union[str, Path, None], start: Optional[float], stop: Optional[float],
                     every: Optional[float], options: EvalOptions, **how) -> Report:
    """Each exact difficulty from `start` to `stop` every `every` (MNIST: 0 to 180 every 5 degrees;
    parity: each non-zero count), and the least-squares slope of steps against it."""
    return evaluate_checkpoint("sweep", checkpoint, (start, stop, every), options, **how)


def calibrate_checkpoint(checkpoint: Union[str, Path, None], buckets: Buckets, options: EvalOptions, *,
                         tolerance: float = 0.005,
                         rules: Optional[list[str]] = None, log: Callable[[str], None] = lambda line: None,
                         progress: bool = False, max_loss: Optional[float] = None, risk: Optional[float] = None,
                         save: bool = False) -> Report:
    """Every candidate exit rule (default registry.CALIBRATION_RULES) on the task's calibration
    data (held out from training, drawn from a stream of calibrate's own), and the cheapest whose
    agreement with the last step has a one-sided 95% lower bound of at least 1 - tolerance; with
    max_loss and risk, the cheapest whose loss passes fixed-sequence testing at that risk. save:
    the chosen rule written into the run folder."""
    if not (math.isfinite(tolerance) and 0 <= tolerance < 1):
        raise BadValue(f"--tolerance must be at least 0 and below 1 (got {tolerance:g})")
    if (max_loss is None) != (risk is None):
        given, missing = ("--max-loss", "--risk") if risk is None else ("--risk", "--max-loss")
        raise BadValue(f"{given} bounds the loss together with {missing}: give both (e.g. --max-loss 0.003 --risk 0.1)")
    for option, value in (("--max-loss", max_loss), ("--risk", risk)):
        if value is not None and not (math.isfinite(value) and 0 < value < 1):
            raise BadValue(f"{option} must be above 0 and below 1 (got {value:g})")
    subject = "calibrate" if rules is None else f"--rules {' '.join(map(str, rules))}"
    try:
        given = None if rules is None else [parse_exit_rule(rule).spelling for rule in rules]
    except ValueError as exc:
        raise BadValue(f"--rules: {exc}") from None
    path, dev, amp, model, cfg, trained = load_one(checkpoint, options, log)
    # by default the candidates of the rule the model was trained for (a threshold's, for a head on the answer)
    rules = given or list(THRESHOLD_CALIBRATION_RULES if default_halting(cfg).startswith("threshold:")
                          else CALIBRATION_RULES)
    if model.max_steps == 1:
        raise BadValue(f"{path} runs one step: every rule halts there, there is nothing to calibrate")
    method = get_method(cfg)
    if any(method.halting_label(rule) != rule for rule in rules):
        raise BadValue(f"{subject} applies to pondernet checkpoints; this one is {cfg.method.name}, which halts "
                       f"by its own rule" + (" or at a fixed budget (fixed:N)" if cfg.method.name == "act" else ""))
    problem = next(filter(None, map(method.halting_problem, rules)), None)  # a budget beyond the steps run
    if problem is not None:
        raise BadValue(problem.replace("--halting", "--rules"))
    task = get_task(cfg)
    specs, options = _specs(task, buckets, "calibrate", options, log)
    if risk is not None and task.buckets_share_inputs and len(specs) * options.repeats > 1:
        raise BadValue(f"--risk bounds the loss on independent inputs, and every {'bucket' if len(specs) > 1 else 'draw'} "
                       f"of {task.article} {task.name} model's calibration reuses the same {task.view().terms.inputs}: "
                       f"give one {task.bucket_options[0] if task.bucket_options else BUCKETS} value and no --repeats "
                       f"(--protocol uniform within the widest angle covers the narrower ones)")
    if save:
        halting_save_problem(path)  # refused before any work
    seed = evaluation_seed(options.seed, cfg)
    draws = derived_seed("calibrate", seed)
    with _progress_bar(len(specs) * options.repeats, progress, log) as bar:
        data = task.calibration_data(options, dev)

        def each_bucket():
            for k in range(options.repeats):
                for spec in specs:
                    yield task.bucket(data, spec, specs, model.max_steps, draws + k, options.protocol, draw=k)
                    bar.update()
        outcomes = rule_outcomes(model, each_bucket(), rules, batch_size=options.batch_size, amp=amp)
    if risk is not None:
        chosen, outcomes = risk_controlled_rule(outcomes, max_loss, risk)
        if chosen is None:
            best = min(outcomes, key=lambda test: test.bound)
            raise PonderError(f"no candidate's {confidence_text(risk)} bound on the loss reaches --max-loss {max_loss:g} on "
                              f"{best.images} {task.calibration_split} {task.view().terms.inputs} (the lowest: "
                              f"{best.halting}, {best.losses} differing, bound {best.bound:.4f}): raise --max-loss or "
                              f"--risk, or calibrate on more inputs")
    else:
        chosen = choose_rule(outcomes, tolerance)
        if save and chosen is None:
            raise PonderError(f"--save: no rule's bound reaches {1 - tolerance:.1%}, there is nothing to save; raise "
                              f"--tolerance or calibrate on more")
    report = calibration_report(str(path), cfg, outcomes, chosen, data=task.calibration_split,
                                sets=[task.bucket_fields(spec, options.protocol, specs) for spec in specs],
                                protocol=options.protocol, seed=seed, view=task.view(), steps=steps_run(cfg, trained),
                                repeats=options.repeats, tolerance=tolerance, more=task.more_calibration(options),
                                max_loss=max_loss, risk=risk)
    if save:
        report.meta["saved"] = str(save_rule(path, report, log))
    return on_device(report, dev)


def save_rule(path: Path, report: Report, log: Callable[[str], None]) -> Path:
    """calibrate's chosen rule, with how it was chosen, written into the run folder of `path`."""
    meta = report.meta
    chosen = next(bucket for bucket in report.buckets if bucket["halting"] == meta["chosen"])
    how = ({"criterion": "risk", "max_loss": meta["max_loss"], "risk": meta["risk"], "bound": chosen["bound"],
            "loss": chosen["loss"]} if meta["criterion"] == "risk" else
           {"criterion": "agreement", "tolerance": meta["tolerance"], "bound": chosen["agreement_lower"]})
    record = {"halting": meta["chosen"], **how, "mean_steps": chosen["mean_steps"],
              **{key: meta[key] for key in ("images", "data", "sets", "protocol", "seed", "max_steps",
                                            "trained_max_steps")}}
    target, before = save_halting(path, record)
    log(f"saved {meta['chosen']} as the run's halting rule in {target}"
        + (f" (replacing {before})" if before else "") + ": eval, extrapolate and sweep halt by it unless --halting "
        "says otherwise")
    return target


def saved_rule(path: Path, cfg, log: Callable[[str], None]) -> Optional[str]:
    """The rule calibrate saved for `path`, said on stderr; None where none is saved, or one for
    other weights (said too)."""
    record, why_not = saved_halting_for(path)
    if record is None:
        return None
    if why_not is not None:
        log(f"the halting rule saved in {path.parent / HALTING_FILE} ({record['halting']}) is not used: {why_not}; "
            f"calibrate again with --save")
        return None
    steps = "" if record.get("max_steps") == cfg.method.max_steps else \
        f"; calibrated at {record.get('max_steps')} steps, run to {cfg.method.max_steps} here"
    log(f"halting {record['halting']}: the run's saved rule ({path.parent / HALTING_FILE}{steps})")
    return record["halting"]


def compare_checkpoints(checkpoints: list[Union[str, Path]], buckets: Buckets, options: EvalOptions, *,
                        log: Callable[[str], None] = lambda line: None, progress: bool = False) -> Report:
    """Several checkpoints of one task on the same inputs and coins; those that differ only in
    the seed are one method, reported as mean ± sd over its distinct models."""
    models, seen, trained = {}, {}, {}
    paths = [resolve_named(checkpoint, log) for checkpoint in checkpoints]  # every name checked before loading
    dev, amp = device_and_amp(options.device, options.amp, log)
    for path in paths:  # every file loaded first: a bad one fails before any evaluation
        # --max-steps for every method that runs several steps; plain keeps its one
        model, cfg, state = load_model(path, dev, options.max_steps, every_method=False)
        digest = weights_digest(state.model)  # the weights as read, on the host: none copied back from a GPU
        if digest in seen:
            log(f"{path}: the same model as {seen[digest]}, counted once")
            continue
        seen[digest] = path
        models[str(path)] = (model, cfg)
        trained[str(path)] = state.config.method.max_steps
    kinds = sorted({get_task(cfg).kind_label() for _, cfg in models.values()})
    if len(kinds) > 1:
        raise BadValue(f"compare needs checkpoints of one task, evaluated on the same inputs (got {', '.join(kinds)})")
    seed = evaluation_seed(options.seed, *(cfg for _, cfg in models.values()))  # one draw for all
    task = get_task(next(iter(models.values()))[1])
    # the rule asked for, else each model's own; a method with a rule of its own halts by that
    rule_of = {path: options.halting or default_halting(cfg) for path, (_, cfg) in models.items()}
    for path, (_, cfg) in models.items():  # a method that halts by the rule asked for must run its steps
        method, rule = get_method(cfg), rule_of[path]
        problem = method.halting_problem(rule) if method.halting_label(rule) == rule else None
        if problem is not None:
            raise BadValue(f"{path}: {problem}")
    # every step of every input: the accuracy at each budget, for the best fixed budget at the same mean steps
    specs, options = _specs(task, buckets, "compare", replace(options, detail=True), log)
    with _progress_bar(len(models) * len(specs) * options.repeats, progress, log) as bar:
        test = task.test_data(options, dev)
        groups = group_by_configuration([(path, cfg) for path, (_, cfg) in models.items()])
        results = [[_bucket_dicts(models[path][0], cfg, test, specs, replace(options, halting=rule_of[path]), seed,
                                  amp, with_loss=False, on_bucket=bar.update)[0]
                    for path, cfg in group.members] for group in groups]
    rules = set(rule_of.values())
    shared_rule = rules.pop() if len(rules) == 1 else None  # None: each its own, which its buckets name
    return on_device(comparison_report(groups, results, specs, protocol=options.protocol,
                                       halting=shared_rule, seed=seed, repeats=options.repeats, view=task.view(),
                                       max_steps=options.max_steps, trained=trained), dev)
