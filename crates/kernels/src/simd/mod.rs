//! The SIMD layer: 16 float32 lanes as a vector of the instruction set the CPU has, and the
//! instruction sets themselves.
//!
//! Every vector operation of the kernels goes through [`Vector`], implemented three times:
//! [`Portable`] (plain arrays), and on x86-64 `Avx2` (two `__m256`) and `Avx512` (one `__m512`).
//! The x86 implementations execute their instruction set's intrinsics, so they may only run on a
//! CPU that has it. That is kept by construction: the vector types and [`Vector`] are private to
//! this crate, and the functions generic over them are reached only through an [`Isa`], whose
//! constructors check the CPU. Nothing outside the crate can name an AVX-512 vector, and an
//! `Isa` value is a proof that its instructions run here.

mod exp;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use exp::exp_nonpositive;
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

/// Rows per vector: 16 float32 fill one AVX-512 register (two AVX2 registers).
pub const LANES: usize = 16;

/// An instruction set the kernels and the GEMM are compiled for, present on this CPU.
///
/// Only [`Isa::available`], [`Isa::detected`], [`Isa::best`] and [`Isa::parse`] make values,
/// and each checks the CPU first: holding an `Isa` means its instructions run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Isa(Level);

/// The instruction sets, narrowest first (the order `Ord` compares by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Level {
    /// Whatever the build targets (SSE2 on x86-64), no FMA: any CPU.
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The variable that restricts the instruction set, for tests and benchmarks: `avx512`, `avx2`
/// or `portable`, never wider than the CPU has.
pub const ISA_VARIABLE: &str = "KERNELS_ISA";

/// The instruction set of this process, once [`Isa::best`] or [`Isa::use_for_process`] chose it.
static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();

impl Isa {
    /// The baseline, which every CPU runs.
    pub const PORTABLE: Isa = Isa(Level::Portable);

    /// The instruction sets this CPU runs, widest first.
    pub fn available() -> Vec<Isa> {
        let mut found = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512dq") && has!("avx2") && has!("fma") {
                found.push(Isa(Level::Avx512));
            }
            if has!("avx2") && has!("fma") {
                found.push(Isa(Level::Avx2));
            }
        }
        found.push(Isa::PORTABLE);
        found
    }

    /// The widest instruction set this CPU runs (detected once: the GEMM asks on every call).
    pub fn detected() -> Isa {
        static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| Isa::available()[0])
    }

    /// The instruction set the kernels use: the one [`ISA_VARIABLE`] names, else the widest this
    /// CPU runs. Read once per process; a value that names no instruction set of this CPU is
    /// reported on stderr and the widest is used (call [`Isa::from_env`] first to refuse it).
    pub fn best() -> Isa {
        *BEST.get_or_init(|| match Isa::from_env() {
            Ok(isa) => isa.unwrap_or_else(Isa::detected),
            Err(error) => {
                eprintln!("warning: {error}; using {}", Isa::detected().name());
                Isa::detected()
            }
        })
    }

    /// Fixes the instruction set [`Isa::best`] returns for the rest of the process (a benchmark's
    /// `--isa`). Fails, returning the one in use, once a kernel has run.
    pub fn use_for_process(isa: Isa) -> Result<(), Isa> {
        BEST.set(isa).or_else(|_| if Isa::best() == isa { Ok(()) } else { Err(Isa::best()) })
    }

    /// The instruction set [`ISA_VARIABLE`] names, if it is set.
    pub fn from_env() -> Result<Option<Isa>, IsaError> {
        match std::env::var(ISA_VARIABLE) {
            Ok(name) if !name.is_empty() => Isa::parse(&name).map(Some),
            _ => Ok(None),
        }
    }

    /// `avx512`, `avx2` or `portable`, if this CPU runs it.
    pub fn parse(name: &str) -> Result<Isa, IsaError> {
        Isa::available().into_iter().find(|isa| isa.name() == name.trim().to_ascii_lowercase()).ok_or_else(|| {
            IsaError { name: name.to_string(), available: Isa::available().iter().map(|isa| isa.name()).collect() }
        })
    }

    /// The name [`Isa::parse`] reads.
    pub fn name(self) -> &'static str {
        match self.0 {
            Level::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
        }
    }

    /// The width of one vector register in bits (128 for the portable path: SSE2 or NEON).
    pub fn vector_bits(self) -> usize {
        match self.0 {
            Level::Portable => 128,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => 256,
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => 512,
        }
    }

    pub(crate) fn level(self) -> Level {
        self.0
    }
}

/// An instruction-set name that this CPU does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsaError {
    pub name: String,
    pub available: Vec<&'static str>,
}

impl std::fmt::Display for IsaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{ISA_VARIABLE}={:?} is not an instruction set of this CPU (it runs: {})",
            self.name,
            self.available.join(", ")
        )
    }
}

impl std::error::Error for IsaError {}

