#!/usr/bin/env python3
"""check-live.py: prove an offsets/cpython-3.X.toml against a running interpreter.

Why: gen.sh proves the numbers match the headers (and DWARF, when there is
one), but a distro binary may be built from other headers or flags.  This
reads the target the way pyprof will, with nothing but the .toml file:

  * locates _PyRuntime (ELF section .PyRuntime, else the _PyRuntime dynsym) in
    the executable or libpython mapped by PID, plus the load bias from maps;
  * 3.13+: checks the cookie, the version word and that every word of the live
    _Py_DebugOffsets equals the value the .toml records from the headers
    (differences are listed; patch releases may change struct sizes);
  * walks runtime -> interpreters -> threads -> frames -> code -> co_name with
    the union of the file's and the target's offsets, and checks the walk
    closes up: tstate->interp points back, native_thread_id is a task of PID,
    instr_ptr lies inside co_code_adaptive, ob_type of the code is "code",
    the GIL holder (if locked) is one of the threads;
  * reads the GC's collecting flag (0 or 1) and every thread's exception
    state: the exc_info chain must end at the item inside the thread state,
    and hold only NULL, None or exceptions;
  * reads every thread's name the way pyprof does (sys.modules -> threading
    -> _active -> Thread._name, per [layout] instance_dict), with its own
    dict/int/attribute code, and checks a thread is named "MainThread" and
    every ident in _active is a thread state's thread_id.

Usage (as root, Python 3.11+ for tomllib):
    check-live.py PID offsets/cpython-3.X.toml
A good target (non-ASCII name exercises PyCompactUnicodeObject; the spinner
keeps the GIL held):
    python3.X -c 'import threading,time
def spin():
    while True: pass
def schläft(): time.sleep(300)
def fängt():
    try: raise KeyError(1)
    except KeyError: time.sleep(300)
threading.Thread(target=fängt, daemon=True).start()
threading.Thread(target=spin, daemon=True, name="spinner-ß").start(); schläft()'
"""
import os
import struct
import sys
import tomllib


# ---- ELF: just enough to find _PyRuntime --------------------------------
def elf_info(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
    loads = []
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr = struct.unpack_from("<IIQQ", data, e_phoff + i * e_phentsize)
        if p_type == 1:
            loads.append((p_offset, p_vaddr))
    secs = []
    for i in range(e_shnum):
        secs.append(struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize))
    shstr = secs[e_shstrndx]

    def name(off, strtab):
        start = strtab[4] + off
        return data[start:data.index(b"\0", start)].decode()

    by_name = {name(s[0], shstr): s for s in secs}
    out = {"min_load": min(v - o for o, v in loads) if loads else 0}
    if ".PyRuntime" in by_name:
        out["section"] = by_name[".PyRuntime"][3]
    dynsym, dynstr = by_name.get(".dynsym"), by_name.get(".dynstr")
    if dynsym and dynstr:
        for off in range(dynsym[4], dynsym[4] + dynsym[5], 24):
            st_name, _, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
            if st_value and name(st_name, dynstr) == "_PyRuntime":
                out["dynsym"], out["dynsym_size"] = st_value, st_size
    return out


def find_runtime(pid):
    seen = {}
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path, off = parts[5], int(parts[2], 16)
        start = int(parts[0].split("-")[0], 16)
        if off == 0 and path not in seen:
            a, b = (int(x, 16) for x in parts[0].split("-"))
            seen[path] = (start, f"{a:x}-{b:x}")
    for path, (start, rng) in seen.items():
        base = os.path.basename(path)
        if not (base.startswith("python") or base.startswith("libpython")):
            continue
        # map_files opens the very file mapped, even across a chroot
        info = elf_info(f"/proc/{pid}/map_files/{rng}")
        if not info or ("section" not in info and "dynsym" not in info):
            continue
        bias = start - info["min_load"]
        sec = info.get("section")
        dyn = info.get("dynsym")
        if sec is not None and dyn is not None and sec != dyn:
            sys.exit(f"{path}: .PyRuntime {sec:#x} != _PyRuntime {dyn:#x}")
        how = ".PyRuntime section" if sec is not None else "_PyRuntime dynsym"
        return bias + (sec if sec is not None else dyn), f"{path} ({how}, bias {bias:#x})", info.get("dynsym_size")
    sys.exit("no _PyRuntime found in any mapped python/libpython")


