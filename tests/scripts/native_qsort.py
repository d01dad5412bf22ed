"""Target for `--native`: the main thread sorts with libc's qsort through
ctypes, and the Python comparison callback spins forever, so the true stack
is <module> -> sort_numbers -> [ctypes, libffi] -> qsort -> [libc] -> [ctypes
thunk] -> compare -> spin. A second thread sleeps in time.sleep (libc's
clock_nanosleep under Python's sleeper_leaf). Prints one JSON line when both
are in place: {"main": native id, "sleeper": native id}. Python 3.8+.
"""
import ctypes
import json
import sys
import threading
import time

libc = ctypes.CDLL("libc.so.6")
CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
sleeping = threading.Event()
ids = {}


def sleeper_leaf():
    ids["sleeper"] = threading.get_native_id()
    sleeping.set()
    time.sleep(100000)


def spin():
    print(json.dumps(ids), flush=True)
    while True: pass  # noqa: E701


def compare(a, b):
    spin()
    return a[0] - b[0]


def sort_numbers():
    values = (ctypes.c_int * 8)(*range(8, 0, -1))
    libc.qsort(values, len(values), ctypes.sizeof(ctypes.c_int), CMP(compare))


if __name__ == "__main__":
    ids["main"] = threading.get_native_id()
    threading.Thread(target=sleeper_leaf, name="sleeper", daemon=True).start()
    sleeping.wait()
    time.sleep(0.05)
    sort_numbers()
    sys.exit(1)
