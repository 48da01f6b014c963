"""The one error of a hub environment that stops the run."""


class HubError(ValueError):
    """A hub's package is missing, or one of its environments cannot be loaded or broke the
    contract LoCoJAX runs it by: one line, the run stops (exit 2)."""
