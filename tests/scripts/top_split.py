"""Wall-clock time split 60/30/10 between three functions, fixed by the clock.

Each round spins on time.perf_counter() in `sixty` for 60 ms, `thirty` for
30 ms and `ten` for 10 ms, so whatever the machine's load, the main thread
spends 60 %, 30 % and 10 % of its wall time in them (own time: the clock is
a C function, no Python frame above them). A second thread, named "idler",
sleeps in `idle` the whole time, for tests that pick a thread.

Prints "ready" (flushed) once both threads run, then runs until killed, or
for argv[1] seconds if given. Syntax and library of CPython 3.8 only.
"""
import sys
import threading
import time

clock = time.perf_counter


# Each spins in its own body (no helper call), so its time is its own.
def sixty(start):
    until = start + 0.060
    while clock() < until:
        pass


def thirty(start):
    until = start + 0.030
    while clock() < until:
        pass


def ten(start):
    until = start + 0.010
    while clock() < until:
        pass


def idle(stop):
    stop.wait()


def main(secs):
    stop = threading.Event()
    idler = threading.Thread(target=idle, args=(stop,), name="idler", daemon=True)
    idler.start()
    # Rounds start on a fixed grid (k * 100 ms): a late round does not
    # shift the ones after it, so the split holds over any whole window.
    t0 = clock()
    print("ready", flush=True)
    k = 0
    while secs is None or clock() - t0 < secs:
        start = t0 + k * 0.100
        sixty(start)
        thirty(start + 0.060)
        ten(start + 0.090)
        k += 1
    stop.set()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else None)
