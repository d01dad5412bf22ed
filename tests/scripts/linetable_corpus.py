"""Line-table corpus for tests/linetable.rs.

Runnable by every CPython 3.8-3.15. Compiles the source of a set of real stdlib
modules, this file itself (which contains functions of odd shapes) and a few
generated sources (huge line gaps, huge negative line deltas, very long lines,
EXTENDED_ARG-heavy code), walks every code object recursively through
co_consts, and prints one JSON document on stdout:

    {"version": [3, 12, 1], "debug_ranges": true, "codes": [CODE, ...]}

CODE is an object with
    name, file, first      co_name, co_filename, co_firstlineno
    table                  hex of co_lnotab (<= 3.9) or co_linetable (>= 3.10)
    n                      number of 2-byte code units in co_code
    a2l                    for every code unit i, the interpreter's own
                           PyCode_Addr2Line(code, 2*i) (called through ctypes),
                           i.e. what frame.f_lineno reports for that
                           instruction when not tracing. -1 means "no line".
    a2l_stride             a2l[j] is for code unit j*a2l_stride. 1 except for
                           huge code objects: PyCode_Addr2Line walks the table
                           from the start on every call, so a dense oracle
                           would be quadratic (co_lines/co_positions stay dense)
    probes                 [[instr, PyCode_Addr2Line(...)], ...] for negative and
                           past-the-end offsets; instr is in the unit the Rust
                           decoder takes (bytes for <= 3.9, code units after)
    starts   (<= 3.9)      dis.findlinestarts(code) as [[byte_offset, line]]
    lines    (>= 3.10)     list(code.co_lines()) as [[start, end, line|null]]
    pos      (>= 3.11)     start line of each code.co_positions() entry (one per
                           code unit, caches included), null for "no location"

All expected values come from the running interpreter (C API, co_lines,
co_positions, dis); nothing here decodes a line table itself.
"""

import asyncio
import ctypes
import dis
import importlib
import json
import os
import sys
import types

VERSION = sys.version_info[:2]

CORPUS_MODULES = [
    "json",
    "argparse",
    "asyncio",
    "dataclasses",
    "email.parser",
    "collections",
    "typing",
    "enum",
    "inspect",
    "textwrap",
    "difflib",
    "tokenize",
    "re",
    "pathlib",
    "functools",
]


# ---------------------------------------------------------------------------
# Functions of odd shapes (compiled again from this file's source below).
# ---------------------------------------------------------------------------

def deco(*a, **k):
    def wrap(f):
        return f
    return wrap


@deco(
    1,
    2,
)
@deco(3)
def decorated(
    a,
    b=(
        1 +
        2
    ),
):
    return (
        a
        +
        b
    )


def multi_line_expr(x):
    y = [
        i * 2
        for i in range(x)
        if i % 3
    ]
    z = {k: v for k, v in
         zip(y, y)}
    s = {
        q
        for q in y
    }
    g = (
        w
        for w in y
    )
    return (y,
            z,
            s,
            list(g))


lam = lambda a, b=2: (a
                      + b)


def gen(n):
    i = 0
    while i < n:
        yield i
        i += 1
    yield from range(3)


async def agen(n):
    for i in range(n):
        yield i
        await asyncio.sleep(0)


async def coro(ctx, something):
    async with ctx() as c:
        async for x in agen(3):
            pass
    return await something


def trying(x):
    try:
        x = 1 / x
    except ZeroDivisionError as e:
        x = 0
    except (TypeError,
            ValueError):
        raise
    else:
        x += 1
    finally:
        x -= 1
    with open(x) as f, \
         open(x) as g:
        pass
    return x


def nocode_lines():
    # comment


    """not a docstring, a constant expression"""

    if 0:
        unreachable()  # noqa: F821
    pass
    return None


def loops(xs):
    total = 0
    for x in xs:
        if x:
            continue
        elif x is None:
            break
        total += x
    else:
        total = -1
    while True:
        total += 1
        if total > 10: break
    return total


class Klass(object):
    attr = 1
    def method(self): return self.attr
    @property
    def prop(self):
        return (self.
                attr)
    @staticmethod
    def st(): pass


