"""The base of the errors a user can cause and fix that no built-in exception names (a damaged or mismatched
sidecar, …): every command reports one as a single ``error:`` line, not a traceback (see :mod:`._cli`)."""


class UserFixableError(Exception):
    """A problem with what the user gave or has on disk, which the message tells them how to mend."""


class UsageError(UserFixableError, ValueError):
    """Flags that contradict each other or the inputs they name: a command reports it as one ``error:`` line and
    exits with status 2, as argparse does for the flags it checks itself."""


class UsageExit(SystemExit):
    """A usage error raised as :class:`SystemExit`, for code whose callers expect one: ``str()`` is its ``error:``
    line, which the command runner prints (:func:`pyserini_mores._cli.run_parsed`); the exit status is 2."""

    def __init__(self, message: str):
        super().__init__(message if message.startswith("error: ") else f"error: {message}")
        self.code = 2  # the process's exit status; the line itself is in args[0]


class InterruptedExit(SystemExit, KeyboardInterrupt):
    """Ctrl-C, once a command has said what it kept: a :class:`KeyboardInterrupt` to the code it passes through, a
    quiet :class:`SystemExit` with status 130 (as a shell reports SIGINT) to the interpreter, so no traceback
    follows the ``error:`` line (``str()``) that the command runner prints."""

    def __init__(self, message: str = "interrupted"):
        super().__init__(message if message.startswith("error: ") else f"error: {message}")
        self.code = 130
