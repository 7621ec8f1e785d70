//! Wide-vector builds of plain loops, chosen at run time.
//!
//! The crate compiles for the baseline of its target (SSE2 on x86-64), so the compiler only
//! vectorizes plain loops 128 bits wide. `multiversion!` compiles a kernel written as plain
//! Rust a second and third time with AVX2+FMA and AVX-512 enabled and calls the best one the CPU
//! has. The kernels keep their reductions in explicit lanes and never fuse a multiply with an
//! add, so every build computes the same bits: the choice changes speed, never results.

/// The widest vector level this CPU has (cached by the standard library).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    Avx512,
    Avx2,
    Baseline,
}

pub fn level() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        // F16C (half-float conversions) comes with every AVX2 CPU; builds may use it.
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Baseline
}

/// `pub fn name(args) -> R = imp;` defines `name`, which runs the `#[inline(always)]` function
/// `imp(args)` compiled for the best [`level`].
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? = $imp:ident;) => {
        $(#[$m])*
        $vis fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU supports AVX-512F, AVX-512BW, AVX2 and FMA (the generated function
                /// checked [`level`]).
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
                unsafe fn wide512($($a: $t),*) $(-> $r)? {
                    $imp($($a),*)
                }
                /// # Safety
                /// The CPU supports AVX2 and FMA (the generated function checked [`level`]).
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide256($($a: $t),*) $(-> $r)? {
                    $imp($($a),*)
                }
                match $crate::cpu::simd::level() {
                    // SAFETY: the CPU has the features these builds enable.
                    $crate::cpu::simd::SimdLevel::Avx512 => return unsafe { wide512($($a),*) },
                    // SAFETY: as above.
                    $crate::cpu::simd::SimdLevel::Avx2 => return unsafe { wide256($($a),*) },
                    $crate::cpu::simd::SimdLevel::Baseline => {}
                }
            }
            $imp($($a),*)
        }
    };
}
pub(crate) use multiversion;

/// `e^x` in f32 to about one unit in the last place, as plain arithmetic that vectorizes (no
/// library call): Cody-Waite range reduction and a degree-6 polynomial. Inputs below -87 give
/// about 1e-38 or 0, above 88 about 1.6e38.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = (p * (r * r) + r) + 1.0;
    // `t` is 1.5 * 2^23 + n with |n| < 2^22, so its low mantissa bits are n itself: the
    // exponent field comes from integer arithmetic on the bits (a float-to-int cast would be
    // saturating, and the compiler does that one element at a time).
    let bias = ROUND.to_bits().wrapping_sub(127);
    y * f32::from_bits(t.to_bits().wrapping_sub(bias) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_takes_its_exponent_from_the_rounding_bits() {
        // The bit arithmetic must give exactly the power of two of the plain cast.
        let cast = |x: f32| {
            let x = x.clamp(-87.0, 88.0);
            let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            f32::from_bits(((n as i32 + 127) as u32) << 23)
        };
        let mut x = -100.0f32;
        while x < 100.0 {
            let y = exp(x);
            let p = cast(x);
            // y = poly(r) * 2^n with poly(r) in [0.7, 1.42]: the same 2^n in both.
            assert!(y / p > 0.7 && y / p < 1.42, "x {x}: {y} against 2^n = {p}");
            x += 0.0173;
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_library() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1000.0) < 1e-37 && exp(1000.0) > 1e38);
    }
}
