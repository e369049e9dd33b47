"""CLI sub-commands: each module here defines ``register(subparsers)`` and is found automatically."""

import sys

EXIT_NONFINITE = 1  # the command ran, but every result it produced is NaN/Inf


def nonfinite_exit(bad: int, total: int) -> int:
    """0, or :data:`EXIT_NONFINITE` with one line on stderr when every one of ``total`` results is non-finite."""
    if total and bad == total:
        print(f"diffquant: error: all {total} results are NaN/Inf (the model's activations overflow?)",
              file=sys.stderr)
        return EXIT_NONFINITE
    return 0