# ---- memory ------------------------------------------------------------
class Mem:
    def __init__(self, pid):
        self.f = open(f"/proc/{pid}/mem", "rb", buffering=0)

    def read(self, addr, n):
        self.f.seek(addr)
        return self.f.read(n)

    def u64(self, a): return struct.unpack("<Q", self.read(a, 8))[0]
    def i64(self, a): return struct.unpack("<q", self.read(a, 8))[0]
    def u32(self, a): return struct.unpack("<I", self.read(a, 4))[0]
    def i32(self, a): return struct.unpack("<i", self.read(a, 4))[0]
    def u8(self, a): return self.read(a, 1)[0]

    def cstr(self, a, n=64):
        b = self.read(a, n)
        return b.split(b"\0")[0].decode(errors="replace")


def thread_names(mem, f, const, strategy, interp, pystr):
    g = lambda k: f[k]
    def tp(obj):
        return mem.u64(obj + g("pyobject.ob_type"))
    def flags(obj):
        return mem.u64(tp(obj) + g("type_object.tp_flags"))

    def entries(keys):
        n = mem.i64(keys + g("dict_keys.dk_nentries"))
        assert 0 <= n < 1 << 16, n
        if "dict_keys.dk_size" in f:
            size = mem.i64(keys + g("dict_keys.dk_size"))
            width = 1 if size <= 0xff else 2 if size <= 0xffff else 4 if size <= 0xffffffff else 8
            ix, sec = size * width, "dict_entry"
        else:
            ix = 1 << mem.u8(keys + g("dict_keys.dk_log2_index_bytes"))
            kind = mem.u8(keys + g("dict_keys.dk_kind"))
            sec = "dict_entry" if kind == const["dict_keys_general"] else "dict_unicode_entry"
        at = keys + g("dict_keys.dk_indices") + ix
        es = g(sec + ".size")
        return [(mem.u64(at + i * es + g(sec + ".me_key")), mem.u64(at + i * es + g(sec + ".me_value"))) for i in range(n)]

    def values_of(values, n):
        if "dict_values.capacity" in f:
            n = min(n, mem.u8(values + g("dict_values.capacity")))
        base = values + f.get("dict_values.values", 0)
        return [mem.u64(base + 8 * i) for i in range(n)]

    def split(keys, values):
        es = entries(keys)
        vs = values_of(values, len(es))
        return [(k, vs[i] if i < len(vs) else 0) for i, (k, _) in enumerate(es)]

    def items(d):
        assert flags(d) & const["tpflags_dict_subclass"], "not a dict"
        keys, values = mem.u64(d + g("dict_object.ma_keys")), mem.u64(d + g("dict_object.ma_values"))
        its = split(keys, values) if values else entries(keys)
        return [(k, v) for k, v in its if k and v]

    def s(obj):
        return pystr(obj) if flags(obj) & const["tpflags_unicode_subclass"] else None

    def get(its, name):
        return next((v for k, v in its if s(k) == name), None)

    def int_of(obj):
        assert flags(obj) & const["tpflags_long_subclass"], "not an int"
        if "long_object.lv_tag" in f:
            tag = mem.u64(obj + g("long_object.lv_tag"))
            n = tag >> const["long_non_size_bits"]
        else:
            n = mem.i64(obj + g("long_object.ob_size"))
        ds = g("long_object.digit_size")
        return sum(int.from_bytes(mem.read(obj + g("long_object.ob_digit") + i * ds, ds), "little") << (const["pylong_shift"] * i) for i in range(n))

    def attr(obj, name):
        t = tp(obj)
        fl = mem.u64(t + g("type_object.tp_flags"))
        if strategy == "dictoffset" or not fl & const.get("tpflags_managed_dict", 0):
            off = mem.i64(t + g("type_object.tp_dictoffset"))
            d = mem.u64(obj + off) if off > 0 else 0
            return get(items(d), name) if d else None
        shared = mem.u64(t + g("heap_type_object.ht_cached_keys"))
        word = mem.u64(obj - const["managed_dict_preheader"])
        if strategy == "managed_values_preheader":
            values = mem.u64(obj - const["managed_values_preheader"])
            if values:
                return get(split(shared, values), name)
        elif strategy == "managed_tagged_preheader":
            if word & const["managed_values_tag"]:
                return get(split(shared, word + const["managed_values_tag"]), name)
        elif strategy == "inline_values":
            if fl & const["tpflags_inline_values"]:
                values = obj + mem.u64(t + g("type_object.tp_basicsize"))
                if mem.u8(values + g("dict_values.valid")):
                    return get(split(shared, values), name)
        return get(items(word), name) if word else None

    modules = mem.u64(interp + g("interpreter_state.imports_modules"))
    threading = get(items(modules), "threading")
    active = get(items(mem.u64(threading + g("module_object.md_dict"))), "_active")
    out = {}
    for k, thread in items(active):
        name = attr(thread, "_name")
        out[int_of(k)] = s(name) if name else None
    return out


