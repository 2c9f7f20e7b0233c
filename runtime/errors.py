"""The one exception type for user mistakes: bad recipes, missing files, impossible resources.

The CLI turns it into a single clear line on stderr and exit status 2, with no traceback,
before any Ray worker starts.
"""

import difflib
from collections.abc import Iterable


class RecipeError(Exception):
    """A problem with what the user asked for (not a bug in trainforge)."""


class UserCodeError(RecipeError):
    """The user's own code that a recipe names (an SBI prior or simulator) cannot be imported,
    raises, or breaks its contract. A recipe error wherever it is found — `validate` fails on
    it too, unlike data missing on the machine that validates."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def not_one_of(key: str, value: object, choices: Iterable[str]) -> RecipeError:
    """The error for a value outside a fixed set of choices, the same wherever it is caught."""
    options = [str(choice) for choice in choices]
    return RecipeError(
        f"{key}: {value!r} is not one of {', '.join(options)}{did_you_mean(str(value), options)}"
    )


class NonFiniteLoss(RuntimeError):
    """Training stopped because its loss turned NaN or inf: every step after it would train on
    garbage, and a checkpoint of it would push the good ones out (``checkpoint.keep_last``)."""


class CollectiveFailed(RuntimeError):
    """An all-reduce came back with values no completed reduction can hold: the collective did
    not finish (NCCL's watchdog aborts the communicator of a rank that waited past
    ``scaling.timeout_s``, and the pending result is left as it was)."""


class NoValidCheckpoint(RecipeError):
    """The run has checkpoints and none passes verification against its manifest: resuming would
    silently start over (or train on a broken state), so the run is refused, nothing deleted."""
