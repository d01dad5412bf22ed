"""One thread spins (on CPU, holds the GIL), one sleeps, one waits on a lock.
argv[1]: seconds to run (default: until killed)."""
import sys
import threading
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
lock = threading.Lock()
lock.acquire()


def sleeping_thread():
    time.sleep(seconds + 5)


def waiting_thread():
    lock.acquire(timeout=seconds + 5)


def spinning_main():
    end = time.time() + seconds
    while time.time() < end:
        pass


threading.Thread(target=sleeping_thread, daemon=True).start()
threading.Thread(target=waiting_thread, daemon=True).start()
print("ready", flush=True)
spinning_main()
