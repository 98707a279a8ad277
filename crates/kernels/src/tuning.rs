//! The attention kernel's blocking, chosen for the processor it runs on.
//!
//! A tile walks its keys (or, for `dk` and `dv`, its query rows) `step` at a time: the step's
//! scores and their gradients, `2 x step` vectors of 16 lanes (128 bytes per key), stay in the L1
//! data cache while the keys and values stream past. The step is therefore derived from the L1
//! size that the `gemm` crate reads at run time (`/sys` on Linux, `sysctl` on macOS, `cpuid`
//! elsewhere): half of L1 for the step's scores, the rest for the streamed rows. A 32 KiB L1 (Zen 4,
//! most Intel client cores) gives 128 keys, a 48 KiB one (Intel server cores since Ice Lake)
//! 192, Apple's 128 KiB 512. `KERNELS_STEP` overrides it, for measurements.
//!
//! Whether the tiles' weighted sums of narrow heads split their rows to keep more multiply-add
//! chains in flight ([`split_narrow_sums`]) depends on how many FMA units a core has, which no
//! register or file reports: it is measured, once per instruction set, on first use (about a
//! millisecond). `KERNELS_SPLIT_SUMS` overrides it. The split changes the order of the sums, so
//! the outputs' last bits depend on it: where two processes must agree bit for bit, set it.
//!
//! How many tiles of 16 rows a task walks together ([`Tiles`]) is chosen by measurement too, per
//! class of calls ([`Class`]: the pass, the instruction set, the head widths, causal or not):
//! the first calls of a class run each candidate in turn, timed, and the fastest (per unit of
//! work, the best of its runs) serves the class. Those calls are real calls, not extra work. A
//! choice is reviewed after 4, 16, 64, ... times the calls it took (each candidate once more,
//! and the best times so far choose again), so that a trial run while another process held a
//! core does not decide for the rest of the process. `KERNELS_TILES` (`1` or `2`) overrides it,
//! for tests and measurements; [`tile_choices`] reports what was measured and chosen.
//!
//! The same way, per shape of matrix product, the GEMM runs on the caller's thread alone or on
//! rayon's pool, split by the `gemm` crate or into one block of rows per thread ([`Threads`]):
//! handing a call to the pool costs two context switches, and at the layers' narrow products the
//! crate's split cost more than a second thread saves. `KERNELS_GEMM_THREADS` (`caller`, `pool`
//! or `rows`) overrides it; [`gemm_choices`] reports.
//!
//! The split, the tiles and the products' threads change the order of some sums, so outputs
//! differ in their last bits from candidate to candidate, and timing differs from process to
//! process. A process that must give the same bits every time (a training run: the same config
//! and seed give the same weights, run twice or resumed) calls [`set_reproducible`]: from then
//! on each of the three is chosen by a rule of the call alone, not by timing or the variables
//! (no split, one tile, the pool wherever the `gemm` crate would split a product), and
//! [`reproducible`] says so.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::dims::Dims;
use crate::simd::{Isa, LANES, Level};

/// Whether the choices that change rounding follow fixed rules ([`set_reproducible`]).
static REPRODUCIBLE: AtomicBool = AtomicBool::new(false);

/// From now on (`true`), the narrow sums' split, the tiles and the products' threads are chosen
/// by rules of the call alone, whatever timing or the override variables would choose, so that
/// the process computes the same bits as any other process on this machine with the same thread
/// count; `false` returns them to timing. Call it before the first kernel call it should cover.
pub fn set_reproducible(on: bool) {
    REPRODUCIBLE.store(on, Ordering::SeqCst);
}

/// Whether [`set_reproducible`] is on.
pub fn reproducible() -> bool {
    REPRODUCIBLE.load(Ordering::SeqCst)
}

/// The variable that overrides [`Tuning::step`]: a multiple of 16 from 16 to 4096.
pub const STEP_VARIABLE: &str = "KERNELS_STEP";

/// The blocking the kernel uses, read once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Keys (or query rows) per step of a tile's walk, a multiple of 16.
    pub step: usize,
    /// The L1 data cache it was derived from, in bytes.
    pub l1_bytes: usize,
}

/// The bytes one key of a step keeps in L1: its scores and their gradients, 16 lanes each.
const BYTES_PER_STEP_KEY: usize = 2 * LANES * size_of::<f32>();

