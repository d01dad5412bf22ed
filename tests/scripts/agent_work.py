"""One workload for the agent's tests: wall-clock time split 70/30 between
a hot and a cold function, by fixed 10 ms slices (7 hot, then 3 cold, per
100 ms round; each slice ends at start + k * 10 ms by time.perf_counter, so
the split holds however the process is scheduled). argv[1] names the pair,
so two workloads have distinct functions: "alpha" runs alpha_hot and
alpha_cold, "beta" beta_hot and beta_cold. Further arguments are ignored
(tests put a marker there for `--match`). Prints "ready", then runs until
killed. Syntax and library of CPython 3.8 only.
"""
import sys
import time

SLICE = 0.01
clock = time.perf_counter


# Four copies of one loop (plain arithmetic, the clock read every 256
# iterations, so each function is the leaf: the clock is C, not a frame).
def alpha_hot(deadline):
    x = 1
    while True:
        i = 0
        while i < 256:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            i += 1
        if clock() >= deadline:
            return x


def alpha_cold(deadline):
    x = 1
    while True:
        i = 0
        while i < 256:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            i += 1
        if clock() >= deadline:
            return x


def beta_hot(deadline):
    x = 1
    while True:
        i = 0
        while i < 256:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            i += 1
        if clock() >= deadline:
            return x


def beta_cold(deadline):
    x = 1
    while True:
        i = 0
        while i < 256:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            i += 1
        if clock() >= deadline:
            return x


PAIRS = {"alpha": (alpha_hot, alpha_cold), "beta": (beta_hot, beta_cold)}


def main():
    hot, cold = PAIRS[sys.argv[1] if len(sys.argv) > 1 else "alpha"]
    print("ready", flush=True)
    start = clock()
    k = 0
    while True:
        deadline = start + (k + 1) * SLICE
        if k % 10 < 7:
            hot(deadline)
        else:
            cold(deadline)
        k += 1


main()
