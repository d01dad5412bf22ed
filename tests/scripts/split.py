"""Time splits 60/30/10 between three functions doing identical work units.
argv[1]: seconds to run (default 3); argv[2]: exit code (default 0)."""
import sys
import time

UNIT = 100000  # ~3 ms: a round (10 units) spans many sampling intervals, so no aliasing


def unit():
    x = 0
    for i in range(UNIT):
        x += i
    return x


def sixty():
    for _ in range(6):
        unit()


def thirty():
    for _ in range(3):
        unit()


def ten():
    unit()


def main(seconds):
    print("ready", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        sixty()
        thirty()
        ten()


main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