/// 16 float32 values: one AVX-512 register, two AVX2 ones.
pub type Lanes = [f32; LANES];

/// A lane-wise expression as a vector. A loop, not `array::from_fn`, which LLVM left as a call
/// (7% of the seed's training step on AVX2, with the closures it calls).
#[inline(always)]
pub fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    let mut out = [0.0; LANES];
    for (i, lane) in out.iter_mut().enumerate() {
        *lane = f(i);
    }
    out
}

/// 16 lanes in registers, for one instruction set. The x86 implementations call intrinsics of
/// their instruction set: they are only used inside functions compiled for it, reached through an
/// [`Isa`] (see the attention kernel's `dispatch!`), so only on CPUs that have it.
pub(crate) trait Vector: Copy {
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    fn load(x: &Lanes) -> Self;
    fn store(self, out: &mut Lanes);
    /// `self * b + c` (fused where the instruction set has FMA)
    fn mul_add(self, b: Self, c: Self) -> Self;
    fn max(self, b: Self) -> Self;
    fn add(self, b: Self) -> Self;
    fn sub(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    /// `self` in the lanes whose bit is set, 0 elsewhere.
    fn keep(self, bits: u16) -> Self;
    /// `2^n` for the `n` that [`exp_nonpositive`]'s rounding trick holds in the low mantissa bits
    /// of `self`: the bit pattern `(bits(self) - bits(magic) + 127) << 23`.
    fn pow2_of_rounded(self, magic: f32) -> Self;
    /// `exp(self)` for lanes `<= 0` ([`exp_nonpositive`]), unless
    /// the instruction set has a shorter way.
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        exp_nonpositive(self)
    }
    /// The shift a bounded step (the attention kernel's `bounded_shifts`) takes for rows whose
    /// logits are at most `bound`: `bound` itself, or a little above it where that lets
    /// [`Vector::exp_shifted`] fold the subtraction into its reduction (AVX2: the next multiple
    /// of `1 / (8 log2 e)`, at most 0.087 above). Softmax is the same for any shift.
    #[inline(always)]
    fn bounded_shift(bound: Self) -> Self {
        bound
    }
    /// What [`Vector::exp_shifted`] takes for a shift from [`Vector::bounded_shift`], made once a
    /// step: the shift itself, unless the instruction set folds it into its reduction.
    #[inline(always)]
    fn shift_constant(shift: Self) -> Self {
        shift
    }
    /// `exp(score - shift)` for `constant = shift_constant(shift)`, lanes where the difference
    /// lies in `[-BOUNDED_GAP - 1, 0]` (the attention kernel's bounded steps): an instruction set
    /// whose `exp` clamps its argument leaves the clamp out, and one that can folds the
    /// subtraction into the reduction (an instruction less a vector).
    #[inline(always)]
    fn exp_shifted(score: Self, constant: Self) -> Self {
        score.sub(constant).exp_nonpositive()
    }
    /// One step of the online softmax with its weighted sum, fused, for value rows of `W`
    /// features (a narrow head): for each row `j` of `rows`, `p = exp(scores[j] - shift)`, 0 in
    /// the lanes `bits[j]` blocks where `MASKED`; `p` counts in the returned sum; where `DROPOUT`
    /// the lanes `keep[j]` drops are zeroed next; then `context[d] += p · values[j · stride + d]`.
    /// At narrow widths a pass that stores `p` and one that reads it back for `W` chains of
    /// multiply-adds leave the FMA ports idle in turns; fused, the exponentials' independent work
    /// fills the chains' waits. One running sum: a row's other work outlasts an add's latency.
    /// With `BOUNDED`, `shift` comes from [`Vector::bounded_shift`] and every allowed lane's
    /// `scores[j] - shift` lies in `[-BOUNDED_GAP - 1, 0]` ([`Vector::exp_shifted`]); blocked
    /// lanes' exponentials may then be anything before the mask zeroes them.
    #[inline(always)]
    fn exp_weighted_rows<const W: usize, const MASKED: bool, const DROPOUT: bool, const BOUNDED: bool>(
        rows: WeightedRows,
        shift: Self,
        context: &mut [Lanes],
    ) -> Self {
        rows.check(W, context);
        let mut acc: [Self; W] = [Self::zero(); W];
        for (acc, context) in acc.iter_mut().zip(context.iter()) {
            *acc = Self::load(context);
        }
        let (mut sum, constant) = (Self::zero(), Self::shift_constant(shift));
        for (score, row, bits, keep) in rows.iter() {
            let score = Self::load(score);
            let p = if BOUNDED { Self::exp_shifted(score, constant) } else { score.sub(shift).exp_nonpositive() };
            sum = sum.add(add_weighted::<Self, W, MASKED, DROPOUT>(p, bits, keep, &row[..W], &mut acc));
        }
        for (acc, context) in acc.iter().zip(context.iter_mut()) {
            acc.store(context);
        }
        sum
    }
    /// The 16 x 16 block `rows` transposed: lane `i` of output `j` is lane `j` of row `i`.
    #[inline(always)]
    fn transpose(rows: &[Lanes; LANES]) -> [Lanes; LANES] {
        // Loops, not `array::from_fn`, which LLVM leaves as calls.
        let mut out = [[0.0; LANES]; LANES];
        for (i, row) in rows.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                out[j][i] = x;
            }
        }
        out
    }
}

