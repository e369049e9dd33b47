"""Errors reported to the user as one line (the CLI exits 2 on these and on ValueError/FileNotFoundError)."""


class UserError(Exception):
    """An error caused by what the user asked for; reported as one line."""
