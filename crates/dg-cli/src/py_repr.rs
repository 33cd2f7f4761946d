//! Python's `repr(float)`, for the places that must print numbers byte for byte as Python does:
//! chat templates rendered by transformers' Jinja (`chat::py_values`) and OpenJev's `json.dumps`
//! (`serve::systemone::pyjson`).

/// `float.__repr__(x)`: the shortest digits that read back (as Rust's), positional for decimal
/// exponents −4 ≤ e < 16 (with `.0` when whole), else `d.ddde±XX`; `nan`, `inf`, `-inf`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exp: i32 = exp.parse().expect("`{:e}`'s exponent is an integer");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let body = if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        }
    } else {
        let fraction = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{}{fraction}e{}{:02}", &digits[..1], if exp < 0 { '-' } else { '+' }, exp.unsigned_abs())
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::float_repr;

    #[test]
    fn floats_print_as_python_repr() {
        // `repr(x)` in CPython 3.11.
        for (x, python) in [
            (1e-7, "1e-07"),
            (1e20, "1e+20"),
            (-1.5e16, "-1.5e+16"),
            (1.234e-100, "1.234e-100"),
            (0.1, "0.1"),
            (1e15, "1000000000000000.0"),
            (1e-4, "0.0001"),
            (2.5, "2.5"),
            (-3.0, "-3.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (123456.789, "123456.789"),
            (0.00012, "0.00012"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(x), python, "{x}");
        }
    }
}
