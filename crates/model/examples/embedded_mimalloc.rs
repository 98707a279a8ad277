//! `embedded` with mimalloc as the global allocator and freed memory kept, as `cargo xtask` runs:
//! the difference between the two is what the allocator, not the kernels, contributes.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "embedded/main.rs"]
mod embedded;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// `mi_option_purge_delay` of `mimalloc.h`, as xtask's main.rs sets it.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one of mimalloc's options, which it allows at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
    embedded::main()
}
