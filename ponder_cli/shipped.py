"""The models shipped inside the package, by name.

They are package data (ponder_cli/checkpoints/, declared in setup.cfg), found through
importlib.resources: the same files whatever the working directory, from a clone, an editable
install or a wheel. Shipping another model is one file there and one line in SHIPPED.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path, PurePath
from typing import Optional

FOLDER = "checkpoints"  # inside the package; also how the README's older commands spell them

# name -> (file under ponder_cli/checkpoints/, what it is)
SHIPPED = {
    "reference": ("best.pt", "pondernet · step mlp · trained within ±22.5°"),
    "interpolation": ("interpolation/best.pt", "pondernet · step mlp · trained on unrotated digits"),
    "align": ("align/best.pt", "pondernet · step align · trained within ±22.5°"),
    "parity16": ("parity/interpolation16.pt", "pondernet · step gru · parity of 16 elements, counts 1-16"),
    "parity16-extrapolation": ("parity/extrapolation16.pt", "pondernet · step gru · parity of 16 elements, trained on "
                                                           "counts 1-8"),
    "parity16-extrapolation-act": ("parity/extrapolation16-act.pt", "act · step gru · parity of 16 elements, trained "
                                                                   "on counts 1-8"),
    "parity32": ("parity/interpolation32.pt", "pondernet · step gru · parity of 32 elements, counts 1-32"),
}
DEFAULT = "reference"


def shipped_dir() -> Path:
    """The package's checkpoints/ folder, wherever the package is installed."""
    return Path(str(resources.files("ponder_cli").joinpath(FOLDER)))


def package_dir() -> Path:
    """Where the ponder_cli package really is (a clone, site-packages): no command writes there."""
    import ponder_cli
    return Path(ponder_cli.__file__).resolve().parent


def inside_package(path: Path) -> bool:
    """Is this path the installed package's folder or anything inside it, whatever its name?"""
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


def shipped_path(name: str) -> Path:
    return shipped_dir() / SHIPPED[name][0]


def shipped_name(path: Path) -> Optional[str]:
    """The name of a shipped model's file, if it is one."""
    for name in SHIPPED:
        if path.resolve() == shipped_path(name).resolve():
            return name
    return None


def shipped_under_old_name(text: str, file: str) -> Optional[Path]:
    """`checkpoints/align/best.pt` (the README's spelling from before the models moved into the
    package) -> the shipped file of that relative name, when there is one; a folder there
    (`checkpoints/align`) -> its `file`."""
    parts = PurePath(text).parts
    if len(parts) < 2 or parts[0] != FOLDER or ".." in parts:
        return None
    path = shipped_dir().joinpath(*parts[1:])
    if path.is_dir():
        path = path / file
    return path if path.is_file() else None
