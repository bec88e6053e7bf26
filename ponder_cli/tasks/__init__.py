"""Tasks: what a model learns and is measured on (MNIST digits, parity vectors).

A task is one module here and one line in `registry.TASKS`, its settings declared in config.py
(`of="parity"`); the model, methods and halting code see only its inputs, labels and coins.
Built from the run's config (`self.cfg`), a task gives, besides Task's attributes and defaults:
`input_shape` (one input's); `load_training(data_dir, download)` -> (train, validation) on the
CPU, `to_device(data, device)`, `training_source(data, device)` -> TrainingSource, `validate(model,
data, amp)` -> evaluate.EvalResult, `describe(train, val)` (the log line); `read_inputs(paths,
InputOptions)` -> UserInputs (`ponder predict`); `view()` -> reports.TaskView; and evaluation by
buckets of difficulty (MNIST: rotations; parity: ranges of non-zero counts): `default_buckets(
command)`, `parse_specs(texts, option)`, `sweep_specs(start, stop, every)`, `test_data(options,
device)`, `calibration_data(options, device)`, `bucket(test, spec, specs, max_steps, seed,
protocol, draw=k)` -> evaluate.EvalBucket (a task that draws its inputs redraws them for draw k
>= 1 of --repeats) and `bucket_fields(spec, protocol, specs)` (its name in JSON and tables; a
band of difficulty adds `band`: [from, to]). See also the third task of tests/test_third_task.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Optional

from .. import BadValue, PonderError, file_problem
from ..registry import TASKS, task_class

BUCKETS = "--buckets"  # the spelling of buckets that every task reads, in its own terms
STDIN = "-"  # the INPUT that names standard input, as for cat and most tools


@dataclass(frozen=True)
class InputOptions:
    """How `ponder predict` reads the user's files (image tasks): `invert` forces or forbids
    swapping dark and light (None: per image), `rotate` degrees (None: not at all); `stdin`: the
    text of standard input, for an INPUT spelled STDIN."""
    invert: Optional[bool] = None
    rotate: Optional[float] = None
    stdin: Optional[str] = None


@dataclass(frozen=True)
class UserInputs:
    names: list  # one per input: "7.png", "digits.npy[3]", "vectors.txt:2"
    x: object  # torch.Tensor (N, ...) on the CPU


class TrainingSource:
    """An epoch of training batches on the training device: `start_epoch()` draws what the epoch
    needs and says how many batches follow, `stage(i)` puts global batch i into the static inputs
    (host side), `batch()` gives this process's inputs and labels, of fixed shapes and with no host
    read, drawing from torch's default generator or `generators()` (so a captured batch replays).
    `graph_safe`: it keeps that promise (tests/test_graph_safe.py), else CUDA trains eagerly."""

    graph_safe = False

    def generators(self) -> tuple:
        return ()

    def state(self) -> Optional[dict]:  # its own generator's, for checkpoints
        return None

    def load_state(self, state: Optional[dict]) -> None:
        pass


class Task:
    name: str = ""
    classes: int = 0
    inputs: str = ""  # what the inputs are, for messages: "28x28 images"
    input_kind: str = ""  # the step functions whose `input_kind` is the same fit it
    uses_protocol: bool = False  # whether --protocol (how test images are rotated) means anything
    # whether calibrate's buckets and draws reuse the same inputs (MNIST's held-out digits), so
    # that only one bucket of one draw holds independent inputs (calibrate --risk)
    buckets_share_inputs: bool = False
    # its spellings of buckets besides --buckets (MNIST: --angles), the first the one messages
    # name, with its metavar; "a" or "an" before its name ("an mnist model")
    bucket_options: tuple = ()
    bucket_metavar: str = "SPEC..."
    article: str = "a"

    def __init__(self, cfg=None):
        self.cfg = cfg

    @property
    def calibration_split(self) -> str:
        """What calibrate chooses on: data of its own, or where it can draw none the validation inputs."""
        return "validation" if self.buckets_share_inputs else "calibration"

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        return []

    @classmethod
    def resolve_options(cls, values: dict, given: dict) -> dict:
        """The config's values with what the task derives from them (`given`: those the user set)."""
        return values

    def run_name_prefix(self) -> str:
        return f"{self.name}-"  # what a run folder's default name starts with

    def kind_label(self) -> str:
        return self.name  # what checkpoints that `compare` sets side by side share (their inputs)

    def example_input(self, batch: int, device):
        import torch  # the CLI imports this package at start-up, before torch is needed

        return torch.zeros((batch, *self.input_shape), device=device)

    def parse_buckets(self, spelled: dict, command: str, protocol: Optional[str] = None,
                      log: Callable[[str], None] = lambda line: None) -> list:
        """The bucket specs spelled {option: texts or None}: the command's default when none is
        given; one option only, --buckets or one of this task's own (another task's is refused,
        naming whose it is). A bucket given twice is evaluated once, where first given, and `log`
        says so; then ordered for `protocol`."""
        given = {option: texts for option, texts in spelled.items() if texts is not None}
        if not given:
            return self.order_buckets(self.default_buckets(command), protocol)
        if len(given) > 1:
            raise BadValue(f"{' and '.join(given)} are alternatives: give one")
        ((option, texts),) = given.items()
        if option != BUCKETS and option not in self.bucket_options:
            owners = task_names(lambda task: option in task.bucket_options) or ["other"]
            own = self.bucket_options[0] if self.bucket_options else BUCKETS
            raise BadValue(f"{option} applies to {', '.join(owners)} checkpoints; this one is {self.article} "
                           f"{self.name} model: give {own} {self.bucket_metavar}")
        texts = [str(text) for text in texts]
        distinct, again = [], []
        for text, spec in zip(texts, self.parse_specs(texts, option)):
            (again if spec in distinct else distinct).append(text if spec in distinct else spec)
        if again:
            log(f"{option}: {' '.join(again)} given again: each bucket is evaluated once")
        return self.order_buckets(distinct, protocol)

    def more_calibration(self, options) -> str:
        """How calibrate chooses on more inputs (its advice when no rule is admitted)."""
        return f"--repeats {max(2, 2 * options.repeats)} (more draws pooled)"

    def order_buckets(self, specs: list, protocol: Optional[str]) -> list:
        return specs  # the order buckets are evaluated and reported in


