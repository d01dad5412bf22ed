"""Workload for tests/diff.rs: steady() and victim() alternate, each call
about a millisecond, so a recording of a second or two holds hundreds of
calls of each and the share of each function is a property of the code, not
of where the recording happened to start or stop.

argv[1]: seconds to run (default 2).
argv[2]: victim's work factor (default 1; 3 makes victim three times slower).
"""
import sys
import time

UNIT = 10000  # loop iterations per work unit (~0.3-0.5 ms on CPython 3.12)


def steady():
    x = 0
    for i in range(2 * UNIT):
        x += i
    return x


def victim(factor):
    x = 0
    for i in range(factor * UNIT):
        x += i
    return x


def main(seconds, factor):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        steady()
        victim(factor)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0, int(sys.argv[2]) if len(sys.argv) > 2 else 1)
