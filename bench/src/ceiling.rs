//! The ceiling: how many calls per second of a request's Lua script (`record_view.lua`,
//! `like_set.lua`) Redis itself sustains, measured with `redis-benchmark` sending EVALSHA of the
//! very script the server runs, on the server's key format, from as many connections as the HTTP
//! load has clients.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context as _, bail};
use pulse::actor::Identity;
use pulse::keys::LikeShardKeys;
use pulse::keys::{LikeKeys, ViewKeys, VoteKeys};
use pulse::likes::Subject;
use pulse::redis::Keys;
use pulse::scripts::SCRIPTS;
use pulse::views::buckets;

use crate::redis_util;

/// All ceiling calls view or like this article, so every key is in one shard (and one cluster
/// slot).
const ARTICLE: i64 = 1;

/// redis-benchmark's placeholder, replaced by a random number below `-r` in every call.
const RANDOM: &str = "__rand_int__";

pub struct CeilingPlan<'a> {
    pub redis_url: &'a str,
    pub clients: u32,
    pub requests: u64,
    /// `-r`: how many distinct viewers (likers) `__rand_int__` draws from.
    pub keyspace: u64,
    pub script: Script,
}

/// The script the ceiling calls, with the server's setting that shapes its work.
pub enum Script {
    /// `record_view.lua`, with the dedup window (`PULSE_VIEW_WINDOW`).
    RecordView { window: Duration },
    /// `like_set.lua` liking, with the relation cache's lifetime (`PULSE_LIKE_RELATION_TTL`). The
    /// relation comes as SQL's "not liked", so a call changes state unless a like by the same
    /// random user came before: with a keyspace far above the call count, nearly all do.
    LikeSet { relation_ttl: Duration },
    /// `vote_cast.lua`, one ballot for the poll's first option by a random voter, built by the
    /// server's own call builder; the poll keeps its buckets for `retention`.
    VoteCast {
        poll: Box<pulse::votes::config::PollConfig>,
        retention: Duration,
    },
}

/// One script's EVALSHA call as redis-benchmark sends it, and where its effect is counted.
struct Call {
    sha: String,
    /// `numkeys`, the keys and the arguments.
    args: Vec<String>,
    /// Reads how many calls did the work (views counted, likes changed, votes accepted).
    counted: redis::Cmd,
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
    let (target, mut conn) = redis_util::connect(plan.redis_url).await?;
    // Before any key is written: redis-benchmark needs one server (a cluster is refused).
    let server = redis_util::benchmark_target_args(&target)?;
    let prefix = format!("pulse-bench-ceiling:{}:", crate::random_hex(12));
    let result = run(&plan, server, &mut conn, &prefix).await;
    let cleaned = redis_util::delete_prefix(&mut conn, &prefix).await;
    let ceiling = result?;
    cleaned.context("cannot delete the ceiling's keys")?;
    Ok(ceiling)
}

async fn run(
    plan: &CeilingPlan<'_>,
    server: Vec<String>,
    conn: &mut pulse::redis::Link,
    prefix: &str,
) -> anyhow::Result<Ceiling> {
    let keys = Keys::new(prefix);
    let now = chrono::Utc::now();
    let call = match plan.script {
        Script::RecordView { window } => record_view_call(&keys, conn, window, now).await?,
        Script::LikeSet { relation_ttl } => like_set_call(&keys, conn, relation_ttl, now).await?,
        Script::VoteCast {
            ref poll,
            retention,
        } => vote_cast_call(&keys, conn, poll, retention, now).await?,
    };
    let mut args = server;
    args.extend([
        "-c".into(),
        plan.clients.to_string(),
        "-n".into(),
        plan.requests.to_string(),
        "-r".into(),
        plan.keyspace.to_string(),
        "--csv".into(),
        "EVALSHA".into(),
        call.sha,
    ]);
    args.extend(call.args);
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

    let counted: Option<u64> = call.counted.query_async(conn).await?;
    Ok(Ceiling {
        calls_per_second,
        p50_ms,
        p99_ms,
        requests: plan.requests,
        counted: counted.unwrap_or(0),
        command_line,
    })
}

