//! Allocator tuning.

/// Makes the allocator hand large buffers (a 1 MiB file read, a reply) back to the
/// kernel when they are freed. glibc raises its mmap threshold each time such a
/// buffer is freed, after which they come from its heaps and the memory a flood of
/// requests made stays with the agent after the client is gone; a fixed threshold
/// stops that. musl (the guest build) returns large allocations already.
pub fn return_large_allocations_to_the_kernel() {
    #[cfg(target_env = "gnu")]
    {
        /// Allocations from this size up are mapped, and unmapped when freed.
        const MMAP_THRESHOLD_BYTES: libc::c_int = 128 * 1024;
        // SAFETY: mallopt only changes allocator tuning; it is called once at start-up,
        // before the runtime starts any thread.
        let _ = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
    }
}
