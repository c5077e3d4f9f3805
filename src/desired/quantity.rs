//! Just enough of Kubernetes' quantity grammar to turn a memory quantity into bytes.

/// Digits beyond this cannot come from a sane memory size and would overflow the arithmetic.
const MAX_DIGITS: usize = 30;

/// Bytes in a quantity such as `512Mi`, `1G`, `1.5Gi`, `+1e9` or `100000`, rounded up as the
/// API server rounds; `None` when it is not a positive quantity.
pub(crate) fn bytes(quantity: &str) -> Option<u128> {
    scaled(quantity, 1).filter(|b| *b > 0)
}

/// Thousandths of a quantity, rounded up, so that `0.5` and `500m`, or `1Gi` and `1024Mi`,
/// compare equal; `None` when it is not a non-negative quantity.
pub fn quantity_millis(quantity: &str) -> Option<u128> {
    scaled(quantity, 1000)
}

/// `quantity * factor`, rounded up.
fn scaled(quantity: &str, factor: u128) -> Option<u128> {
    let unsigned = quantity.strip_prefix('+').unwrap_or(quantity);
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(split);
    let (digits, fraction_len) = decimal(number)?;
    let (multiplier, divisor) = scale(suffix)?;
    let numerator = digits.checked_mul(multiplier)?.checked_mul(factor)?;
    let denominator = 10u128.checked_pow(fraction_len)?.checked_mul(divisor)?;
    Some(numerator.div_ceil(denominator))
}

/// `1.50` -> (150, 2): the digits as an integer and how many of them follow the point.
fn decimal(number: &str) -> Option<(u128, u32)> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all = format!("{whole}{fraction}");
    if all.is_empty() || all.len() > MAX_DIGITS || fraction.contains('.') {
        return None;
    }
    let digits = all.parse().ok()?;
    Some((digits, u32::try_from(fraction.len()).ok()?))
}

/// The suffix as a fraction `multiplier / divisor`.
fn scale(suffix: &str) -> Option<(u128, u128)> {
    let binary = |power: u32| Some((1u128 << (10 * power), 1));
    let decimal = |power: u32| Some((10u128.checked_pow(power)?, 1));
    match suffix {
        "" => Some((1, 1)),
        "m" => Some((1, 1000)),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => exponent(suffix),
    }
}

/// `e9` / `E-3`: a decimal exponent.
fn exponent(suffix: &str) -> Option<(u128, u128)> {
    let power = suffix.strip_prefix(['e', 'E'])?;
    let power: i32 = power.parse().ok()?;
    let ten = |p: u32| 10u128.checked_pow(p);
    if power >= 0 {
        Some((ten(power.unsigned_abs())?, 1))
    } else {
        Some((1, ten(power.unsigned_abs())?))
    }
}

#[cfg(test)]
mod tests {
    use super::{bytes, quantity_millis};

    #[test]
    fn memory_quantities() {
        assert_eq!(bytes("256Mi"), Some(256 << 20));
        assert_eq!(bytes("1Gi"), Some(1 << 30));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("512M"), Some(512_000_000));
        assert_eq!(bytes("1e9"), Some(1_000_000_000));
        assert_eq!(bytes("+2k"), Some(2000));
        assert_eq!(bytes("100000"), Some(100_000));
        assert_eq!(bytes(".5Ki"), Some(512));
        assert_eq!(bytes("1500m"), Some(2));
        assert_eq!(bytes("1E"), Some(10u128.pow(18)));
    }

    #[test]
    fn not_memory_quantities() {
        for bad in [
            "", "0", "-1Gi", "1GB", "Gi", "1..5", "1.5.5", "e9", "1e", "1 Gi", "1e99999",
        ] {
            assert_eq!(bytes(bad), None, "{bad:?}");
        }
        assert_eq!(bytes(&"9".repeat(40)), None);
    }

    #[test]
    fn millis_compare_normalized_quantities() {
        assert_eq!(quantity_millis("0.5"), quantity_millis("500m"));
        assert_eq!(quantity_millis("1Gi"), quantity_millis("1024Mi"));
        assert_eq!(quantity_millis("2"), Some(2000));
        assert_eq!(quantity_millis("0"), Some(0));
        assert_ne!(quantity_millis("1Gi"), quantity_millis("1G"));
        assert_eq!(quantity_millis("-1"), None);
    }
}