def many_on_one_line(): x = 1; y = 2; z = x + y; return [x, y, z, x * y, x - y, x // (y or 1), str(x) + str(y), [q for q in (x, y, z)], {x: y}, (lambda: z)()]


def nested(a):
    def inner(b):
        def innermost(c):
            nonlocal b
            b = c
            return a + b + c
        return innermost
    return inner


def chained(obj):
    return (obj
            .attr
            .method()
            .other(
                1,
                2)
            [0])


# ---------------------------------------------------------------------------
# Generated sources for shapes that are impractical to write out literally.
# ---------------------------------------------------------------------------

def generated_sources():
    out = []
    nl = "\n"
    # Line gaps > 255 (and > 65535) between consecutive statements.
    out.append(("gap", (
        "def gap():\n"
        "    a = 1\n" + nl * 300 +
        "    b = 2\n" + nl * 70000 +
        "    c = 3\n" + nl * 129 +
        "    return a + b + c\n")))
    # Big negative line deltas: the call/build instruction belongs to an
    # earlier line than its last operand (3.8+ attribute calls to the first
    # line of the call; decorators are applied on their own line).
    out.append(("neg", (
        "def neg(f, x):\n"
        "    r = f(\n" + nl * 300 +
        "        x,\n"
        "    )\n"
        "    d = {\n" + nl * 200 +
        "        'k': x,\n" + nl * 140 +
        "        'j': f(x)}\n"
        "    return (r +\n" + nl * 500 + "      d)\n"
        "@neg\n" + nl * 300 +
        "def decorated_far(): pass\n")))
    # > 127 instructions and > 255 bytes of bytecode on a single line.
    out.append(("long_line", (
        "def long_line(a):\n"
        "    return " + " + ".join(["a"] * 1500) + "\n"
        "def long_call(f, a):\n"
        "    return f(" + ", ".join("a.x%d" % i for i in range(300)) + ")\n")))
    # EXTENDED_ARG: > 256 locals/constants, jumps over long bodies.
    body = "".join("        v%d = %d\n" % (i, i) for i in range(400))
    out.append(("ext_arg", (
        "def ext_arg(a):\n"
        "    if a:\n" + body +
        "        pass\n"
        "    else:\n"
        "        v0 = -1\n"
        "    return v0 + v399\n")))
    # Large function: > 2**16 bytes of bytecode on 3.11+ (tens of KB before),
    # two-byte jump arguments, thousands of table entries. (Kept moderate: a
    # per-offset check is quadratic in the table size.)
    body = "".join("        x = x + %d\n" % (i,) for i in range(3500))
    out.append(("huge_func", (
        "def huge_func(x):\n"
        "    while x:\n" + body +
        "        if x > 5: break\n"
        "    return x\n")))
    # Code that starts far down in a file.
    out.append(("far", nl * 200000 + "def far(a):\n    return a\n"))
    if VERSION >= (3, 10):
        out.append(("match", (
            "def matching(p):\n"
            "    match p:\n"
            "        case {'x': x,\n"
            "              'y': [1, 2, *rest]}:\n"
            "            return x\n"
            "        case (1 |\n"
            "              2):\n"
            "            return 2\n"
            "        case str() if (\n"
            "                p):\n"
            "            return 3\n"
            "        case _:\n"
            "            pass\n")))
    if VERSION >= (3, 11):
        out.append(("except_star", (
            "def estar():\n"
            "    try:\n"
            "        raise ExceptionGroup('g', [ValueError(1)])\n"
            "    except* ValueError as e:\n"
            "        pass\n"
            "    except* (TypeError,\n"
            "             KeyError):\n"
            "        raise\n")))
    if VERSION >= (3, 12):
        out.append(("type_params", (
            "def ident[T: (int,\n"
            "              str)](x: T) -> T:\n"
            "    return x\n"
            "class Box[T]:\n"
            "    def get(self) -> T: ...\n"
            "type Alias[K] = dict[K,\n"
            "                     list[K]]\n")))
    return out


# ---------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------

ADDR2LINE = ctypes.pythonapi.PyCode_Addr2Line
ADDR2LINE.argtypes = [ctypes.py_object, ctypes.c_int]
ADDR2LINE.restype = ctypes.c_int
A2L_MAX_CALLS = 4000


def walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            for sub in walk(c):
                yield sub


def describe(code):
    n_bytes = len(code.co_code)
    n = n_bytes // 2
    stride = max(1, n // A2L_MAX_CALLS)
    rec = {
        "name": code.co_name,
        "file": code.co_filename,
        "first": code.co_firstlineno,
        "n": n,
        "a2l_stride": stride,
        "a2l": [ADDR2LINE(code, 2 * i) for i in range(0, n, stride)],
    }
    if VERSION <= (3, 9):
        rec["table"] = code.co_lnotab.hex()
        probe_instrs = [-1, -2, 1, n_bytes - 1, n_bytes, n_bytes + 1,
                        n_bytes + 2, n_bytes + 1000]
        rec["probes"] = [[p, ADDR2LINE(code, p)] for p in probe_instrs]
        rec["starts"] = [[o, l] for o, l in dis.findlinestarts(code)]
    else:
        rec["table"] = code.co_linetable.hex()
        probe_instrs = [-1, -2, n, n + 1, n + 1000]
        rec["probes"] = [[p, ADDR2LINE(code, 2 * p)] for p in probe_instrs]
        rec["lines"] = [[s, e, l] for s, e, l in code.co_lines()]
        if VERSION >= (3, 11):
            rec["pos"] = [p[0] for p in code.co_positions()]
    return rec


def module_sources():
    for name in CORPUS_MODULES:
        importlib.import_module(name)
    seen = set()
    for modname in sorted(sys.modules):
        if not any(modname == n or modname.startswith(n + ".")
                   for n in CORPUS_MODULES):
            continue
        path = getattr(sys.modules[modname], "__file__", None)
        if not path or not path.endswith(".py") or path in seen:
            continue
        seen.add(path)
        with open(path, "rb") as f:
            yield path, f.read()
    here = os.path.abspath(__file__)
    with open(here, "rb") as f:
        yield here, f.read()
    for name, src in generated_sources():
        yield "<corpus:%s>" % name, src


def main():
    codes = []
    for filename, src in module_sources():
        top = compile(src, filename, "exec", dont_inherit=True)
        for code in walk(top):
            codes.append(describe(code))
    debug_ranges = VERSION >= (3, 11) and not (
        os.environ.get("PYTHONNODEBUGRANGES")
        or "no_debug_ranges" in getattr(sys, "_xoptions", {}))
    json.dump({
        "version": list(sys.version_info[:3]),
        "debug_ranges": debug_ranges,
        "codes": codes,
    }, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
