"""Training configurations in files: `ponder train --config FILE` reads one, `--print-config`
and every run folder's `config.toml` write one. A file has a table per piece, its settings under
their flat keys (the flag `--lambda-p` is the key `lambda_p`); a flat file, JSON of either shape
and a run's `config.json` are read too. What a file sets overrides the defaults and what the
chosen pieces imply; flags override the file. Values are checked where every setting is
(config.py), the messages naming the file and its key.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from . import PonderError, file_problem
from .config import PLACES, SECTIONS, PonderConfig, applies


def read_config_file(path: Path) -> dict:
    """The settings a file gives, {key: value}: TOML (.toml) or JSON (anything else)."""
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
    if isinstance(data.get("config"), dict) and "ponder_cli" in data:
        # a run's config.json holds every setting: those its pieces do not read had no effect on
        # it (a warning for any not at its neutral value), and are left out
        try:
            cfg = PonderConfig.from_dict({key: value for key, value in data["config"].items() if value is not None},
                                         saved=f"--config {path}")
        except PonderError as exc:
            raise PonderError(f"--config {path}: {exc}") from None
        return {key: value for key, value in data["config"].items()
                if value is not None and key in PLACES and applies(key, cfg.chosen())}
    values = {}
    for key, value in data.items():
        table = key if isinstance(value, dict) else None
        if table is not None and table not in SECTIONS:
            raise PonderError(f"--config {path}: unknown table [{key}]; the tables are "
                              f"{', '.join(f'[{s}]' for s in SECTIONS)}")
        for name, item in (value.items() if table else [(key, value)]):
            if name not in PLACES:
                close = difflib.get_close_matches(name, list(PLACES), n=1)
                raise PonderError(f"--config {path}: unknown setting {name!r}" +
                                  (f" (did you mean {close[0]!r}?)" if close else ""))
            if table is not None and PLACES[name][0] != table:
                raise PonderError(f"--config {path}: {name} belongs in [{PLACES[name][0]}], not [{table}]")
            values[name] = item
    return values


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


def render_config(cfg: PonderConfig, sources: dict, shown: list[str], fmt: str = "toml") -> str:
    """The settings `shown`, by table, each with where its value came from (a TOML comment, or a
    JSON "sources" object); read back, the same configuration. A value the pieces imply but do
    not read (plain's one step) is a comment; a None (halting_bias: the method's own) is left out."""
    values, chosen = cfg.to_dict(), cfg.chosen()
    settable = [key for key in shown if values[key] is not None and applies(key, chosen)]
    if fmt == "json":
        tables = {section: {key: values[key] for key in keys if key in settable}
                  for section, keys in SECTIONS.items()}
        return json.dumps({**tables, "sources": {key: sources.get(key, "default") for key in settable}},
                          indent=2) + "\n"
    lines = ["# ponder train --config FILE (flags on the command line override it)"]
    for section, keys in SECTIONS.items():
        whose = "method" if section == "method" else "run"
        rows = [(f"{'' if key in settable else '# '}{key} = {_toml_value(values[key])}",
                 sources.get(key, "default") + ("" if key in settable else f", not a setting of this {whose}"))
                for key in keys if key in settable or (key in shown and values[key] is not None)]
        rows.sort(key=lambda row: row[0].startswith("#"))  # the settings, then the comments
        if rows:
            width = max(len(text) for text, _ in rows)
            lines += ["", f"[{section}]"] + [f"{text.ljust(width)}  # {source}" for text, source in rows]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # a float's shortest text that reads back as the same float
    return json.dumps(value)  # a TOML basic string
