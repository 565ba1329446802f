#!/usr/bin/env python3
"""What makes a benchmark run unusable (report.problems), on made-up results: the smoke run in
the test command exits 1 on any problem, so a check that is too strict fails CI on noise and one
that is too loose lets a broken measurement through."""
import os, sys, unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def cpu_cell(floor, warden_own, res=0.5):
    s = lambda system, own: {"system_ms": system, "own_ms": own}
    return {"cpu": {"cells": [{"files": 20, "concurrency": 2, "resolution_ms": res, "servers": {
        "floor": s(*floor), "upstream": s(6.0, 6.5), "cmp-warden": s(10.1, warden_own)}}]}}


class CpuProblems(unittest.TestCase):
    def test_a_floor_at_zero_within_the_ticks_resolution_is_a_measurement(self):
        self.assertEqual(report.problems(cpu_cell((-0.24, 0.0), 9.5)), [])

    def test_a_floor_below_the_resolution_is_not(self):
        [p] = report.problems(cpu_cell((-0.6, 1.0), 9.5))
        self.assertIn("floor system -0.6 ms", p)

    def test_a_server_whose_tree_measured_no_cpu_is_not(self):
        [p] = report.problems(cpu_cell((0.7, 1.0), 0))
        self.assertIn("cmp-warden", p)


if __name__ == "__main__":
    unittest.main()
