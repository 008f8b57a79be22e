//! JSON text exactly as Python's `json.dumps(value, ensure_ascii=False)` writes it.
//!
//! The reference encoder prints tool schemas and non-string tool arguments this way, so the
//! prompt bytes (and ids) depend on it: `", "` and `": "` separators, keys in input order
//! (serde_json's `preserve_order`), non-ASCII kept, and Python's float `repr`
//! (`1e-05`, `1e+16`, `100.0`).

use serde_json::{Number, Value};

/// Serialises `value` like `json.dumps(value, ensure_ascii=False)`.
pub(crate) fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// A JSON string literal, Python style.
pub(crate) fn dumps_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_str(&mut out, s);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, key);
                out.push_str(": ");
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(out: &mut String, n: &Number) {
    if n.is_u64() || n.is_i64() {
        out.push_str(&n.to_string());
    } else if let Some(f) = n.as_f64() {
        out.push_str(&python_float_repr(f));
    } else {
        out.push_str(&n.to_string());
    }
}

/// Python's `repr(float)`: shortest round-trip digits; positional when the decimal exponent
/// is in `-4..16`, else `d.ddde±XX` with at least two exponent digits.
pub(crate) fn python_float_repr(f: f64) -> String {
    if !f.is_finite() {
        // json.dumps writes these (non-standard JSON); serde_json values never hold them.
        return if f.is_nan() {
            "NaN".to_string()
        } else if f > 0.0 {
            "Infinity".to_string()
        } else {
            "-Infinity".to_string()
        };
    }
    // Rust's `{:e}` already gives the shortest round-trip digits, e.g. "-1.25e-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        positional(&digits, exp)
    } else {
        scientific(&digits, exp)
    };
    format!("{sign}{body}")
}

fn positional(digits: &str, exp: i32) -> String {
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{digits}{zeros}.0")
    } else {
        let (int_part, frac) = digits.split_at(int_len);
        format!("{int_part}.{frac}")
    }
}

fn scientific(digits: &str, exp: i32) -> String {
    let (first, rest) = digits.split_at(1.min(digits.len()));
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let exp_sign = if exp < 0 { '-' } else { '+' };
    format!("{first}{frac}e{exp_sign}{:02}", exp.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (1.5, "1.5"),
            (123.456, "123.456"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e22, "1.2345e+22"),
            (1e100, "1e+100"),
            (-2.5e-300, "-2.5e-300"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn dumps_matches_python() -> Result<(), serde_json::Error> {
        let v: Value = serde_json::from_str(
            r#"{"b": [1, 2.0, -3, true, null], "a": {"é": "x\"\\\n\t\u0001"}, "c": {}, "d": []}"#,
        )?;
        assert_eq!(
            dumps(&v),
            r#"{"b": [1, 2.0, -3, true, null], "a": {"é": "x\"\\\n\t\u0001"}, "c": {}, "d": []}"#
        );
        Ok(())
    }
}
