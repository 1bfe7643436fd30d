//! Logging and metrics set-up. Log lines are messages with dotted fields; tokens, passwords and
//! client addresses are never logged.

use std::io::IsTerminal;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only help a person at a terminal; in a file or a log collector they are noise
    // that breaks searches. NO_COLOR (no-color.org) turns them off at a terminal too.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The process-wide Prometheus recorder (the `metrics` facade has one global recorder, so every app
/// in a process, as in the test suite, shares it), with every metric of [`METRICS`] described and
/// present from the start: a dashboard or an alert on a counter that has not moved yet sees a 0,
/// not a missing series.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .expect("the bucket list is not empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            for metric in METRICS {
                metric.register();
            }
            handle
        })
        .clone()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// One metric Pulse exports: its name, type and help text, and the label sets it starts with.
pub struct Metric {
    pub name: &'static str,
    pub kind: MetricKind,
    pub help: &'static str,
    /// Series created at start-up, at zero.
    pub initial: Initial,
}

/// The series a metric starts with.
pub enum Initial {
    /// These label sets; a metric without labels has one, with none.
    Labels(&'static [&'static [(&'static str, &'static str)]]),
    /// One per job of the service registry (`services::JOBS`), labelled `job`.
    PerJob,
}

const NO_LABELS: Initial = Initial::Labels(&[&[]]);
const BY_STREAM_TRANSPORT: Initial =
    Initial::Labels(&[&[("transport", "sse")], &[("transport", "multipart")]]);

impl Metric {
    fn register(&self) {
        let (name, help) = (self.name, self.help);
        match self.kind {
            MetricKind::Counter => metrics::describe_counter!(name, help),
            MetricKind::Gauge => metrics::describe_gauge!(name, help),
            MetricKind::Histogram => metrics::describe_histogram!(name, help),
        }
        let label_sets: Vec<Vec<metrics::Label>> = match self.initial {
            Initial::Labels(sets) => sets
                .iter()
                .map(|labels| {
                    labels
                        .iter()
                        .map(|(key, value)| metrics::Label::new(*key, *value))
                        .collect()
                })
                .collect(),
            Initial::PerJob => crate::services::JOBS
                .iter()
                .map(|job| vec![metrics::Label::new("job", job.spec.name)])
                .collect(),
        };
        for labels in label_sets {
            match self.kind {
                MetricKind::Counter => metrics::counter!(name, labels).increment(0),
                MetricKind::Gauge => metrics::gauge!(name, labels).increment(0.0),
                MetricKind::Histogram => drop(metrics::histogram!(name, labels)),
            }
        }
    }
}

