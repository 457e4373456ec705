"""The one exception type users see: the CLI prints its message on one line and exits with code 2."""


class TaskformerError(Exception):
    """A problem the user can fix (bad input, bad config, missing file); never a bug in taskformer."""

    exit_code = 2  # the CLI's exit status for it (an interruption's is 130, as a shell's for SIGINT)


class DataError(TaskformerError):
    """Malformed or missing data; the message names the file and, where there is one, the line."""
