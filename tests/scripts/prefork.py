"""A pre-fork server in small: forks 4 workers at start, then one more
every 0.3 s for 1.5 s, while the older ones end on their own (each works
in worker_loop for 0.5-0.9 s, then exits). For every worker reaped it prints
to stderr "worker PID SECS BORN", SECS being how long it worked and BORN
whether it was forked after the first four (while recorded for sure)."""
import os
import sys
import time


def worker_loop(secs):
    # Busy half the time, as a worker serving requests: five processes
    # spinning non-stop would leave a 2-CPU machine nothing else, and the
    # rate the test asks for is pyprof's, not the machine's.
    end = time.time() + secs
    while time.time() < end:
        busy = time.time() + 0.005
        while time.time() < busy:
            pass
        time.sleep(0.005)


def spawn(secs):
    pid = os.fork()
    if pid == 0:
        try:
            worker_loop(secs)
        finally:
            os._exit(0)
    return pid


def parent_wait(live):
    """Reap finished workers; True once none is left."""
    while live:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return False
        secs, born = live.pop(pid)
        print("worker %d %.3f %d" % (pid, secs, born), file=sys.stderr, flush=True)
    return True


def main():
    live = {}
    for i in range(4):
        secs = 0.5 + 0.1 * i
        live[spawn(secs)] = (secs, 0)
    start = time.time()
    n = 0
    while True:
        if time.time() - start >= 0.3 * (n + 1) and n < 5:
            secs = 0.5 + 0.1 * (n % 5)
            live[spawn(secs)] = (secs, 1)
            n += 1
        if parent_wait(live) and n == 5:
            break
        time.sleep(0.01)


main()
