//! The kernels' working memory, reused from call to call.
//!
//! A fused attention call packs its operands into buffers of megabytes (the query in lanes, the
//! keys and values in rows, the output and row statistics), keeps them for the backward pass, and
//! the backward pass adds as many again. Freshly mapped pages cost a page fault and a zeroing by
//! the kernel each: glibc's malloc returns blocks of that size to the system when they are freed
//! (they are above its mmap threshold, or trimmed from a worker thread's arena), and mimalloc
//! maps its huge objects afresh. In a plain binary at 8,512,256,8x32 that was 540,000 page faults
//! in 70 calls. A [`Buffer`] comes from a free list of the ones released before and goes back to
//! it when dropped, so the speed does not depend on the allocator a user's binary installs.
//!
//! Buffers below [`MIN_BYTES`] are left to the allocator, which serves them from memory it keeps;
//! each list keeps at most [`MAX_KEPT_BYTES`], the most recently released.
//!
//! The tensors a call returns (the projections, the attention's output, their gradients) are
//! Burn's to free, through the global allocator, so [`keep_freed_memory`] asks glibc's malloc to
//! keep such blocks for the next call instead of handing them back to the system.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use crate::simd::Lanes;

/// Sets glibc's malloc, once per process, to serve blocks of up to 32 MiB from its heaps and to
/// give a heap's free top back to the system only beyond 256 MiB. Its defaults map each block
/// above 128 KiB afresh (raising that bound as they are freed) and trim any free top beyond twice
/// the bound, so every call faulted its output tensors in page by page: 370,000 page faults in
/// 70 calls of the embedded example at 8,512,256,8x32, whose forward pass took 40 ms with them
/// and 28 ms without, as with mimalloc (AMD EPYC Zen 4, 2 threads).
///
/// Only glibc targets, and only memory that reaches `malloc`: a binary that installs its own
/// global allocator is unaffected. `KERNELS_KEEP_FREED_MEMORY=0` leaves glibc's settings alone.
pub(crate) fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("KERNELS_KEEP_FREED_MEMORY").is_some_and(|value| value == "0") {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: `mallopt` may be called at any time; both values are within glibc's bounds
        // (the mmap threshold at most half of a 64 MiB arena heap).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    });
}

/// Smaller buffers are allocated and freed as usual.
pub const MIN_BYTES: usize = 64 << 10;
/// What one free list keeps at most.
pub const MAX_KEPT_BYTES: usize = 512 << 20;

/// An element type with a free list of its own.
pub trait Pooled: Copy + Default + Send + 'static {
    /// What [`Buffer::overwritten`] fills a buffer with in this crate's tests.
    const POISON: Self;
    fn free_list() -> &'static FreeList<Self>;
}

macro_rules! pooled {
    ($($element:ty: $poison:expr),*) => {$(
        impl Pooled for $element {
            const POISON: Self = $poison;
            fn free_list() -> &'static FreeList<Self> {
                static LIST: FreeList<$element> = FreeList::new();
                &LIST
            }
        }
    )*};
}
pooled!(f32: f32::NAN, Lanes: [f32::NAN; crate::simd::LANES], [f32; 4]: [f32::NAN; 4], u16: 0xdead);

/// Released buffers of one element type, and their total size in bytes.
pub struct FreeList<T> {
    kept: Mutex<(Vec<Vec<T>>, usize)>,
}

impl<T: Pooled> FreeList<T> {
    pub const fn new() -> Self {
        Self { kept: Mutex::new((Vec::new(), 0)) }
    }

    /// The smallest kept buffer that holds `len` elements without wasting more than half of
    /// itself, taken off the list.
    fn take(&self, len: usize) -> Option<Vec<T>> {
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (buffers, bytes) = &mut *kept;
        let fits = |buffer: &Vec<T>| buffer.capacity() >= len && buffer.capacity() <= 2 * len;
        let (index, _) = buffers.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.capacity())?;
        let buffer = buffers.swap_remove(index);
        *bytes -= byte_size(&buffer);
        Some(buffer)
    }

    /// Keeps `buffer` if it is large enough to be worth keeping, making room by freeing the
    /// buffers released longest ago: a process whose shapes change keeps those of its recent calls.
    fn give(&self, buffer: Vec<T>) {
        let size = byte_size(&buffer);
        if !(MIN_BYTES..=MAX_KEPT_BYTES).contains(&size) {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (buffers, bytes) = &mut *kept;
        while *bytes + size > MAX_KEPT_BYTES {
            *bytes -= byte_size(&buffers.remove(0));
        }
        *bytes += size;
        buffers.push(buffer);
    }
}

impl<T: Pooled> Default for FreeList<T> {
    fn default() -> Self {
        Self::new()
    }
}

fn byte_size<T>(buffer: &Vec<T>) -> usize {
    buffer.capacity() * size_of::<T>()
}

/// `len` elements, from the free list where it has a buffer of the size; back to it when
/// dropped.
pub struct Buffer<T: Pooled> {
    data: Vec<T>,
}

impl<T: Pooled> Buffer<T> {
    /// `len` zeroed elements: for buffers that are summed into.
    pub fn zeroed(len: usize) -> Self {
        let mut data = Self::kept(len);
        data.clear();
        data.resize(len, T::default());
        Self { data }
    }

