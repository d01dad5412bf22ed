"""N named threads ("worker-0" ... "worker-N-1"), each asleep three frames
deep, and a sleeping main thread: for thread-selection tests; with a second
argument "spin", the main thread spins instead (in main_spin -> spin_step),
the shape of a server with one busy thread. Prints one JSON line, {"pid",
"threads": [{"name", "native_id"}]}, once every worker is in its sleep.
Runs on CPython 3.8+ (threading.get_native_id)."""
import json
import os
import sys
import threading
import time

started = threading.Semaphore(0)


def leaf():
    started.release()
    time.sleep(100000)


def middle():
    leaf()


def top():
    middle()


def main_wait():
    time.sleep(100000)


def spin_step():
    x = 0
    for i in range(200):
        x += i
    return x


def main_spin():
    while True:
        spin_step()


workers = [threading.Thread(target=top, name=f"worker-{i}", daemon=True) for i in range(int(sys.argv[1]))]
for w in workers:
    w.start()
for _ in workers:
    started.acquire()
me = threading.current_thread()
threads = [{"name": t.name, "native_id": t.native_id} for t in [me] + workers]
print(json.dumps({"pid": os.getpid(), "threads": threads}), flush=True)
if sys.argv[2:] == ["spin"]:
    main_spin()
else:
    main_wait()
