//! Numbers for people, in one style wherever they are shown (the `tidegate` command, the HTML
//! review page, the server's messages): sizes in binary units (`53.0 KiB`), durations in the
//! largest two units that matter (`4 min 10 s`), and counts with the noun agreeing (`1 retry`,
//! `2 retries`).

use std::fmt::Display;

/// A byte count: `512 B`, `1.5 KiB`, `3.2 MiB`, `1.0 GiB` (binary units, one decimal).
pub fn size(bytes: u64) -> String {
    bytesize::ByteSize::b(bytes).display().iec().to_string()
}

/// A duration in seconds: `0.3 s` and `9.5 s` below ten seconds, `42 s` below a minute, then the
/// two largest units: `4 min 10 s`, `2 h 5 min`, `3 d 4 h` (a zero second unit is left out).
/// A negative or unknown duration is `0.0 s`.
pub fn duration(seconds: f64) -> String {
    let s = if seconds.is_finite() { seconds.max(0.0) } else { 0.0 };
    if s < 9.95 {
        return format!("{s:.1} s");
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "finite, not negative, rounded")]
    let whole = s.round() as u64;
    let units = [(86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")];
    let Some(first) = units.iter().position(|(n, _)| whole >= *n) else { return "0 s".to_owned() };
    let (n, unit) = units[first];
    let mut text = format!("{} {unit}", whole / n);
    if let Some((m, next)) = units.get(first + 1)
        && (whole % n) / m > 0
    {
        text.push_str(&format!(" {} {next}", (whole % n) / m));
    }
    text
}

/// `n` and the noun agreeing with it: `1 retry`, `0 retries`, `2 retries`.
pub fn count<N: TryInto<u64> + Display + Copy>(n: N, one: &str, many: &str) -> String {
    format!("{n} {}", noun(n, one, many))
}

/// The noun agreeing with `n` (`one` for exactly one, else `many`), for sentences that place the
/// number apart from its noun.
pub fn noun<'a, N: TryInto<u64> + Copy>(n: N, one: &'a str, many: &'a str) -> &'a str {
    if n.try_into().ok() == Some(1) { one } else { many }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_binary_units_with_one_decimal() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        // The review page once said "54.3 KB" where the command said this.
        assert_eq!(size(54_300), "53.0 KiB");
        assert_eq!(size(3 * 1024 * 1024 + 200 * 1024), "3.2 MiB");
        assert_eq!(size(1 << 30), "1.0 GiB");
    }

    #[test]
    fn durations_show_the_two_largest_units() {
        assert_eq!(duration(0.0), "0.0 s");
        assert_eq!(duration(0.34), "0.3 s");
        assert_eq!(duration(9.5), "9.5 s");
        assert_eq!(duration(9.96), "10 s");
        assert_eq!(duration(42.4), "42 s");
        assert_eq!(duration(59.6), "1 min");
        assert_eq!(duration(250.0), "4 min 10 s");
        assert_eq!(duration(3_600.0), "1 h");
        assert_eq!(duration(7_530.0), "2 h 5 min");
        assert_eq!(duration(273_600.0), "3 d 4 h");
        assert_eq!(duration(-5.0), "0.0 s");
        assert_eq!(duration(f64::NAN), "0.0 s");
    }

    #[test]
    fn counts_agree_with_their_noun() {
        assert_eq!(count(1, "retry", "retries"), "1 retry");
        assert_eq!(count(2_usize, "retry", "retries"), "2 retries");
        assert_eq!(count(0_u32, "step", "steps"), "0 steps");
        assert_eq!(count(-1_i64, "file", "files"), "-1 files");
        assert_eq!(noun(1_u64, "partition", "partitions"), "partition");
    }
}
