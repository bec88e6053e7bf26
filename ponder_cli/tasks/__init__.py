"""Tasks: what a model learns and is measured on (MNIST digits, parity vectors).

A task is a piece like a step function or a halting method: one module here and one line in
`registry.TASKS`, its settings declared in config.py (`of="parity"`: read by parity). It says
what its inputs are and how many classes they have, how training batches are drawn and
validated, and what a difficulty bucket of its evaluation is: MNIST buckets are rotations, parity
buckets are ranges of non-zero counts. The model, the methods and the halting code never see any
of that: they get input tensors, labels and halting coins.

Interface (see MnistTask and ParityTask, and the third task of tests/test_third_task.py; a task
is built from the run's config, `self.cfg`):
- `classes`, `inputs` (words for messages), `input_kind` ("images", "vectors": the step
  functions with the same `input_kind` fit it) and `input_shape` (one input's, without the
  batch: the step is built for it), `difficulty` (the bucket key in reports: "rotation",
  "counts"), `uses_protocol`; a task an installed package registers names the declared settings
  it reads (`reads`) and implies (`implied`: values, and pieces of later kinds);
- the config and the run: `resolve_options(values, given)` (what it derives before the config
  is built: parity saves train_counts, and above 32 elements its paper-scale recipe,
  config.PAPER_SCALE), `run_name_prefix()` (the run folder's name), `kind_label()`
  (what checkpoints `compare` sets side by side share);
- training: `load_training(data_dir, download)` -> (training data, validation data) on the CPU,
  `to_device(data, device)`, `training_source(data, device)` -> a `TrainingSource` (batches of one
  shape, graph-safe),
  `validate(model, validation data, amp)` -> evaluate.EvalResult, `describe` (the log line);
- the user's own inputs (`ponder predict`): `read_inputs(paths, options)` -> `UserInputs`, the
  files read and checked (a problem is one PonderError naming the file), ready for the model;
- evaluation: `default_buckets(command)`, `parse_specs(texts, option)` (the texts of --buckets,
  or of one of its own spellings `bucket_options`: MNIST --angles and --rotation, parity --counts;
  `parse_buckets` refuses the others, naming whose they are) and `sweep_specs(start, stop,
  every)` -> bucket specs, `test_data(options, device)` and
  `calibration_data(options, device)` (what calibrate chooses an exit rule on: data of its own
  where the task can draw them, parity; MNIST's held-out training images),
  `bucket(test, spec, specs, max_steps, seed, protocol, draw=k)` -> evaluate.EvalBucket (draw k
  of --repeats: a task that draws its inputs redraws them for k >= 1), and
  `bucket_fields(spec, protocol, specs)`: the bucket's name in the task's own terms for JSON and
  tables (a bucket covering a band of difficulty adds `band`: [from, to], shown as `from–to`);
  `order_buckets(specs, protocol)`: the order they are evaluated in (by default as given).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Optional

from .. import BadValue, PonderError, file_problem
from ..registry import TASKS, task_class

BUCKETS = "--buckets"  # the spelling of buckets that every task reads, in its own terms


@dataclass(frozen=True)
class InputOptions:
    """How `ponder predict` reads the user's files: `invert` True/False forces or forbids
    swapping dark and light (None: detected per image), `rotate` turns every input by that many
    degrees first (None: not at all). Only image tasks read them. `stdin`: the text of standard
    input, for an INPUT spelled STDIN (a task that reads text inputs reads it there)."""
    invert: Optional[bool] = None
    rotate: Optional[float] = None
    stdin: Optional[str] = None


STDIN = "-"  # the INPUT that names standard input, as for cat and most tools


@dataclass(frozen=True)
class UserInputs:
    """The user's inputs as the model reads them: a name per input ("7.png", "digits.npy[3]",
    "vectors.txt:2") and the batch x (N, ...) on the CPU."""
    names: list
    x: object  # torch.Tensor


class TrainingSource:
    """An epoch of training batches on the training device.

    `start_epoch` draws what the epoch needs up front and says how many batches follow;
    `stage(i)` puts global batch i into the source's static inputs, on the host's side; `batch()`
    gives this process's share, inputs and labels of fixed shapes, computed on the device with no
    host read, drawing from torch's default generator or `generators()` (so a captured batch
    replays it). `state`/`load_state`: its own generator, for checkpoints. `graph_safe`: it keeps
    that promise (tests/test_graph_safe.py); one that does not trains eagerly on CUDA.
    """

    graph_safe = False

    def start_epoch(self) -> int:
        raise NotImplementedError

    def stage(self, index: int) -> None:
        raise NotImplementedError

    def batch(self):
        raise NotImplementedError

    def generators(self) -> tuple:
        """The generators `batch` draws from besides torch's default one (a capture registers them)."""
        return ()

    def state(self) -> Optional[dict]:
        return None

    def load_state(self, state: Optional[dict]) -> None:
        pass


