//! The ceiling: how many `record_view.lua` calls per second Redis itself sustains, measured with
//! `redis-benchmark` sending EVALSHA of the very script the server runs, on the server's key
//! format, from as many connections as the HTTP load has clients.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context as _, bail};
use pulse::actor::Identity;
use pulse::redis::{Keys, Scripts};
use pulse::views::buckets;

use crate::redis_util;

/// All ceiling calls view this article, so every key is in one shard (and one cluster slot).
const ARTICLE: i64 = 1;

pub struct CeilingPlan<'a> {
    pub redis_url: &'a str,
    pub clients: u32,
    pub requests: u64,
    /// `-r`: how many distinct viewers `__rand_int__` draws from.
    pub keyspace: u64,
    /// The dedup window the server uses (`PULSE_VIEW_WINDOW`, 1 h by default).
    pub window: Duration,
}

#[derive(Debug)]
pub struct Ceiling {
    pub calls_per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    /// Calls that counted a view (the script's slow path: 6 more commands than a duplicate).
    pub counted: u64,
    /// The command line, password redacted, quoted for a POSIX shell.
    pub command_line: String,
}

pub async fn measure(plan: CeilingPlan<'_>) -> anyhow::Result<Ceiling> {
    let (client, mut conn) = redis_util::connect(plan.redis_url).await?;
    let prefix = format!("pulse-bench-ceiling:{}:", crate::random_hex(12));
    let result = run(&plan, &client, &mut conn, &prefix).await;
    let cleaned = redis_util::delete_prefix(&mut conn, &prefix).await;
    let ceiling = result?;
    cleaned.context("cannot delete the ceiling's keys")?;
    Ok(ceiling)
}

async fn run(
    plan: &CeilingPlan<'_>,
    client: &redis::Client,
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> anyhow::Result<Ceiling> {
    let keys = Keys::new(prefix);
    let shard = keys.view_shard(ARTICLE);
    // The real seen key with the viewer's address swapped for redis-benchmark's placeholder
    // (a 12-digit number: as long as a typical 10.x.y.z address).
    let sample = Ipv4Addr::new(10, 0, 0, 1);
    let seen = shard.seen(ARTICLE, Identity::Address(IpAddr::V4(sample)));
    let seen = seen
        .strip_suffix(&sample.to_string())
        .with_context(|| format!("the seen key {seen} does not end with the viewer address"))?
        .to_owned()
        + "__rand_int__";

    let sha = Scripts::load()
        .record_view
        .load_async(conn)
        .await
        .context("SCRIPT LOAD record_view.lua")?;
    // Without a base count the script answers -1 and counts nothing (the server would read SQL).
    let () = redis::cmd("HSET")
        .arg(shard.base())
        .arg(ARTICLE)
        .arg(0)
        .query_async(conn)
        .await?;

    let now = chrono::Utc::now();
    let mut args = redis_util::benchmark_target_args(client.get_connection_info())?;
    args.extend([
        "-c".into(),
        plan.clients.to_string(),
        "-n".into(),
        plan.requests.to_string(),
        "-r".into(),
        plan.keyspace.to_string(),
        "--csv".into(),
        "EVALSHA".into(),
        sha,
        "6".into(),
        seen,
        shard.base(),
        shard.pending(),
        shard.rank_all_time(),
        shard.rank_bucket(&buckets::day(now, chrono_tz::UTC)),
        shard.rank_bucket(&buckets::week(now, chrono_tz::UTC)),
        ARTICLE.to_string(),
        plan.window.as_secs().max(1).to_string(),
        "1".into(),
        buckets::DAY_BUCKET_TTL.as_secs().to_string(),
        buckets::WEEK_BUCKET_TTL.as_secs().to_string(),
        String::new(),
        keys.article_stats_channel(ARTICLE),
    ]);
    let command_line = shell_line("redis-benchmark", &args);
    let output = tokio::process::Command::new("redis-benchmark")
        .args(&args)
        .output()
        .await
        .context("cannot run redis-benchmark (is it installed?)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "redis-benchmark failed ({}): {}{}",
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let (calls_per_second, p50_ms, p99_ms) = parse_csv(&stdout)
        .with_context(|| format!("cannot parse redis-benchmark's output: {stdout}"))?;

    let counted: Option<u64> = redis::cmd("HGET")
        .arg(shard.pending())
        .arg(ARTICLE)
        .query_async(conn)
        .await?;
    Ok(Ceiling {
        calls_per_second,
        p50_ms,
        p99_ms,
        requests: plan.requests,
        counted: counted.unwrap_or(0),
        command_line,
    })
}

/// `(rps, p50 ms, p99 ms)` from `--csv` output. The columns are `"test","rps","avg_latency_ms",
/// "min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"`; the
/// test name is the command line and may hold commas, so fields are counted from the end.
fn parse_csv(output: &str) -> Option<(f64, f64, f64)> {
    let line = output
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty() && !line.starts_with("\"test\""))?;
    let fields: Vec<f64> = line
        .rsplit(',')
        .take(7)
        .map(|field| field.trim().trim_matches('"').parse().ok())
        .collect::<Option<Vec<f64>>>()?;
    // Reversed: max, p99, p95, p50, min, avg, rps.
    match fields.as_slice() {
        [_max, p99, _p95, p50, _min, _avg, rps] => Some((*rps, *p50, *p99)),
        _ => None,
    }
}

/// `program args…` as one POSIX shell line, with the password after `-a` hidden.
fn shell_line(program: &str, args: &[String]) -> String {
    let mut words = vec![program.to_owned()];
    let mut hide_next = false;
    for arg in args {
        if hide_next {
            words.push("'***'".into());
            hide_next = false;
            continue;
        }
        hide_next = arg == "-a";
        let plain = !arg.is_empty()
            && arg
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:/=@%+,".contains(c));
        words.push(if plain {
            arg.clone()
        } else {
            format!("'{}'", arg.replace('\'', r"'\''"))
        });
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_are_counted_from_the_end() {
        let output = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                      \"EVALSHA abc 6 a,b {v:1} '' \",\"16129.03\",\"0.098\",\"0.016\",\"0.047\",\"0.095\",\"2.119\",\"8.343\"\n";
        assert_eq!(parse_csv(output), Some((16129.03, 0.047, 2.119)));
    }

    #[test]
    fn shell_lines_quote_what_needs_it() {
        let args = ["-a", "secret", "x:{v:1}:y", ""].map(String::from);
        assert_eq!(
            shell_line("redis-benchmark", &args),
            "redis-benchmark -a '***' 'x:{v:1}:y' ''"
        );
    }
}