    /// `len` elements of no particular value (a released buffer's old contents, or zeros): for
    /// buffers whose every element is written before it is read. Zeroing them first cost 10% of
    /// the backward pass at 8,256,512,16x32 (eight buffers of 4 MB, filled on one thread).
    /// In this crate's tests every element starts as [`Pooled::POISON`] (NaN for floats), so that
    /// one left unwritten shows in the results.
    pub fn overwritten(len: usize) -> Self {
        let mut data = Self::kept(len);
        if cfg!(test) {
            data.clear();
            data.resize(len, T::POISON);
        } else {
            data.truncate(len);
            data.resize(len, T::default());
        }
        Self { data }
    }

    /// A released buffer that holds `len` elements, if one is kept and the size is worth keeping.
    fn kept(len: usize) -> Vec<T> {
        if len * size_of::<T>() >= MIN_BYTES { T::free_list().take(len).unwrap_or_default() } else { Vec::new() }
    }
}

impl<T: Pooled> Drop for Buffer<T> {
    fn drop(&mut self) {
        T::free_list().give(std::mem::take(&mut self.data));
    }
}

impl<T: Pooled> Deref for Buffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.data
    }
}

impl<T: Pooled> DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
}

impl<T: Pooled> Clone for Buffer<T> {
    fn clone(&self) -> Self {
        let mut copy = Self::overwritten(self.len());
        copy.copy_from_slice(self);
        copy
    }
}

impl<T: Pooled> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Buffer({} x {})", self.len(), std::any::type_name::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element types of the tests' own, so that no other test shares their free lists: one per
    /// test that checks which buffer it gets back.
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    struct Element(u64);
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    struct Poisoned(u64);
    pooled!(Element: Element(u64::MAX), Poisoned: Poisoned(u64::MAX));

    const LARGE: usize = MIN_BYTES / 8 * 4; // four times the smallest kept size

    /// Releases a buffer of `LARGE` elements set to `value` to its free list; returns its address.
    fn release_one<T: Pooled>(value: T) -> *const T {
        let mut buffer = Buffer::<T>::zeroed(LARGE);
        buffer.fill(value);
        buffer.as_ptr()
    }

    #[test]
    fn a_released_buffer_is_reused_zeroed_and_a_small_one_is_not_kept() {
        let address = release_one(Element(7));

        // A request of 60% of its size is served by it, zeroed; one of 40% would waste too much.
        assert!(Buffer::<Element>::zeroed(LARGE * 2 / 5).as_ptr() != address);
        let second = Buffer::<Element>::zeroed(LARGE * 3 / 5);
        assert_eq!(second.as_ptr(), address);
        assert!(second.iter().all(|&e| e == Element(0)));
        assert_eq!(second.len(), LARGE * 3 / 5);

        // The 40% one went back to the list, as the 60% one does now: two kept, none small.
        drop(second);
        let small = Buffer::<Element>::zeroed(16);
        drop(small);
        let (buffers, bytes) = &*Element::free_list().kept.lock().unwrap();
        assert_eq!(buffers.len(), 2);
        assert_eq!(*bytes, buffers.iter().map(byte_size).sum::<usize>());
        assert!(buffers.iter().all(|b| byte_size(b) >= MIN_BYTES));
    }

    #[test]
    fn an_overwritten_buffer_reuses_released_memory_and_is_poisoned_in_tests() {
        let address = release_one(Poisoned(7));

        // In tests every element starts as the poison, so a kernel that leaves one unwritten
        // shows it; outside tests it keeps whatever the buffer held.
        let second = Buffer::<Poisoned>::overwritten(LARGE * 3 / 4);
        assert_eq!(second.as_ptr(), address);
        assert_eq!(second.len(), LARGE * 3 / 4);
        assert!(second.iter().all(|&e| e == Poisoned::POISON));
    }

    #[test]
    fn the_list_keeps_no_more_than_its_limit_and_frees_the_oldest_first() {
        let list = FreeList::<f32>::new();
        let floats = |bytes: usize| vec![0.0f32; bytes / 4];
        list.give(floats(MAX_KEPT_BYTES / 2));
        list.give(floats(MAX_KEPT_BYTES / 2 - 4));
        list.give(floats(4096)); // below the smallest kept size
        list.give(floats(MAX_KEPT_BYTES + 4)); // larger than the list
        list.give(floats(MAX_KEPT_BYTES / 4)); // frees the first
        let (buffers, bytes) = &*list.kept.lock().unwrap();
        let sizes: Vec<usize> = buffers.iter().map(byte_size).collect();
        assert_eq!(sizes, [MAX_KEPT_BYTES / 2 - 4, MAX_KEPT_BYTES / 4]);
        assert_eq!(*bytes, sizes.iter().sum::<usize>());
    }

    #[test]
    fn a_clone_holds_the_same_values_in_its_own_memory() {
        let mut original = Buffer::<f32>::zeroed(100_000);
        original.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        let copy = original.clone();
        assert_eq!(&copy[..], &original[..]);
        assert_ne!(copy.as_ptr(), original.as_ptr());
    }
}
