//! The soak's memory check: does memory keep growing with the number of requests?
//!
//! A leak grows memory in proportion to the requests served; warm-up (allocator arenas, pools,
//! caches filling to their bound) grows it early and then stops. So the load after the warm-up
//! runs in rounds of equal size, memory is read once the server is idle after each, and the
//! verdict looks only at the rounds after the first: memory leaks when it rose in every one
//! of them *and* rose by more than the allowed growth over them. Memory that rises and then
//! stays level, or moves up and down, is warm-up or noise, whatever its size.
//!
//! The series watched is the allocator's heap in use where the server exports it (it moves
//! only with live allocations; Ferrum's `ferrum_heap_in_use_bytes`), else resident memory.

/// Which memory a verdict was reached on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    HeapInUse,
    Resident,
}

impl Watched {
    pub fn name(self) -> &'static str {
        match self {
            Watched::HeapInUse => "heap in use",
            Watched::Resident => "resident memory",
        }
    }
}

/// What the readings say.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Growth from the end of the first round to the end of the last, in MiB.
    pub growth_mib: f64,
    /// Whether memory rose in every round after the first.
    pub rose_every_round: bool,
    pub leak: bool,
}

/// The verdict on `readings` in MiB: after the warm-up, then after each round (so at least
/// three readings: two rounds). `None` with fewer.
pub fn judge(readings: &[f64], max_growth_mib: f64) -> Option<Verdict> {
    // Readings after the first round onwards.
    let later = readings.get(1..).filter(|r| r.len() >= 2)?;
    let rose_every_round = later.windows(2).all(|w| w[1] > w[0]);
    let growth_mib = later[later.len() - 1] - later[0];
    Some(Verdict {
        growth_mib,
        rose_every_round,
        leak: rose_every_round && growth_mib > max_growth_mib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_growth_is_a_leak() {
        // 10 MiB per round: a leak at any size of growth past the bound.
        let v = judge(&[100.0, 110.0, 120.0, 130.0, 140.0], 16.0).expect("enough readings");
        assert!(v.leak && v.rose_every_round);
        assert_eq!(v.growth_mib, 30.0);
        // Below the bound it is reported, not failed.
        let v = judge(&[100.0, 101.0, 102.0, 103.0, 104.0], 16.0).expect("enough readings");
        assert!(!v.leak && v.rose_every_round);
    }

    #[test]
    fn warm_up_then_level_is_not_a_leak() {
        // The first round's 66 MiB (the growth that failed the old one-threshold check) is
        // warm-up: the later rounds are level or move both ways.
        let v = judge(&[500.0, 566.1, 566.3, 565.9, 566.4], 16.0).expect("enough readings");
        assert!(!v.leak && !v.rose_every_round);
        let v = judge(&[500.0, 566.0, 590.0, 590.0, 590.0], 16.0).expect("enough readings");
        assert!(!v.leak, "rose in one later round, then stopped: {v:?}");
    }

    #[test]
    fn one_round_cannot_tell() {
        assert_eq!(judge(&[1.0, 2.0], 0.0), None);
        assert_eq!(judge(&[], 0.0), None);
        assert!(judge(&[1.0, 2.0, 3.0], 0.5).expect("two rounds").leak);
    }
}