impl Tuning {
    /// This process's blocking: [`STEP_VARIABLE`] if it is set and valid (an invalid value is
    /// reported on stderr and ignored), else the rule for this CPU's L1.
    pub fn get() -> Tuning {
        static TUNING: OnceLock<Tuning> = OnceLock::new();
        *TUNING.get_or_init(|| {
            let l1_bytes = gemm_common::cache::CACHE_INFO[0].cache_bytes;
            let derived = Tuning::for_l1(l1_bytes);
            match std::env::var(STEP_VARIABLE).ok().filter(|v| !v.is_empty()).map(|v| Tuning::parse_step(&v)) {
                None => derived,
                Some(Ok(step)) => Tuning { step, ..derived },
                Some(Err(error)) => {
                    eprintln!("warning: {error}; using {}", derived.step);
                    derived
                }
            }
        })
    }

    /// The rule: as many keys as fill half of an L1 of `l1_bytes` with their scores, rounded
    /// down to a multiple of 16, from 64 to 512 (an L1 that reads as 0 counts as 32 KiB).
    pub fn for_l1(l1_bytes: usize) -> Tuning {
        let l1 = if l1_bytes == 0 { 32 * 1024 } else { l1_bytes };
        let step = (l1 / 2 / BYTES_PER_STEP_KEY / LANES * LANES).clamp(64, 512);
        Tuning { step, l1_bytes }
    }

    fn parse_step(value: &str) -> Result<usize, String> {
        match value.trim().parse::<usize>() {
            Ok(step) if step % LANES == 0 && (LANES..=4096).contains(&step) => Ok(step),
            _ => Err(format!("{STEP_VARIABLE}={value:?} is not a multiple of {LANES} from {LANES} to 4096")),
        }
    }
}

/// The variable that overrides [`split_narrow_sums`]: `1` splits, `0` does not.
pub const SPLIT_VARIABLE: &str = "KERNELS_SPLIT_SUMS";

/// How much slower a multiply-add of half as many chains as the tiles' accumulators must be for
/// the split to pay: on a core whose FMA units half the chains already fill, the two rates are
/// equal (1.00 measured on a Zen 4 with AVX-512; 1.33 with AVX2, whose half nearly fill them);
/// on one whose units need twice as many chains to stay busy, the half take twice as long. The
/// measurement is aimed at AVX-512: an AVX2 vector is two registers, so a group of 4 features
/// already keeps 8 of them in flight, and there the split only ever reaches groups of 2 and 1.
const SPLIT_WHEN_SLOWER: f64 = 1.5;

/// Whether `lane_accumulate` splits the rows of a group of fewer features than its accumulators
/// on the instruction set `level`: [`SPLIT_VARIABLE`] if set (`0` or `1`; another value is
/// reported on stderr and ignored), else the measurement `times`, run once per instruction set,
/// which returns the seconds per multiply-add of the tiles' accumulators' number of chains and
/// of half as many.
pub(crate) fn split_narrow_sums(level: Level, times: impl FnOnce() -> (f64, f64)) -> bool {
    if reproducible() {
        return false;
    }
    static SPLIT: [OnceLock<bool>; 3] = [const { OnceLock::new() }; 3];
    *SPLIT[level as usize].get_or_init(|| split_from(std::env::var(SPLIT_VARIABLE).ok().as_deref(), times))
}

/// [`split_narrow_sums`]'s rule, given the override's value.
fn split_from(variable: Option<&str>, times: impl FnOnce() -> (f64, f64)) -> bool {
    match variable.map(str::trim).filter(|v| !v.is_empty()) {
        Some("1") => return true,
        Some("0") => return false,
        Some(other) => eprintln!("warning: {SPLIT_VARIABLE}={other:?} is neither 0 nor 1; measuring"),
        None => {}
    }
    let (full, half) = times();
    half > SPLIT_WHEN_SLOWER * full
}

/// How many tiles of 16 rows (query rows, or keys) one task walks together. Two tiles broadcast
/// each element of the rows they stream past once for two multiply-adds: half the loads per
/// multiply-add, and twice the independent sums, which a core with two FMA units of the
/// vector's width needs to keep both busy; a core with one loses nothing but pays for the
/// larger working set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tiles {
    One,
    Two,
}

