"""A target whose stack changes all the time (torn-read stress), and which
exits by itself after the number of seconds given as argv[1] (default: never).
Every function here calls only the next one in `CHAIN`, so any correct stack
read from this process is a prefix-closed path of that chain."""
import sys
import time

deadline = time.time() + float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")


def level(n):
    if n < 6:
        return level(n + 1) + 1
    return 0


def churn():
    print("ready", flush=True)
    while time.time() < deadline:
        for _ in range(1000):
            level(0)


churn()
