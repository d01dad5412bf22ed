"""Pre-fork server target for `bench/run.py --scale` (Python 3.8+, stdlib only).

    python prefork_target.py WORKERS LOGFILE [CHURN_SECS]

The parent forks WORKERS workers that spin in a few Python frames, then every
CHURN_SECS (default 1) kills the oldest and forks a replacement, as a pre-fork
server recycling workers does. LOGFILE gets one JSON line per worker,
{"pid", "start", "end"} (time.time(); "start" is taken in the parent just
before fork(), "end" after it was reaped), written when it ends or when the
parent gets SIGTERM ("end": null). Prints "ready" once the first WORKERS run.

A worker's first ms of life are spent in age_ms(), one source line per
AGE_STEP seconds of its age, so the line of the earliest sample a profiler
took of a worker says, to AGE_STEP, how long after fork() that sample came:
profiles carry no per-sample timestamps, the stack itself carries the time.
"""
import json
import os
import signal
import sys
import time

AGE_STEP = 0.002   # seconds per line of age_ms
AGE_LINES = 250    # so age_ms covers the first 0.5 s of a worker's life
AGE_FIRST_LINE = 2  # line of age_ms's first loop in its generated source


def work_unit():
    x = 0
    for i in range(100):
        x += i * i
    return x


# age_ms(t0): line AGE_FIRST_LINE + k runs while the age is in [k, k+1) steps.
_src = "def age_ms(t0):\n" + "".join(
    "    while time.time() - t0 < %r: work_unit()\n" % ((k + 1) * AGE_STEP) for k in range(AGE_LINES))
_ns = {"time": time, "work_unit": work_unit}
exec(compile(_src, "<age>", "exec"), _ns)
age_ms = _ns["age_ms"]


def serve():
    while True:
        work_unit()


def worker(t0):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    age_ms(t0)
    serve()


def main():
    n, logpath = int(sys.argv[1]), sys.argv[2]
    churn = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    log = open(logpath, "w")
    live = []   # (pid, start), oldest first

    def spawn():
        t0 = time.time()
        pid = os.fork()
        if pid == 0:
            try:
                worker(t0)
            finally:
                os._exit(0)
        live.append((pid, t0))

    def retire(pid, start):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        log.write(json.dumps({"pid": pid, "start": start, "end": time.time()}) + "\n")
        log.flush()

    def stop(signum, frame):
        for pid, start in live:
            os.kill(pid, signal.SIGKILL)
            log.write(json.dumps({"pid": pid, "start": start, "end": None}) + "\n")
        log.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    for _ in range(n):
        spawn()
    print("ready", flush=True)
    while True:
        time.sleep(churn)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # no stop() mid-replacement
        retire(*live.pop(0))
        spawn()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])


if __name__ == "__main__":
    main()
