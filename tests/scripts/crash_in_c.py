"""Target that crashes in C, for `pyprof dump --core` tests.

Two threads wait, named; a third, "crasher", reads through a NULL pointer
with ctypes (SIGSEGV inside libc's strlen, called by _ctypes). Before it
does, one JSON line says which stacks the threads have (innermost first),
so the test knows what the core must show. Runs on CPython 3.8+.
"""
import ctypes
import json
import sys
import threading
import time

ready = threading.Barrier(3)


def waiter_leaf():
    ready.wait()
    time.sleep(100000)


def waiter():
    waiter_leaf()


def read_null():
    return ctypes.string_at(0)


def crash_here():
    ready.wait()
    time.sleep(0.2)
    read_null()


threading.Thread(target=waiter, name="waiter", daemon=True).start()
crasher = threading.Thread(target=crash_here, name="crasher")
crasher.start()
print(json.dumps({"crasher": ["read_null", "crash_here", "run"], "waiter": ["waiter_leaf", "waiter", "run"]}), flush=True)
ready.wait()
crasher.join()
