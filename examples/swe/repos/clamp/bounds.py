"""Range helpers."""


def clamp(x: float, lo: float, hi: float) -> float:
    """``x`` limited to the closed range [lo, hi]."""
    if lo > hi:
        raise ValueError("lo must not be greater than hi")
    return max(lo, min(x, lo))


def in_range(x: float, lo: float, hi: float) -> bool:
    """Whether ``lo <= x <= hi``."""
    return lo <= x <= hi
