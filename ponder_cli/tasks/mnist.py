"""The MNIST task: digits, 10 classes; difficulty is the rotation of the test images.

Training images are the seeded split of MNIST's training set (data.train_val_split), shuffled
every epoch from torch's shared stream and rotated uniformly within +-train_rotation; validation
rotates the held-out images the same way with the run's seed. Evaluation buckets are rotation
angles under a protocol (uniform, band, fixed: rotation.protocol_angles).
"""

from __future__ import annotations

from typing import Optional

from .. import PonderError
from . import Task, TrainingSource

EVAL_ANGLES, EXTRAPOLATION_ANGLES = [0.0], [22.5, 45.0, 67.5, 90.0]


class ImageBatches(TrainingSource):
    """An epoch: a fresh permutation of the training images in batches, each rotated uniformly
    within +-train_rotation (the permutation from torch's shared stream, the same on every rank;
    the rotations from this rank's stream)."""

    def __init__(self, data, cfg):
        self.data, self.cfg = data, cfg
        self.order = None

    def start_epoch(self) -> int:
        import torch

        from .. import distributed

        count = len(self.data)
        order = torch.randperm(count, device=self.data.images.device)  # (N,)
        self.order = order[:distributed.even_length(count)]  # under torchrun the last batch must split evenly
        return -(-self.order.shape[0] // self.cfg.batch_size)

    def batch(self, index: int):
        from .. import distributed
        from ..data import prepare_batch
        from ..rotation import uniform_angles

        start = index * self.cfg.batch_size
        rows = distributed.shard(self.order[start:start + self.cfg.batch_size])  # this rank's contiguous slice
        device = self.data.images.device
        angles = (uniform_angles(rows.shape[0], self.cfg.train_rotation, device=device)
                  if self.cfg.train_rotation > 0 else None)
        return prepare_batch(self.data.images[rows], angles), self.data.labels[rows]


class MnistTask(Task):
    name = "mnist"
    classes = 10
    inputs = "28x28 images"
    difficulty = "rotation"
    uses_protocol = True
    reads = ("train_rotation", "val_size", "train_size")

    # training -----------------------------------------------------------------------------

    def load_training(self, data_dir, download: bool):
        from ..data import load_mnist, train_val_split

        full = load_mnist(data_dir, train=True, download=download)
        return train_val_split(full, val_size=self.cfg.val_size, train_size=self.cfg.train_size, seed=self.cfg.seed)

    def to_device(self, data, device):
        return data.to(device)

    def training_source(self, data, device) -> TrainingSource:
        return ImageBatches(data, self.cfg)

    def validate(self, model, data, amp: bool):
        from ..evaluate import evaluate
        return evaluate(model, data, self.cfg, max_angle=self.cfg.train_rotation, seed=self.cfg.seed, amp=amp)

    def describe(self, train_data, val_data) -> str:
        return f"on {len(train_data)} images, validating on {len(val_data)}"

    def view(self):
        from ..reports import mnist_view
        return mnist_view(self.cfg)

    # evaluation ---------------------------------------------------------------------------

    def default_buckets(self, command: str) -> list[float]:
        if command == "calibrate":  # the validation images as training rotated them
            return [self.cfg.train_rotation]
        return list(EVAL_ANGLES if command == "eval" else EXTRAPOLATION_ANGLES)

    def parse_buckets(self, angles: Optional[list], counts: Optional[list], command: str) -> list[float]:
        if counts is not None:
            raise PonderError("--counts applies to parity checkpoints; this one is an mnist model: "
                              "give --angles DEG...")
        if angles is None:
            return self.default_buckets(command)
        from ..api import parse_angles
        return parse_angles([str(a) for a in angles])

    def test_data(self, options, device):
        from ..api import _data_dir
        from ..data import load_mnist

        test = load_mnist(_data_dir(options.data_dir), train=False, download=options.download)
        return (test.subset(slice(0, options.limit)) if options.limit else test).to(device)

    def validation_data(self, options, device):
        """The held-out training images (data.train_val_split with the run's seed), the first
        --limit of them: what training validated on, for calibrate."""
        from ..api import _data_dir

        _, held_out = self.load_training(_data_dir(options.data_dir), options.download)
        return (held_out.subset(slice(0, options.limit)) if options.limit else held_out).to(device)

    def bucket(self, data, spec: float, specs: list, max_steps: int, seed: int, protocol: str):
        from ..evaluate import image_bucket

        lower = max((a for a in specs if a < spec), default=0.0)  # the band protocol's inner edge
        return image_bucket(data, max_steps, spec, seed, protocol=protocol, lower=lower)

    def bucket_fields(self, spec: float, protocol: str) -> dict:
        return {"rotation": spec, "protocol": protocol}

    def sweep_specs(self, start: Optional[float], stop: Optional[float], every: Optional[float]) -> list[float]:
        """Exact angles --from..--to every --every degrees (default 0 to 180 every 5)."""
        from ..api import check_angle

        start, stop, every = (0.0 if start is None else start, 180.0 if stop is None else stop,
                              5.0 if every is None else every)
        check_angle(start, "--from"), check_angle(stop, "--to")
        if not every > 0 or stop < start:
            raise PonderError(f"the sweep needs --from <= --to and --every > 0 (got {start:g}, {stop:g}, {every:g})")
        count = int((stop - start) / every + 1e-9) + 1
        if count > 400:
            raise PonderError(f"{count} angles is too many for one sweep; use a larger --every")
        return [start + i * every for i in range(count)]

    def bucket_label(self, bucket: dict) -> str:
        return f"±{bucket['rotation']:g}°"
