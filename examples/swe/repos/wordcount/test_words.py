import unittest

from words import count_words, longest_word


class TestWords(unittest.TestCase):
    def test_count_simple(self) -> None:
        self.assertEqual(count_words("one two three"), 3)

    def test_count_whitespace(self) -> None:
        self.assertEqual(count_words("  hello   world\n"), 2)
        self.assertEqual(count_words(""), 0)

    def test_longest(self) -> None:
        self.assertEqual(longest_word("a bbb cc"), "bbb")
        self.assertEqual(longest_word(""), "")


if __name__ == "__main__":
    unittest.main()
