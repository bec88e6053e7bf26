"""The `ponder` command: parse, call one library function (api/), render. Results on stdout,
chatter on stderr; every command runs behind one error boundary (`app.PonderGroup`). One module
per group of commands; importing them registers their commands on the app."""

from ..cli_options import expand_angles
# each registers its commands; in this order they appear in `ponder --help`
from . import train, evaluation  # noqa: F401, I001
from .app import app

__all__ = ["app", "expand_angles", "run"]


def run() -> None:
    app(prog_name="ponder")
