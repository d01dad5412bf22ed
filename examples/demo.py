"""A small program with a recognisable profile, for `scripts/demo.sh`."""
import json
import threading
import time


def is_prime(n):
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def count_primes(limit):
    return sum(1 for n in range(limit) if is_prime(n))


def encode_documents(count):
    docs = [{"id": i, "tags": ["a", "b", str(i)], "score": i / 7} for i in range(count)]
    return len(json.dumps(docs))


def background_sleeper(stop):
    while not stop.is_set():
        time.sleep(0.05)


def main(seconds=3.0):
    stop = threading.Event()
    t = threading.Thread(target=background_sleeper, args=(stop,), name="sleeper")
    t.start()
    end = time.time() + seconds
    while time.time() < end:
        count_primes(20000)
        encode_documents(2000)
    stop.set()
    t.join()


if __name__ == "__main__":
    main()
