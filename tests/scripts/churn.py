"""A target whose stack changes all the time (torn-read stress), and which
exits by itself after the number of seconds given as argv[1] (default: never;
"inf" too). `level` frames stack at most 7 deep on top of `churn`, and each
but the innermost waits on its recursive call line. With argv[2] == "via-c"
the recursion is `level_via_c`, which calls itself through C code (map), so
every callee is a frame the eval loop was entered for, not an inlined call."""
import sys
import time

deadline = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
VIA_C = sys.argv[2:] == ["via-c"]


def level(n):
    if n < 6:
        return level(n + 1) + 1
    return 0


def level_via_c(n):
    if n < 6:
        return sum(map(level_via_c, (n + 1,))) + 1
    return 0


def churn():
    print("ready", flush=True)
    run = level_via_c if VIA_C else level
    while time.time() < deadline:
        for _ in range(1000):
            run(0)


churn()
