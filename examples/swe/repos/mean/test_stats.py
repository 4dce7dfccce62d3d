import unittest

from stats import mean, median


class TestStats(unittest.TestCase):
    def test_mean(self) -> None:
        self.assertEqual(mean([1, 2, 3]), 2)
        self.assertEqual(mean([4]), 4)

    def test_mean_empty(self) -> None:
        with self.assertRaises(ValueError):
            mean([])

    def test_median(self) -> None:
        self.assertEqual(median([3, 1, 2]), 2)
        self.assertEqual(median([4, 1, 3, 2]), 2.5)


if __name__ == "__main__":
    unittest.main()
