"""Word counting helpers."""


def count_words(text: str) -> int:
    """The number of words in ``text``; words are separated by any whitespace."""
    return len(text.split(" "))


def longest_word(text: str) -> str:
    """The longest word (the first one on a tie), or "" for a text without words."""
    best = ""
    for word in text.split():
        if len(word) > len(best):
            best = word
    return best
