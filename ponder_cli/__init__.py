"""ponder_cli: train, evaluate and extrapolate PonderNet on MNIST."""

__version__ = "0.1.0"


class PonderError(Exception):
    """A user-facing problem: the CLI prints its message as one line and exits non-zero."""
