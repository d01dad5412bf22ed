"""Time split between handling an exception and plain work, measured
in-process, and two idle threads that tell exception states apart.

The main thread cuts time into 20 ms slices; 2 of every 5 run `handler`,
which raises and then spins inside the `except` block until the slice
ends, the others `plain`, which spins with no exception. Seconds from the
raise to the end of the `except` block are summed. Two more threads sleep:
`sleeps_in_handler` inside an except block, under a generator running there
(its exception lies below the generator's own, empty, exception item), and
`sleeps_after_handler` after an except block (its item holds None again).

Prints "ready" (flushed) once the threads are there, runs for argv[1]
seconds (default 3), then prints "handled HANDLED TOTAL": seconds in the
handler and seconds run since "ready". Syntax and library of CPython 3.8 only.
"""
import sys
import threading
import time

clock = time.perf_counter
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
SLICE = 0.02


def handler(deadline):
    try:
        raise ValueError("handled")  # RAISE LINE
    except ValueError:
        spin = 0
        while clock() < deadline:
            spin += 1  # HANDLER END LINE
    return spin


def plain(deadline):
    spin = 0
    while clock() < deadline:
        spin += 1
    return spin


def idle_gen(ready):
    ready.set()
    time.sleep(seconds + 30)
    yield


def sleeps_in_handler(ready):
    try:
        raise KeyError("held")
    except KeyError:
        for _ in idle_gen(ready):
            pass


def sleeps_after_handler(ready):
    try:
        raise KeyError("done")
    except KeyError:
        pass
    ready.set()
    time.sleep(seconds + 30)


def main():
    for target in (sleeps_in_handler, sleeps_after_handler):
        ready = threading.Event()
        threading.Thread(target=target, args=(ready,), daemon=True).start()
        ready.wait()
    print("ready", flush=True)
    start = clock()
    handled = 0.0
    k = 0
    while clock() - start < seconds:
        deadline = start + (k + 1) * SLICE
        if k % 5 < 2:
            t0 = clock()
            handler(deadline)
            handled += clock() - t0
        else:
            plain(deadline)
        k += 1
    print("handled %.6f %.6f" % (handled, clock() - start), flush=True)


main()
