"""The parity task of the PonderNet paper (Banino et al. 2021, §3.1; after Graves 2016, §3.1).

A vector of `elems` entries, `count` of them (the "non-zero count") +1 or -1 at random positions,
the rest 0; the label is 1 when the number of +1 entries is odd (two classes: the paper's logistic
unit reparametrised). Training batches are drawn on the training device from the run's own
generator (an "epoch" is `batches_per_epoch` batches); evaluation sets and their coins on the CPU
per (seed, elems, count), so a count's figures are the same on every device and in any bucket."""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from .. import BadValue, PonderError, distributed
from ..config import default_halting
from ..evaluate import EvalBucket, evaluate_bucket
from . import STDIN, TrainingSource, UserInputs, check_input_file, derived_seed, load_inputs, numbered, uniforms
from .declared import Parity, parse_count_range, train_range

# Seeds of the fixed evaluation sets: validation (and so model selection), test for reported
# figures, calibration for choosing an exit rule
VALIDATION_SEED, TEST_SEED, CALIBRATION_SEED = 1, 2, 3
VAL_PER_COUNT = 64  # validation rows per non-zero count of the training range
TEST_PER_COUNT = 256  # evaluation rows per non-zero count of a bucket (--limit lowers it)
CALIBRATION_PER_COUNT = 256  # calibration rows per non-zero count (--limit sets it)



class ParityBatch(NamedTuple):
    x: torch.Tensor  # (B, elems) float32, entries in {-1, 0, +1}
    labels: torch.Tensor  # (B,) long: 1 when the number of +1 entries is odd
    counts: torch.Tensor  # (B,) long: the number of non-zero entries


def parity_labels(x: torch.Tensor) -> torch.Tensor:
    """1 where the number of +1 entries of a row is odd (B, elems) -> (B,) long."""
    return ((x == 1).sum(dim=-1) % 2).long()


def vectors_with_counts(counts: torch.Tensor, keys: torch.Tensor, signs: torch.Tensor,
                        layout: str = "scattered") -> ParityBatch:
    """Rows with the non-zero counts (B,) from uniforms in [0, 1): scattered, the non-zeros at the
    `count` positions of smallest `keys` (B, elems), uniform among all subsets of that size;
    prefix, the first `count` positions (`keys` unread: both layouts draw the same stream); +1
    where `signs` (B, elems) is below 1/2, else -1."""
    batch, elems = keys.shape
    first = torch.arange(elems, device=keys.device) < counts[:, None]  # (B, elems): the first `count` slots
    if layout == "prefix":
        nonzero = first
    else:
        order = keys.argsort(dim=1)  # random permutations
        nonzero = torch.zeros(batch, elems, dtype=torch.bool, device=keys.device).scatter_(1, order, first)
    x = torch.where(nonzero, torch.where(signs < 0.5, 1.0, -1.0), 0.0)  # (B, elems) float32
    return ParityBatch(x, parity_labels(x), counts)


def parity_batch(batch: int, elems: int, lo: int, hi, generator: torch.Generator, layout: str = "scattered",
                 mix: float = 0.0, top=None) -> ParityBatch:
    """A training batch on the generator's device: non-zero counts uniform in [lo, top] (top: hi
    unless given; a tensor for the curriculum's, staged on the device), with `mix` > 0 that share
    of the rows (in expectation) uniform in [lo, hi] instead."""
    top = hi if top is None else top
    if not isinstance(top, torch.Tensor) and not 1 <= lo <= top <= elems:
        raise ValueError(f"non-zero counts must satisfy 1 <= lo <= hi <= elems (got {lo}-{top} of {elems})")
    device = generator.device
    counts = lo + (torch.rand(batch, generator=generator, device=device) * (top - lo + 1)).long()
    # u * span rounds up to span only for u within float32's last bit of 1
    counts = counts.clamp_max(top)
    keys = torch.rand(batch, elems, generator=generator, device=device)
    signs = torch.rand(batch, elems, generator=generator, device=device)
    if mix > 0:  # drawn after the rest: a run without it keeps the stream it always had
        whole = lo + (torch.rand(batch, generator=generator, device=device) * (hi - lo + 1)).long()
        looking_back = torch.rand(batch, generator=generator, device=device) < mix
        counts = torch.where(looking_back, whole.clamp_max(hi), counts)
    return vectors_with_counts(counts, keys, signs, layout)


