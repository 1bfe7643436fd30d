//! `dedup-memory`: what one dedup marker costs Redis. The record-view script keeps one
//! `SET <seen key> 1 NX EX <window>` per viewer per article per window; this writes `n` of them on
//! the server's own key format and reads `used_memory` before and after.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use pulse::actor::Identity;
use pulse::redis::Keys;
use pulse::redis::Link;
use serde_json::json;

use crate::load::viewer_ip;
use crate::report::{print_table, thousands};
use crate::{DedupMemoryArgs, redis_util};
use pulse::keys::ViewKeys;

const SMOKE_ENTRIES: u32 = 10_000;
/// The markers are spread over this many articles (ids 1..=100, so over every shard).
const ARTICLES: u32 = 100;
/// The reference figure the result is compared with: about 108 bytes for a plain key.
const ANCHOR_BYTES: f64 = 108.0;

struct Measured {
    entries: u64,
    used_before: f64,
    used_after: f64,
    dbsize_delta: i64,
    key_len_min: usize,
    key_len_max: usize,
    key_len_avg: f64,
    sample_key: String,
    sample_memory_usage: Option<u64>,
}

pub async fn run(args: DedupMemoryArgs) -> anyhow::Result<()> {
    let entries = if args.common.smoke {
        SMOKE_ENTRIES
    } else {
        args.entries
    };
    let mut conn = redis_util::connect_for_memory(&args.common.redis_url, "dedup-memory").await?;
    let prefix = redis_util::fresh_prefix(&mut conn).await?;
    let window = pulse::Config::defaults().view_window;
    let result = measure(&mut conn, &prefix, entries, window).await;
    let deleted = redis_util::delete_prefix(&mut conn, &prefix).await;
    let measured = result?;
    let deleted = deleted.context("cannot delete the dedup markers")?;

    let per_entry = (measured.used_after - measured.used_before) / measured.entries as f64;
    let mut rows = vec![
        ("entries", thousands(measured.entries as f64)),
        (
            "key length (bytes)",
            format!(
                "{:.1} avg ({}..{}), e.g. {}",
                measured.key_len_avg,
                measured.key_len_min,
                measured.key_len_max,
                measured.sample_key
            ),
        ),
        (
            "used_memory before/after",
            format!(
                "{} / {} bytes",
                thousands(measured.used_before),
                thousands(measured.used_after)
            ),
        ),
        ("bytes per entry", format!("{per_entry:.1}")),
        (
            "vs anchor",
            format!(
                "{:.2}x the ~{ANCHOR_BYTES:.0} bytes anchor for a plain key",
                per_entry / ANCHOR_BYTES
            ),
        ),
        (
            "MEMORY USAGE (one key)",
            measured
                .sample_memory_usage
                .map_or("n/a".into(), |bytes| format!("{bytes} bytes")),
        ),
        ("keys deleted afterwards", thousands(deleted as f64)),
    ];
    if measured.dbsize_delta != measured.entries as i64 {
        rows.push((
            "warning",
            format!(
                "DBSIZE grew by {} instead of {}: other clients wrote to this Redis meanwhile, \
                 so the figure is noisy",
                measured.dbsize_delta, measured.entries
            ),
        ));
    }
    print_table(
        &format!(
            "pulse-bench dedup-memory: {} seen markers (SET NX EX {}) over {ARTICLES} articles on {}",
            thousands(measured.entries as f64),
            window.as_secs(),
            redis_util::redacted(&args.common.redis_url)
        ),
        &rows,
    );
    if args.common.json {
        let report = json!({
            "scenario": "dedup-memory",
            "entries": measured.entries,
            "used_memory_before": measured.used_before,
            "used_memory_after": measured.used_after,
            "bytes_per_entry": per_entry,
            "anchor_bytes": ANCHOR_BYTES,
            "key_len_avg": measured.key_len_avg,
            "key_len_min": measured.key_len_min,
            "key_len_max": measured.key_len_max,
            "sample_key": measured.sample_key,
            "memory_usage_sample_key": measured.sample_memory_usage,
            "dbsize_delta": measured.dbsize_delta,
        });
        println!("{report}");
    }
    Ok(())
}

async fn measure(
    conn: &mut Link,
    prefix: &str,
    entries: u32,
    window: Duration,
) -> anyhow::Result<Measured> {
    let keys = Keys::new(prefix);
    let dbsize_before: i64 = redis::cmd("DBSIZE").query_async(conn).await?;
    let used_before = redis_util::info_field(conn, "memory", "used_memory").await?;

    let (mut len_min, mut len_max, mut len_sum) = (usize::MAX, 0, 0u64);
    let mut sample_key = String::new();
    let mut batch = redis_util::Batcher::new(conn);
    for index in 0..entries {
        let article = i64::from(index % ARTICLES + 1);
        let viewer = Identity::Address(IpAddr::V4(viewer_ip(index)));
        let key = keys.view_shard(article).seen(article, viewer);
        len_min = len_min.min(key.len());
        len_max = len_max.max(key.len());
        len_sum += key.len() as u64;
        let mut set = redis::cmd("SET");
        set.arg(&key)
            .arg(1)
            .arg("NX")
            .arg("EX")
            .arg(window.as_secs().max(1));
        batch.push(set).await?;
        if sample_key.is_empty() {
            sample_key = key;
        }
    }
    batch.flush().await?;

    let used_after = redis_util::settled_used_memory(conn).await?;
    let dbsize_after: i64 = redis::cmd("DBSIZE").query_async(conn).await?;
    let sample_memory_usage: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&sample_key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .ok()
        .flatten();
    Ok(Measured {
        entries: u64::from(entries),
        used_before,
        used_after,
        dbsize_delta: dbsize_after - dbsize_before,
        key_len_min: len_min,
        key_len_max: len_max,
        key_len_avg: len_sum as f64 / f64::from(entries),
        sample_key,
        sample_memory_usage,
    })
}
