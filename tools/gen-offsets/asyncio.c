/*
 * asyncio.c: print the header half of offsets/asyncio/cpython-3.X.toml: the
 * generic objects an asyncio task graph passes through (methods, builtin
 * methods, functions' closures, cells, tuples, lists, sets, weak references),
 * coroutine objects and where a suspended frame's value stack ends.
 * Driven by asyncio.sh, which adds the _asyncio module's own structs (they
 * live in Modules/_asynciomodule.c, no header: from DWARF) and provenance.
 *
 * Same scheme as offsets.c: every number goes through a macro that records
 * its C expression; `asyncio --gdb` prints "gdb-expression<TAB>value" so
 * asyncio.sh can prove the headers against a libpython with DWARF.
 */
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if PY_VERSION_HEX < 0x03080000
#  error "pyprof supports CPython 3.8 and newer"
#endif
#if PY_VERSION_HEX >= 0x030E0000
#  include "internal/pycore_interpframe_structs.h" /* PyGenObject, _PyInterpreterFrame */
#  include "internal/pycore_stackref.h"            /* Py_TAG_BITS */
#  include "internal/pycore_frame.h"               /* PyFrameState */
#elif PY_VERSION_HEX >= 0x030B0000
#  include "internal/pycore_frame.h"               /* _PyInterpreterFrame, PyFrameState */
#endif

static int gdb_mode;

static void section(const char *name)
{
    if (!gdb_mode)
        printf("\n[%s]\n", name);
}

static void emit(const char *key, long long v, const char *gdb_expr, const char *comment)
{
    if (gdb_mode) {
        if (gdb_expr)
            printf("%s\t%lld\n", gdb_expr, v);
        return;
    }
    printf("%s = %lld  # %s\n", key, v, comment);
}

#define SIZE(T)           emit("size", sizeof(T), "sizeof(" #T ")", "sizeof(" #T ")")
#define OFF(key, T, path) emit(key, offsetof(T, path), "&((" #T "*)0)->" #path, #T "." #path)
#define CONST(key, name)  emit(key, (long long)(name), "(long)" #name, #name)
#define MACRO(key, name)  emit(key, (long long)(name), NULL, #name)

static void layout(void)
{
    section("layout");
    if (gdb_mode)
        return;
    /* How a task finds what awaits it: done-callbacks until 3.14 added
     * task_awaited_by (which 3.14+ describe in their own debug section). */
    printf("awaiter_links = \"callbacks\"\n");
#if PY_VERSION_HEX < 0x030B0000
    printf("gen_frame = \"pointer\"        # gi_frame: a PyFrameObject\n");
#else
    printf("gen_frame = \"embedded\"       # gi_iframe: the _PyInterpreterFrame inside the object\n");
#endif
#if PY_VERSION_HEX < 0x030A0000
    printf("value_stack = \"frame_stacktop\"\n");
#elif PY_VERSION_HEX < 0x030B0000
    printf("value_stack = \"frame_depth\"\n");
#elif PY_VERSION_HEX < 0x030E0000
    printf("value_stack = \"localsplus_top\"\n");
#else
    printf("value_stack = \"stack_pointer\"\n");
#endif
    /* Which slot, counting down from the end of a suspended coroutine's
     * value stack, holds what it awaits (what _PyGen_yf and cr_await give):
     * the top one until 3.14; 3.15 keeps a NULL slot above it (seen in every
     * suspended coroutine by check-asyncio.py: the top is NULL, the awaited
     * object the slot below). */
#if PY_VERSION_HEX >= 0x030F0000
    printf("awaited_slot = 2\n");
#else
    printf("awaited_slot = 1\n");
#endif
}

