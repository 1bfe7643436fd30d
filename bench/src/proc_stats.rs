//! CPU time and memory of a process, from Linux's `/proc`.

use anyhow::{Context as _, bail};

/// Clock ticks per second of `/proc/<pid>/stat`'s times: `getconf CLK_TCK`, else the usual 100.
pub fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|ticks| *ticks > 0.0)
        .unwrap_or(100.0)
}

/// User plus system CPU time of `pid` so far, in clock ticks (`"self"` for this process).
pub fn cpu_ticks(pid: &str) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name (field 2) is in parentheses and may contain spaces: fields are counted
    // from the last ')'. The first field after it is field 3 (state); utime and stime are 14, 15.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("malformed /proc stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| -> anyhow::Result<u64> {
        fields
            .get(number - 3)
            .and_then(|value| value.parse().ok())
            .with_context(|| format!("{path} has no field {number}"))
    };
    Ok(field(14)? + field(15)?)
}

/// Resident and peak resident memory of `pid`, in bytes (`VmRSS`, `VmHWM`).
pub fn memory(pid: &str) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let kib = |name: &str| -> anyhow::Result<u64> {
        for line in status.lines() {
            if let Some(value) = line
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
            {
                let number = value.trim().trim_end_matches("kB").trim();
                return Ok(number.parse::<u64>()? * 1024);
            }
        }
        bail!("{path} has no {name}")
    };
    Ok((kib("VmRSS")?, kib("VmHWM")?))
}
