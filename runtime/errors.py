"""The one exception type for user mistakes: bad recipes, missing files, impossible resources.

The CLI turns it into a single clear line on stderr and exit status 2, with no traceback,
before any Ray worker starts.
"""


class RecipeError(Exception):
    """A problem with what the user asked for (not a bug in trainforge)."""
