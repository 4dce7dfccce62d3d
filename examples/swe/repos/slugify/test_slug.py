import unittest

from slug import slugify, unique_slug


class TestSlug(unittest.TestCase):
    def test_slugify(self) -> None:
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(slugify("  rlgate 101 "), "rlgate-101")

    def test_unique(self) -> None:
        self.assertEqual(unique_slug("a b", {"a-b"}), "a-b-2")
        self.assertEqual(unique_slug("a b", {"a-b", "a-b-2"}), "a-b-3")


if __name__ == "__main__":
    unittest.main()
