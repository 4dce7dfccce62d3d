"""URL slugs from titles."""

import re

_WORD = re.compile(r"[A-Za-z0-9]+")


def slugify(title: str) -> str:
    """Lower-case ASCII words of ``title`` joined by hyphens: "Hello, World!" -> "hello-world"."""
    words = _WORD.findall(title)
    return "-".join(words)


def unique_slug(title: str, taken: set[str]) -> str:
    """``slugify(title)``, with "-2", "-3", ... appended until it is not in ``taken``."""
    base = slugify(title)
    slug, n = base, 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    return slug
