//! A steady sample allocates nothing, roots included: allocations counted
//! by a global allocator, per thread (tests run in parallel).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use pyprof::profile::aggregate::{AggregateOptions, Aggregator};
use pyprof::stack::Frame;

struct Counting;

thread_local!(static ALLOCS: Cell<u64> = const { Cell::new(0) });

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCS.with(|a| a.get())
}

/// `--threads` and `--subprocesses` label their roots; the labels used to
/// be formatted on every sample.
#[test]
fn steady_samples_with_thread_and_process_roots_allocate_nothing() {
    let mut agg = Aggregator::new(AggregateOptions { by_function: false, thread_roots: true, process_roots: true });
    let frames = vec![Frame::python("inner", "app.py", 3), Frame::python("outer", "app.py", 9)];
    for _ in 0..3 {
        agg.add(42, "python app.py", Some(7), Some("MainThread"), &frames);
        agg.add(42, "python app.py", Some(8), Some("worker"), &frames);
    }
    let before = allocations();
    for _ in 0..1000 {
        agg.add(42, "python app.py", Some(7), Some("MainThread"), &frames);
        agg.add(42, "python app.py", Some(8), Some("worker"), &frames);
    }
    assert_eq!(allocations() - before, 0, "allocations in 2000 steady samples");
    // A renamed thread gets a new root, once.
    agg.add(42, "python app.py", Some(8), Some("renamed"), &frames);
    assert_eq!(agg.distinct_stacks(), 3);
}