def evaluation_set(elems: int, lo: int, hi: int, per_count: int, seed: int, device=None,
                   layout: str = "scattered") -> ParityBatch:
    """`per_count` rows for every non-zero count in [lo, hi], in count order, row j of count c from
    (seed, elems, c, j) alone: a smaller set (--limit) is the first rows of each count of a larger."""
    parts = []
    for count in range(lo, hi + 1):
        draws = uniforms(seed, "vectors", (elems, count), torch.arange(per_count), 2 * elems)
        parts.append(vectors_with_counts(torch.full((per_count,), count), draws[:, :elems], draws[:, elems:], layout))
    return ParityBatch(*(torch.cat(column).to(device) for column in zip(*parts)))


def halting_coins(counts: torch.Tensor, elems: int, max_steps: int, seed: int) -> torch.Tensor:
    """The coins (max_steps, N) of rows grouped by count, row j of a count from its own stream."""
    values, sizes = torch.unique_consecutive(counts.cpu(), return_counts=True)
    parts = [uniforms(seed, "coins", (elems, count), torch.arange(size), max_steps, torch.float32)
             for count, size in zip(values.tolist(), sizes.tolist())]
    return torch.cat(parts).T.contiguous()


def vector_bucket(data: ParityBatch, max_steps: int, seed: int) -> EvalBucket:
    coins = halting_coins(data.counts, data.x.shape[1], max_steps, seed)
    return EvalBucket(labels=data.labels, inputs=lambda start, end: data.x[start:end],
                      uniforms=coins.to(data.x.device), difficulty=data.counts.double().cpu())