static void objects(void)
{
    section("cfunction");   /* a builtin method bound to its object, e.g. Task.task_wakeup */
    SIZE(PyCFunctionObject);
    OFF("m_self", PyCFunctionObject, m_self);
    section("method");      /* a bound Python method, e.g. TaskGroup._on_task_done */
    SIZE(PyMethodObject);
    OFF("im_func", PyMethodObject, im_func);
    OFF("im_self", PyMethodObject, im_self);
    section("function");    /* gather's _done_callback closes over its outer future */
    SIZE(PyFunctionObject);
    OFF("func_closure", PyFunctionObject, func_closure);
    section("cell");
    SIZE(PyCellObject);
    OFF("ob_ref", PyCellObject, ob_ref);
    section("tuple");
    SIZE(PyTupleObject);
    OFF("ob_size", PyVarObject, ob_size);
    OFF("ob_item", PyTupleObject, ob_item);
    section("list");
    SIZE(PyListObject);
    OFF("ob_size", PyVarObject, ob_size);
    OFF("ob_item", PyListObject, ob_item);
    section("set");
    SIZE(PySetObject);
    OFF("mask", PySetObject, mask);
    OFF("table", PySetObject, table);
    section("setentry");
    SIZE(setentry);
    OFF("key", setentry, key);
    section("weakref");
    SIZE(PyWeakReference);
    OFF("wr_object", PyWeakReference, wr_object);
}

/* A coroutine shares the generator's head (cr_ prefix), so PyGenObject's
 * offsets are PyCoroObject's; checked here rather than assumed. */
#if PY_VERSION_HEX < 0x030B0000
_Static_assert(offsetof(PyCoroObject, cr_frame) == offsetof(PyGenObject, gi_frame), "coro head");
#else
_Static_assert(offsetof(PyCoroObject, cr_iframe) == offsetof(PyGenObject, gi_iframe), "coro head");
_Static_assert(offsetof(PyCoroObject, cr_frame_state) == offsetof(PyGenObject, gi_frame_state), "coro head");
#endif

static void generators(void)
{
    section("gen");
    SIZE(PyGenObject);
#if PY_VERSION_HEX < 0x030B0000
    OFF("gi_frame", PyGenObject, gi_frame);
#else
    OFF("gi_iframe", PyGenObject, gi_iframe);
    OFF("gi_frame_state", PyGenObject, gi_frame_state);
#endif
#if PY_VERSION_HEX < 0x030B0000
    section("frame");       /* PyFrameObject */
    SIZE(PyFrameObject);
#  if PY_VERSION_HEX < 0x030A0000
    OFF("f_stacktop", PyFrameObject, f_stacktop);
#  else
    OFF("f_valuestack", PyFrameObject, f_valuestack);
    OFF("f_stackdepth", PyFrameObject, f_stackdepth);
#  endif
#else
    section("frame");       /* _PyInterpreterFrame */
    SIZE(_PyInterpreterFrame);
    OFF("localsplus", _PyInterpreterFrame, localsplus);
#  if PY_VERSION_HEX < 0x030E0000
    OFF("stacktop", _PyInterpreterFrame, stacktop);
#  else
    OFF("stackpointer", _PyInterpreterFrame, stackpointer);
#  endif
#endif

    section("constants");
#if PY_VERSION_HEX >= 0x030B0000
    /* FRAME_STATE_SUSPENDED(S): the range of gi_frame_state a suspended
     * coroutine has (3.15 renumbered the enum and added a locked state). */
    CONST("frame_suspended_min", FRAME_SUSPENDED);
#  if PY_VERSION_HEX >= 0x030F0000
    CONST("frame_suspended_max", FRAME_SUSPENDED_YIELD_FROM_LOCKED);
#  elif PY_VERSION_HEX >= 0x030D0000
    CONST("frame_suspended_max", FRAME_SUSPENDED_YIELD_FROM);
#  else
    CONST("frame_suspended_max", FRAME_SUSPENDED);
#  endif
#endif
#if PY_VERSION_HEX >= 0x030E0000
    /* Value-stack slots are _PyStackRef: these low bits are tags. */
    MACRO("stack_tag_mask", Py_TAG_BITS);
#else
    emit("stack_tag_mask", 0, NULL, "slots are plain PyObject * before 3.14");
#endif
}

int main(int argc, char **argv)
{
    gdb_mode = argc > 1 && strcmp(argv[1], "--gdb") == 0;
    layout();
    objects();
    generators();
    return 0;
}
