"""The one exception type users see: the CLI prints its message on one line and exits with code 2."""


class TaskformerError(Exception):
    """A problem the user can fix (bad input, bad config, missing file); never a bug in taskformer."""


class DataError(TaskformerError):
    """Malformed or missing data; the message names the file and, where there is one, the line."""
