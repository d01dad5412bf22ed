"""Real code as a stationary workload: CPython's own test cases, run over
and over in this process.

    python test_rounds.py SECONDS MODULE [MODULE ...]
    python test_rounds.py check MODULE [MODULE ...]

Imports `test.MODULE` for each MODULE, runs one round under `warm_up`,
prints "ready", then runs rounds under `measured_round` until SECONDS have
passed, and prints "rounds N in S s ...". A round loads and runs every
test case of every module once, in the order given, results discarded;
`random` is seeded alike before each, so every round runs the same code on
the same data. Only whole rounds are run (the last one starts only if it
should end closer to SECONDS than stopping before it would; at least two
are run), so the samples under `measured_round` are of some number of
identical rounds, and two runs' differ by sampling noise alone: not by how
much of the start-up or of the first, different, round each profiler saw,
nor by where in a round each happened to stop.

Made for comparing profilers on real code (tests/accuracy.rs): pick
modules that are CPU-bound and single-threaded (no subprocesses, sleeps or
waits), so a profiler that counts only running threads and one that counts
wall time see the same samples. `check` only imports the modules (exit
status 0 if they all import). Syntax and library of CPython 3.8 only.
"""
import importlib
import random
import sys
import time
import unittest


def run_tests(modules):
    # Tests that draw random data draw the same in every round and run.
    random.seed(20240601)
    # HtmlDiff numbers its tables across instances, and test_difflib
    # compares its output with a file: restart the count.
    difflib = sys.modules.get("difflib")
    if difflib is not None:
        difflib.HtmlDiff._default_prefix = 0
    loader = unittest.TestLoader()
    result = unittest.TestResult()
    for module in modules:
        # A TestSuite drops its tests as it runs them: load afresh per round.
        loader.loadTestsFromModule(module).run(result)
    return result


def warm_up(modules):
    # The first round differs from the rest (first calls, caches, imports
    # the tests make): it runs under this name, which profiles can leave out.
    return run_tests(modules)


def measured_round(modules):
    return run_tests(modules)


def main():
    modules = [importlib.import_module("test." + name) for name in sys.argv[2:]]
    if sys.argv[1] == "check":
        return
    secs = float(sys.argv[1])
    warm_up(modules)
    print("ready", flush=True)
    clock = time.perf_counter
    start = clock()
    rounds = 0
    while True:
        t0 = clock()
        result = measured_round(modules)
        rounds += 1
        now = clock()
        took = now - t0
        if rounds >= 2 and now + took / 2 >= start + secs:
            break
    problems = len(result.errors) + len(result.failures)
    print("rounds %d in %.2f s, %d tests, %d errors or failures in the last round"
          % (rounds, clock() - start, result.testsRun, problems), flush=True)


if __name__ == "__main__":
    main()
