"""Target with known stacks, for `pyprof dump` tests.

Threads reach a steady state (a line they stay on), then a reporter thread
prints, as one JSON line, what the interpreter itself says every other
thread's stack is (sys._current_frames), innermost first. The test compares
pyprof's view with it. Runs on CPython 3.8+.
"""
import asyncio
import json
import sys
import threading
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
import ünïcødé_模块  # noqa: E402

ready = []
lock = threading.Lock()
lock.acquire()


def arrived():
    ready.append(threading.get_ident())


def spin_forever():
    arrived()
    while True: pass  # noqa: E701 (one line, so the line number is stable)


class Outer:
    def method(self):
        def inner():
            (lambda: spin_forever())()
        inner()


def sleeper_leaf():
    arrived()
    time.sleep(100000)


def sleeper():
    sleeper_leaf()


def blocked():
    arrived()
    lock.acquire()


def recurse(n):
    if n > 1:
        return recurse(n - 1)
    arrived()
    time.sleep(100000)


class Built:
    # Called often enough to be specialised: 3.13 then runs __init__ above a
    # hidden trampoline frame of its own, which must not show.
    def __init__(self, last):
        if last:
            arrived()
            time.sleep(100000)


def build():
    for i in range(50):
        Built(i == 49)


def gen():
    arrived()
    yield 1
    while True: time.sleep(1000)  # noqa: E701


def consume_gen():
    for _ in gen():
        pass


async def coro_inner():
    arrived()
    time.sleep(100000)  # blocking on purpose: keeps the stack still


async def coro_outer():
    await coro_inner()


def run_coro():
    asyncio.run(coro_outer())


def name_of(code):
    return getattr(code, "co_qualname", code.co_name)


def stack_of(frame):
    out = []
    while frame is not None:
        out.append({"function": name_of(frame.f_code), "file": frame.f_code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return out


def report(expected_threads):
    while len(ready) < expected_threads:
        time.sleep(0.01)
    me = threading.get_ident()
    natives = {t.ident: t.native_id for t in threading.enumerate()}
    names = {t.ident: t.name for t in threading.enumerate()}
    prev = None
    while True:
        time.sleep(0.2)
        snap = {i: stack_of(f) for i, f in sys._current_frames().items() if i != me}
        if snap == prev:
            break
        prev = snap
    threads = [{"native_id": natives.get(i), "name": names.get(i), "frames": s} for i, s in snap.items()]
    print(json.dumps({"pid": __import__("os").getpid(), "threads": threads}), flush=True)


workers = [
    threading.Thread(target=sleeper, name="sleeper", daemon=True),
    threading.Thread(target=blocked, name="blocked", daemon=True),
    threading.Thread(target=recurse, args=(200,), name="recursive", daemon=True),
    threading.Thread(target=consume_gen, name="generator", daemon=True),
    threading.Thread(target=build, name="constructor", daemon=True),
    threading.Thread(target=run_coro, name="coroutine", daemon=True),
    threading.Thread(target=ünïcødé_模块.функция_λ, name="ünïcødé-名前", daemon=True),
]
for w in workers:
    w.start()
reporter = threading.Thread(target=report, args=(len(workers) + 1,), name="reporter", daemon=True)
reporter.start()
if len(sys.argv) > 1 and sys.argv[1] == "--idle-main":
    arrived()
    time.sleep(100000)
Outer().method()
