//! Schema extensions: error codes on every error, and per-operation metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextParseQuery, NextRequest,
    NextSubscribe,
};
use async_graphql::parser::types::ExecutableDocument;
use async_graphql::{Response, ServerError, ServerResult, Variables};
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use metrics::{Counter, Histogram};

/// Errors raised by our resolvers carry a code already. Those without one come from async-graphql
/// itself: a document that does not parse, does not validate, is too deep or too complex, or names
/// an operation it does not contain. All of those are the client's to fix.
pub struct ErrorCodes;

const CLIENT_QUERY_ERROR: &str = "BAD_USER_INPUT";

fn with_codes(mut response: Response) -> Response {
    response.errors.iter_mut().for_each(ensure_code);
    response
}

fn ensure_code(error: &mut ServerError) {
    let extensions = error.extensions.get_or_insert_with(Default::default);
    if extensions.get("code").is_none() {
        extensions.set("code", CLIENT_QUERY_ERROR);
    }
}

impl ExtensionFactory for ErrorCodes {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(ErrorCodes)
    }
}

#[async_trait::async_trait]
impl Extension for ErrorCodes {
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        with_codes(next.run(ctx).await)
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        next.run(ctx, stream).map(with_codes).boxed()
    }
}

/// Distinct operation names kept as metric labels; names past this share the label `other`, so
/// clients cannot grow the metrics without bound by inventing names.
const MAX_OPERATION_LABELS: usize = 200;

/// The registered series of one operation label, looked up once per label rather than per request.
struct OperationSeries {
    ok: (Counter, Histogram),
    error: (Counter, Histogram),
}

impl OperationSeries {
    fn new(operation: &str) -> Self {
        let series = |outcome: &'static str| {
            let labels = [
                ("operation", operation.to_owned()),
                ("outcome", outcome.to_owned()),
            ];
            (
                metrics::counter!("pulse_graphql_requests_total", &labels),
                metrics::histogram!("pulse_graphql_request_duration_seconds", &labels),
            )
        };
        Self {
            ok: series("ok"),
            error: series("error"),
        }
    }
}

/// Request count and latency by operation name and outcome.
#[derive(Default)]
pub struct OperationMetrics {
    series: Arc<Mutex<HashMap<String, Arc<OperationSeries>>>>,
}

impl OperationMetrics {
    fn series_for(&self, name: &str) -> Arc<OperationSeries> {
        let mut series = self.series.lock().expect("metrics lock poisoned");
        if let Some(found) = series.get(name) {
            return found.clone();
        }
        let label = if series.len() < MAX_OPERATION_LABELS {
            name
        } else {
            "other"
        };
        series
            .entry(label.to_owned())
            .or_insert_with(|| Arc::new(OperationSeries::new(label)))
            .clone()
    }
}

impl ExtensionFactory for OperationMetrics {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(OperationMetricsExtension {
            metrics: OperationMetrics {
                series: self.series.clone(),
            },
            operation: Mutex::new(None),
        })
    }
}

struct OperationMetricsExtension {
    metrics: OperationMetrics,
    operation: Mutex<Option<Arc<OperationSeries>>>,
}

#[async_trait::async_trait]
impl Extension for OperationMetricsExtension {
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        let started = Instant::now();
        let response = next.run(ctx).await;
        let executed = self.operation.lock().expect("metrics lock poisoned").take();
        // A document that never executed (it did not parse or validate) is labelled `invalid`.
        let series = executed.unwrap_or_else(|| self.metrics.series_for("invalid"));
        let (count, latency) = if response.errors.is_empty() {
            &series.ok
        } else {
            &series.error
        };
        count.increment(1);
        latency.record(started.elapsed().as_secs_f64());
        response
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        let series = self
            .metrics
            .series_for(operation_name.unwrap_or("anonymous"));
        *self.operation.lock().expect("metrics lock poisoned") = Some(series);
        next.run(ctx, operation_name).await
    }
}

/// Documents kept parsed; past this the cache starts over (the operations in use come back at once).
const MAX_CACHED_DOCUMENTS: usize = 512;
/// Longer documents are parsed every time, so the cache's memory stays bounded.
const MAX_CACHED_QUERY_BYTES: usize = 8 * 1024;

/// Parsed documents by query text. Clients send the same few operations again and again, and
/// parsing was about a tenth of the CPU of a `recordView` request; cloning a parsed document costs a
/// fraction of that. Only documents that parsed are kept; validation still runs on every request.
#[derive(Default)]
pub struct DocumentCache {
    documents: Arc<Mutex<HashMap<String, ExecutableDocument>>>,
}

impl ExtensionFactory for DocumentCache {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(DocumentCache {
            documents: self.documents.clone(),
        })
    }
}

#[async_trait::async_trait]
impl Extension for DocumentCache {
    async fn parse_query(
        &self,
        ctx: &ExtensionContext<'_>,
        query: &str,
        variables: &Variables,
        next: NextParseQuery<'_>,
    ) -> ServerResult<ExecutableDocument> {
        if query.len() > MAX_CACHED_QUERY_BYTES {
            return next.run(ctx, query, variables).await;
        }
        if let Some(document) = self
            .documents
            .lock()
            .expect("cache lock poisoned")
            .get(query)
        {
            return Ok(document.clone());
        }
        let document = next.run(ctx, query, variables).await?;
        let mut documents = self.documents.lock().expect("cache lock poisoned");
        if documents.len() >= MAX_CACHED_DOCUMENTS {
            documents.clear();
        }
        documents.insert(query.to_owned(), document.clone());
        Ok(document)
    }
}
