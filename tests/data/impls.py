"""Things that are not implementations: passing them as --impl must be refused up front."""

_HOLD = [1, 2, 3]  # a module-level list, not a function
