"""predict: looking inside a model (info, runs, models, diff, without torch: ponder_cli.listing)."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Union

import torch

from .. import BadValue, PonderError, PonderWarning
from ..model import get_method
from ..reports import Report, prediction_report
from ..tasks import STDIN, InputOptions, get_task, uniforms as draw_uniforms
from . import check_halting, evaluation_seed, load_one, on_device, steps_run
from .evaluation import EvalOptions


PLOT_INPUTS = 16  # strips in one --plot figure: more would not be readable


@dataclass(frozen=True)
class PredictOptions(EvalOptions):
    """How `ponder predict` reads the inputs and halts (its own fields: EvalOptions' last four)."""
    batch_size: int = 256


def predict_inputs(checkpoint: Union[str, Path, None], inputs: list[Union[str, Path]], options: PredictOptions, *,
                   log: Callable[[str], None] = lambda line: None) -> Report:
    """A model on the user's own files (the task reads them), one bucket per input: every step
    runs, and the method picks the prediction and halting step under `options.halting` as
    evaluation does, input i's coins drawn from (`options.seed`, i) (tasks.uniforms)."""
    if not inputs:
        raise PonderError("predict needs at least one INPUT file")
    path, dev, _, model, cfg, trained_cfg = load_one(checkpoint, options, log)  # predict runs float32
    ran, trained = cfg.method.max_steps, trained_cfg.method.max_steps
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
    return on_device(prediction_report(str(path), cfg, buckets, halting=used, seed=seed, steps=options.steps,
                                       views=views, view=task.view(), rotate=options.rotate, invert=options.invert,
                                       **steps_run(cfg, trained_cfg)), dev)


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