class Task:
    name: str = ""
    classes: int = 0
    inputs: str = ""  # what the inputs are, for messages: "28x28 images"
    # the kind of its inputs: the step functions whose `input_kind` is the same fit it
    input_kind: str = ""
    difficulty: str = ""  # the key naming a bucket's difficulty in reports
    uses_protocol: bool = False  # whether --protocol (how test images are rotated) means anything
    calibration_split: str = ""  # what calibrate chooses on: "calibration" (data of its own) or "validation"
    # whether calibrate's buckets and draws reuse the same inputs (MNIST: the held-out digits, rotated
    # again), so that only one bucket of one draw holds independent inputs (calibrate --risk)
    buckets_share_inputs: bool = False
    # how the command line spells its buckets besides --buckets (MNIST: --angles), the first the
    # one messages name, with its metavar; "a" or "an" before its name ("an mnist model")
    bucket_options: tuple = ()
    bucket_metavar: str = "SPEC..."
    article: str = "a"

    def __init__(self, cfg=None):
        self.cfg = cfg

    @classmethod
    def config_problems(cls, cfg) -> list[str]:
        """The task's own settings out of their range, as messages for the user."""
        return []

    @classmethod
    def resolve_options(cls, values: dict, given: dict) -> dict:
        """The config's values (`given`: those the user set) with what this task derives from
        them filled in, before the config is built; by default nothing."""
        return values

    def run_name_prefix(self) -> str:
        """What a run folder's default name starts with (runs.run_dir_name): the task's name."""
        return f"{self.name}-"

    def kind_label(self) -> str:
        """What checkpoints that `compare` may set side by side share (the same inputs): the task."""
        return self.name

    def read_inputs(self, paths: list, options: InputOptions) -> UserInputs:
        """Read the user's files (`ponder predict`); see the interface above."""
        raise NotImplementedError

    @property
    def input_shape(self) -> tuple:
        """One input's shape, without the batch: what the step function is built for."""
        raise NotImplementedError

    def example_input(self, batch: int, device):
        """A batch of inputs of this task's shape (zeros), for probing a model."""
        raise NotImplementedError

    def view(self):
        """What reports say of this task for this run (reports.TaskView: plain data, no torch)."""
        raise NotImplementedError

    def parse_buckets(self, spelled: dict, command: str, protocol: Optional[str] = None,
                      log: Callable[[str], None] = lambda line: None) -> list:
        """The bucket specs the user spelled, {option: texts or None (not given)}: the command's
        default buckets when none is given; one option only, --buckets or one of this task's
        own spellings (another task's is refused, naming whose it is), its texts read by
        `parse_specs`. A bucket given twice (`--angles 45 45`, or `45 45.0`) is evaluated once, in
        the place first given, and `log` says so; then `order_buckets` orders them for
        `protocol`."""
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
        specs = self.parse_specs(texts, option)
        distinct, again = [], []
        for text, spec in zip(texts, specs):
            (again if spec in distinct else distinct).append(text if spec in distinct else spec)
        if again:
            log(f"{option}: {' '.join(again)} given again: each bucket is evaluated once")
        return self.order_buckets(distinct, protocol)

    def more_calibration(self, options) -> str:
        """How calibrate chooses on more inputs (its advice when no rule is admitted): the options."""
        return f"--repeats {max(2, 2 * options.repeats)} (more draws pooled)"

    def order_buckets(self, specs: list, protocol: Optional[str]) -> list:
        """The order the buckets are evaluated and reported in: as given (MNIST's band protocol
        sorts them, each band running from the angle before it)."""
        return specs

    def parse_specs(self, texts: list, option: str) -> list:
        """Bucket specs from the texts given to `option` (a problem: one PonderError naming it)."""
        raise NotImplementedError