/// Something a class of calls chooses by measurement: one of two or three candidates.
trait Candidate: Copy + Eq {
    /// Its place in the candidates' order: 0, 1 or 2.
    fn index(self) -> usize;
}

impl Candidate for Tiles {
    fn index(self) -> usize {
        self.count() - 1
    }
}

impl Tiles {
    pub const ALL: [Tiles; 2] = [Tiles::One, Tiles::Two];

    /// Tiles walked together.
    pub fn count(self) -> usize {
        match self {
            Tiles::One => 1,
            Tiles::Two => 2,
        }
    }

    fn parse(value: &str) -> Result<Tiles, String> {
        match value.trim() {
            "1" => Ok(Tiles::One),
            "2" => Ok(Tiles::Two),
            _ => Err(format!("{TILES_VARIABLE}={value:?} is neither 1 nor 2")),
        }
    }
}

/// The variable that fixes [`Tiles`] for every call: `1` or `2`.
pub const TILES_VARIABLE: &str = "KERNELS_TILES";

/// The kernel's passes, each measured on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    Forward,
    /// The forward pass that also writes the probabilities: a second walk over the keys.
    ForwardWithProbs,
    Backward,
}

/// A class of calls that share one choice of [`Tiles`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class {
    pub pass: Pass,
    /// The instruction set's name.
    pub isa: &'static str,
    /// The query/key and value widths, padded to a multiple of 4.
    pub key_width: usize,
    pub value_width: usize,
    /// A causal call visits about half the key tiles of the others.
    pub causal: bool,
}

/// What was measured for one class, and what it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct TileChoice {
    pub class: Class,
    /// Each candidate's best time per unit of work (nanoseconds per 1000 (row, key) pairs of a
    /// (batch, head) pair), in the order of [`Tiles::ALL`]; `None` where it was not run.
    pub nanos: [Option<f64>; 2],
    /// The candidate that serves the class: `None` while it is still being measured.
    pub chosen: Option<Tiles>,
}

/// Timed calls of each candidate before a class chooses, after one untimed call (the first
/// call of a shape also pays for its buffers and page faults).
const TRIALS: usize = 3;

/// How much later each review of a choice comes than the one before, in calls of the class: the
/// first when it has made this many times the calls it took to choose. A review runs each
/// candidate once more, timed, and the best times so far choose again: a trial that ran while
/// another process held the second core (a reference's, in the bench: `[4096, 256] x [256, 256]`
/// chose the caller's thread at 5.6 ms a call, against 3.7 ms on the pool without it) is put
/// right by the first quiet review, and the reviews' slower candidates cost a few calls in a
/// growing number.
const REVIEW_GROWTH: usize = 4;

/// A class's measurements so far.
#[derive(Debug)]
struct Trial<C> {
    /// Calls begun.
    calls: usize,
    /// Seconds per unit of work of each timed call, per candidate (at most three).
    times: [Vec<f64>; 3],
    chosen: Option<C>,
    /// The call that begins the next review.
    review_at: usize,
    /// The candidates that this review has yet to run, by index.
    to_review: [bool; 3],
}

impl<C> Default for Trial<C> {
    fn default() -> Self {
        Self { calls: 0, times: Default::default(), chosen: None, review_at: 0, to_review: [false; 3] }
    }
}

impl<C: Candidate> Trial<C> {
    /// Begins a call: the candidate it runs (the chosen one, else each candidate in turn, and
    /// each once more in a review) and whether to time it.
    fn begin(&mut self, candidates: &[C]) -> (C, bool) {
        self.calls += 1;
        let Some(chosen) = self.chosen else {
            // The first call is untimed; then the candidate with the fewest times so far.
            let fewest = candidates.iter().min_by_key(|c| self.times[c.index()].len());
            return match self.calls {
                1 => (candidates[0], false),
                _ => (*fewest.expect("a candidate"), true),
            };
        };
        if self.calls == self.review_at {
            candidates.iter().for_each(|c| self.to_review[c.index()] = true);
            self.review_at *= REVIEW_GROWTH;
        }
        match candidates.iter().find(|c| self.to_review[c.index()]) {
            Some(&candidate) => {
                self.to_review[candidate.index()] = false;
                (candidate, true)
            }
            None => (chosen, false),
        }
    }

