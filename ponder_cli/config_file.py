"""Training configurations in files: `ponder train --config FILE` reads one, `--print-config`
and every run folder's `config.toml` write one. No torch: the CLI reads a file before loading it.

A file has one table per piece, holding that piece's settings under their option names with
underscores (the flag `--lambda-p` is the key `lambda_p`):

    [task]
    task = "parity"
    elems = 16

    [method]
    lambda_p = 0.1

A flat file (keys without tables) and a run's `config.json` are read too. What the file sets
overrides the defaults and what the chosen pieces imply; flags given on the command line override
the file.
"""

from __future__ import annotations

import difflib
import json
import math
import typing
from pathlib import Path

from . import PonderError, file_problem
from .config import PonderConfig, applies
from .settings import SECTION_OF, SECTIONS, setting_types



def read_config_file(path: Path) -> dict:
    """The settings a config file gives: {field: value}, checked against the fields and their
    types (one PonderError naming the file and the key). TOML (.toml) or JSON (anything else)."""
    path = Path(path)
    problem = file_problem(path)
    if problem is not None:
        raise PonderError(f"--config {path} {problem}; name a .toml or .json configuration (a run folder's "
                          f"config.toml re-runs that run)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PonderError(f"--config {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    data = _parse(path, text)
    if isinstance(data.get("config"), dict) and "ponder_cli" in data:  # a run's config.json
        return _from_saved_run(path, data["config"])
    values = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in SECTIONS:
                raise PonderError(f"--config {path}: unknown table [{key}]; the tables are "
                                  f"{', '.join(f'[{s}]' for s in SECTIONS)}")
            for name, item in value.items():
                _check_place(path, name, key)
                values[name] = item
        else:
            _check_place(path, key, None)
            values[key] = value
    return {name: _typed(path, name, value) for name, value in values.items()}


def _parse(path: Path, text: str) -> dict:
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PonderError(f"--config {path}: not valid TOML ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PonderError(f"--config {path}: not valid JSON ({exc}); TOML files must end in .toml") from None
    if not isinstance(data, dict):
        raise PonderError(f"--config {path}: a JSON object of settings is needed, not a {type(data).__name__}")
    return data


def _from_saved_run(path: Path, saved: dict) -> dict:
    """A run's config.json holds every field; those its pieces do not read had no effect on it and
    are left out, so that the file re-runs the run whatever its task, step and method."""
    for name in saved:
        _check_place(path, name, None)
    values = {name: _typed(path, name, value) for name, value in saved.items() if value is not None}
    chosen = {kind: values.get(kind, PonderConfig.default(kind)) for kind in ("task", "step", "method")}
    return {name: value for name, value in values.items() if applies(name, chosen)}


def _check_place(path: Path, name: str, section) -> None:
    if name not in SECTION_OF:
        close = difflib.get_close_matches(name, list(SECTION_OF), n=1)
        raise PonderError(f"--config {path}: unknown setting {name!r}" + (f" (did you mean {close[0]!r}?)" if close
                                                                          else ""))
    if section is not None and SECTION_OF[name] != section:
        raise PonderError(f"--config {path}: {name} belongs in [{SECTION_OF[name]}], not [{section}]")


_TYPES = setting_types()


def _typed(path: Path, name: str, value):
    """The value as the field's type wants it: a whole number is a float where a float is due,
    and nothing else is converted (a string where a number is due is a mistake in the file)."""
    kind = _TYPES[name]
    if name == "halting_bias":  # a number, or "prior": the logit of lambda_p (config.from_options)
        if value == "prior" or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return float(value) if value != "prior" else value
        raise PonderError(f"--config {path}: halting_bias is a number or \"prior\" (got {value!r})")
    wanted = {"int": int, "float": float, "str": str, "bool": bool}.get(kind if isinstance(kind, str)
                                                                        else typing.get_origin(kind) or kind)
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if wanted is None or type(value) is not wanted:
        raise PonderError(f"--config {path}: {name} must be {_a(kind)} (got {value!r})")
    if wanted is float and not math.isfinite(value):
        raise PonderError(f"--config {path}: {name} must be a finite number (got {value!r})")
    return value


def _a(kind) -> str:
    return {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false"}.get(kind, kind)


def render_config(cfg: PonderConfig, sources: dict, shown: list[str], fmt: str = "toml") -> str:
    """The settings `shown` of a configuration, by table, each with where its value came from
    (a comment in TOML, a "sources" object in JSON); read back with read_config_file, it gives
    the same configuration. A value the pieces imply but do not take as a setting (plain's one
    step) is a comment, and a None (halting_bias: the method's own) is left out: TOML has no null,
    and leaving it out means the same."""
    values, chosen = cfg.to_dict(), cfg.chosen()
    settable = [name for name in shown if values[name] is not None and applies(name, chosen)]
    tables = {section: {name: values[name] for name in names if name in settable} for section, names in SECTIONS.items()}
    if fmt == "json":
        return json.dumps({**tables, "sources": {name: sources.get(name, "default") for name in settable}},
                          indent=2) + "\n"
    lines = ["# ponder train --config FILE (flags on the command line override it)"]
    for section, names in SECTIONS.items():
        rows = [(f"{name} = {_toml_value(values[name])}", sources.get(name, "default")) for name in names
                if name in settable]
        rows += [(f"# {name} = {_toml_value(values[name])}", f"{sources.get(name, 'default')}, not a setting of "
                  f"this {'method' if SECTION_OF[name] == 'method' else 'run'}") for name in names
                 if name in shown and name not in settable and values[name] is not None]
        if not rows:
            continue
        width = max(len(text) for text, _ in rows)
        lines += ["", f"[{section}]"] + [f"{text.ljust(width)}  # {source}" for text, source in rows]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # a TOML basic string
