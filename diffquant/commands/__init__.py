"""CLI sub-commands: each module here defines ``register(subparsers)`` and is found automatically."""
