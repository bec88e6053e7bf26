"""The run folder, read and moved without torch (the CLI and the listings read it before torch,
or never import it): its files' names, the shipped models (package data, found through
importlib.resources: one file there and one line in SHIPPED ships another), which file a
CHECKPOINT names, a run's labels and record, a checkpoint read without its weights, the lock,
finding the runs below a folder, and the trash."""

from __future__ import annotations

import array
import collections
import contextlib
import io
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Iterable, Optional, Union

from . import BadValue, PonderError, brief, file_problem, keeping, uninterrupted
from .registry import AT_CHANCE, FORMAT_VERSION, TIME_LIMIT, TORCH_LOAD, loaded

if TYPE_CHECKING:
    from .config import PonderConfig

RUNS_DIR = Path("runs")
BEST, LAST = "best.pt", "last.pt"
CHECKPOINT_FILES = (BEST, LAST)  # what `ponder train` writes into its folder
CONFIG_FILE, METRICS_FILE = "config.json", "metrics.csv"  # beside them, readable without torch
CONFIG_TOML = "config.toml"  # the settings as `ponder train --config` reads them
ENVIRONMENT_FILE = "environment.json"  # what the run ran on (runs.py)
LATEST = "latest"  # the CHECKPOINT word for the newest run under runs/
LOCK_FILE = ".ponder.lock"
TRASH = ".trash"  # where `ponder runs rm` moves a run: beside it (one file system), hidden from listings
TRASH_NOTE, ENTRY_RUN = "trashed.json", "run"  # in each trash entry: where its run was, and the run folder
TENSORBOARD_EVENTS = "events.out.tfevents.*"  # what `train --tensorboard` writes (runs.py)
BESIDE_CHECKPOINTS = (CONFIG_FILE, CONFIG_TOML, METRICS_FILE, ENVIRONMENT_FILE)  # nothing lost if a run dies early
# every file a run writes into its folder: a folder holding any of them is not a fresh one
RUN_FILES = (*CHECKPOINT_FILES, *BESIDE_CHECKPOINTS)


# the shipped models -------------------------------------------------------------------------

SHIPPED_FOLDER = "checkpoints"  # inside the package; also how the README's older commands spell them

# name -> (file under ponder_cli/checkpoints/, what it is)
SHIPPED = {
    "reference": ("best.pt", "pondernet · step mlp · trained within ±22.5°"),
    "interpolation": ("interpolation/best.pt", "pondernet · step mlp · trained on unrotated digits"),
    "align": ("align/best.pt", "pondernet · step align · trained within ±22.5°"),
    "parity16": ("parity/interpolation16.pt", "pondernet · step gru · parity of 16 elements · counts 1-16"),
    "parity16-extrapolation": ("parity/extrapolation16.pt", "pondernet · step gru · parity of 16 elements · trained "
                                                           "on counts 1-8"),
    "parity16-extrapolation-act": ("parity/extrapolation16-act.pt", "act · step gru · parity of 16 elements · trained "
                                                                   "on counts 1-8"),
    "parity32": ("parity/interpolation32.pt", "pondernet · step gru · parity of 32 elements · counts 1-32"),
    "parity64": ("parity/interpolation64.pt", "pondernet · step gru · parity of 64 elements · counts 1-64 · "
                                              "entries as x and x²"),
    "parity64-prefix": ("parity/interpolation64-prefix.pt", "pondernet · step gru · parity of 64 elements · "
                                                            "counts 1-64 · prefix layout"),
}
DEFAULT = "reference"


def shipped_dir() -> Path:
    return Path(str(resources.files("ponder_cli").joinpath(SHIPPED_FOLDER)))


def shipped_path(name: str) -> Path:
    return shipped_dir() / SHIPPED[name][0]


def package_dir() -> Path:
    """Where the ponder_cli package really is (a clone, site-packages): no command writes there."""
    import ponder_cli
    return Path(ponder_cli.__file__).resolve().parent


def inside_package(path: Path) -> bool:
    here, package = Path(path).resolve(), package_dir()
    return here == package or package in here.parents


def package_problem(path: Path, what: str) -> Optional[str]:
    """Why `what` (an option and its value) may not write to `path`, or None; the caller adds
    what to do instead."""
    if not inside_package(path):
        return None
    here, shipped = Path(path).resolve(), shipped_dir().resolve()
    models = ", among the shipped models" if here == shipped or shipped in here.parents else ""
    return f"{what} is inside the installed ponder_cli package ({package_dir()}){models}, where no command writes"


def shipped_name(path: Path) -> Optional[str]:
    return next((name for name in SHIPPED if path.resolve() == shipped_path(name).resolve()), None)


# what a researcher calls a run ----------------------------------------------------------------

LABEL_CHARACTERS = 200  # a name, a tag or a note longer than this is a mistake (a pasted file?)


@dataclass(frozen=True)
class Labels:
    """A run's name, tags and note (`ponder train --name --tag --note`, `ponder runs label`), kept
    in its record but no setting: they change nothing the model learns, so resuming keeps them."""
    name: Optional[str] = None
    tags: tuple = ()
    note: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", tuple(dict.fromkeys(self.tags)))  # each once, in the order given
        for option, text in (("--name", self.name), *(("--tag", tag) for tag in self.tags), ("--note", self.note)):
            if text is None:
                continue
            if not text.strip() or not text.isprintable() or len(text) > LABEL_CHARACTERS:
                raise BadValue(f"{option} {text!r}: give one line of printable text, {LABEL_CHARACTERS} "
                               f"characters at most")
            if option == "--tag" and any(char in text for char in " ,;="):
                raise BadValue(f"{option} {text!r}: a tag is one word (no space, comma, semicolon or =); repeat "
                               f"--tag for several")

    @classmethod
    def of(cls, saved: Optional[dict]) -> "Labels":
        """A run's labels from its record (none where it holds none, or holds them garbled)."""
        labels = saved.get("labels") if isinstance(saved, dict) else None
        try:
            return cls(labels.get("name"), tuple(labels.get("tags") or ()), labels.get("note"))
        except (PonderError, TypeError, AttributeError):
            return cls()

    def updated(self, given: "Labels", untag: tuple = ()) -> "Labels":
        """A name or note given replaces its own, tags given are added, those in `untag` removed."""
        return Labels(given.name if given.name is not None else self.name,
                      tuple(tag for tag in (*self.tags, *given.tags) if tag not in untag),
                      given.note if given.note is not None else self.note)

    def to_dict(self) -> dict:
        return {"name": self.name, "tags": list(self.tags), "note": self.note}


