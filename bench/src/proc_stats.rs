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
    let [rss, peak] = status_bytes(pid, ["VmRSS", "VmHWM"])?;
    Ok((rss, peak))
}

/// Resident anonymous memory of `pid` (`RssAnon`, in bytes): its heap and stacks, without the
/// pages of its binary and files, which the kernel maps in and drops as it likes.
pub fn anonymous_memory(pid: &str) -> anyhow::Result<u64> {
    let [anonymous] = status_bytes(pid, ["RssAnon"])?;
    Ok(anonymous)
}

/// Fields of `/proc/<pid>/status` given in kB, in bytes.
fn status_bytes<const N: usize>(pid: &str, names: [&str; N]) -> anyhow::Result<[u64; N]> {
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
    let mut bytes = [0; N];
    for (field, name) in bytes.iter_mut().zip(names) {
        *field = kib(name)?;
    }
    Ok(bytes)
}

/// CPU of the server, Redis and this tool over a measured phase, and the server's memory after it.
pub struct Cost {
    pub server_cpu_seconds: f64,
    pub redis_cpu_seconds: f64,
    pub bench_cpu_seconds: f64,
    pub rss: u64,
    pub peak_rss: u64,
}

/// Readings taken when a measured phase starts; [`CostMeter::stop`] turns them into a [`Cost`].
pub struct CostMeter {
    pid: String,
    server_ticks: u64,
    bench_ticks: u64,
    redis_seconds: f64,
}

impl CostMeter {
    pub async fn start(server_pid: u32, redis: &mut pulse::redis::Link) -> anyhow::Result<Self> {
        let pid = server_pid.to_string();
        Ok(Self {
            server_ticks: cpu_ticks(&pid)?,
            bench_ticks: cpu_ticks("self")?,
            redis_seconds: crate::redis_util::cpu_seconds(redis).await?,
            pid,
        })
    }

    pub async fn stop(self, redis: &mut pulse::redis::Link) -> anyhow::Result<Cost> {
        let ticks = clock_ticks_per_second();
        let server_ticks = cpu_ticks(&self.pid)?;
        let bench_ticks = cpu_ticks("self")?;
        let redis_seconds = crate::redis_util::cpu_seconds(redis).await?;
        let (rss, peak_rss) = memory(&self.pid)?;
        Ok(Cost {
            server_cpu_seconds: (server_ticks - self.server_ticks) as f64 / ticks,
            redis_cpu_seconds: redis_seconds - self.redis_seconds,
            bench_cpu_seconds: (bench_ticks - self.bench_ticks) as f64 / ticks,
            rss,
            peak_rss,
        })
    }
}

impl Cost {
    /// The report's rows, per 1,000 of `unit` (`views`, `toggles`) when `done` of them took
    /// `seconds`.
    pub fn rows(&self, unit: &str, done: u64, seconds: f64) -> Vec<(&'static str, String)> {
        let per_thousand = |cpu: f64| cpu / done.max(1) as f64 * 1000.0;
        let cpu_row = |cpu: f64| {
            format!(
                "{:.3} s per 1k {unit} ({:.2} cores busy)",
                per_thousand(cpu),
                cpu / seconds
            )
        };
        vec![
            ("server CPU", cpu_row(self.server_cpu_seconds)),
            (
                "server RSS",
                format!(
                    "{:.1} MiB after the load (peak {:.1} MiB)",
                    self.rss as f64 / crate::report::MIB,
                    self.peak_rss as f64 / crate::report::MIB
                ),
            ),
            ("redis CPU", cpu_row(self.redis_cpu_seconds)),
            ("bench client CPU", cpu_row(self.bench_cpu_seconds)),
        ]
    }

    /// The JSON report's fields, per 1,000 of `unit`.
    pub fn json(&self, unit: &str, done: u64) -> serde_json::Map<String, serde_json::Value> {
        let per_thousand = |cpu: f64| cpu / done.max(1) as f64 * 1000.0;
        let mut fields = serde_json::Map::new();
        for (who, cpu) in [
            ("server", self.server_cpu_seconds),
            ("redis", self.redis_cpu_seconds),
            ("bench", self.bench_cpu_seconds),
        ] {
            fields.insert(
                format!("{who}_cpu_s_per_1k_{unit}"),
                per_thousand(cpu).into(),
            );
        }
        fields.insert("server_rss_bytes".into(), self.rss.into());
        fields.insert("server_peak_rss_bytes".into(), self.peak_rss.into());
        fields
    }
}
