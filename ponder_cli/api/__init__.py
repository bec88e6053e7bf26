"""One library function per command: load what it needs, run it, return a reports.Report.

The CLI parses options, calls one of these and renders the report; everything here is usable
(and tested) without the CLI. One module per group of commands: evaluation (eval, extrapolate,
sweep, compare, calibrate), training (train), inspection (predict, info, runs); loading holds what
they share, signals how training stops on one.
"""

from .evaluation import (EvalOptions, calibrate_checkpoint, compare_checkpoints, evaluate_checkpoint,
                         sweep_checkpoint)
from .inspection import PLOT_INPUTS, PredictOptions, list_runs, predict_inputs, run_info
from .signals import Interrupted, Terminated
from .training import TrainOptions, train_run, training_config

__all__ = ["EvalOptions", "calibrate_checkpoint", "compare_checkpoints", "evaluate_checkpoint", "sweep_checkpoint",
           "PLOT_INPUTS", "PredictOptions", "list_runs", "predict_inputs", "run_info", "Interrupted", "Terminated", "TrainOptions",
           "train_run", "training_config"]
