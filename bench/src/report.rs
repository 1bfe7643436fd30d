//! Plain-text result tables.

/// Prints `title` and then one aligned `metric | value` row per entry.
pub fn print_table(title: &str, rows: &[(&str, String)]) {
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .flat_map(|(_, value)| value.lines())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let rule = format!("+-{}-+-{}-+", "-".repeat(width), "-".repeat(value_width));
    println!("{title}");
    println!("{rule}");
    for (name, value) in rows {
        for (index, line) in value.lines().enumerate() {
            let name = if index == 0 { *name } else { "" };
            println!("| {name:<width$} | {line:<value_width$} |");
        }
    }
    println!("{rule}");
}

/// `12345.6` as `12,346`.
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < 0.0 && digits != "0" {
        grouped.insert(0, '-');
    }
    grouped
}

pub const MIB: f64 = 1024.0 * 1024.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(thousands(-12345.0), "-12,345");
    }
}
