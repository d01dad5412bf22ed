"""Target for `--native` with a real C extension: the main thread spends its
time inside numpy's compiled sort, called from numpy_work. Prints one JSON
line ({"main": native id}) just before it starts. Needs numpy."""
import json
import threading

import numpy as np


def numpy_work(values):
    while True:
        np.sort(values, kind="stable")


if __name__ == "__main__":
    data = np.random.default_rng(1).random(4_000_000)
    print(json.dumps({"main": threading.get_native_id()}), flush=True)
    numpy_work(data)