# a checkpoint file read without torch ---------------------------------------------------------

# How torch.save's files begin: a zip archive (since PyTorch 1.6), or a pickle (the legacy format).
_ZIP_MAGIC = b"PK\x03\x04"
DAMAGE_HINT = "copy it again, or use the run's other checkpoint (best.pt or last.pt)"


def damage(path: Path) -> str | None:
    """How a file in torch's zip format is broken, said before torch.load, whose own words never
    say the file is cut short: no zip end (an interrupted copy), or a member failing its CRC-32
    (every member is read: megabytes, milliseconds). None for a legacy pickle or a whole archive."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != _ZIP_MAGIC:
                return None
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile:
        return f"cut short or damaged: its zip archive has no end (an interrupted copy or download?); {DAMAGE_HINT}"
    except (OSError, EOFError, ValueError, NotImplementedError) as exc:  # unreadable, or a member cut short
        return f"cut short or damaged ({brief(exc)}); {DAMAGE_HINT}"
    if bad is not None:
        return f"damaged: {bad} fails its checksum (the file changed after it was written); {DAMAGE_HINT}"
    return None


def not_a_torch_file(path: Path) -> str | None:
    """What a file torch.save cannot have written looks like ("an empty file", "a text file"), or
    None when it may be one (torch.load then has the last word)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None  # torch.load reports it
    if not head:
        return "an empty file"
    if head.startswith((_ZIP_MAGIC, b"\x80")):
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # a character cut by the 512-byte read is no sign of a binary file
        text = head[:exc.start].decode("utf-8") if exc.start >= len(head) - 3 else "\0"
    return "a text file" if all(c.isprintable() or c.isspace() for c in text) else "a file PyTorch did not write"


class _Tensor:
    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _Tensor()  # a tensor of a checkpoint read by peek_checkpoint: its data left unread
_SAFE_GLOBALS = {("collections", "OrderedDict"): collections.OrderedDict, ("builtins", "set"): set,
                 ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice}


def _data_prefix(archive: zipfile.ZipFile) -> Optional[str]:
    """The folder of torch.save's zip file that holds its data.pkl, None where there is none."""
    return next((name[:-len("/data.pkl")] for name in archive.namelist()
                 if name.endswith("/data.pkl") and name.count("/") == 1), None)


