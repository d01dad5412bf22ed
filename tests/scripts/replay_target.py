"""Target for the replay fixtures (examples/capture_replay.rs): a few threads
parked on known lines, each showing one thing the walker must get right, and
none deeper than it needs to be, so a recording of one snapshot stays small.
Prints, as one JSON line, what the interpreter itself says every thread's
stack is (sys._current_frames, innermost first), then keeps still.
Runs on CPython 3.8+.
"""
import json
import os
import sys
import threading
import time

arrived = []


def park():
    arrived.append(threading.get_ident())
    time.sleep(100000)


def leaf():
    park()


class Outer:
    def method(self):
        # A lambda in a method: qualified names.
        (lambda: leaf())()


def via_c(_):
    # Entered from C (map): a callee the eval loop was entered for, not an
    # inlined call.
    park()
    return 0


def calls_through_c():
    return sum(map(via_c, [1]))


def gen():
    yield 1
    park()
    yield 2


def consume():
    for _ in gen():
        pass


class Built:
    # Called often enough to be specialised: 3.13+ then run __init__ above a
    # trampoline frame CPython hides, which must not show.
    def __init__(self, last):
        if last:
            park()


def build():
    for i in range(40):
        Built(i == 39)


def name_of(code):
    return getattr(code, "co_qualname", code.co_name)


def stack_of(frame):
    out = []
    while frame is not None:
        out.append([name_of(frame.f_code), frame.f_code.co_filename, frame.f_lineno])
        frame = frame.f_back
    return out


def report(expected):
    while len(arrived) < expected:
        time.sleep(0.01)
    me = threading.get_ident()
    prev = None
    while True:
        time.sleep(0.1)
        snap = {i: stack_of(f) for i, f in sys._current_frames().items() if i != me}
        if snap == prev:
            break
        prev = snap
    by_ident = {t.ident: t for t in threading.enumerate()}
    threads = [{"python_id": i, "native_id": by_ident[i].native_id, "name": by_ident[i].name, "frames": s} for i, s in snap.items()]
    print(json.dumps({"pid": os.getpid(), "threads": threads}), flush=True)


workers = [
    threading.Thread(target=calls_through_c, name="via-c", daemon=True),
    threading.Thread(target=consume, name="generator", daemon=True),
    threading.Thread(target=build, name="constructor", daemon=True),
]
for w in workers:
    w.start()
threading.Thread(target=report, args=(len(workers) + 1,), name="reporter", daemon=True).start()
Outer().method()
