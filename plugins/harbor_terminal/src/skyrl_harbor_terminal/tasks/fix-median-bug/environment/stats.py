"""Small statistics helpers used by the reporting scripts."""


def mean(values):
    """Return the arithmetic mean of a non-empty list of numbers."""
    return sum(values) / len(values)


def median(values):
    """Return the median of a non-empty list of numbers.

    For an even number of values the median is the average of the two middle values.
    The list passed in must not be modified.
    """
    values.sort()
    middle = len(values) // 2
    return values[middle]