    /// Records a timed call of `candidate`; once every candidate has [`TRIALS`] times, and once
    /// a review has run each candidate, chooses the one with the least best time.
    fn record(&mut self, candidate: C, seconds_per_unit: f64, candidates: &[C]) {
        self.times[candidate.index()].push(seconds_per_unit);
        if !self.reviewing() && candidates.iter().all(|c| self.times[c.index()].len() >= TRIALS) {
            let best = |c: &C| self.times[c.index()].iter().copied().fold(f64::INFINITY, f64::min);
            if self.chosen.is_none() {
                self.review_at = self.calls * REVIEW_GROWTH;
            }
            self.chosen = candidates.iter().copied().min_by(|a, b| best(a).total_cmp(&best(b)));
        }
    }

    /// Whether a review has candidates yet to run.
    fn reviewing(&self) -> bool {
        self.to_review.contains(&true)
    }

    /// Whether the class's next call is timed: it has not chosen yet, or a review is under way.
    fn measuring(&self) -> bool {
        self.chosen.is_none() || self.reviewing()
    }

    /// Each candidate's best time so far, scaled by `scale`, in the candidates' order.
    fn best_times<const N: usize>(&self, scale: f64) -> [Option<f64>; N] {
        std::array::from_fn(|i| {
            let best = self.times[i].iter().copied().fold(f64::INFINITY, f64::min);
            best.is_finite().then_some(best * scale)
        })
    }
}

/// The trials of every class of one kind measured so far, locked (a panic while it was held left
/// nothing half-written).
fn locked<K, C>(trials: &'static LazyLock<Mutex<HashMap<K, Trial<C>>>>) -> MutexGuard<'static, HashMap<K, Trial<C>>> {
    trials.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `run` with the candidate of `class` (the measured choice, else the one the measurement
/// needs next) and, while the class is being measured, times it: `units` of work a call.
fn with_choice<K, C, R>(
    trials: &'static LazyLock<Mutex<HashMap<K, Trial<C>>>>,
    class: K,
    candidates: &[C],
    units: usize,
    run: impl FnOnce(C) -> R,
) -> R
where
    K: std::hash::Hash + Eq + Copy,
    C: Candidate,
{
    let (candidate, timed) = locked(trials).entry(class).or_default().begin(candidates);
    if !timed {
        return run(candidate);
    }
    // Not locked during the call: a pass may run products that choose too.
    let start = Instant::now();
    let out = run(candidate);
    let seconds_per_unit = start.elapsed().as_secs_f64() / units.max(1) as f64;
    if let Some(trial) = locked(trials).get_mut(&class) {
        trial.record(candidate, seconds_per_unit, candidates);
    }
    out
}

/// Every class of one kind measured so far, sorted: its candidates' best times (scaled by
/// `scale`, in the candidates' order) and its choice.
fn measured<K: Ord + Copy, C: Candidate, const N: usize>(
    trials: &'static LazyLock<Mutex<HashMap<K, Trial<C>>>>,
    scale: f64,
) -> Vec<(K, [Option<f64>; N], Option<C>)> {
    let mut all: Vec<_> =
        locked(trials).iter().map(|(class, trial)| (*class, trial.best_times(scale), trial.chosen)).collect();
    all.sort_by_key(|(class, ..)| *class);
    all
}

/// Whether some class of calls is still measuring its candidates (its trial, or a review under
/// way): its next calls run slower candidates too. A benchmark warms up until none is, so that
/// it times the choices, not the trials (a product's trial of the caller's thread alone runs at
/// half the speed of two threads).
pub fn measuring() -> bool {
    let tiles = locked(&TILE_TRIALS).values().any(Trial::measuring);
    tiles || locked(&THREAD_TRIALS).values().any(Trial::measuring)
}

/// Every class of the tiles' choice measured so far.
static TILE_TRIALS: LazyLock<Mutex<HashMap<Class, Trial<Tiles>>>> = LazyLock::new(Mutex::default);

/// The candidates measured on `isa`: two tiles only where a vector is one register (AVX-512),
/// since an AVX2 vector is two registers that already share each broadcast, and the baseline
/// has no FMA units to keep busy.
pub fn tiles_to_measure(isa: Isa) -> &'static [Tiles] {
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => &Tiles::ALL,
        _ => &[Tiles::One],
    }
}

/// The candidate an environment variable forces: `None` when unset (an invalid value is
/// reported on stderr and ignored, and the choice measured).
fn forced<C>(variable: &str, parse: fn(&str) -> Result<C, String>) -> Option<C> {
    let value = std::env::var(variable).ok().filter(|v| !v.is_empty())?;
    parse(&value).map_err(|error| eprintln!("warning: {error}; measuring")).ok()
}

/// [`TILES_VARIABLE`]'s value, read once ([`forced`]).
fn forced_tiles() -> Option<Tiles> {
    static FORCED: OnceLock<Option<Tiles>> = OnceLock::new();
    *FORCED.get_or_init(|| forced(TILES_VARIABLE, Tiles::parse))
}

/// Runs `run` with the [`Tiles`] of its class ([`TILES_VARIABLE`], else the measured choice,
/// else the candidate the measurement needs next) and, while the class is being measured, times
/// it.
pub(crate) fn with_tiles<R>(pass: Pass, isa: Isa, dims: Dims, causal: bool, run: impl FnOnce(Tiles) -> R) -> R {
    if reproducible() {
        return run(Tiles::One);
    }
    if let Some(tiles) = forced_tiles() {
        return run(tiles);
    }
    let candidates = tiles_to_measure(isa);
    // An empty call (no pair, row or key) takes no time whatever the tiles: it measures nothing.
    if candidates.len() == 1 || dims.is_empty() {
        return run(candidates[0]);
    }
    let class = Class { pass, isa: isa.name(), key_width: dims.key_width(), value_width: dims.value_width(), causal };
    let units = dims.pairs() * dims.query_len * dims.source_len;
    with_choice(&TILE_TRIALS, class, candidates, units, run)
}

/// What each class measured so far, and its choice, sorted by class.
pub fn tile_choices() -> Vec<TileChoice> {
    let measured = measured(&TILE_TRIALS, 1e12).into_iter();
    measured.map(|(class, nanos, chosen)| TileChoice { class, nanos, chosen }).collect()
}

/// Where a matrix product runs: on the caller's thread alone, or on rayon's pool with every
/// thread (two context switches to hand it over), split by the `gemm` crate or into one block of
/// rows per thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Threads {
    Caller,
    Pool,
    /// One block of `A`'s rows per thread, each a product on one thread: for the layers' narrow
    /// products (`[B T, 24] x [24, 72]`), which the crate's split ran slower than one thread.
    Rows,
}

