"""A steady stack: recurse 20 frames deep, then compute forever (no code
object is created or freed once it prints "ready")."""
import gc


def busy():
    x = 0
    for i in range(1000):
        x += i
    return x


def down(n):
    if n:
        return down(n - 1)
    busy()
    gc.collect()  # whatever startup left to free goes now, not while sampled
    print("ready", flush=True)
    while True:
        busy()


down(20)
