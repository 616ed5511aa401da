"""The base of the errors a user can cause and fix that no built-in exception names (a damaged or mismatched
sidecar, …): every command reports one as a single ``error:`` line, not a traceback (see :mod:`._cli`)."""


class UserFixableError(Exception):
    """A problem with what the user gave or has on disk, which the message tells them how to mend."""