def get_task(cfg) -> Task:
    return task_class(cfg.task.name)(cfg)


def task_names(test) -> list:
    """The registered tasks whose class passes `test`, for messages naming whose an option is."""
    return [name for name in TASKS if test(task_class(name))]


def derived_seed(stream: str, *parts) -> int:
    """A generator seed for one named stream of draws ("coins", "vectors") and the values that pick
    its member (a seed, a count, a bucket): distinct ones give unrelated seeds."""
    text = ":".join([stream, *map(str, parts)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


# splitmix64's constants as the signed int64 torch stores (its arithmetic wraps modulo 2**64)
_GOLDEN, _MIX1, _MIX2 = (value - (1 << 64) for value in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(z, bits: int):
    """A logical right shift of int64 tensors (torch's >> keeps the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z):
    """splitmix64's finaliser (Steele, Lea and Flood 2014): integer arithmetic only, so the same
    bits on every CPU, vector unit and device."""
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def uniforms(seed: int, stream: str, key: tuple, index, count: int, dtype=None):
    """The random numbers of evaluation: (N, count) uniforms in [0, 1) for the inputs numbered
    `index` (N,), in `stream` ("coins", "rotation") of the bucket `key`, from `seed`.

    Counter-based (splitmix64 over (seed, stream, key, input, column)): input i's numbers depend on
    nothing else, so a --limit evaluation is the first inputs of the full one, and neither batch
    size, device nor early exit changes a draw. float64 (53 random bits) by default; float32 has
    24, so a number never rounds up to 1."""
    import torch

    base = derived_seed(stream, seed, *key)
    rows = _mix(torch.as_tensor(index, dtype=torch.int64).cpu() * _GOLDEN + base)  # (N,): a counter per input
    z = _mix(rows[:, None] + torch.arange(1, count + 1, dtype=torch.int64) * _GOLDEN)  # (N, count)
    if dtype is None or dtype == torch.float64:
        return _shift_right(z, 11).to(torch.float64) * 2.0 ** -53
    return (_shift_right(z, 40).to(torch.float32) * 2.0 ** -24).to(dtype)


def numbered(path, count: int) -> list:
    """The names of a file's `count` inputs: the file's alone, or each numbered ("digits.npy[3]")."""
    return [f"{path}[{i}]" for i in range(count)] if count > 1 else [str(path)]


def check_input_file(path, wanted: str) -> None:
    """A user's INPUT must be an existing regular file; `wanted` names what this task reads."""
    problem = file_problem(path)
    if problem == "does not exist":
        raise PonderError(f"{path}: no such file")
    if problem is not None:  # reading a pipe would wait for a writer; a device holds no inputs
        raise PonderError(f"{path} {problem}; name {wanted}")


def load_inputs(path, shape: tuple, what: str):
    """A user's .npy file of inputs of `shape` each as an array (N, *shape), one alone (`shape`)
    N = 1; a problem is one error naming the file, the array as it is, and what the model reads."""
    import numpy as np  # the CLI imports this package's torch-free modules at start-up: no numpy then

    try:
        # mapped first: a header that promises more than the file holds (a file cut short, or
        # made to exhaust memory) fails here, before anything is allocated
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        array = np.array(array) if isinstance(array, np.memmap) else array
    except (ValueError, OSError, EOFError) as exc:
        if "mmap length is greater than file size" in str(exc):  # numpy's words for it
            raise PonderError(f"{path}: a .npy array cut short: its header promises more data than the file "
                              f"holds") from None
        raise PonderError(f"{path}: not a readable .npy array ({exc})") from None
    except MemoryError:
        raise PonderError(f"{path}: too large to load into memory; give fewer inputs per file") from None
    found = f"shape {tuple(array.shape)}, dtype {array.dtype}"
    if array.dtype.kind not in "biuf":
        raise PonderError(f"{path}: not real numbers ({found}); this model reads {what}")
    if array.size == 0:
        raise PonderError(f"{path}: an empty array ({found}); give at least one of the {what} this model reads")
    if array.shape == shape:
        return array[None]
    if array.ndim != len(shape) + 1 or array.shape[1:] != shape:
        raise PonderError(f"{path}: wrong {found}; this model reads {what}: give shape "
                          f"(N, {', '.join(map(str, shape))}) or {shape}")
    return array
