"""Checkpoints: plain dicts of tensors and Python values, written atomically, loaded safely."""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import warnings
from pathlib import Path

import torch

from . import PonderError
from .config import PonderConfig
from .model import PonderNet

FORMAT = "ponder_cli"
VERSION = 1
REQUIRED_KEYS = ("format", "version", "config", "model", "epoch")
BEST, LAST = "best.pt", "last.pt"


def save_checkpoint(payload: dict, path: Path) -> None:
    """Temp file in the same directory, flushed and fsynced, then os.replace: never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600 files; a checkpoint is an ordinary file
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, "version": VERSION, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path | str, map_location="cpu") -> dict:
    """Load with weights_only=True: a file carrying pickled code is refused, never executed."""
    path = Path(path)
    if not path.exists():
        raise PonderError(f"checkpoint {path} does not exist (train one with `ponder train`)")
    if path.is_dir():
        raise PonderError(f"checkpoint {path} is a directory, not a file")
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols before failing
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        # weights_only refuses any pickled global (a class or function to call) before running it
        found = re.search(r"GLOBAL\s+([\w.]+)", str(exc), flags=re.IGNORECASE)
        if found:
            raise PonderError(f"checkpoint {path} refused: it contains pickled code ({found.group(1)}), "
                              "not just tensors and plain values") from None
        raise PonderError(f"checkpoint {path} is not a readable checkpoint (corrupt data)") from None
    except Exception as exc:  # truncated, empty, not a torch file at all
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PonderError(f"checkpoint {path} is not a readable checkpoint ({reason})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise PonderError(f"{path} is not a ponder_cli checkpoint")
    if ckpt.get("version") != VERSION:
        raise PonderError(f"checkpoint {path} has format version {ckpt.get('version')!r}; "
                          f"this ponder_cli reads version {VERSION}")
    missing = [key for key in REQUIRED_KEYS if key not in ckpt]
    if missing:
        raise PonderError(f"checkpoint {path} is missing {', '.join(missing)}")
    return ckpt


def config_of(ckpt: dict, path: Path | str = "checkpoint") -> PonderConfig:
    try:
        return PonderConfig.from_dict(ckpt["config"])
    except (PonderError, TypeError, AttributeError) as exc:
        raise PonderError(f"checkpoint {path} has an incompatible config: {exc}") from None


def load_model(path: Path | str, device) -> tuple[PonderNet, PonderConfig, dict]:
    """Rebuild the model from the config stored in the checkpoint itself."""
    ckpt = load_checkpoint(path)
    cfg = config_of(ckpt, path)
    model = PonderNet(cfg)
    try:
        model.load_state_dict(ckpt["model"])
    except (RuntimeError, TypeError, AttributeError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise PonderError(f"checkpoint {path}: weights do not match its config ({reason})") from None
    return model.to(device).eval(), cfg, ckpt