/// Every metric Pulse exports. A test reads the source and fails on a metric missing here.
pub const METRICS: &[Metric] = &[
    Metric {
        name: "pulse_graphql_requests_total",
        kind: MetricKind::Counter,
        help: "GraphQL operations answered, by operation name (`invalid`: never executed; `other`: past the label bound) and outcome",
        initial: Initial::Labels(&[&[("operation", "invalid"), ("outcome", "error")]]),
    },
    Metric {
        name: "pulse_graphql_request_duration_seconds",
        kind: MetricKind::Histogram,
        help: "Time to answer a GraphQL operation, by operation name and outcome",
        initial: Initial::Labels(&[&[("operation", "invalid"), ("outcome", "error")]]),
    },
    Metric {
        name: "pulse_graphql_validations_skipped_total",
        kind: MetricKind::Counter,
        help: "Requests whose document's earlier validation was reused: a document already accepted, with variables that cannot change the verdict",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_http_connections_open",
        kind: MetricKind::Gauge,
        help: "TCP connections open to the HTTP server",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_http_requests_in_flight",
        kind: MetricKind::Gauge,
        help: "HTTP requests being answered",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_job_processed_total",
        kind: MetricKind::Counter,
        help: "Job stream entries handled and acknowledged, by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_job_retried_total",
        kind: MetricKind::Counter,
        help: "Job batches retried after a transient failure, by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_job_failed_total",
        kind: MetricKind::Counter,
        help: "Job entries that failed (retried later or dead-lettered), by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_job_dead_lettered_total",
        kind: MetricKind::Counter,
        help: "Job entries moved to the dead letters after their last attempt, by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_job_pending",
        kind: MetricKind::Gauge,
        help: "Entries delivered to a worker and not yet acknowledged, by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_job_lag",
        kind: MetricKind::Gauge,
        help: "Entries in the stream not yet delivered to any worker, by job",
        initial: Initial::PerJob,
    },
    Metric {
        name: "pulse_view_rollbacks_total",
        kind: MetricKind::Counter,
        help: "View shards repaired after Redis came back older than SQL",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_view_rollback_dropped_views_total",
        kind: MetricKind::Counter,
        help: "Views counted in Redis but dropped by a rollback repair because SQL already had them",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_article_announcements_deferred_total",
        kind: MetricKind::Counter,
        help: "articlePublished announcements Redis could not take at publish time, left to the relay loop",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_article_announcements_late_total",
        kind: MetricKind::Counter,
        help: "articlePublished announcements made by the relay loop for publishes that could not make them",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_channels",
        kind: MetricKind::Gauge,
        help: "Redis pub/sub channels this process subscribes to for its live subscriptions",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_hub_subscriptions",
        kind: MetricKind::Gauge,
        help: "Local listeners of the pub/sub hub's channels (coalescing watchers, feed and publication subscriptions)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_messages_received_total",
        kind: MetricKind::Counter,
        help: "Pub/sub messages the hub received from Redis",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_messages_skipped_total",
        kind: MetricKind::Counter,
        help: "Pub/sub messages a local listener fell too far behind to receive",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_pubsub_reconnects_total",
        kind: MetricKind::Counter,
        help: "Times the hub's pub/sub connection was lost and made again (its channels subscribed again)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_replayed_total",
        kind: MetricKind::Counter,
        help: "Events a resumed subscription (feedItemAdded or articlePublished with `after`) sent from history before going live",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_resyncs_total",
        kind: MetricKind::Counter,
        help: "Resumed subscriptions ended with RESYNC_REQUIRED because their history no longer reaches the cursor",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_subscribers",
        kind: MetricKind::Gauge,
        help: "Live subscriptions served by a coalescing watcher, by kind (leaderboardChanged, articleStatsChanged)",
        initial: Initial::Labels(&[&[("kind", "article_stats")], &[("kind", "leaderboard")]]),
    },
    Metric {
        name: "pulse_live_watchers",
        kind: MetricKind::Gauge,
        help: "Subjects this process watches for coalesced subscription snapshots, by kind",
        initial: Initial::Labels(&[&[("kind", "article_stats")], &[("kind", "leaderboard")]]),
    },
    Metric {
        name: "pulse_live_snapshot_reads_total",
        kind: MetricKind::Counter,
        help: "Redis reads made to build coalesced subscription snapshots, by kind",
        initial: Initial::Labels(&[&[("kind", "article_stats")], &[("kind", "leaderboard")]]),
    },
    Metric {
        name: "pulse_live_announcements_coalesced_total",
        kind: MetricKind::Counter,
        help: "Change announcements folded into a snapshot read already due, by kind",
        initial: Initial::Labels(&[&[("kind", "article_stats")], &[("kind", "leaderboard")]]),
    },
    Metric {
        name: "pulse_live_snapshots_unchanged_total",
        kind: MetricKind::Counter,
        help: "Snapshot reads that found nothing new and sent nothing, by kind",
        initial: Initial::Labels(&[&[("kind", "article_stats")], &[("kind", "leaderboard")]]),
    },
    Metric {
        name: "pulse_live_sockets_open",
        kind: MetricKind::Gauge,
        help: "GraphQL websockets being served",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_operations",
        kind: MetricKind::Gauge,
        help: "Operations running on websockets, by subscription field (other: a field the server does not list, or several)",
        initial: Initial::Labels(&[
            &[("field", "articlePublished")],
            &[("field", "articleStatsChanged")],
            &[("field", "feedItemAdded")],
            &[("field", "leaderboardChanged")],
            &[("field", "other")],
        ]),
    },
    Metric {
        name: "pulse_live_detached_operations",
        kind: MetricKind::Gauge,
        help: "Websocket event operations whose source the server holds between events instead of a GraphQL execution (feed items)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_messages_sent_total",
        kind: MetricKind::Counter,
        help: "Messages written to websockets (protocol messages, pings and closes included)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_bytes_sent_total",
        kind: MetricKind::Counter,
        help: "Bytes of text messages written to websockets",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_queued_bytes",
        kind: MetricKind::Gauge,
        help: "Bytes of messages waiting for websockets that have not taken them yet (each socket at most PULSE_WS_SEND_BUDGET)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_snapshots_replaced_total",
        kind: MetricKind::Counter,
        help: "Unsent snapshots replaced by a newer one of the same subscription for a websocket that fell behind",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_slow_consumer_closes_total",
        kind: MetricKind::Counter,
        help: "Websockets closed (4413) for falling more than their send budget behind on a message that is not an event of a running operation",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_slow_consumer_resyncs_total",
        kind: MetricKind::Counter,
        help: "Websocket event streams ended with RESYNC_REQUIRED and the cursor to resume from, for falling more than their socket's send budget behind",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_ping_timeouts_total",
        kind: MetricKind::Counter,
        help: "Websockets closed (3008) for not answering a ping within PULSE_WS_PONG_TIMEOUT",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_groups",
        kind: MetricKind::Gauge,
        help: "Groups of identical websocket snapshot operations running, each one stream resolved and serialized once per result for all its sockets",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_group_payloads_total",
        kind: MetricKind::Counter,
        help: "Results serialized by groups: one per result of a group, however many sockets share it",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_group_deliveries_total",
        kind: MetricKind::Counter,
        help: "Serialized group results handed to the sockets of their members (a late joiner's last result included)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_live_streams_open",
        kind: MetricKind::Gauge,
        help: "Subscriptions served over HTTP responses, by transport (sse: graphql-sse streams of either mode, reserved ones included; multipart: Apollo's multipart subscriptions)",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_operations",
        kind: MetricKind::Gauge,
        help: "Operations running on HTTP streams, by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_messages_sent_total",
        kind: MetricKind::Counter,
        help: "Messages written to HTTP streams (events, parts, heartbeats), by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_bytes_sent_total",
        kind: MetricKind::Counter,
        help: "Bytes written to HTTP streams, by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_queued_bytes",
        kind: MetricKind::Gauge,
        help: "Bytes waiting for HTTP streams whose clients have not read them yet (each stream at most PULSE_WS_SEND_BUDGET), by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_snapshots_replaced_total",
        kind: MetricKind::Counter,
        help: "Unsent snapshots replaced by a newer one of the same subscription for an HTTP stream that fell behind, by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_slow_consumer_cuts_total",
        kind: MetricKind::Counter,
        help: "HTTP streams cut (their response broken off) for falling more than their send budget behind on a snapshot with no unsent one to replace, by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_live_stream_slow_consumer_resyncs_total",
        kind: MetricKind::Counter,
        help: "Event streams on HTTP streams ended with RESYNC_REQUIRED and the cursor to resume from, for falling more than their stream's send budget behind, by transport",
        initial: BY_STREAM_TRANSPORT,
    },
    Metric {
        name: "pulse_like_changes_total",
        kind: MetricKind::Counter,
        help: "Likes and unlikes that changed state, by action",
        initial: Initial::Labels(&[&[("action", "like")], &[("action", "unlike")]]),
    },
    Metric {
        name: "pulse_like_sql_loads_total",
        kind: MetricKind::Counter,
        help: "Like relations and counters read from SQL because Redis did not hold them, by what",
        initial: Initial::Labels(&[&[("what", "relation")], &[("what", "count")]]),
    },
    Metric {
        name: "pulse_like_events_archived_total",
        kind: MetricKind::Counter,
        help: "Like events written to the SQL archive",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_like_events_unchanged_total",
        kind: MetricKind::Counter,
        help: "Like events that changed nothing in SQL because Redis had lost state SQL holds",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_like_events_late_total",
        kind: MetricKind::Counter,
        help: "Like events archived after newer ones of their relation (a dead consumer's, taken over); they change nothing",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_featured_recomputes_total",
        kind: MetricKind::Counter,
        help: "Featured-comment lists recomputed from SQL under the refresh lease",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_featured_fallbacks_total",
        kind: MetricKind::Counter,
        help: "Featured-comment reads answered from SQL after waiting in vain for another process's recompute",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_votes_total",
        kind: MetricKind::Counter,
        help: "Ballots cast, by outcome (accepted, or rate_limited by a poll's rules)",
        initial: Initial::Labels(&[&[("outcome", "accepted")], &[("outcome", "rate_limited")]]),
    },
    Metric {
        name: "pulse_votes_archived_total",
        kind: MetricKind::Counter,
        help: "Vote events written to the SQL vote log",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_vote_board_reads_total",
        kind: MetricKind::Counter,
        help: "Leaderboard boards read from Redis (reads, standings and live snapshots)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_inbox_writes_total",
        kind: MetricKind::Counter,
        help: "Articles added to followers' inboxes by fan-out (active inboxes only)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_announcements_total",
        kind: MetricKind::Counter,
        help: "feedItemAdded announcements published for online followers",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_fanout_chunks_total",
        kind: MetricKind::Counter,
        help: "Fan-out jobs queued, one per chunk of an author's active followers",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_audience_left_total",
        kind: MetricKind::Counter,
        help: "Followers dropped from an author's audience by a delivery that found their inbox expired",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_celebrity_publishes_total",
        kind: MetricKind::Counter,
        help: "Articles by authors over the celebrity threshold, merged at read time instead of fanned out",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_relayed_total",
        kind: MetricKind::Counter,
        help: "Publications relayed from the SQL outbox to the fan-out stream",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_relay_deferred_total",
        kind: MetricKind::Counter,
        help: "Publications Redis could not take at once, left to the relay loop",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_rebuilds_total",
        kind: MetricKind::Counter,
        help: "Missing inboxes rebuilt by pull from the followees' outboxes",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_rebuilds_restarted_total",
        kind: MetricKind::Counter,
        help: "Inbox rebuilds started over because a follow or unfollow came during them",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_sql_reads_total",
        kind: MetricKind::Counter,
        help: "Feed pages read from SQL (past the cached window, or while an inbox is rebuilt)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_feed_vacuumed_keys_total",
        kind: MetricKind::Counter,
        help: "Feed keys removed by `pulse feed vacuum` (of deleted users, or left by crashed rebuilds)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_lag_seconds",
        kind: MetricKind::Gauge,
        help: "Age of the oldest search outbox row this process's replica has not applied (0: caught up)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_rows_applied_total",
        kind: MetricKind::Counter,
        help: "Search outbox rows applied to this process's replica",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_documents_written_total",
        kind: MetricKind::Counter,
        help: "Search documents written or removed (an article's rows of one batch are one write)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_documents_rewritten_total",
        kind: MetricKind::Counter,
        help: "Of the search documents written, those re-indexed because their text, author or dates changed (count changes rewrite none)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_rebuilds_total",
        kind: MetricKind::Counter,
        help: "Rebuilds of this process's search replica from SQL (new, requested, or behind the pruning)",
        initial: NO_LABELS,
    },
    Metric {
        name: "pulse_search_gaps_expired_total",
        kind: MetricKind::Counter,
        help: "Search outbox ids stepped over and never seen within the gap window (rolled back)",
        initial: NO_LABELS,
    },
];
