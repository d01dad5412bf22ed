"""The main thread spins; a second thread sleeps in first_wait for argv[1]
seconds, then sleeps on in second_wait for good. Its stack changes once,
while another thread holds the GIL nearly all the time: a profiler that
carries blocked threads' stacks over from one sample to the next must
notice it. Prints "ready" once the second thread is in first_wait."""
import sys
import threading
import time

first = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
entered = threading.Event()


def first_wait():
    entered.set()
    time.sleep(first)


def second_wait():
    time.sleep(100000)


def sleeper():
    first_wait()
    second_wait()


def spin():
    x = 0
    for i in range(200):
        x += i
    return x


threading.Thread(target=sleeper, daemon=True).start()
entered.wait()
print("ready", flush=True)
while True:
    spin()
