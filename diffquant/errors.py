"""Our one error type: anything caused by input (a path, a file's content, an argument, a device) raises a
:class:`UserError` with a one-line message at the boundary where it is found; the CLI prints that line and
exits 2. Anything else is a bug: the CLI's last-resort handler prints one line and the hint to rerun with -v."""


class UserError(Exception):
    """An error caused by what the user asked for or gave us; reported as one line."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name; an OS error as ``PATH: reason``
    (never a bare ``[Errno 13] ...``)."""
    if isinstance(exc, OSError) and exc.strerror and exc.args[1:2] == (exc.strerror,):
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        reason = exc.strerror[0].lower() + exc.strerror[1:]
        return f"{where}: {reason}" if where else reason
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
