"""The one error of an environment or tool of the user's that stops the run."""


class EnvError(ValueError):
    """An environment class or tool function of the user's cannot be loaded or broke its
    contract (wrong types from `reset` or `step`): the entry point prints its one line,
    exit 2."""
