"""Threads come and go: one worker at a time spins ~20 ms and exits, the
main thread waits for it, pauses ~10 ms, and starts the next."""
import threading
import time


def work():
    end = time.monotonic() + 0.02
    while time.monotonic() < end:
        pass


print("ready", flush=True)
while True:
    t = threading.Thread(target=work)
    t.start()
    t.join()
    time.sleep(0.01)