def peek_checkpoint(path: Path) -> Optional[dict]:
    """The dict a checkpoint holds, its tensors TENSOR, from its small data.pkl alone (what
    `ponder runs` and `models` list, without torch). None for torch's legacy format; a file that
    cannot be read so is one PonderError."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != _ZIP_MAGIC:
                return None
        with zipfile.ZipFile(path) as archive:
            prefix = _data_prefix(archive)
            payload = None if prefix is None else _Reader(archive, prefix, lenient=True).load()
    except Exception as exc:  # cut short (no zip end), a CRC that fails, a pickle torch never wrote
        raise PonderError(f"checkpoint {path} is cut short or damaged ({brief(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or not isinstance(
            payload.get("config"), dict):
        raise PonderError(f"{path} is not a ponder_cli checkpoint")
    return payload


# a checkpoint's training state, every key checked ------------------------------------------------

FORMAT = "ponder_cli"
# 2: the step function became a module of its own (weights under "step."); 1 is read and upgraded
VERSION = 2
READABLE_VERSIONS = (1, 2)
_V1_PREFIXES = {"encoder.": "step.encoder.", "step_mlp.": "step.mlp."}
# what each optional key must hold (absent or None in checkpoints never meant to be resumed)
_KINDS = {"best_epoch": (int, "an integer"), "epochs_without_improvement": (int, "an integer"),
          "best_accuracy": ((int, float), "a number"), "history": (list, "a list"), "optimizer": (dict, "a dict"),
          "scheduler": (dict, "a dict"), "scaler": (dict, "a dict"), "rng": (dict, "a dict"),
          "stop_reason": (str, "a string"), "run": (dict, "a dict")}
RESUMING = ("optimizer", "scheduler", "scaler", "rng")  # what a resume needs beside the weights


@dataclass
class TrainingState:
    """Everything a run needs to be evaluated (config, model, epoch) or resumed (the rest)."""
    config: "PonderConfig"
    model: dict  # state_dict of the model
    epoch: int  # the last completed epoch
    optimizer: dict | None = None
    scheduler: dict | None = None
    scaler: dict | None = None
    best_accuracy: float = -1.0
    best_epoch: int = 0
    epochs_without_improvement: int = 0
    history: list = field(default_factory=list)  # one dict per epoch (train.EpochStats fields)
    rng: dict | None = None  # {"torch": ByteTensor, "cuda": the training GPU's (older: a list, every GPU's)}
    stop_reason: str | None = None  # "time limit" (short of its epochs, to be resumed) or "at chance"
    # the run's record beside its settings (folders.run_record): its labels, the weights it
    # started from, --amp; a copied best.pt keeps them
    run: dict | None = None

    @property
    def stopped_early(self) -> bool:
        """Early stopping ended the run before its planned epochs: patience ran out with epochs
        still to train (running out at the last epoch itself, the run simply finished)."""
        patience, epochs = self.config.training.patience, self.config.training.epochs
        return bool(patience) and self.epochs_without_improvement >= patience and self.epoch < epochs

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **{f.name: getattr(self, f.name) for f in fields(self)},
                "config": self.config.to_dict()}

    @classmethod
    def from_dict(cls, payload, path: Union[Path, str] = "checkpoint", tensor: type = _Tensor) -> "TrainingState":
        """Check every key of a loaded dict, its tensors of type `tensor` (torch.load's, or
        read_state's without torch); a problem is one PonderError naming the key."""
        from .config import PonderConfig

        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise PonderError(f"{path} is not a ponder_cli checkpoint")
        version = payload.get("version")
        if version not in READABLE_VERSIONS:
            raise PonderError(f"checkpoint {path} has format version {version!r}; "
                              f"this ponder_cli reads versions {', '.join(map(str, READABLE_VERSIONS))}")
        missing = [key for key in ("config", "model", "epoch") if key not in payload]
        if missing:
            raise PonderError(f"checkpoint {path} is missing {', '.join(missing)}")

        def bad(key: str, expected: str) -> PonderError:
            return PonderError(f"checkpoint {path} has a malformed {key!r} (expected {expected}, "
                               f"got {type(payload[key]).__name__})")

        if not isinstance(payload["config"], dict):
            raise bad("config", "a dict")
        try:
            config = PonderConfig.from_dict(payload["config"], saved=f"checkpoint {path}")
        except (PonderError, TypeError) as exc:
            raise PonderError(f"checkpoint {path} has an incompatible config: {exc}") from None
        model = payload["model"]
        if not isinstance(model, dict) or not all(isinstance(k, str) and isinstance(v, tensor)
                                                  for k, v in model.items()):
            raise bad("model", "a dict of tensors")
        if version == 1:
            model = {next((new + k[len(old):] for old, new in _V1_PREFIXES.items() if k.startswith(old)), k): v
                     for k, v in model.items()}
        epoch = payload["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise bad("epoch", "an integer")
        if epoch < 0:
            raise PonderError(f"checkpoint {path} has a malformed 'epoch' ({epoch})")
        values: dict = {"config": config, "model": model, "epoch": epoch}
        for key, (kind, expected) in _KINDS.items():
            if payload.get(key) is not None:
                if isinstance(payload[key], bool) or not isinstance(payload[key], kind):
                    raise bad(key, expected)
                values[key] = payload[key]
        if "rng" in values and not isinstance(values["rng"].get("torch"), tensor):
            raise PonderError(f"checkpoint {path} has a malformed 'rng' (no torch generator state)")
        if not all(isinstance(h, dict) for h in values.get("history", [])):
            raise bad("history", "a list of dicts")
        return cls(**values)

    def require_resumable(self, path: Union[Path, str]) -> None:
        missing = [key for key in RESUMING if getattr(self, key) is None]
        if missing:
            raise PonderError(f"checkpoint {path} cannot be resumed: it has no {', '.join(missing)} state "
                              "(only checkpoints written by `ponder train` can)")

def checkpoint_file_problem(path: Path) -> Optional[str]:
    """Why `path` is no checkpoint, said before any of it is unpickled (not a regular file, not a
    file PyTorch wrote, cut short or damaged), as the one line naming it; None: read it."""
    problem = file_problem(path)
    if problem is not None:
        return f"checkpoint {path} {problem}" + (" (train one with `ponder train`)" if problem == "does not exist" else "")
    kind = not_a_torch_file(path)
    if kind is not None:
        return f"{path} is {kind}, not a ponder_cli checkpoint"
    broken = damage(path)
    return None if broken is None else f"checkpoint {path} is {broken}"


def read_state(path: Union[Path, str]) -> TrainingState:
    """A checkpoint's state as checkpoint.load_checkpoint gives it, its tensors placeholders (what
    `info` reads), without torch where torch.load would add nothing: a zip file of tensors and
    plain values, every weight finite. Anything else load_checkpoint reads, torch with it."""
    path = Path(path)
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise PonderError(problem)
    try:
        with zipfile.ZipFile(path) as archive:
            payload = _Reader.payload(archive)
            state = None if payload is None else TrainingState.from_dict(payload, path)
            if state is not None and all(_finite(archive, tensor) for tensor in state.model.values()):
                return state
    except (_LeftToTorch, zipfile.BadZipFile, OSError):
        pass
    return loaded(TORCH_LOAD)(path)


class _LeftToTorch(Exception):
    """What read_state cannot say as torch.load would: torch reads the file."""


# how torch.save names a storage's type -> its array code (None: no finite check without torch), item size
_STORAGES = {"FloatStorage": ("f", 4), "DoubleStorage": ("d", 8), "HalfStorage": (None, 2),
             "BFloat16Storage": (None, 2), "LongStorage": ("q", 8), "IntStorage": ("i", 4), "ShortStorage": ("h", 2),
             "CharStorage": ("b", 1), "ByteStorage": ("B", 1), "BoolStorage": ("?", 1)}
_FLOATING = ("FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage")


@dataclass(frozen=True)
class _Storage:
    member: str  # its file in the archive
    kind: str  # a key of _STORAGES


class _Located(_Tensor):
    """A tensor read without torch: where its values lie (its storage, offset, size, stride)."""

    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)


class _Reader(pickle.Unpickler):
    """A checkpoint's data.pkl without torch; nothing is called. As torch.load(weights_only=True)
    reads what torch.save writes of tensors (a storage type, torch._utils._rebuild_tensor_v2,
    OrderedDict) and plain values, its tensors _Located; any other global (torch may accept or
    refuse it), a storage missing or of another size: _LeftToTorch. `lenient` (peek_checkpoint):
    torch's globals become TENSOR, the storages left unread, any other global but _SAFE_GLOBALS
    refused, as weights_only refuses it."""

    def __init__(self, archive: zipfile.ZipFile, prefix: str, lenient: bool = False):
        super().__init__(io.BytesIO(archive.read(f"{prefix}/data.pkl")))
        self.archive, self.prefix, self.lenient = archive, prefix, lenient

    @classmethod
    def payload(cls, archive: zipfile.ZipFile):
        """The archive's dict as torch.load gives it, its tensors _Located; None: not torch.save's zip file."""
        names, prefix = archive.namelist(), _data_prefix(archive)
        if prefix is None or f"{prefix}/version" not in names or sys.byteorder != "little" or \
                f"{prefix}/byteorder" not in names or archive.read(f"{prefix}/byteorder") != b"little":
            return None
        try:
            return cls(archive, prefix).load()
        except Exception:  # _LeftToTorch, or a pickle torch never wrote: its words are torch's to say
            return None

    def find_class(self, module: str, name: str):
        if self.lenient:
            if (module, name) in _SAFE_GLOBALS:
                return _SAFE_GLOBALS[module, name]
            if module == "torch" or module.startswith("torch."):
                return lambda *args, **kwargs: TENSOR
            raise pickle.UnpicklingError(f"it contains pickled code ({module}.{name})")
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: _Located(storage, offset, size, stride)
        if module == "torch" and name in _STORAGES:
            return name
        raise _LeftToTorch

    def persistent_load(self, pid):
        if self.lenient:
            return TENSOR
        kind, storage, key, _location, numel = pid
        member = f"{self.prefix}/data/{key}"
        if kind != "storage" or storage not in _STORAGES or member not in self.archive.NameToInfo or \
                self.archive.getinfo(member).file_size != numel * _STORAGES[storage][1]:
            raise _LeftToTorch
        return _Storage(member, storage)


def _finite(archive: zipfile.ZipFile, tensor) -> bool:
    """Whether a tensor read by _Reader holds no NaN or inf (integers, always): every value of the
    span of its storage it lies in, which is exact for a tensor laid out row by row (a value
    outside a strided one's own only asks torch); _LeftToTorch for half precision."""
    if not isinstance(tensor, _Located) or tensor.storage.kind not in _FLOATING:
        return True
    code, itemsize = _STORAGES[tensor.storage.kind]
    if code is None:
        raise _LeftToTorch
    if 0 in tensor.size:
        return True
    end = tensor.offset + 1 + sum((extent - 1) * stride for extent, stride in zip(tensor.size, tensor.stride))
    values = array.array(code)
    values.frombytes(archive.read(tensor.storage.member)[tensor.offset * itemsize:end * itemsize])
    return math.isfinite(sum(values))  # NaN and inf carry through a sum (an overflow only asks torch)


@dataclass(frozen=True)
class Summary:
    """How far a run got, from its checkpoint's dict (peek_checkpoint, or TrainingState.to_dict)."""
    config: dict  # flat
    epoch: int
    best_epoch: int
    epochs_without_improvement: int
    history: list
    stop_reason: Optional[str]
    run: Optional[dict]  # its record, None in a checkpoint from before records
    resumable: bool

    @classmethod
    def of(cls, payload: dict) -> "Summary":
        from .config import with_defaults

        return cls(with_defaults(payload["config"]), payload.get("epoch") or 0, payload.get("best_epoch") or 0,
                   payload.get("epochs_without_improvement") or 0, list(payload.get("history") or []),
                   payload.get("stop_reason"), payload.get("run") if isinstance(payload.get("run"), dict) else None,
                   all(payload.get(key) is not None for key in RESUMING))

    @classmethod
    def read(cls, path: Path) -> "Summary":
        """From checkpoint `path`'s data.pkl alone (a legacy-format file is none of ponder_cli's)."""
        payload = peek_checkpoint(path)
        if payload is None:
            raise PonderError(f"{path} is not a ponder_cli checkpoint")
        return cls.of(payload)

    @property
    def best(self) -> dict:
        """The best epoch's row of its history ({}: none)."""
        return next((h for h in self.history if isinstance(h, dict) and h.get("epoch") == self.best_epoch), {})


# the halting rule `ponder calibrate --save` keeps beside a run's checkpoints (runs.save_halting)
HALTING_FILE = "halting.json"
SAVED_BY = "ponder calibrate --save"  # marks the file as calibrate's: any other is the user's, never replaced


def saved_halting(folder: Path) -> Optional[dict]:
    """The rule calibrate saved in `folder`, or None where there is none, or the file is not
    calibrate's."""
    record = json_record(Path(folder) / HALTING_FILE)
    ok = record is not None and record.get("saved_by") == SAVED_BY and isinstance(record.get("halting"), str)
    return record if ok else None


def json_record(path: Path) -> Optional[dict]:
    """A JSON file's object, or None where there is none, it is not readable JSON or no object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None

def run_status(summary: Summary, path: Path) -> tuple[str, str]:
    """How the run went, as a word (finished, stopped early, time limit, at chance,
    interrupted, running, best epoch) and as a sentence for `info`."""
    folder, epochs, patience = path.parent, summary.config.get("epochs") or 0, summary.config.get("patience") or 0
    if path.name != LAST and summary.epoch == summary.best_epoch:
        # a best.pt (the shipped models among them) is a snapshot: it cannot tell how its run went on
        text = f"its run's best epoch (saved after epoch {summary.epoch} of {epochs})"
        if (folder / LAST).is_file():
            text += f"; the run's latest state is {folder / LAST}"
        return "best epoch", text
    holder = lock_holder(folder / LOCK_FILE)
    if holder is not None:
        return "running", f"training now (PID {holder})"
    if summary.stop_reason == AT_CHANCE:
        return AT_CHANCE, f"at chance after epoch {summary.epoch} of {epochs}: it did not learn"
    # patience ran out with epochs still to train (at the last epoch itself it simply finished)
    if patience and summary.epochs_without_improvement >= patience and summary.epoch < epochs:
        return "stopped early", (f"stopped early after epoch {summary.epoch} (no better validation accuracy for "
                                 f"{patience} epochs)")
    if summary.epoch < epochs:
        timed = summary.stop_reason == TIME_LIMIT
        text = (f"stopped at its time limit after epoch {summary.epoch} of {epochs}" if timed else
                f"interrupted after epoch {summary.epoch} of {epochs}")
        if summary.resumable:
            text += f"; resume with: ponder train --resume {path}"
        return (TIME_LIMIT if timed else "interrupted"), text
    return "finished", "finished"


# the record of a run ---------------------------------------------------------------------------
# What a run is besides its settings, kept in every checkpoint it writes (TrainingState.run) and
# in its config.json: its labels, the weights it started from (--init-from: a shipped model by
# name, else the file's absolute path, with its epoch and a digest of its weights, so that a
# source trained on since is noticed) and --amp (it changes the figures). Everything that shows
# or reruns a run reads it: info, diff, runs, the reproduce line, config.toml.

def run_record(labels: Labels, init_from: Optional[dict], amp: bool) -> dict:
    return {"labels": labels.to_dict(), "init_from": init_from, "amp": bool(amp)}


def start_text(init_from) -> Optional[str]:
    """`reference (epoch 30)`, a path and its epoch; an older run's record holds the path alone."""
    if isinstance(init_from, dict):
        return f"{init_from.get('checkpoint')} (epoch {init_from.get('epoch')})"
    return init_from


# what may differ from the checkpoint's config when resuming: how long to go on
RESUMABLE_CHANGES = ("epochs", "patience")


def same_run(a: dict, b: dict) -> bool:
    """Two flat configs of one run: the same settings (an older one's missing: their defaults)
    but for how long to go on."""
    from .config import PLACES, with_defaults

    def kept(config: dict) -> dict:
        return {key: value for key, value in with_defaults(config).items()
                if key in PLACES and key not in RESUMABLE_CHANGES}
    return kept(a) == kept(b)


def saved_config(folder: Path) -> Optional[dict]:
    return json_record(folder / CONFIG_FILE)


def run_of(summary: Optional[Summary], folder: Path) -> dict:
    """A run's record: its folder's config.json where that records the same run, else its
    checkpoint's (a copied best.pt, a config.json cut short or another run's), else none."""
    saved = saved_config(folder) or {}
    config = saved.get("config")
    if saved and (summary is None or same_run(config if isinstance(config, dict) else {}, summary.config)):
        return saved
    return (summary.run if summary is not None else None) or {}


def run_time(folder: Path) -> Optional[float]:
    """What orders runs, newest last (`ponder runs`, `latest`): when the run last started, by its
    config.json's `started` (UTC), else (an earlier version's folder) when its files or lock were
    last written; None for neither."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return datetime.fromisoformat((saved_config(folder) or {})["started"]).timestamp()
    stamps = []
    for name in (*RUN_FILES, LOCK_FILE):
        with contextlib.suppress(OSError):  # not there, or removed while we look
            stamps.append((folder / name).stat().st_mtime)
    return max(stamps, default=None)


# which file a CHECKPOINT argument names ------------------------------------------------------

@dataclass(frozen=True)
class Resolved:
    path: Path  # the file to read, as the user spelled it (or found under runs/)
    why: str  # how the argument led there, for the `using PATH (WHY)` line

    @classmethod
    def shipped(cls, path: Path, why: str) -> "Resolved":
        """A shipped model, relative to the working directory when below it (a clone's root)."""
        with contextlib.suppress(ValueError):
            path = path.relative_to(Path.cwd())
        return cls(path, why)


def accepted_forms(file: str = BEST) -> str:
    return (f"a checkpoint file, a run folder (its {file}), `{LATEST}` (the newest run under {RUNS_DIR}/) or a "
            f"shipped model: {', '.join(SHIPPED)}")


def resolve_checkpoint(given: Union[str, Path, None], file: Union[str, tuple[str, ...]] = BEST) -> Resolved:
    """The file a CHECKPOINT argument names, tried in this order: a file; a run folder's `file`
    (several: the first it holds); `latest`; a shipped model's name; `checkpoints/...` (the
    README's older spelling); None: the default model. Else one error naming the forms."""
    files = (file,) if isinstance(file, str) else tuple(file)
    file, named = files[0], " or ".join(files)
    if given is None:
        hint = f"; `{LATEST}` reads your newest run" if newest_run_checkpoint(name=file) is not None else ""
        return Resolved.shipped(shipped_path(DEFAULT), f"the shipped model '{DEFAULT}', the default{hint}")
    text, path = str(given), Path(given)
    if path.is_file():
        return Resolved(path, "as given")
    held = next((name for name in files if (path / name).is_file()), None) if path.is_dir() else None
    if held is not None:
        return Resolved(path / held, f"the {held} of run folder {path}")
    if text == LATEST:
        newest = newest_run_checkpoint(name=file)
        if newest is None:
            raise PonderError(f"`{LATEST}`: no run under {RUNS_DIR.resolve()}/ has a {file} yet; train one with "
                              "`ponder train`, or name another checkpoint")
        return Resolved(newest, f"{LATEST}: the newest run under {RUNS_DIR}/")
    if text in SHIPPED:
        return Resolved.shipped(shipped_path(text), f"the shipped model '{text}'")
    parts = PurePath(text).parts  # checkpoints/align/best.pt, or the folder checkpoints/align (its `file`)
    if len(parts) >= 2 and parts[0] == SHIPPED_FOLDER and ".." not in parts:
        old = shipped_dir().joinpath(*parts[1:])
        old = old / file if old.is_dir() else old
        if old.is_file():
            name = shipped_name(old)
            return Resolved.shipped(old, f"the shipped model '{name}'" if name else f"shipped as {text}")
    if path.is_dir():
        if is_run_folder(path):
            other = next((path / name for name in CHECKPOINT_FILES if (path / name).is_file()), None)
            if other is not None:
                raise PonderError(f"{path} is a run folder with no {named} (it has {other}: name that file); "
                                  f"name {accepted_forms(file)}")
            holder = lock_holder(path / LOCK_FILE)
            why = (f"training now (PID {holder}), its first epoch not finished" if holder is not None else
                   "no epoch was saved (the run failed or was stopped before its first epoch ended)")
            raise PonderError(f"{path} is a run folder with no checkpoint yet: {why}")
        runs = [str(run.relative_to(path)) for run in runs_under(path)]
        if runs:
            raise PonderError(f"{path} is a folder of runs ({some_of(runs)}), not one run: `ponder runs {path}` lists "
                              f"them; name one, or {accepted_forms(file)}")
        raise PonderError(f"{path} holds no {named}; name {accepted_forms(file)}")
    raise PonderError(f"checkpoint {path} {file_problem(path) or 'cannot be read'}; name {accepted_forms(file)}")



def names_checkpoint(given: str) -> bool:
    """Whether a CHECKPOINT argument names a checkpoint as resolve_checkpoint reads it (a file
    torch may have written), not some other file; `latest` and a shipped name always do."""
    try:
        path = resolve_checkpoint(given).path
    except PonderError:
        return given == LATEST or given in SHIPPED  # even with no run under runs/ yet
    return not_a_torch_file(path) is None


def newest_run_checkpoint(root: Path = RUNS_DIR, name: str = BEST) -> Optional[Path]:
    """<run>/<name> of the run under `root` started last (the order `ponder runs` lists them in)
    among those that hold one, if any."""
    found = [(run_time(run) or 0.0, str(run), run / name) for run in runs_under(root) if (run / name).is_file()]
    return max(found)[2] if found else None


def some_of(paths: list) -> str:
    """The first three of a list for a message: `a, b, c, ...`."""
    return ", ".join(str(path) for path in paths[:3]) + (", ..." if len(paths) > 3 else "")


# The run lock: a file naming the process that holds it, taken atomically, released on the way
# out, taken over from a process that is gone.

def lock_holder(path: Path) -> Optional[int]:
    """The PID in a lock file, if that process is still alive (and is not this one)."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # gone, or written by a process that died before writing its PID
    if pid == os.getpid() or pid <= 0:
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return pid


class InUse(PonderError):
    """A folder whose lock a live process holds."""


def _in_use(directory: Path, pid: int) -> InUse:
    return InUse(f"{directory} is in use by another ponder command (PID {pid}: a `ponder train`, or a "
                 "`ponder runs rm` moving it); wait for it to finish, or train into another folder")


def check_unlocked(directory: Path) -> None:
    """Fail early, before loading any data, when a live run holds the folder (RunLock decides)."""
    pid = lock_holder(directory / LOCK_FILE)
    if pid is not None:
        raise _in_use(directory, pid)


class RunLock:
    """`.ponder.lock` in a run folder, holding the PID of the run that writes there: made with
    O_EXCL under a flock of the folder (two processes never both take over one stale lock), a
    dead process's taken over, a live one's refused. `held_on`: a resume's lock is the run's."""

    held_here: dict = {}  # resolved folder -> the RunLock this process holds on it

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.held = False

    @classmethod
    def held_on(cls, directory: Path) -> Optional["RunLock"]:
        with contextlib.suppress(OSError, RuntimeError):
            return cls.held_here.get(Path(directory).resolve())
        return None

    def acquire(self) -> "RunLock":
        try:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                with contextlib.suppress(ImportError):  # not POSIX: the O_EXCL create alone
                    import fcntl
                    fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
                while True:
                    try:
                        lock = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    except FileExistsError:
                        pid = lock_holder(self.path)
                        if pid is not None:
                            raise _in_use(self.directory, pid) from None
                        self.path.unlink(missing_ok=True)  # stale: its process is gone
                        continue
                    with os.fdopen(lock, "w") as f:
                        f.write(f"{os.getpid()}\n")
                    self.held = True
                    RunLock.held_here[self.directory.resolve()] = self
                    return self
            finally:
                os.close(fd)
        except OSError as exc:
            raise PonderError(f"cannot write checkpoints to {self.directory}: {exc.strerror or exc}") from None

    def release(self, remove: bool = True) -> None:
        """Let go (`remove`: False where the lock file moved away with its folder)."""
        if self.held:
            self.held = False
            for key in [key for key, lock in RunLock.held_here.items() if lock is self]:
                del RunLock.held_here[key]
            if remove:
                with contextlib.suppress(OSError):
                    self.path.unlink()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def resumed_lock(given: Union[str, Path, None]):
    """`ponder train --resume CHECKPOINT`: its run folder locked before anything of the run is
    read, so that a `ponder runs rm` and a resume cannot both go ahead; nothing is locked where
    no lock can be taken (the resume then says what it finds)."""
    lock = None
    try:
        folder = resolve_checkpoint(given, file=LAST).path.parent if given is not None else None
    except PonderError:
        folder = None  # the resume itself says why
    if folder is not None and is_run_folder(folder) and not inside_package(folder):
        try:
            lock = RunLock(folder).acquire()
        except InUse:
            raise
        except PonderError:
            pass  # gone (moved to the trash meanwhile) or read-only
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


# finding runs ----------------------------------------------------------------------------------

def run_files_in(directory: Path) -> list[str]:
    """The files of `directory` that a run would write (RUN_FILES, TensorBoard events)."""
    found = [name for name in RUN_FILES if os.path.lexists(directory / name)]
    return found + sorted(p.name for p in directory.glob(TENSORBOARD_EVENTS)) if directory.is_dir() else found


def is_run_folder(folder: Path) -> bool:
    """A folder `ponder train` wrote: it holds a checkpoint, the run lock, or a config.json of
    ponder's (a folder of the user's own with a config.json is not one)."""
    try:
        found = run_files_in(folder)
        if any(name in CHECKPOINT_FILES for name in found) or os.path.lexists(folder / LOCK_FILE):
            return True
    except OSError:
        return False
    saved = saved_config(folder) if CONFIG_FILE in found else None
    return saved is not None and "ponder_cli" in saved


# folders never looked into for runs: hidden ones (.git, .trash), Python's (__pycache__), a
# JavaScript project's packages; a virtual environment (a pyvenv.cfg inside) is skipped too
SKIPPED = ("node_modules",)


def _walk(folder: Path, into_top: bool = False):
    """The one walk that finds runs: (path, names it holds) for each folder at or below `folder`,
    None for a run folder, not looked into (with `into_top`, `folder` is not taken for one).
    Hidden folders, virtual environments, the package and links (another project?) are passed by."""
    seen, todo = set(), [(Path(folder), True)]
    while todo:
        here, top = todo.pop()
        if not (top and into_top) and is_run_folder(here):
            yield here, None
            continue
        try:
            key = here.resolve()
            if key in seen or inside_package(here):
                continue
            seen.add(key)
            entries = list(os.scandir(here))
        except (OSError, RuntimeError):  # not readable, removed while we look, a loop of links
            continue
        names = [entry.name for entry in entries]
        if not top and "pyvenv.cfg" in names:
            continue
        yield here, names
        below = []
        for entry in entries:
            with contextlib.suppress(OSError):
                if not entry.name.startswith((".", "__")) and entry.name not in SKIPPED \
                        and entry.is_dir(follow_symlinks=False):
                    below.append(entry.name)
        todo += [(here / name, False) for name in sorted(below, reverse=True)]


def runs_under(folder: Path, below: bool = False) -> list[Path]:
    """The run folder itself, else every run folder below it, by path (`below`: those below it
    only, which a run written into it would hide)."""
    return [path for path, names in _walk(folder, into_top=below) if names is None]


def hidden_folder_of(folder: Path) -> Optional[Path]:
    """The first hidden folder from the current folder down to `folder` (`.exp` for .exp/run1),
    if any: a bare `ponder runs` passes it by."""
    try:
        parts = Path(os.path.abspath(folder)).relative_to(Path.cwd()).parts
    except ValueError:
        return None  # not below the current folder: no bare `ponder runs` here lists it anyway
    hidden = next((i for i, part in enumerate(parts) if part.startswith((".", "__"))), None)
    return Path(*parts[:hidden + 1]) if hidden is not None else None


def enclosing_run(folder: Path) -> Optional[Path]:
    """The run folder that `folder` lies inside, if any: a run written there would be hidden from
    `ponder runs` and `latest`, which never look inside a run folder."""
    for parent in Path(os.path.abspath(folder)).parents:
        if is_run_folder(parent):
            with contextlib.suppress(ValueError):
                return parent.relative_to(Path.cwd())
            return parent
    return None


# The trash: `ponder runs rm` moves a run folder into .trash/<name>.<UTC time>/run beside it, with
# trashed.json saying where it was; `--restore` moves it back as it was, and `--empty` alone
# deletes. The trash holds only what those reach: a run folder itself (never a link, nor anything
# already in a trash), in an entry made whole or not at all. ----------------------------------

def trashes_under(roots: Iterable[Path]) -> dict[Path, list[Path]]:
    """The trash folders in `roots` and below them (where runs are looked for) that hold runs,
    each with its entries."""
    found = {}
    for root in roots:
        for path, names in _walk(Path(root)):
            trash = path / TRASH
            if names is not None and TRASH in names and trash.is_dir() and not os.path.islink(trash):
                found.setdefault(trash, trash_entries(trash))
    return {trash: entries for trash, entries in found.items() if entries}


def trashed(entry: Path) -> Optional[dict]:
    """A trash entry's note (where its run was: "original"), when it is one (its run there too)."""
    note, run = json_record(entry / TRASH_NOTE), entry / ENTRY_RUN
    ours = not os.path.islink(entry) and not os.path.islink(run) and run.is_dir()  # a link is no entry of ours
    return note if ours and note is not None and "original" in note else None


def trash_entries(trash: Path) -> list[Path]:
    try:
        return sorted(path for path in trash.iterdir() if trashed(path) is not None)
    except OSError:
        return []


def trashed_runs(roots) -> list[str]:
    """Where each run in the trash under `roots` was (`--restore` takes it so), relative to the
    current folder where it lay below it, each once."""
    held = [trashed(entry)["original"] for entries in trashes_under(roots).values() for entry in entries]
    return list(dict.fromkeys(os.path.relpath(path) if Path(path).is_relative_to(Path.cwd()) else path
                              for path in held))


def check_trashable(folder: Path) -> None:
    """Refuse a folder `ponder runs rm` may not move to the trash, before any run named moves."""
    holder = lock_holder(folder / LOCK_FILE) if folder.is_dir() and is_run_folder(folder) else None
    if holder is not None:
        raise PonderError(f"{folder} is being trained (PID {holder}): stop that run first (Ctrl-C, or kill -TERM "
                          f"PID), then remove it; nothing was moved")
    if os.path.islink(folder):
        raise PonderError(f"{folder} is a link (to {os.readlink(folder)}): `ponder runs rm` moves run folders "
                          f"themselves, never a link; name the run folder itself, or remove the link with rm")
    parts = set(Path(os.path.abspath(folder)).parts)  # inside a trash, as given or once its links resolve
    with contextlib.suppress(OSError, RuntimeError):
        parts |= set(folder.resolve().parts)
    if TRASH in parts:
        raise PonderError(f"{folder} is in a trash already: `ponder runs rm --restore` brings a trashed run back, "
                          f"`ponder runs rm --empty` deletes it")
    if not folder.is_dir():
        raise PonderError(f"{folder} {file_problem(folder) or 'is a file'}: `ponder runs rm` takes run folders "
                          f"(`ponder runs` lists them)")
    if not is_run_folder(folder):
        below = runs_under(folder, below=True)
        raise PonderError(f"{folder} is " + (f"a folder of runs ({some_of(below)}): name each run to remove" if below
                                             else "not a run folder: `ponder runs` lists them"))
    if any(same_path(folder, here) for here in (Path.cwd(), *Path.cwd().parents)):
        raise PonderError(f"{folder} holds the current folder; run `ponder runs rm` from outside it")
    trash = folder.parent / TRASH
    if os.path.islink(trash) or (os.path.lexists(trash) and not trash.is_dir()):
        raise PonderError(f"{trash} is {'a link' if os.path.islink(trash) else 'not a folder'}, not a trash of "
                          f"ponder's: move it aside, then remove {folder}")


def entry_name(name: str, stamp: str, limit: int = 255) -> str:
    """<run's name>.<UTC time>, the name cut short (its start kept, never inside a character)
    where the whole would be longer than the file system takes: trashed.json keeps it in full."""
    suffix = os.fsencode(f".{stamp}")
    head = os.fsencode(name)[:max(1, limit - len(suffix))]
    while head:
        try:
            return head.decode("utf-8", "strict") + suffix.decode()
        except UnicodeDecodeError:
            head = head[:-1]
    return os.fsdecode(os.fsencode(name)[:max(1, limit - len(suffix))] + suffix)


def trash_run(folder: Path) -> dict:
    """Move a run folder into the trash, its lock held meanwhile; a move that fails or is
    interrupted leaves no entry behind."""
    folder = Path(folder)
    check_trashable(folder)
    trash = folder.parent / TRASH
    lock = RunLock(folder).acquire()  # refused, naming its PID, when a live run holds the folder
    made_trash, entry, moved = not trash.exists(), None, False
    try:
        with uninterrupted():  # a signal waits until the entry is whole, or undone
            stamp = datetime.now(timezone.utc)
            trash.mkdir(exist_ok=True)
            try:
                limit = os.pathconf(trash, "PC_NAME_MAX")
            except (OSError, ValueError, AttributeError):
                limit = 255
            named = trash / entry_name(folder.name, stamp.strftime('%Y%m%dT%H%M%S.%fZ'), limit)
            named.mkdir()
            entry = named  # ours from here: undone if the move does not finish
            note = {"format_version": FORMAT_VERSION, "run": str(folder), "original": os.path.abspath(folder),
                    "removed": stamp.isoformat()}
            replace_atomically(entry / TRASH_NOTE, lambda f: f.write(json.dumps(note, indent=2) + "\n"))
            os.rename(folder, entry / ENTRY_RUN)
            moved = True
    except BaseException as exc:
        if not moved:  # the entry, and the trash this move made, removed
            for path in ([entry / TRASH_NOTE, *entry.glob(f".{TRASH_NOTE}.*.tmp")] if entry else []):
                with contextlib.suppress(OSError):
                    path.unlink()
            for made in (entry, trash if made_trash else None):
                if made is not None:
                    with contextlib.suppress(OSError):
                        made.rmdir()
            lock.release()
        if isinstance(exc, OSError):
            raise PonderError(f"cannot move {folder} to the trash: {exc.strerror or exc}; it stays where it was")\
                from None
        raise
    (entry / ENTRY_RUN / LOCK_FILE).unlink(missing_ok=True)  # ours, taken for the move: the run as it was
    lock.release(remove=False)
    return {"run": str(folder), "trash": str(entry), "removed": note["removed"]}


def restore_run(given: Path) -> dict:
    """Move a trashed run back where it was, as it was: `given` is the path it had (the newest
    entry of that path in the trash beside it) or a trash entry's own."""
    given = Path(given)
    if not os.path.islink(given) and trashed(given) is not None:
        entry = given
    else:
        original = os.path.abspath(given)
        entries = sorted(((note["removed"], entry) for entry in trash_entries(given.parent / TRASH)
                          for note in [trashed(entry)] if note["original"] == original), reverse=True)
        if not entries:
            raise PonderError(f"no run {given} in {given.parent / TRASH}/: `ponder runs rm --restore` takes the path "
                              f"a removed run had (or its entry in the trash)")
        entry = entries[0][1]
    note = trashed(entry)
    target = Path(note["original"])
    if os.path.lexists(target):
        raise PonderError(f"{note.get('run') or target} exists again (something else is there now): move it aside, "
                          f"then restore; the removed run stays in {entry}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(entry / ENTRY_RUN, target)
    except OSError as exc:
        raise PonderError(f"cannot restore {given}: {exc.strerror or exc}; it stays in {entry}") from None
    (entry / TRASH_NOTE).unlink()
    entry.rmdir()
    with contextlib.suppress(OSError):
        entry.parent.rmdir()  # the trash, when this was its last run
    return {"run": note.get("run") or str(given), "trash": str(entry), "removed": note.get("removed")}


def trash_contents(folders: Iterable[Path]) -> list[dict]:
    """What `--empty` would delete: each entry of each folder's own trash (never one below it,
    nor a link), with its size in bytes, links not followed."""
    trashes = {}
    for folder in folders:
        trash = Path(folder) / TRASH
        if not os.path.islink(trash) and trash.is_dir():
            trashes.setdefault(trash.resolve(), trash)  # each once (runs/ named twice), as named
    rows = []
    for entry in (entry for trash in trashes.values() for entry in trash_entries(trash)):
        size = 0
        for top, folders_below, files in os.walk(entry, followlinks=False):
            for name in files + [name for name in folders_below if os.path.islink(os.path.join(top, name))]:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(top, name)).st_size
        note = trashed(entry)
        rows.append({"run": note.get("run"), "trash": str(entry), "removed": note.get("removed"), "bytes": size})
    return rows


def empty_trash(rows: list[dict]) -> list[dict]:
    """Delete these trash entries, the one way `ponder` deletes a run, each whole; an interrupt
    or a failure says how many were deleted and how many are still in the trash."""
    done: list[dict] = []

    def said() -> str:
        left = len(rows) - len(done)
        return (f"{len(done)} of {len(rows)} trashed runs deleted for good, "
                f"{left} still in the trash" + (" (`ponder runs rm --empty` deletes them)" if left else ""))
    with keeping(said):
        for row in rows:
            entry = Path(row["trash"])
            try:
                with uninterrupted():  # counted as gone before an interrupt held meanwhile is raised
                    shutil.rmtree(entry / ENTRY_RUN)  # the run first: an entry cut short by a failure still has its note
                    shutil.rmtree(entry)
                    done.append(row)
                    with contextlib.suppress(OSError):
                        entry.parent.rmdir()  # the trash, once its last entry is gone
            except OSError as exc:
                raise PonderError(f"cannot delete {entry}: {exc.strerror or exc}; {said()}") from None
    return done


def replace_atomically(path: Path, write, binary_from: Optional[Path] = None, *, binary: bool = False) -> None:
    """Write a file (`write` gets it open, as text unless `binary`), or copy `binary_from`, under a
    temporary name, then rename it into place: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if binary_from is not None:
            with os.fdopen(fd, "wb") as f, open(binary_from, "rb") as source:
                shutil.copyfileobj(source, f)
        else:
            with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                write(f)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def same_path(a: Path, b: Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()
