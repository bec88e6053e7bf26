"""The MNIST task: digits, 10 classes; difficulty is the rotation of the test images.

Training images are the seeded split of MNIST's training set (train_val_split), reshuffled every
epoch and rotated uniformly within +-train_rotation; validation rotates the held-out images the
same way with the run's seed; evaluation buckets are angles under a protocol (protocol_angles)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from .. import BadValue, PonderError, PonderWarning, brief, distributed
from ..config import PonderConfig, default_halting
from ..evaluate import EvalBucket, EvalResult, evaluate_bucket
from ..registry import EVAL_ANGLES, EXTRAPOLATION_ANGLES, PROTOCOLS
from . import STDIN, TrainingSource, UserInputs, check_input_file, load_inputs, numbered, uniforms
from .declared import Mnist

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
SIDE = 28  # MNIST's images are 28x28...
BOX = 20  # ...with the digit's ink scaled to fit 20x20, centred by its centre of mass
MAX_ANGLE = 180.0  # degrees: rotating by more than +-180 repeats angles already covered
LIGHT_BORDER = 0.5  # a border brighter than this on average: a dark digit on a light background
INK = 0.1  # pixels at least this bright (of the brightest) belong to the digit's bounding box



def default_data_dir() -> Path:
    """$PONDER_DATA_DIR, else a per-user cache directory."""
    if os.environ.get("PONDER_DATA_DIR"):
        return Path(os.environ["PONDER_DATA_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ponder_cli"


def resolve_data_dir(data_dir: Path | None) -> Path:
    return data_dir if data_dir is not None else default_data_dir()


@dataclass(frozen=True)
class ImageSet:
    images: torch.Tensor  # (N, 28, 28) uint8
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device) -> "ImageSet":
        return ImageSet(self.images.to(device), self.labels.to(device))

    def subset(self, index) -> "ImageSet":
        return ImageSet(self.images[index], self.labels[index])


def read_idx(path: Path) -> torch.Tensor:
    """One IDX file of unsigned bytes (MNIST's format) as a uint8 tensor, with its header checked."""
    data = Path(path).read_bytes()
    if len(data) < 4 or data[:3] != b"\x00\x00\x08" or not 1 <= data[3] <= 4:
        raise PonderError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    header = 4 + 4 * data[3]
    if len(data) < header:
        raise PonderError(f"{path} is truncated (incomplete header)")
    dims = struct.unpack(f">{data[3]}I", data[4:header])
    if len(data) - header != math.prod(dims):
        raise PonderError(f"{path} is truncated or padded: {len(data) - header} bytes of data for shape "
                          f"{'x'.join(map(str, dims))} ({math.prod(dims)} expected)")
    if not math.prod(dims):  # torch.frombuffer refuses an empty buffer
        return torch.empty(dims, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).view(*dims)


def _download(root: Path, train: bool) -> None:
    from torchvision.datasets import MNIST  # slow to import: only when a download is needed

    with contextlib.redirect_stdout(sys.stderr):  # torchvision's progress: stdout belongs to results
        MNIST(str(root), train=train, download=True)


def load_mnist(data_dir: Path | str, *, train: bool, download: bool = True) -> ImageSet:
    """The whole training (60k) or test (10k) set from torchvision's layout, downloaded when absent."""
    root = Path(data_dir).expanduser()
    raw = root / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    image_file, label_file = raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"
    if root.exists() and not root.is_dir():
        raise PonderError(f"data directory {root} is not a directory")
    for path in (image_file, label_file):
        if path.is_dir():  # not a missing file: no download would help
            raise PonderError(f"{path} is a directory, not an IDX file; put MNIST's {path.name} file there")
    if not (image_file.is_file() and label_file.is_file()):
        reason = "not found"
        if download:
            created = None if raw.exists() else raw  # the topmost directory a download would create
            while created is not None and not created.parent.exists():
                created = created.parent
            try:
                _download(root, train)
            except Exception as exc:  # offline, unwritable directory, server down
                if created is not None:  # leave no half-made directory behind
                    shutil.rmtree(created, ignore_errors=True)
                detail = brief(" ".join(str(exc).split()).rsplit("got: ", 1)[-1] or type(exc).__name__, 120)
                reason = f"not found and could not be downloaded ({detail})"
        if not (image_file.is_file() and label_file.is_file()):
            raise PonderError(f"MNIST {reason} in {raw}; put the four IDX files {', '.join(RAW_FILES)} "
                              "there (uncompressed), or point --data-dir / PONDER_DATA_DIR at the "
                              "directory that holds MNIST/raw")
    try:
        images, labels = read_idx(image_file), read_idx(label_file)
    except OSError as exc:
        raise PonderError(f"cannot read MNIST in {raw}: {exc.strerror or exc}") from None
    if images.dim() != 3 or tuple(images.shape[1:]) != (SIDE, SIDE) or labels.shape != images.shape[:1]:
        raise PonderError(f"MNIST files in {raw} do not hold N 28x28 images and N labels "
                          f"(images {tuple(images.shape)}, labels {tuple(labels.shape)})")
    if images.shape[0] == 0:
        raise PonderError(f"{image_file} holds no images")
    if int(labels.max()) > 9:
        raise PonderError(f"{label_file} holds labels outside 0-9")
    return ImageSet(images, labels.long())


def train_val_split(full: ImageSet, *, val_size: int, train_size: int, seed: int) -> tuple[ImageSet, ImageSet]:
    """Seeded split into training and held-out validation images (train_size 0: all the rest)."""
    available = len(full) - val_size
    if available <= 0:
        raise BadValue(f"val-size {val_size} leaves no training images out of {len(full)}")
    if train_size > available:
        raise BadValue(f"train-size {train_size} exceeds the {available} images left after validation")
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(seed))
    return full.subset(order[val_size:val_size + (train_size or available)]), full.subset(order[:val_size])