impl Candidate for Threads {
    fn index(self) -> usize {
        self as usize
    }
}

impl Threads {
    pub const ALL: [Threads; 3] = [Threads::Caller, Threads::Pool, Threads::Rows];

    fn parse(value: &str) -> Result<Threads, String> {
        match value.trim() {
            "caller" => Ok(Threads::Caller),
            "pool" => Ok(Threads::Pool),
            "rows" => Ok(Threads::Rows),
            _ => Err(format!("{THREADS_VARIABLE}={value:?} is none of caller, pool and rows")),
        }
    }
}

/// The variable that fixes [`Threads`] for every product the `gemm` crate would split: `caller`,
/// `pool` or `rows`.
pub const THREADS_VARIABLE: &str = "KERNELS_GEMM_THREADS";

/// A shape of matrix product, `[M, K] x [K, N]`, on one instruction set: the class that shares
/// one choice of [`Threads`] (a layer's products repeat every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProductClass {
    pub isa: &'static str,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// What was measured for one shape of product, and what it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadChoice {
    pub class: ProductClass,
    /// Each candidate's best time a call in microseconds, in the order of [`Threads::ALL`];
    /// `None` where it was not run.
    pub micros: [Option<f64>; 3],
    /// The candidate that serves the class: `None` while it is still being measured.
    pub chosen: Option<Threads>,
}

/// Every shape of product measured so far.
static THREAD_TRIALS: LazyLock<Mutex<HashMap<ProductClass, Trial<Threads>>>> = LazyLock::new(Mutex::default);

/// [`THREADS_VARIABLE`]'s value, read once ([`forced`]).
fn forced_threads() -> Option<Threads> {
    static FORCED: OnceLock<Option<Threads>> = OnceLock::new();
    *FORCED.get_or_init(|| forced(THREADS_VARIABLE, Threads::parse))
}