/// One tile's rows of a forward step, for [`Vector::exp_weighted_rows`]: its scores, their mask
/// bits and dropout keep bits (bit `i` for lane `i`), and the step's value rows, `stride` apart.
#[derive(Clone, Copy)]
pub(crate) struct WeightedRows<'a> {
    pub scores: &'a [Lanes],
    pub bits: &'a [u16],
    pub keep: &'a [u16],
    pub values: &'a [f32],
    pub stride: usize,
}

impl<'a> WeightedRows<'a> {
    /// Panics unless every score row has its bits, keep bits and a value row of `width`, and
    /// `context` holds a vector for each of the `width` features.
    #[inline(always)]
    pub(crate) fn check(&self, width: usize, context: &[Lanes]) {
        let n = self.scores.len();
        assert!(
            self.bits.len() >= n
                && self.keep.len() >= n
                && width <= self.stride
                && self.values.len() >= n * self.stride
                && context.len() >= width,
            "exp_weighted_rows: a value row of {width}, bits for each of {n} score rows and {width} context vectors"
        );
    }

    /// Row by row: the scores, the value row (`stride` elements), the bits and the keep bits.
    #[inline(always)]
    pub(crate) fn iter(self) -> impl Iterator<Item = (&'a Lanes, &'a [f32], u16, u16)> {
        let rows = self.scores.iter().zip(self.values.chunks_exact(self.stride));
        rows.zip(self.bits.iter().zip(self.keep)).map(|((score, row), (&bits, &keep))| (score, row, bits, keep))
    }
}

/// A row's probabilities `exp(score - shift)`: the ones its sum counts (0 in the lanes `bits`
/// blocks where `MASKED`), and the ones kept after dropout (also 0 in the lanes `keep` drops
/// where `DROPOUT`: dropped entries still count in the normalising sum).
#[inline(always)]
pub(crate) fn masked_exp<V: Vector, const MASKED: bool, const DROPOUT: bool>(
    score: &Lanes,
    shift: V,
    bits: u16,
    keep: u16,
) -> (V, V) {
    masked::<V, MASKED, DROPOUT>(V::load(score).sub(shift).exp_nonpositive(), bits, keep)
}

/// The exponentials `p` as [`masked_exp`] returns them: counted, and kept.
#[inline(always)]
fn masked<V: Vector, const MASKED: bool, const DROPOUT: bool>(mut p: V, bits: u16, keep: u16) -> (V, V) {
    if MASKED {
        p = p.keep(bits);
    }
    let counted = p;
    if DROPOUT {
        p = p.keep(keep);
    }
    (counted, p)
}

/// One row's exponentials `p` into a weighted sum: masked by `bits` where `MASKED` and returned
/// for the sum; `acc[d] += p · row[d]`, `p` kept by `keep` first where `DROPOUT`. (A function, not
/// a closure: a closure does not inherit the caller's target features.)
#[inline(always)]
fn add_weighted<V: Vector, const W: usize, const MASKED: bool, const DROPOUT: bool>(
    p: V,
    bits: u16,
    keep: u16,
    row: &[f32],
    acc: &mut [V; W],
) -> V {
    let (counted, p) = masked::<V, MASKED, DROPOUT>(p, bits, keep);
    for (acc, &v) in acc.iter_mut().zip(row) {
        *acc = p.mul_add(V::splat(v), *acc);
    }
    counted
}

/// The baseline: plain arrays, whatever the compiler makes of them.
#[derive(Clone, Copy)]
pub(crate) struct Portable(Lanes);

impl Vector for Portable {
    #[inline(always)]
    fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable([x; LANES])
    }
    #[inline(always)]
    fn load(x: &Lanes) -> Self {
        Portable(*x)
    }
    #[inline(always)]
    fn store(self, out: &mut Lanes) {
        *out = self.0;
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        Portable(lanes(|i| self.0[i] * b.0[i] + c.0[i]))
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i].max(b.0[i])))
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] + b.0[i]))
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] - b.0[i]))
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] * b.0[i]))
    }
    #[inline(always)]
    fn keep(self, bits: u16) -> Self {
        Portable(lanes(|i| if bits >> i & 1 == 1 { self.0[i] } else { 0.0 }))
    }
    #[inline(always)]
    fn pow2_of_rounded(self, magic: f32) -> Self {
        Portable(lanes(|i| f32::from_bits(self.0[i].to_bits().wrapping_sub(magic.to_bits()).wrapping_add(127) << 23)))
    }
}