def split_seed(cfg) -> int:
    """The seed of a run's held-out split: its --split-seed (carried by --init-from), else its --seed."""
    return cfg.training.seed if cfg.task.split_seed is None else cfg.task.split_seed


def prepare_batch(images: torch.Tensor, angles: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (B, 28, 28) -> normalised float (B, 1, 28, 28), rotated first when angles are given:
    rotating the raw pixels with zero fill, then normalising, is RandomRotation -> ToTensor -> Normalize."""
    x = images.unsqueeze(1).float()
    if angles is not None:
        x = rotate(x, angles)
    return (x / 255 - MNIST_MEAN) / MNIST_STD


def rotate(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image counter-clockwise by its angle in degrees: (B, C, H, W) float, (B,).

    torchvision rotates one angle per call; this builds the sampling grid of its tensor `rotate`
    (nearest, zero fill, no expand) for a whole batch and runs one grid_sample: pixel-identical.
    """
    batch, _, height, width = images.shape
    device = images.device
    # torchvision's inverse affine matrix [d, -b, 0, -c, a, 0] (a = d = cos, b = -sin, c = sin),
    # in float64 before the cast as there, so the float32 matrices agree bit for bit
    rot = torch.deg2rad(-angles.to(device, torch.float64))
    cos, sin, zeros = torch.cos(rot), torch.sin(rot), torch.zeros_like(rot)
    theta = torch.stack([cos, sin, zeros, -sin, cos, zeros], dim=1).view(-1, 2, 3).to(torch.float32).transpose(1, 2)
    # divided by Python numbers: a tensor made from a list is copied to the device, and on CUDA
    # that copy makes the host wait, for every training batch
    rescaled = torch.stack([theta[..., 0] / (0.5 * width), theta[..., 1] / (0.5 * height)], dim=-1)
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=device)  # pixel centres about the centre
    base[..., 0].copy_(torch.linspace(-width * 0.5 + 0.5, width * 0.5 - 0.5, steps=width, device=device))
    base[..., 1].copy_(torch.linspace(-height * 0.5 + 0.5, height * 0.5 - 0.5, steps=height, device=device).unsqueeze(-1))
    base[..., 2].fill_(1)
    grid = torch.bmm(base.view(1, height * width, 3).expand(batch, -1, -1), rescaled).view(batch, height, width, 2)
    return F.grid_sample(images, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def uniform_angles(count: int, max_angle: float, *, generator: torch.Generator | None = None,
                   device=None) -> torch.Tensor:
    """(count,) angles drawn uniformly from [-max_angle, max_angle] degrees."""
    return (2 * torch.rand(count, generator=generator, device=device) - 1) * max_angle


def protocol_angles(draws: torch.Tensor, angle: float, protocol: str = "uniform", *,
                    lower: float = 0.0) -> torch.Tensor:
    """(N,) test rotations (float64: the same on every CPU) from two uniforms per image (N, 2), the
    turn's size and sign. uniform: within +-angle; band: |rotation| between the previous bucket's
    angle `lower` and `angle`, so buckets do not overlap; fixed: exactly +-angle."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}")
    u, sign = draws[:, 0].double(), torch.where(draws[:, 1] < 0.5, -1.0, 1.0).double()
    if protocol == "uniform":
        return (2 * u - 1) * angle
    if protocol == "band":
        return sign * (lower + u * (angle - lower))
    return sign * angle


def band_lower(angle: float, angles: list) -> float:
    """The band protocol's inner edge of `angle`'s bucket: the largest angle below it, else 0."""
    return max((a for a in angles if a < angle), default=0.0)


def check_angle(angle: float, what: str) -> float:
    if not math.isfinite(angle):
        raise BadValue(f"{what} must be a finite number of degrees (got {angle})")
    if not 0 <= angle <= MAX_ANGLE:
        raise BadValue(f"{what} must be between 0 and {MAX_ANGLE:g} degrees: images are rotated within "
                       f"+-angle (got {angle:g})")
    return angle + 0.0  # -0 is 0: the same bucket, named and drawn alike


def parse_angles(texts: list[str], what: str = "--angles") -> list[float]:
    angles = []
    for text in texts:
        try:
            angles.append(check_angle(float(text), what))
        except ValueError:
            raise BadValue(f"{what}: {text!r} is not a number of degrees") from None
    if not angles:
        raise PonderError(f"{what} needs at least one angle")
    return angles


def bucket_key(angle: float, protocol: str, lower: float = 0.0) -> tuple:
    """What names a bucket's draws (tasks.uniforms): its protocol, angle and, under band, inner edge."""
    return (protocol, float(angle), *((float(lower),) if protocol == "band" else ()))


def evaluation_draws(count: int, max_steps: int, angle: float, seed: int, device, *,
                     protocol: str = "uniform", lower: float = 0.0) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Images 0..count-1's rotations (N,) float64 (None: none rotated) and halting uniforms (steps, N)
    float32, each image's from (seed, bucket, index) alone: a --limit evaluation is the first images
    of the full one, whatever the device, batch or halting rule."""
    index, key = torch.arange(count), bucket_key(angle, protocol, lower)
    angles = protocol_angles(uniforms(seed, "rotation", key, index, 2), angle, protocol, lower=lower)
    coins = uniforms(seed, "coins", key, index, max_steps, torch.float32).T.contiguous()
    rotated = bool(angles.abs().max() > 0) if count else False
    return (angles.to(device) if rotated else None), coins.to(device)


def image_bucket(data: ImageSet, max_steps: int, angle: float, seed: int, protocol: str = "uniform",
                 lower: float = 0.0) -> EvalBucket:
    angles, coins = evaluation_draws(len(data), max_steps, angle, seed, data.images.device, protocol=protocol,
                                     lower=lower)
    return EvalBucket(
        labels=data.labels, uniforms=coins,
        inputs=lambda start, end: prepare_batch(data.images[start:end], None if angles is None else angles[start:end]),
        difficulty=angles.abs().cpu() if angles is not None else torch.zeros(len(data), dtype=torch.float64))


def evaluate(model: torch.nn.Module, data: ImageSet, cfg: PonderConfig, *, max_angle: float = 0.0,
             seed: int = 0, protocol: str = "uniform", lower: float = 0.0, **options) -> EvalResult:
    """Images rotated within +-max_angle (see evaluate.evaluate_bucket for the options)."""
    return evaluate_bucket(model, image_bucket(data, model.max_steps, max_angle, seed, protocol, lower), cfg, **options)


# The user's own images (`ponder predict`); Pillow only here, never loaded for training or evaluation

def _gray(path):
    """An image file as float pixels (H, W) in [0, 1], whatever its mode; transparency composited onto white."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow's guard against decompression bombs (a few hundred KB that decode to
            # gigabytes) only warns below twice its limit: here every image over it is refused
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(path)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise PonderError(f"{path}: refused, an image of more than {Image.MAX_IMAGE_PIXELS:,} pixels (Pillow's guard "
                          f"against decompression bombs); scale it down, a digit needs few pixels") from None
    except UnidentifiedImageError:
        raise PonderError(f"{path}: not an image file Pillow can read (PNG, JPEG, ...) nor a .npy array") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise PonderError(f"{path}: cannot read the image ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        with image:
            image = ImageOps.exif_transpose(image)  # a photo as the camera held it
            if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
                pixels = np.asarray(image, dtype=np.float64)
                top = 65535.0 if image.mode != "F" and pixels.max() > 255 else (1.0 if pixels.max() <= 1 else 255.0)
                return np.clip(pixels / top, 0, 1)
            if image.mode in ("RGBA", "LA", "PA", "P") or "transparency" in image.info:
                white = Image.new("RGBA", image.size, (255, 255, 255, 255))
                image = Image.alpha_composite(white, image.convert("RGBA"))
            return np.asarray(image.convert("L"), dtype=np.float64) / 255
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt image data
        raise PonderError(f"{path}: cannot read the image ({getattr(exc, 'strerror', None) or exc})") from None


def frame_like_mnist(ink):
    """A bright digit on a dark background (H, W) in [0, 1] of any size -> 28x28 as MNIST framed
    its digits: the border's median taken off and the contrast stretched, the ink's bounding box
    scaled to fit 20x20 keeping its aspect, its centre of mass at the image's centre."""
    from PIL import Image

    border = np.concatenate([ink[0, :], ink[-1, :], ink[:, 0], ink[:, -1]])
    ink = np.clip(ink - np.median(border), 0, None)
    if ink.max() <= 0:
        return np.zeros((SIDE, SIDE))
    ink = ink / ink.max()
    rows, cols = np.nonzero(ink >= INK)
    ink = ink[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    height, width = ink.shape
    scale = BOX / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    box = np.clip(np.asarray(Image.fromarray(ink.astype(np.float32), mode="F").resize(size, Image.LANCZOS)), 0, 1)
    total = box.sum()
    if total <= 0:
        return np.zeros((SIDE, SIDE))
    ys, xs = np.indices(box.shape)
    top = int(np.clip(round((SIDE - 1) / 2 - (ys * box).sum() / total), 0, SIDE - box.shape[0]))
    left = int(np.clip(round((SIDE - 1) / 2 - (xs * box).sum() / total), 0, SIDE - box.shape[1]))
    framed = np.zeros((SIDE, SIDE))
    framed[top:top + box.shape[0], left:left + box.shape[1]] = box
    return framed


def read_images(paths, invert=None, rotate=None):
    """Image files (anything Pillow reads; any size and mode) and .npy arrays (N, 28, 28) -> names
    and inputs (N, 1, 28, 28) prepared as MNIST's (prepare_batch). Grayscale in [0, 1]; a light
    border (a dark digit on a light background) is inverted unless `invert` decides; other sizes
    than 28x28 framed as MNIST's digits were; `rotate`: degrees, counter-clockwise."""
    names, images = [], []
    for path in paths:
        check_input_file(path, "image files or .npy arrays")
        if path.suffix.lower() == ".npy":  # uint8 (or any values above 1) read as 0-255, else 0-1
            array = load_inputs(path, (SIDE, SIDE), "28x28 images").astype(np.float64)
            if not np.isfinite(array).all() or array.min() < 0 or array.max() > 255:
                raise PonderError(f"{path}: pixel values must be finite, in 0-1 or 0-255 (got {array.min():g} to "
                                  f"{array.max():g})")
            found = list(array / 255 if array.max() > 1 else array)
        else:
            found = [_gray(path)]
        for label, pixels in zip(numbered(path, len(found)), found):
            border = [pixels[0, :], pixels[-1, :], pixels[:, 0], pixels[:, -1]]
            light = float(sum(b.sum() for b in border) / sum(b.size for b in border)) > LIGHT_BORDER
            pixels = 1 - pixels if (light if invert is None else invert) else pixels
            if pixels.shape != (SIDE, SIDE):
                pixels = frame_like_mnist(pixels)
            image = np.round(pixels * 255)  # MNIST's 256 levels: a 28x28 PNG reads back exactly
            if image.min() == image.max():  # predicted all the same
                warnings.warn(f"{label} is blank: all its pixels are {image.flat[0]:g} (of 255) as the model reads "
                              f"it, so its prediction means nothing", PonderWarning)
            names.append(label)
            images.append(image)
    raw = torch.from_numpy(np.stack(images)).float()  # (N, 28, 28) on the 0-255 scale of MNIST's bytes
    # a turn by whole circles changes nothing; taken off exactly here, it cannot overflow float32
    angles = None if not rotate else torch.full((raw.shape[0],), math.fmod(float(rotate), 360.0))
    return names, prepare_batch(raw, angles)


class ImageBatches(TrainingSource):
    """An epoch: a fresh permutation of the training images (torch's shared stream, the same on
    every rank) in whole batches, each image rotated within +-train_rotation (this rank's stream).
    The last, partial batch is dropped (other images every epoch); a set smaller than a batch is one."""

    graph_safe = True

    def __init__(self, data, cfg):
        self.data, self.cfg = data, cfg
        # a global batch splits evenly over the ranks under torchrun
        self.batch_size = min(cfg.training.batch_size, distributed.even_length(len(data)))
        share = self.batch_size // distributed.world_size()
        self.rows = torch.zeros(share, dtype=torch.long, device=data.images.device)  # the staged batch

    def start_epoch(self) -> int:
        self.order = torch.randperm(len(self.data), device=self.data.images.device)  # (N,)
        return len(self.data) // self.batch_size

    def stage(self, index: int) -> None:
        start = index * self.batch_size
        self.rows.copy_(distributed.shard(self.order[start:start + self.batch_size]))  # this rank's slice

    def batch(self):
        rotation = self.cfg.task.train_rotation
        angles = uniform_angles(self.rows.shape[0], rotation, device=self.rows.device) if rotation > 0 else None
        return prepare_batch(self.data.images[self.rows], angles), self.data.labels[self.rows]


class MnistTask(Mnist):
    input_shape = (1, SIDE, SIDE)

    def load_training(self, data_dir, download: bool):
        full = load_mnist(data_dir, train=True, download=download)
        return train_val_split(full, val_size=self.cfg.task.val_size, train_size=self.cfg.task.train_size,
                               seed=split_seed(self.cfg))

    def to_device(self, data, device):
        return data.to(device)

    def training_source(self, data, device) -> TrainingSource:
        return ImageBatches(data, self.cfg)

    def validate(self, model, data, amp: bool):
        return evaluate(model, data, self.cfg, max_angle=self.cfg.task.train_rotation, seed=self.cfg.training.seed,
                        amp=amp, halting=default_halting(self.cfg))

    def describe(self, train_data, val_data) -> str:
        return f"on {len(train_data)} images, validating on {len(val_data)}"

    def run_name_prefix(self) -> str:
        return ""  # the first task: its runs are <method>-<step>-seed<seed>

    def read_inputs(self, paths, options):
        if any(str(path) == STDIN for path in paths):  # images are files; vectors are text (parity)
            raise BadValue(f"{STDIN} (standard input) holds the vectors of parity models; this MNIST model reads "
                           "image files or .npy arrays: name them")
        return UserInputs(*read_images(paths, invert=options.invert, rotate=options.rotate))

    def default_buckets(self, command: str) -> list[float]:
        if command == "calibrate":  # the validation images as training rotated them
            return [self.cfg.task.train_rotation]
        return list(EVAL_ANGLES if command == "eval" else EXTRAPOLATION_ANGLES)

    def parse_specs(self, texts: list, option: str) -> list[float]:
        return parse_angles(texts, option)

    def test_data(self, options, device):
        test = load_mnist(resolve_data_dir(options.data_dir), train=False, download=options.download)
        return test.subset(slice(options.limit or None)).to(device)  # --limit 0: all of them

    def calibration_data(self, options, device):
        """The first --limit held-out training images: MNIST has no other held-out digits (these chose the
        best epoch); calibrate rotates them, and flips coins, from a stream of its own."""
        _, held_out = self.load_training(resolve_data_dir(options.data_dir), options.download)
        return held_out.subset(slice(options.limit or None)).to(device)

    def more_calibration(self, options) -> str:
        draws = f"--repeats {max(2, 2 * options.repeats)} (more rotations and coins of these digits, pooled)"
        if options.limit:  # the held-out digits left out first
            return f"--limit 0 (every one of the {self.cfg.task.val_size} held-out digits), or {draws}"
        return f"{draws}, or a run holding out more digits (--val-size at training)"

    def order_buckets(self, specs: list, protocol) -> list:
        # a band runs from the angle below it: ascending, so that each row follows the band it adjoins
        return sorted(specs) if protocol == "band" else specs

    def bucket(self, data, spec: float, specs: list, max_steps: int, seed: int, protocol: str, *, draw: int = 0):
        return image_bucket(data, max_steps, spec, seed, protocol, band_lower(spec, specs))

    def bucket_fields(self, spec: float, protocol: str, specs: list) -> dict:
        """The angle and protocol; under band its edges too (`band`: [45, 90], shown as `45–90`)."""
        band = {"band": [band_lower(spec, specs), spec]} if protocol == "band" else {}
        return {"rotation": spec, "protocol": protocol, **band}

    def sweep_specs(self, start: Optional[float], stop: Optional[float], every: Optional[float]) -> list[float]:
        """Exact angles --from..--to every --every degrees (default 0 to 180 every 5)."""
        start = check_angle(0.0 if start is None else start, "--from")
        stop, every = check_angle(180.0 if stop is None else stop, "--to"), 5.0 if every is None else every
        if not every > 0 or stop < start:
            raise BadValue(f"the sweep needs --from <= --to and --every > 0 (got {start:g}, {stop:g}, {every:g})")
        count = int((stop - start) / every + 1e-9) + 1
        if count > 400:
            raise BadValue(f"{count} angles is too many for one sweep; use a larger --every")
        return [start + i * every for i in range(count)]