/// Runs the product `run` of `class` where its [`Threads`] say ([`THREADS_VARIABLE`], else the
/// measured choice, else the candidate the measurement needs next), timing it, the hand-over to
/// the pool included, while the class is being measured.
pub(crate) fn with_threads<R>(class: ProductClass, run: impl FnOnce(Threads) -> R) -> R {
    if reproducible() {
        return run(Threads::Pool);
    }
    match forced_threads() {
        Some(threads) => run(threads),
        None => with_choice(&THREAD_TRIALS, class, &Threads::ALL, 1, run),
    }
}

/// What each shape of product measured so far, and its choice, sorted by shape.
pub fn gemm_choices() -> Vec<ThreadChoice> {
    let measured = measured(&THREAD_TRIALS, 1e6).into_iter();
    measured.map(|(class, micros, chosen)| ThreadChoice { class, micros, chosen }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_follows_the_l1_size_in_multiples_of_16() {
        let step = |kib: usize| Tuning::for_l1(kib * 1024).step;
        assert_eq!([step(16), step(32), step(48), step(64), step(128), step(1024)], [64, 128, 192, 256, 512, 512]);
        assert_eq!(Tuning::for_l1(0).step, 128, "an unreadable L1 counts as 32 KiB");
        assert_eq!(Tuning::for_l1(40 * 1024).step % LANES, 0);
    }

    #[test]
    fn narrow_sums_split_where_half_the_chains_run_at_half_the_rate() {
        let never = || -> (f64, f64) { panic!("an override is not measured") };
        assert!(split_from(Some("1"), never) && !split_from(Some(" 0 "), never));
        // A core with twice the FMA units that half the chains fill; one they fill (a Zen 4 with
        // AVX-512: 0.271 and 0.271 ns); one they nearly fill (its AVX2: 0.271 and 0.361 ns).
        assert!(split_from(None, || (1.0, 2.0)));
        assert!(!split_from(None, || (0.271, 0.271)));
        assert!(!split_from(None, || (0.271, 0.361)));
        assert!(split_from(Some("yes"), || (1.0, 2.0)), "an invalid override is ignored");
    }

    #[test]
    fn an_override_must_be_a_multiple_of_16_in_range() {
        assert_eq!(Tuning::parse_step("96"), Ok(96));
        for bad in ["0", "100", "8192", "x", "-16"] {
            let error = Tuning::parse_step(bad).unwrap_err();
            assert!(error.contains(STEP_VARIABLE) && error.contains(bad), "{error}");
        }
    }

    /// Runs `calls` calls of `trial`, each taking `seconds(candidate, call)`; returns the
    /// candidates in the order they ran and whether each was timed.
    fn run_calls<C: Candidate>(
        trial: &mut Trial<C>,
        candidates: &[C],
        calls: usize,
        seconds: impl Fn(C, usize) -> f64,
    ) -> Vec<(C, bool)> {
        let start = trial.calls;
        (start..start + calls)
            .map(|call| {
                let (candidate, timed) = trial.begin(candidates);
                if timed {
                    trial.record(candidate, seconds(candidate, call), candidates);
                }
                (candidate, timed)
            })
            .collect()
    }

    #[test]
    fn a_class_runs_each_candidate_then_keeps_the_fastest() {
        let candidates = &Tiles::ALL;
        let mut trial = Trial::default();
        // The first call is untimed; then the candidates take turns until each has TRIALS times.
        let seconds = |tiles, call| if tiles == Tiles::Two { 1.0 } else { 2.0 + call as f64 };
        let order = run_calls(&mut trial, candidates, 1 + 2 * TRIALS, seconds);
        assert_eq!(order[0], (Tiles::One, false));
        for tiles in Tiles::ALL {
            assert_eq!(order[1..].iter().filter(|&&(t, timed)| t == tiles && timed).count(), TRIALS, "{order:?}");
        }
        assert_eq!(trial.chosen, Some(Tiles::Two));
        assert_eq!(trial.begin(candidates), (Tiles::Two, false), "the choice stays, untimed");
        // The best time decides, not the last: a candidate slowed once still wins.
        let mut trial = Trial::default();
        let slowed = [9.0, 1.0, 1.5, 50.0, 1.5, 1.2, 1.5, 1.2, 1.5, 1.2];
        run_calls(&mut trial, candidates, 1 + slowed.len(), |_, call| slowed[call.saturating_sub(1)]);
        assert_eq!(trial.chosen, Some(Tiles::Two));
        // Three candidates take turns the same way.
        let candidates = &Threads::ALL;
        let mut trial = Trial::default();
        let order =
            run_calls(&mut trial, candidates, 1 + 3 * TRIALS, |t, _| if t == Threads::Rows { 1.0 } else { 2.0 });
        for threads in Threads::ALL {
            assert_eq!(order[1..].iter().filter(|&&(t, _)| t == threads).count(), TRIALS, "{order:?}");
        }
        assert_eq!(trial.chosen, Some(Threads::Rows));
    }

    #[test]
    fn a_choice_made_in_a_busy_moment_is_put_right_by_a_review() {
        // The pool and the row split measured while another process held the second core (the
        // caller's thread alone fastest), then the core free: each threaded call takes 0.6.
        let candidates = &Threads::ALL;
        let busy_until = 1 + 3 * TRIALS;
        let seconds = |threads, call| match threads {
            Threads::Caller => 1.0,
            _ if call < busy_until => 1.1,
            _ => 0.6,
        };
        let mut trial = Trial::default();
        assert!(trial.measuring(), "a class measures until it chooses");
        let first = run_calls(&mut trial, candidates, busy_until, seconds);
        assert_eq!(trial.chosen, Some(Threads::Caller), "{first:?}");
        assert!(!trial.measuring());
        // The choice serves untimed until the review, after REVIEW_GROWTH times the trial's calls.
        let until_review = run_calls(&mut trial, candidates, (REVIEW_GROWTH - 1) * busy_until - 1, seconds);
        assert!(until_review.iter().all(|&call| call == (Threads::Caller, false)), "{until_review:?}");
        assert!(!trial.measuring());
        let review = run_calls(&mut trial, candidates, 2, seconds);
        assert_eq!(trial.chosen, Some(Threads::Caller), "a review chooses when it has run every candidate");
        assert!(trial.measuring(), "a review under way measures");
        let review = [review, run_calls(&mut trial, candidates, 1, seconds)].concat();
        assert!(!trial.measuring());
        assert_eq!(review, Threads::ALL.map(|threads| (threads, true)), "each candidate once, timed");
        assert_eq!(trial.chosen, Some(Threads::Pool), "the best times so far choose again");
        assert_eq!(trial.begin(candidates), (Threads::Pool, false));
        // The next review comes REVIEW_GROWTH times later again; a busy one changes nothing.
        let next = busy_until * REVIEW_GROWTH * REVIEW_GROWTH;
        let before_review = next - trial.calls - 1;
        let quiet = run_calls(&mut trial, candidates, before_review, seconds);
        assert!(quiet.iter().all(|&call| call == (Threads::Pool, false)), "{quiet:?}");
        let review = run_calls(&mut trial, candidates, 3, |threads, _| seconds(threads, 0));
        assert_eq!(review.iter().filter(|(_, timed)| *timed).count(), 3);
        assert_eq!(trial.chosen, Some(Threads::Pool), "a slow moment does not undo a fast one");
    }

    #[test]
    fn the_threads_override_is_caller_pool_or_rows() {
        assert_eq!(Threads::parse(" caller "), Ok(Threads::Caller));
        assert_eq!(Threads::parse("pool"), Ok(Threads::Pool));
        assert_eq!(Threads::parse("rows"), Ok(Threads::Rows));
        for bad in ["1", "all", ""] {
            let error = Threads::parse(bad).unwrap_err();
            assert!(error.contains(THREADS_VARIABLE), "{error}");
        }
    }

    #[test]
    fn the_tiles_override_is_1_or_2() {
        assert_eq!(Tiles::parse(" 2 "), Ok(Tiles::Two));
        assert_eq!(Tiles::parse("1"), Ok(Tiles::One));
        for bad in ["0", "3", "two", ""] {
            let error = Tiles::parse(bad).unwrap_err();
            assert!(error.contains(TILES_VARIABLE), "{error}");
        }
    }
}
