"""A module whose file name and function name are not ASCII."""
import time


def функция_λ():
    __import__("stacks").arrived() if False else None
    import __main__
    __main__.arrived()
    time.sleep(100000)