def split_range(lo: int, hi: int, parts: int = 4) -> list[tuple[int, int]]:
    """[lo, hi] in `parts` consecutive ranges of (nearly) equal size: 1-64 -> 1-16 ... 49-64."""
    size = hi - lo + 1
    parts = min(parts, size)
    edges = [lo + i * size // parts for i in range(parts + 1)]
    return [(a, b - 1) for a, b in zip(edges, edges[1:])]


def curriculum_top(drawn: int, lo: int, hi: int, batches: int, start: int) -> int:
    """The top training count after `drawn` batches: linear from `start` to hi over `batches`, then hi."""
    if batches <= 0 or drawn >= batches:
        return hi
    start = min(max(lo, start), hi)
    return start + (hi - start) * drawn // batches


class ParityBatches(TrainingSource):
    """An epoch: `batches_per_epoch` batches from the run's own generator, the counts uniform up to
    the curriculum's top: on a schedule (curriculum_top), or by progress (--curriculum-advance:
    raised by an eighth of the range once validation is that accurate up to it, `advance`);
    --curriculum-mix of each from the whole range. Under torchrun every rank draws the same global
    batch and keeps its slice."""

    graph_safe = True

    def __init__(self, cfg, device):
        self.cfg, self.device = cfg, torch.device(device)
        self.lo, self.hi = train_range(cfg)
        self.by_progress = cfg.task.curriculum_advance > 0
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.training.seed)
        self.drawn = 0  # batches drawn so far in the run: where the schedule is
        self.level = min(max(self.lo, cfg.task.curriculum_start), self.hi)  # the top count by progress now
        self.top = torch.full((), self.hi, dtype=torch.long, device=self.device)  # the staged batch's top count
        self.rows = distributed.shard(torch.arange(cfg.training.batch_size, device=self.device))  # this rank's

    def start_epoch(self) -> int:
        if self.by_progress and distributed.active():  # validation (rank 0's) raised it there
            self.level = int(distributed.broadcast_from_main([float(self.level)], self.device)[0])
        return self.cfg.task.batches_per_epoch

    def stage(self, index: int) -> None:
        task = self.cfg.task
        self.top.fill_(self.level if self.by_progress else
                       curriculum_top(self.drawn, self.lo, self.hi, task.curriculum, task.curriculum_start))
        self.drawn += 1

    def advance(self, counts: torch.Tensor, correct: torch.Tensor) -> None:
        """After validation (rows' counts and whether right, on the CPU): raise the top once learnt up to it."""
        if not self.by_progress or self.level >= self.hi:
            return
        within = counts <= self.level
        if within.any() and float(correct[within].double().mean()) >= self.cfg.task.curriculum_advance:
            self.level = min(self.hi, self.level + max(1, -(-(self.hi - self.lo + 1) // 8)))

    def batch(self):
        drawn = parity_batch(self.cfg.training.batch_size, self.cfg.task.elems, self.lo, self.hi, self.generator,
                             self.cfg.task.layout, self.cfg.task.curriculum_mix, top=self.top)
        if not distributed.active():
            return drawn.x, drawn.labels
        return drawn.x[self.rows], drawn.labels[self.rows]

    def generators(self) -> tuple:
        return (self.generator,)

    def state(self) -> Optional[dict]:
        return {"generator": self.generator.get_state(), "device": self.device.type, "drawn": self.drawn,
                "level": self.level}

    def load_state(self, state: Optional[dict]) -> None:
        if not state:
            return
        # a generator's state belongs to its device type: a run resumed on another kind of device
        # starts that device's stream afresh from the seed (the curriculum goes on)
        if state.get("device") == self.device.type:
            self.generator.set_state(state["generator"])
        self.drawn = int(state.get("drawn", 0))
        self.level = int(state.get("level", self.level))


def _vector_rows(path, elems: int, text: Optional[str] = None) -> tuple[list[str], torch.Tensor]:
    """A .npy array (N, elems) or (elems,), or a text file (`text`: standard input's) of a vector a
    line, entries apart by spaces or commas, blank lines and # comments skipped -> names and rows."""
    if text is None and path.suffix.lower() == ".npy":
        rows = torch.from_numpy(load_inputs(path, (elems,), f"vectors of {elems} entries").astype(np.float32))
        names = numbered(path, rows.shape[0])
    else:
        try:
            lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
        except UnicodeDecodeError:
            raise PonderError(f"{path}: not a text file of vectors nor a .npy array") from None
        names, parsed = [], []
        for number, line in enumerate(lines, 1):
            entries = line.split("#", 1)[0].replace(",", " ").split()
            if not entries:
                continue
            try:
                values = [float(v) for v in entries]
            except ValueError:
                raise PonderError(f"{path}:{number}: not a vector of numbers ({line.strip()!r})") from None
            if len(values) != elems:
                raise PonderError(f"{path}:{number}: a vector of {len(values)} entries; this model reads vectors "
                                  f"of {elems}")
            names.append(f"{path}:{number}")
            parsed.append(values)
        if not parsed:
            raise PonderError(f"{path}: no vectors in it (one per line, {elems} entries each)")
        rows = torch.tensor(parsed, dtype=torch.float32)
    bad = ~((rows == -1) | (rows == 0) | (rows == 1))
    if bad.any():
        where = names[int(bad.any(dim=1).nonzero()[0])]
        raise PonderError(f"{where}: entries must be -1, 0 or +1 (got {float(rows[bad][0]):g})")
    return names, rows


class ParityTask(Parity):
    source = None  # the training batches, once drawn: validation moves a curriculum by progress on

    @property
    def input_shape(self) -> tuple:
        return (self.cfg.task.elems,)

    def run_name_prefix(self) -> str:
        return f"parity{self.cfg.task.elems}-"

    def kind_label(self) -> str:
        return f"parity with --elems {self.cfg.task.elems}"  # vectors of other sizes are other inputs

    def load_training(self, data_dir, download: bool):
        return None, evaluation_set(self.cfg.task.elems, *train_range(self.cfg), VAL_PER_COUNT, VALIDATION_SEED,
                                    layout=self.cfg.task.layout)

    def to_device(self, data, device):
        return None if data is None else ParityBatch(*(t.to(device) for t in data))

    def training_source(self, data, device) -> TrainingSource:
        self.source = ParityBatches(self.cfg, device)
        return self.source

    def validate(self, model, data, amp: bool):
        result = evaluate_bucket(model, vector_bucket(data, model.max_steps, self.cfg.training.seed), self.cfg, amp=amp,
                                 halting=default_halting(self.cfg))
        if self.source is not None:
            self.source.advance(result.samples.difficulty.long(), result.samples.correct)
        return result

    def describe(self, train_data, val_data) -> str:
        lo, hi = train_range(self.cfg)
        return (f"on {self.cfg.task.batches_per_epoch} batches of {self.cfg.training.batch_size} fresh vectors per "
                f"epoch ({self.cfg.task.elems} elements, non-zero counts {lo}-{hi}, {self.layout_text()}), "
                f"validating on {val_data.x.shape[0]}")

    def read_inputs(self, paths, options):
        for name, value in (("--rotate", options.rotate), ("--invert/--no-invert", options.invert)):
            if value is not None:
                raise PonderError(f"{name} applies to mnist models; this one is a parity model")
        names, rows = [], []
        for path in paths:
            stdin = str(path) == STDIN
            if not stdin:
                check_input_file(path, ".npy arrays or text files of vectors")
            found_names, found = _vector_rows(path, self.cfg.task.elems, options.stdin if stdin else None)
            names += found_names
            rows.append(found)
        return UserInputs(names, torch.cat(rows))

    def default_buckets(self, command: str) -> list[tuple[int, int]]:
        """eval: the training range in four; extrapolate: the counts beyond it in four (else, and for
        compare, every count in four); calibrate: the training range."""
        lo, hi = train_range(self.cfg)
        if command == "extrapolate" and hi < self.cfg.task.elems:
            return split_range(hi + 1, self.cfg.task.elems)
        if command == "eval":
            return split_range(lo, hi)
        if command == "calibrate":  # the validation set: the training range
            return [(lo, hi)]
        return split_range(1, self.cfg.task.elems)

    def parse_specs(self, texts: list, option: str) -> list[tuple[int, int]]:
        if not texts:
            raise PonderError(f"{option} needs at least one range LO-HI")
        return [parse_count_range(text, self.cfg.task.elems) for text in texts]

    def test_data(self, options, device):
        """The vectors are drawn per bucket: where, how many per count, from which seed."""
        return device, options.limit or TEST_PER_COUNT, TEST_SEED

    def calibration_data(self, options, device):
        """Vectors of calibrate's own: neither those that chose the best epoch nor the test vectors."""
        return device, options.limit or CALIBRATION_PER_COUNT, CALIBRATION_SEED

    def more_calibration(self, options) -> str:
        return (f"--limit {2 * (options.limit or CALIBRATION_PER_COUNT)} (vectors per non-zero count), or "
                f"{super().more_calibration(options)}")

    def bucket(self, test, spec: tuple[int, int], specs: list, max_steps: int, seed: int, protocol: str, *,
               draw: int = 0):
        """Draw 0: the fixed set; draw k >= 1 of --repeats: fresh vectors from `seed` (the evaluation's + k)."""
        device, per_count, set_seed = test
        set_seed = set_seed if draw == 0 else derived_seed("vectors", seed)
        data = evaluation_set(self.cfg.task.elems, *spec, per_count, set_seed, device, self.cfg.task.layout)
        return vector_bucket(data, max_steps, seed)

    def bucket_fields(self, spec: tuple[int, int], protocol: str, specs: list) -> dict:
        lo, hi = spec
        return {"counts": str(lo) if lo == hi else f"{lo}-{hi}", "lo": lo, "hi": hi}

    def sweep_specs(self, start: Optional[float], stop: Optional[float], every: Optional[float]) -> list[tuple[int, int]]:
        values = (1 if start is None else start, self.cfg.task.elems if stop is None else stop,
                  1 if every is None else every)
        if any(float(v) != int(v) for v in values):
            raise BadValue(f"a parity sweep runs over whole non-zero counts: --from, --to and --every must be "
                           f"integers (got {', '.join(f'{float(v):g}' for v in values)})")
        start, stop, every = (int(v) for v in values)
        if not 1 <= start <= stop <= self.cfg.task.elems or every < 1:
            raise BadValue(f"the sweep needs 1 <= --from <= --to <= {self.cfg.task.elems} (the elements of a "
                           f"vector) and --every >= 1 (got {start}, {stop}, {every})")
        return [(count, count) for count in range(start, stop + 1, every)]
