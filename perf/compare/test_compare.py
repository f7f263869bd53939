#!/usr/bin/env python3
"""test_compare.py: the comparison harness's own logic, without any library run: option
handling (--large, --peers), reading the peer benchmarks' lines, launches and their status, the
round spread, the best-peer ratio, and a missing peer's skip line. ctest runs it as
perf_compare_harness; `python3 perf/compare/test_compare.py` runs it by hand."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare  # noqa: E402
import runners  # noqa: E402


class Args(unittest.TestCase):
    def test_defaults(self):
        a = compare.parse_args([])
        self.assertEqual((a.minbytes, a.maxbytes, a.factor, a.rounds), (8, 16 << 20, 4, 1))
        self.assertEqual(a.peers, ["ompi", "gloo"])

    def test_large_fills_only_what_is_not_given(self):
        a = compare.parse_args(["--large"])
        self.assertEqual((a.minbytes, a.maxbytes, a.factor, a.rounds, a.iters, a.repeats),
                         (16 << 20, 256 << 20, 2, 10, 10, 3))
        a = compare.parse_args(["--large", "--rounds", "4", "--maxbytes", "64M"])
        self.assertEqual((a.minbytes, a.maxbytes, a.rounds), (16 << 20, 64 << 20, 4))

    def test_peers(self):
        self.assertEqual(compare.parse_args(["--peers", "all"]).peers, list(runners.PEERS))
        # Run order is PEERS' order, whatever order they are named in; --no-mpi drops ompi.
        a = compare.parse_args(["--peers", "oneccl-ofi,mpich,ompi", "--no-mpi"])
        self.assertEqual(a.peers, ["mpich", "oneccl-ofi"])
        with self.assertRaises(SystemExit):
            compare.parse_args(["--peers", "nccl"])


class Lines(unittest.TestCase):
    def test_parse_lines(self):
        a = compare.parse_args(["--colls", "allreduce,reducescatter"])
        res = compare.Results()
        text = "\n".join([
            "2026:11:26-05:16:31:17383:[1] |CCL_WARN| workers are disabled",
            "warn: five words on a line",
            "# oneccl-version 2022.1.2-gold",
            "8 2 14.926 0 6.427",
            "8 2 12.901 1 6.389",
            "# unsupported: reducescatter: no reduce_scatter here",
            "64 16 3.5 0 2.5",
        ])
        seen = runners.parse_lines(a, res, "oneccl-ofi", "allreduce", text)
        self.assertEqual(seen, {"allreduce"})
        self.assertEqual(res.samples["oneccl-ofi"]["allreduce"], {8: [6.427, 6.389], 64: [2.5]})
        self.assertEqual(res.means["oneccl-ofi"]["allreduce"][8], [14.926, 12.901])
        self.assertEqual(res.version["oneccl"], "2022.1.2-gold")
        self.assertTrue(res.status["oneccl-ofi"]["reducescatter"].startswith("unsupported"))

    def test_launch_status(self):
        a = compare.parse_args(["--colls", "allreduce", "--minbytes", "8", "--maxbytes", "8"])
        res = compare.Results()
        # The collective's arguments follow the launch: sh -c SCRIPT sh COLL MIN MAX ...
        runners.run_launched(a, res, "mpich", ["sh", "-c", 'echo "$2 2 1.0 0 0.5"', "sh"])
        self.assertEqual(res.status["mpich"]["allreduce"], "ok")
        self.assertEqual(res.samples["mpich"]["allreduce"], {8: [0.5]})
        runners.run_launched(a, res, "gloo", ["sh", "-c", "echo wrong >&2; exit 1", "sh"])
        self.assertTrue(res.status["gloo"]["allreduce"].startswith("exit 1: wrong"))
        runners.run_launched(a, res, "oneccl-mpi", ["sh", "-c", "echo nothing", "sh"])
        self.assertTrue(res.status["oneccl-mpi"]["allreduce"].startswith("no result"))


class Tables(unittest.TestCase):
    def results(self):
        res = compare.Results()
        for r, (chorus, mpich, ofi) in enumerate([(10.0, 30.0, 20.0), (20.0, 30.0, 20.0)]):
            res.round = r
            res.add("chorus-shm", "allreduce", 1 << 20, chorus, chorus)
            res.add("mpich", "allreduce", 1 << 20, mpich, mpich)
            res.add("oneccl-ofi", "allreduce", 1 << 20, ofi, ofi)
        for lib in ("chorus-shm", "mpich", "oneccl-ofi"):
            res.set_status(lib, "allreduce", "ok")
        return res

    def test_round_spread(self):
        res = self.results()
        self.assertEqual(res.round_spread("chorus-shm", "allreduce", 1 << 20), (2.0, 2))
        self.assertEqual(res.round_spread("mpich", "allreduce", 1 << 20), (1.0, 2))
        self.assertIsNone(res.round_spread("gloo", "allreduce", 1 << 20))

    def test_best_peer_and_spread_table(self):
        a = compare.parse_args(["--colls", "allreduce", "--rounds", "2"])
        res = self.results()
        md = compare.make_tables(a, res, ["chorus-shm", "mpich", "oneccl-ofi"])
        rows = [line for line in md.splitlines() if line.startswith("| 1048576 ")]
        # Chorus's median 15 us against the best peer's (oneccl-ofi) 20 us, and mpich's 30 us.
        self.assertIn("1.33x (oneccl-ofi)", rows[0])
        self.assertIn("| 2.00x |", rows[0])
        self.assertIn("chorus-shm/best peer", md)
        self.assertEqual(rows[1], "| 1048576 | 2.00x | 1.00x | 1.00x |")

    def test_slowest_round_names_its_machine_state(self):
        a = compare.parse_args(["--colls", "allreduce", "--rounds", "2"])
        res = self.results()
        for r, (before, after, steal) in enumerate([(92, 101, 0), (503, 512, 40)]):
            res.round = r
            res.observe("chorus-shm", before, after, steal)
        res.observe("mpich", None, 95, None)
        self.assertEqual(res.slowest_round("chorus-shm", "allreduce", 1 << 20), 1)
        md = compare.make_tables(a, res, ["chorus-shm", "mpich", "oneccl-ofi"])
        row = [line for line in md.splitlines() if line.startswith("| slowest round ")][0]
        self.assertIn("| 2 at 1 of 1 sizes (503->512 ns, steal 40 ms) |", row)
        self.assertEqual(res.run_state("mpich", 1), "?->95 ns, steal ? ms")
        self.assertEqual(res.run_state("oneccl-ofi", 0), "?")

    def test_rounds_led_counts_rounds_against_that_rounds_best_peer(self):
        a = compare.parse_args(["--colls", "allreduce", "--rounds", "2"])
        res = self.results()  # Chorus 10 then 20 us; the best peer 20 us in both rounds
        self.assertEqual(compare.rounds_led(res, "chorus-shm", ["mpich", "oneccl-ofi"],
                                            "allreduce", 1 << 20), (1, 2))
        md = compare.make_tables(a, res, ["chorus-shm", "mpich", "oneccl-ofi"])
        self.assertIn("| 1048576 | 1 of 2 |", md)

    def test_steal_reads_proc_stat(self):
        v = runners.steal_ms()
        if os.path.exists("/proc/stat"):
            self.assertIsNotNone(v)
            self.assertGreaterEqual(v, 0)


class Exit(unittest.TestCase):
    def test_failures(self):
        res = compare.Results()
        res.set_status("chorus-shm", "allreduce", "ok")
        res.set_status("gloo", "reducescatter", "unsupported: no reduce_scatter")
        res.set_status("mpich", "allreduce", "exit 1: wrong")
        res.set_status("mpich", "allreduce", "ok")  # a later round's ok keeps the failure
        self.assertEqual(compare.failures(compare.parse_args([]), res), [])
        self.assertEqual(compare.failures(compare.parse_args(["--strict"]), res),
                         ["mpich allreduce: exit 1: wrong"])
        res.set_status("chorus-shm", "allgather", "exit 1, 3 wrong elements")
        self.assertEqual(len(compare.failures(compare.parse_args([]), res)), 1)


class Missing(unittest.TestCase):
    def test_missing_oneccl_says_how_to_install(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = compare.parse_args(["--peers", "oneccl-mpi,oneccl-ofi", "--oneccl-venv",
                                    os.path.join(tmp, "none")])
            skipped = []
            peers = runners.prepare_peers(a, compare.Results(), tmp, skipped)
        self.assertEqual(peers, {})
        self.assertEqual(len([s for s in skipped if "install_oneccl.sh" in s]), 2)
        self.assertTrue(any(s.startswith("ompi, mpich, gloo: not in --peers") for s in skipped))


if __name__ == "__main__":
    unittest.main(verbosity=2)
