//! The Hugging Face extensions that real chat templates use, for minijinja:
//! `raise_exception(msg)`, `strftime_now(fmt)` and a `tojson` filter that writes what Python's
//! `json.dumps(x, ensure_ascii=False, indent=..., sort_keys=...)` writes (transformers
//! overrides Jinja's HTML-escaping `tojson` the same way). Python string methods come from
//! minijinja-contrib's pycompat callback.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// `raise_exception(message)`: fails the render with the template's own message.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time formatted like Python's `strftime`.
pub(crate) fn strftime_now(format: String) -> Result<String, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats UNIX time `secs` (UTC) with the common `strftime` directives.
pub(crate) fn strftime(format: &str, secs: i64) -> Result<String, Error> {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let piece = match spec {
            'Y' => y.to_string(),
            'y' => format!("{:02}", y.rem_euclid(100)),
            'm' => format!("{m:02}"),
            'd' => format!("{d:02}"),
            'e' => format!("{d:>2}"),
            'B' => MONTHS[m as usize - 1].to_owned(),
            'b' | 'h' => MONTHS[m as usize - 1][..3].to_owned(),
            'A' => DAYS[weekday].to_owned(),
            'a' => DAYS[weekday][..3].to_owned(),
            'u' => (weekday + 1).to_string(),
            'w' => ((weekday + 1) % 7).to_string(),
            'j' => format!("{yday:03}"),
            'H' => format!("{hh:02}"),
            'I' => format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            'p' => (if hh < 12 { "AM" } else { "PM" }).to_owned(),
            'M' => format!("{mm:02}"),
            'S' => format!("{ss:02}"),
            'F' => format!("{y}-{m:02}-{d:02}"),
            'T' => format!("{hh:02}:{mm:02}:{ss:02}"),
            'Z' => "UTC".to_owned(),
            'z' => "+0000".to_owned(),
            '%' => "%".to_owned(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The widest `tojson` indent accepted: wider ones only serve to blow up the output.
const MAX_INDENT: usize = 64;

/// The `tojson` filter with Python `json.dumps` formatting.
pub(crate) fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(v.as_usize().filter(|&n| n <= MAX_INDENT).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: indent must be an integer from 0 to {MAX_INDENT}"),
            )
        })?),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let opts = JsonOpts {
        indent,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn newline(out: &mut String, opts: &JsonOpts, level: usize) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write_json(out: &mut String, v: &Value, opts: &JsonOpts, level: usize) -> Result<(), Error> {
    if level > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    let item_sep = if opts.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&py_float(f));
            }
        }
        ValueKind::String | ValueKind::Plain => write_str(out, &v.to_string(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, opts, level + 1);
                write_json(out, item, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, opts, level + 1);
                let key = match k.as_str() {
                    Some(s) => s.to_owned(),
                    None => k.to_string(),
                };
                write_str(out, &key, opts.ensure_ascii);
                out.push_str(": ");
                write_json(out, &v.get_item(k)?, opts, level + 1)?;
            }
            newline(out, opts, level);
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of kind {:?}", v.kind()),
            ))
        }
    }
    Ok(())
}

/// A float as Python's `repr` writes it.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Python: shortest digits, exponent with a sign and at least two digits.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The widest `indent` accepted (Jinja's `indent` filter, otherwise as minijinja has it).
const MAX_INDENT_WIDTH: usize = 256;

/// Jinja's `indent(width=4, first=false, blank=false)`, refusing widths that only serve to
/// blow up memory (minijinja's own builds `width` spaces first, whatever the width).
pub(crate) fn indent(
    value: String,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kwargs.get::<Option<Value>>("width")?,
    };
    // An integer is a number of spaces; a string is the indentation itself.
    let prefix = match width {
        None => "    ".to_string(),
        Some(w) if w.as_str().is_some() => w.as_str().unwrap_or_default().to_string(),
        Some(w) => " ".repeat(
            w.as_usize()
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "indent: width must be a non-negative integer or a string",
                    )
                })?
                .min(MAX_INDENT_WIDTH + 1),
        ),
    };
    if prefix.len() > MAX_INDENT_WIDTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("indent: width must be at most {MAX_INDENT_WIDTH}"),
        ));
    }
    let first = match first {
        Some(f) => f,
        None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
    };
    let blank = match blank {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    fn strip_newline(s: &str) -> &str {
        let s = s.strip_suffix('\n').unwrap_or(s);
        s.strip_suffix('\r').unwrap_or(s)
    }
    let mut lines = strip_newline(&value).split('\n');
    let mut out = String::new();
    if !first {
        out.push_str(lines.next().unwrap_or_default());
        out.push('\n');
    }
    for line in lines {
        if !line.is_empty() || blank {
            out.push_str(&prefix);
        }
        out.push_str(line);
        out.push('\n');
    }
    out.truncate(strip_newline(&out).len());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // 2024-07-23 13:05:09 UTC, a Tuesday, day 205.
        let t = 1_721_739_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "23 Jul 2024");
        assert_eq!(
            strftime("%A %B %e %j %H:%M:%S %I%p %%", t).unwrap(),
            "Tuesday July 23 205 13:05:09 01PM %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert!(strftime("%Q", t).is_err());
    }

    #[test]
    fn py_floats() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(1e20), "1e+20");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(-3.25), "-3.25");
    }
}