def derived_seed(stream: str, *parts) -> int:
    """A generator seed for one named stream of random draws ("coins", "vectors", "calibrate")
    and the values that pick its member (a seed, a count, a bucket's protocol and angle): distinct
    streams and members give unrelated seeds, so no two draws share a generator by accident."""
    text = ":".join([stream, *map(str, parts)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: consecutive counters far apart


def _int64(value: int) -> int:
    """A 64-bit pattern as the signed int64 torch stores (its arithmetic wraps modulo 2**64)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(z, bits: int):
    """A logical right shift of int64 tensors (torch's >> keeps the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z):
    """splitmix64's finaliser (Steele, Lea and Flood 2014) on int64 tensors: integer arithmetic
    only, so the same bits on every CPU, vector unit and device."""
    z = (z ^ _shift_right(z, 30)) * _int64(0xBF58476D1CE4E5B9)
    z = (z ^ _shift_right(z, 27)) * _int64(0x94D049BB133111EB)
    return z ^ _shift_right(z, 31)


def uniforms(seed: int, stream: str, key: tuple, index, count: int, dtype=None):
    """The random numbers of evaluation, one row per input: (N, count) uniforms in [0, 1) for
    the inputs numbered `index` (N,) in the stream `stream` ("coins", "rotation") of the bucket
    `key` (e.g. its protocol and angle), from `seed`.

    Counter-based (splitmix64 over (seed, stream, key, input, column)): input i's numbers depend
    on nothing else, so a --limit evaluation is exactly the first inputs of the full one, buckets
    draw independently, and neither batch size, device nor early exit changes a draw; a longer
    row (more steps) only appends numbers. float64 (53 random bits) by default, exact on every
    CPU; torch.float32 gives 24 random bits, so a number never rounds up to 1."""

    import torch  # the CLI imports this package at start-up, before torch is needed

    dtype = torch.float64 if dtype is None else dtype
    base = derived_seed(stream, seed, *key)
    index = torch.as_tensor(index, dtype=torch.int64).cpu()
    rows = _mix(index * _int64(_GOLDEN) + base)  # (N,): one counter per input
    z = _mix(rows[:, None] + torch.arange(1, count + 1, dtype=torch.int64) * _int64(_GOLDEN))  # (N, count)
    if dtype == torch.float64:
        return _shift_right(z, 11).to(torch.float64) * 2.0 ** -53
    return (_shift_right(z, 40).to(torch.float32) * 2.0 ** -24).to(dtype)


def get_task(cfg) -> Task:
    return task_class(cfg.task.name)(cfg)


def task_names(test) -> list:
    """The registered tasks whose class passes `test`, for messages naming whose an option is."""
    return [name for name in TASKS if test(task_class(name))]


def load_array(path):
    """A user's .npy file as a numpy array, or one error naming the file (no pickles)."""

    import numpy as np  # the CLI imports this package's torch-free modules at start-up: no numpy then

    try:
        # mapped first: a header that promises more than the file holds (a file cut short, or
        # made to exhaust memory) fails here, before anything is allocated
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        return np.array(array) if isinstance(array, np.memmap) else array
    except (ValueError, OSError, EOFError) as exc:
        if "mmap length is greater than file size" in str(exc):  # numpy's words for it
            raise PonderError(f"{path}: a .npy array cut short: its header promises more data than the file "
                              f"holds") from None
        raise PonderError(f"{path}: not a readable .npy array ({exc})") from None
    except MemoryError:
        raise PonderError(f"{path}: too large to load into memory; give fewer inputs per file") from None


def load_inputs(path, shape: tuple, what: str):
    """A user's .npy file of inputs of `shape` each, as an array (N, *shape); one input alone
    (`shape`) is N = 1. A problem is one error that says what is wrong first, then the array as
    it is (its own shape and dtype), then what this model reads (`what`: "28x28 images")."""

    array = load_array(path)
    found = f"shape {tuple(array.shape)}, dtype {array.dtype}"
    if array.dtype.kind not in "biuf":
        raise PonderError(f"{path}: not real numbers ({found}); this model reads {what}")
    if array.size == 0:
        raise PonderError(f"{path}: an empty array ({found}); give at least one of the {what} this model reads")
    if array.shape == shape:
        array = array[None]
    elif array.ndim != len(shape) + 1 or array.shape[1:] != shape:
        raise PonderError(f"{path}: wrong {found}; this model reads {what}: give shape "
                          f"(N, {', '.join(map(str, shape))}) or {shape}")
    return array


def check_input_file(path, wanted: str) -> None:
    """A user's INPUT must be an existing regular file; `wanted` names what this task reads, for
    the message about anything else."""

    problem = file_problem(path)
    if problem == "does not exist":
        raise PonderError(f"{path}: no such file")
    if problem is not None:  # reading a pipe would wait for a writer; a device holds no inputs
        raise PonderError(f"{path} {problem}; name {wanted}")
