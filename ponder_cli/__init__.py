"""ponder_cli: train, evaluate and extrapolate PonderNet on MNIST."""

__version__ = "0.2.0"


class PonderError(Exception):
    """A user-facing problem: the CLI prints `headline: message` as one line and exits with
    exit_code, never a traceback."""
    exit_code = 1
    headline = "Error"
