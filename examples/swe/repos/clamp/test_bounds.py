import unittest

from bounds import clamp, in_range


class TestBounds(unittest.TestCase):
    def test_clamp_inside(self) -> None:
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_clamp_outside(self) -> None:
        self.assertEqual(clamp(-3, 0, 10), 0)
        self.assertEqual(clamp(42, 0, 10), 10)

    def test_clamp_bad_range(self) -> None:
        with self.assertRaises(ValueError):
            clamp(1, 5, 0)

    def test_in_range(self) -> None:
        self.assertTrue(in_range(3, 0, 3))
        self.assertFalse(in_range(4, 0, 3))


if __name__ == "__main__":
    unittest.main()