async fn record_view_call(
    keys: &Keys,
    conn: &mut pulse::redis::Link,
    window: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Call> {
    let shard = keys.view_shard(ARTICLE);
    // The real seen key with the viewer's address swapped for redis-benchmark's placeholder
    // (a 12-digit number: as long as a typical 10.x.y.z address).
    let sample = Ipv4Addr::new(10, 0, 0, 1);
    let seen = randomized(
        &shard.seen(ARTICLE, Identity::Address(IpAddr::V4(sample))),
        &sample.to_string(),
    )?;
    let sha = load_script(&SCRIPTS.record_view, conn, "record_view.lua").await?;
    // Without a base count the script answers -1 and counts nothing (the server would read SQL).
    let () = redis::cmd("HSET")
        .arg(shard.base())
        .arg(ARTICLE)
        .arg(0)
        .query_async(conn)
        .await?;
    Ok(Call {
        sha,
        args: vec![
            "6".into(),
            seen,
            shard.base(),
            shard.pending(),
            shard.rank_all_time(),
            shard.rank_bucket(&buckets::day(now, chrono_tz::UTC)),
            shard.rank_bucket(&buckets::week(now, chrono_tz::UTC)),
            ARTICLE.to_string(),
            window.as_secs().max(1).to_string(),
            "1".into(),
            buckets::DAY_BUCKET_TTL.as_secs().to_string(),
            buckets::WEEK_BUCKET_TTL.as_secs().to_string(),
            String::new(),
            shard.article_stats_channel(ARTICLE),
            // The ceiling runs on one server, as the server's own calls there do.
            "PUBLISH".into(),
        ],
        counted: hget(shard.pending(), ARTICLE.to_string()),
    })
}

/// A like of article 1 by a random user, exactly as `LikeService` calls the script once it has
/// read SQL's relation ("not liked") and count (0); redis-benchmark draws a fresh random number
/// for every placeholder, so the relation key, its field and the event id are each random.
async fn like_set_call(
    keys: &Keys,
    conn: &mut pulse::redis::Link,
    relation_ttl: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Call> {
    let subject = Subject::Article(ARTICLE);
    let shard = keys.like_shard(subject.id());
    let sample_user = 7;
    let relation = randomized(&shard.relation(&subject.field(), sample_user), "7")?;
    let relation_field = randomized(
        &LikeShardKeys::relation_field(&subject.field(), sample_user),
        "7",
    )?;
    let stream = redis_util::like_archive_stream(keys, shard.shard());
    let sha = load_script(&SCRIPTS.like_set, conn, "like_set.lua").await?;
    let field = subject.field();
    Ok(Call {
        sha,
        args: vec![
            "11".into(),
            relation,
            shard.unarchived(),
            shard.base(),
            shard.base_versions(),
            shard.pending(),
            shard.seq(),
            stream,
            shard.rank_all_time(),
            shard.rank_bucket(&buckets::day(now, chrono_tz::UTC)),
            shard.rank_bucket(&buckets::week(now, chrono_tz::UTC)),
            shard.article_stats_versions(),
            "1".into(),
            field.clone(),
            relation_field,
            RANDOM.into(),
            RANDOM.into(),
            "0".into(),
            "0".into(),
            "0".into(),
            relation_ttl.as_secs().max(1).to_string(),
            now.timestamp_millis().to_string(),
            buckets::DAY_BUCKET_TTL.as_secs().to_string(),
            buckets::WEEK_BUCKET_TTL.as_secs().to_string(),
            subject.kind_code().to_string(),
            ARTICLE.to_string(),
            shard.article_stats_channel(ARTICLE),
            "PUBLISH".into(),
        ],
        counted: hget(shard.pending(), field),
    })
}

/// One ballot, exactly as `VoteService` calls the script, with the voter (and so its rate-limit
/// counters and participant entries) and the event id drawn at random for every call.
async fn vote_cast_call(
    keys: &Keys,
    conn: &mut pulse::redis::Link,
    poll: &pulse::votes::config::PollConfig,
    retention: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Call> {
    use pulse::votes::service::{Ballot, CastCall, Origin, vote_cast_call};
    let option = poll
        .options
        .first()
        .context("the ceiling's poll has no option")?;
    let ballots = [Ballot {
        poll: poll.id,
        option: option.id,
    }];
    let call = vote_cast_call(&CastCall {
        keys,
        config: poll,
        voter: RANDOM,
        ip: "127.0.0.1",
        ballots: &ballots,
        origin: &Origin::default(),
        now,
        retention,
        event_prefix: RANDOM,
        // The ceiling runs on one server only (redis-benchmark refuses a cluster).
        publish: "PUBLISH",
    });
    let sha = load_script(&pulse::votes::scripts::VOTE_CAST, conn, "vote_cast.lua").await?;
    let mut args = vec![call.keys.len().to_string()];
    args.extend(call.keys);
    args.extend(call.args);
    // The REAL all-time board counts one per accepted ballot.
    let mut counted = redis::cmd("ZSCORE");
    counted
        .arg(keys.poll(poll.id).board("r", "all"))
        .arg(option.id);
    Ok(Call { sha, args, counted })
}

fn hget(key: String, field: String) -> redis::Cmd {
    let mut cmd = redis::cmd("HGET");
    cmd.arg(key).arg(field);
    cmd
}

/// `key` with its trailing `sample` (a viewer, a user) swapped for redis-benchmark's placeholder.
fn randomized(key: &str, sample: &str) -> anyhow::Result<String> {
    key.strip_suffix(sample)
        .map(|stem| format!("{stem}{RANDOM}"))
        .with_context(|| format!("{key} does not end with {sample}"))
}

async fn load_script(
    script: &redis::Script,
    conn: &mut pulse::redis::Link,
    name: &str,
) -> anyhow::Result<String> {
    script
        .load_async(conn)
        .await
        .with_context(|| format!("SCRIPT LOAD {name}"))
}

/// `(rps, p50 ms, p99 ms)` from `--csv` output. The columns are `"test","rps","avg_latency_ms",
/// "min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"`; the
/// test name is the command line and may hold commas, so fields are counted from the end.
pub(crate) fn parse_csv(output: &str) -> Option<(f64, f64, f64)> {
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
pub(crate) fn shell_line(program: &str, args: &[String]) -> String {
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
    fn a_key_ending_in_its_sample_gets_the_placeholder() {
        assert_eq!(
            randomized("p:lr:{l:1}:a1:7", "7").unwrap(),
            "p:lr:{l:1}:a1:__rand_int__"
        );
        assert!(randomized("p:lr:{l:1}:a1:8", "7").is_err());
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
