"""The table of every `ponder train --config` key in docs/configuration.md, made from the code:
its table, its default, the values pieces imply, which pieces read it and its command-line flag.

    python tools/config_reference.py            # print the table
    python tools/config_reference.py --write    # rewrite it in docs/configuration.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
START, END = "<!-- keys: made by tools/config_reference.py -->", "<!-- end of keys -->"


def train_flags() -> dict:
    """field -> (flag text, hidden) of `ponder train`'s options."""
    import typer.main

    from ponder_cli.cli import app

    command = typer.main.get_command(app).commands["train"]
    return {param.name: ("/".join(param.opts + param.secondary_opts), param.hidden) for param in command.params}


def table() -> str:
    from ponder_cli.config import PonderConfig, implied_by_pieces, readers
    from ponder_cli.config import SECTIONS
    from ponder_cli.render import value_text

    flags = train_flags()
    rows = ["| key | default | pieces imply | read by | flag |", "|---|---|---|---|---|"]
    for section, names in SECTIONS.items():
        rows.append(f"| **[{section}]** | | | | |")
        for name in names:
            default = PonderConfig.default(name)
            implied = ", ".join(f"{piece}: {value_text(value)}" for piece, value in implied_by_pieces(name))
            read_by = "; ".join(f"{kind.replace('_', '-')} {', '.join(pieces)}"
                                for kind, pieces in readers(name).items()) or "every run"
            flag, hidden = flags.get(name, ("", False))
            flag_text = f"`{flag}`" + (" (not in --help)" if hidden else "") if flag else "file only"
            rows.append(f"| `{name}` | {value_text(default)} | {implied} | {read_by} | {flag_text} |")
    return "\n".join(rows)


def page_with_table(text: str) -> str:
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table()}\n{END}{after}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/configuration.md")
    args = parser.parse_args(argv)
    if not args.write:
        print(table())
        return 0
    PAGE.write_text(page_with_table(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
