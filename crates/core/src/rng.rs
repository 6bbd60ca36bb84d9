//! A tiny deterministic generator (splitmix64): seeded, so a test or a demo can reproduce every
//! sample. For backoff jitter and synthetic data; not for anything that needs unpredictability.

/// splitmix64 over a 64-bit state.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose samples are fully determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 well-mixed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform sample in `[0, 1)`.
    pub fn next_unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit
    }

    /// A sample in `[0, n)` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_same_seed_gives_the_same_samples_in_range() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..1000 {
            let x = a.next_unit();
            assert!((0.0..1.0).contains(&x));
            assert_eq!(x.to_bits(), b.next_unit().to_bits());
        }
        assert_ne!(SplitMix64::new(7).next_u64(), SplitMix64::new(8).next_u64());
        assert!(SplitMix64::new(1).below(10) < 10);
    }
}