def main():
    pid, path = int(sys.argv[1]), sys.argv[2]
    text = open(path).read()
    doc = tomllib.loads(text)
    mem = Mem(pid)
    runtime, where, symsize = find_runtime(pid)
    print(f"_PyRuntime at {runtime:#x} in {where}")
    problems = []

    # Union: file sections, then (3.13+) the target's _Py_DebugOffsets.
    f = {}
    for sec, tab in doc.items():
        if sec in ("provenance", "layout", "constants", "debug_offsets"):
            continue
        for k, v in tab.items():
            if isinstance(v, int):
                f[f"{sec}.{k}"] = v
    const = doc.get("constants", {})
    dbg = doc.get("debug_offsets")
    if dbg:
        names = dbg["fields"]
        raw = mem.read(runtime, dbg["size"])
        cookie = raw[:8].decode(errors="replace")
        words = struct.unpack_from(f"<{len(names)}Q", raw, 8)
        print(f"cookie {cookie!r}, version {words[0]:#x}, free_threaded {words[1]}")
        if cookie != dbg["cookie"]:
            sys.exit(f"cookie {cookie!r} != {dbg['cookie']!r}")
        want_minor = int(doc["provenance"]["python"].split(".")[1])
        if words[0] >> 24 != 3 or (words[0] >> 16) & 0xFF != want_minor:
            sys.exit(f"version word {words[0]:#x} is not 3.{want_minor}")
        # values the .toml recorded from the headers, from its comments
        expected = {}
        for line in text.splitlines():
            if line.strip().startswith('"') and "# [" in line:
                name = line.split('"')[1]
                val = line.rsplit("=", 1)[1].strip()
                expected[name] = int(val, 0)
        same = 0
        for name, w in zip(names, words):
            if name in expected and expected[name] != w and name != "version":
                print(f"  differs from headers: {name} = {w} (headers {expected[name]})")
            else:
                same += 1
        print(f"  {same} of {len(names)} words equal the values compiled from the headers")
        for name, w in zip(names, words):
            f[name] = w
        # The only words whose size must also agree: the words after the last
        # field are not part of the struct, so size itself is checked by the
        # walk below starting at the right place.

    g = lambda k: f[k]
    # The linker knows sizeof(_PyRuntimeState): st_size of the _PyRuntime symbol.
    if symsize is not None:
        print(f"_PyRuntime symbol size {symsize}, runtime_state.size {f['runtime_state.size']}")
        if symsize != f["runtime_state.size"]:
            problems.append("st_size of _PyRuntime != runtime_state.size")
    # ---- walk ----
    interp = mem.u64(runtime + g("runtime_state.interpreters_head"))
    print(f"interp {interp:#x} id {mem.i64(interp + g('interpreter_state.id'))}")
    if mem.u64(interp + g("interpreter_state.next")) not in (0,):
        print("  (more than one interpreter)")
    modules = mem.u64(interp + g("interpreter_state.imports_modules"))
    for k, addr in (("modules", modules), ("sysdict", mem.u64(interp + g("interpreter_state.sysdict"))),
                    ("builtins", mem.u64(interp + g("interpreter_state.builtins")))):
        tp = mem.u64(addr + g("pyobject.ob_type"))
        tn = mem.cstr(mem.u64(tp + g("type_object.tp_name")))
        print(f"  interp.{k} -> {tn}")
        if tn != "dict":
            problems.append(f"interp.{k} is a {tn}, not a dict")

    tasks = set(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    tstates = []
    t = mem.u64(interp + g("interpreter_state.threads_head"))
    while t and len(tstates) < 64:
        tstates.append(t)
        t = mem.u64(t + g("thread_state.next"))
    mask = ~const.get("executable_tag_mask", 0) & (2**64 - 1)
    owner_names = {v: k[len("frame_owned_by_"):] for k, v in const.items() if k.startswith("frame_owned_by_")}

    def pystr(addr):
        st = mem.u32(addr + g("unicode_object.state"))
        n = mem.i64(addr + g("unicode_object.length"))
        kind = (st & const["unicode_state_kind_mask"]) >> 2
        compact = st & const["unicode_state_compact_mask"]
        ascii_ = st & const["unicode_state_ascii_mask"]
        if not compact:
            return "<non-compact str>"
        data = addr + (g("unicode_object.asciiobject_size") if ascii_ else g("unicode_object.compact_size"))
        raw = mem.read(data, n * kind)
        return raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])

    def type_name(obj):
        return mem.cstr(mem.u64(mem.u64(obj + g("pyobject.ob_type")) + g("type_object.tp_name")))

    names_seen = []
    for t in tstates:
        back = mem.u64(t + g("thread_state.interp"))
        tid = mem.u64(t + g("thread_state.thread_id"))
        line = f"tstate {t:#x} thread_id {tid:#x}"
        if back != interp:
            problems.append(f"tstate {t:#x}: interp {back:#x} != {interp:#x}")
        if "thread_state.native_thread_id" in f:
            ntid = mem.u64(t + g("thread_state.native_thread_id"))
            line += f" native {ntid}"
            if ntid not in tasks:
                problems.append(f"native_thread_id {ntid} not a task of {pid}")
        print(line)
        frame = mem.u64(t + g("thread_state.current_frame"))
        if "cframe.current_frame" in f:
            frame = mem.u64(frame + g("cframe.current_frame")) if frame else 0
        chunk = mem.u64(t + g("thread_state.datastack_chunk")) if "thread_state.datastack_chunk" in f else 0
        depth = 0
        while frame and depth < 100:
            depth += 1
            if "frame_object.code" in f:
                code = mem.u64(frame + g("frame_object.code"))
                nxt = mem.u64(frame + g("frame_object.back"))
                lasti = mem.i32(frame + g("frame_object.lasti"))
                extra = f"lasti {lasti} lineno {mem.i32(frame + g('frame_object.lineno'))}"
                owner = None
            else:
                nxt = mem.u64(frame + g("interpreter_frame.previous"))
                owner = mem.u8(frame + g("interpreter_frame.owner"))
                extra = f"owner {owner}={owner_names.get(owner, '?')}"
                if "interpreter_frame.is_entry" in f:
                    extra += f" is_entry {mem.u8(frame + g('interpreter_frame.is_entry'))}"
                raw = mem.u64(frame + g("interpreter_frame.executable"))
                code = raw & mask
                if raw != code:
                    extra += f" (f_executable tag {raw & ~mask & 0xff:#x})"
                if owner_names.get(owner) in ("cstack", "interpreter"):
                    print(f"  frame {frame:#x} {extra}: not Python code, executable {type_name(code) if code > 4096 else code}")
                    frame = nxt
                    continue
            tn = type_name(code)
            if tn != "code":
                problems.append(f"frame {frame:#x}: executable is a {tn}")
                break
            name = pystr(mem.u64(code + g("code_object.name")))
            fn = pystr(mem.u64(code + g("code_object.filename")))
            first = mem.i32(code + g("code_object.firstlineno"))
            if "code_object.qualname" in f:
                name = pystr(mem.u64(code + g("code_object.qualname")))
            if "code_object.co_code_adaptive" in f:
                ip = mem.u64(frame + g("interpreter_frame.instr_ptr"))
                start = code + g("code_object.co_code_adaptive")
                n = mem.i64(code + g("bytes_object.ob_size"))  # PyVarObject ob_size: code units
                ok = start - 2 <= ip < start + 2 * n  # 3.11/3.12 prev_instr may be start - 2
                extra += f" instr {(ip - start) // 2}/{n}"
                if not ok:
                    problems.append(f"{name}: instr_ptr {ip:#x} outside co_code_adaptive")
                if "code_object.firsttraceable" in f:
                    ft = mem.i32(code + g("code_object.firsttraceable"))
                    extra += f" firsttraceable {ft}"
                    if not 0 <= ft < n:
                        problems.append(f"{name}: _co_firsttraceable {ft} outside 0..{n}")
                if owner_names.get(owner) == "thread" and chunk:
                    size = mem.u64(chunk + 8)
                    if not chunk <= frame < chunk + size:
                        # the innermost chunk holds the newest frames only
                        extra += " (not in newest datastack chunk)"
            elif "code_object.code" in f:
                co = mem.u64(code + g("code_object.code"))
                n = mem.i64(co + g("bytes_object.ob_size"))
                unit = 2 if doc["layout"]["lasti"] == "code_units" else 1
                extra += f" co_code {n} bytes"
                if not -1 <= lasti * unit < n:
                    problems.append(f"{name}: lasti {lasti} outside co_code")
            names_seen.append(name)
            print(f"  {name} ({fn}:{first}) {extra}")
            frame = nxt

    # GIL: ≤3.11 in _PyRuntime, 3.12+ in the interpreter.
    if "runtime_state.gil_locked" in f:
        base, lk, hd = runtime, g("runtime_state.gil_locked"), g("runtime_state.gil_holder")
    elif "interpreter_state.gil_runtime_state_locked" in f:
        base, lk, hd = interp, g("interpreter_state.gil_runtime_state_locked"), g("interpreter_state.gil_runtime_state_holder")
        gp = mem.u64(interp + g("interpreter_state.ceval_gil"))
        own = interp + g("interpreter_state.gil_runtime_state")
        print(f"ceval.gil {gp:#x}, &_gil {own:#x}")
        if gp != own:
            problems.append("interp->ceval.gil does not point at interp->_gil")
    else:
        base = None
    if base is not None:
        for _ in range(20):
            locked, holder = mem.u32(base + lk), mem.u64(base + hd)
            if locked:
                break
        print(f"gil locked {locked} last_holder {holder:#x}")
        if locked not in (0, 1) or (holder and holder not in tstates):
            problems.append(f"GIL fields look wrong: locked {locked}, holder {holder:#x}")

    # ---- <GC> frames: the collector's flag; --mode exception: each thread's
    # exception in flight and its exc_info chain, which must end at the item
    # embedded in the thread state itself (tstate->exc_state) ----
    if "gc.collecting" in f:
        gc_base = runtime + g("runtime_state.gc") if "runtime_state.gc" in f else interp + g("interpreter_state.gc")
        collecting = mem.u32(gc_base + g("gc.collecting"))
        print(f"gc.collecting {collecting}")
        if collecting not in (0, 1):
            problems.append(f"gc.collecting reads {collecting}")
    else:
        print("note: no GC flag offsets in this file")
    if "thread_state.exc_info" in f:
        handling = 0
        for t in tstates:
            cur = mem.u64(t + g("thread_state.current_exception"))
            item, last, chain = mem.u64(t + g("thread_state.exc_info")), 0, []
            while item and len(chain) < 64:
                v = mem.u64(item + g("err_stackitem.exc_value"))
                chain.append(type_name(v) if v else "NULL")
                last, item = item, mem.u64(item + g("err_stackitem.previous_item"))
            print(f"tstate {t:#x}: in flight {type_name(cur) if cur else None}, exc_info chain {chain}")
            handling += any(c not in ("NULL", "NoneType") for c in chain)
            if item or not t <= last < t + g("thread_state.size"):
                problems.append(f"tstate {t:#x}: exc_info chain does not end at the thread's own item")
            if not all(c == "NULL" or c == "NoneType" or c.endswith(("Error", "Exception")) for c in chain):
                problems.append(f"tstate {t:#x}: exc_info chain holds {chain}")
        if not handling:
            print("note: no thread is handling an exception (target script differs?)")
    else:
        print("note: no exception-state offsets in this file")

    # ---- thread names: sys.modules -> threading._active -> Thread._name ----
    # An implementation independent of pyprof's, from the same .toml: dicts
    # (combined / split, <= 3.10 dk_size / 3.11+ log2 + kind), ints, and the
    # [layout] instance_dict strategy.
    if "dict_keys.dk_indices" in f:
        tnames = thread_names(mem, f, const, doc["layout"]["instance_dict"], interp, pystr)
        tids = {mem.u64(t + g("thread_state.thread_id")): t for t in tstates}
        for ident, name in sorted(tnames.items()):
            print(f"thread {ident:#x}: {name!r}" + ("" if ident in tids else " (no thread state)"))
        if "MainThread" not in tnames.values():
            problems.append("no thread named MainThread in threading._active")
        if not set(tnames) <= set(tids):
            problems.append("threading._active has idents that are no thread state's thread_id")
    else:
        print("note: no thread-name offsets in this file")

    for n in ("schläft", "spin"):
        if n not in names_seen:
            print(f"note: function {n!r} not seen (target script differs?)")
    if problems:
        print("PROBLEMS:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
