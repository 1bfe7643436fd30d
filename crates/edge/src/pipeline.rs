//! The request pipeline, one async-graphql extension for any schema: error codes on every error,
//! the query limits, per-operation metrics, persisted documents, the document guard with the
//! parsed-document cache, and the response order.
//!
//! Errors raised here carry their code in `extensions.code`: `BAD_USER_INPUT` for a document or
//! variables the client must fix (and for any error async-graphql raised without a code),
//! `METHOD_NOT_ALLOWED` for a mutation over GET, `WEBSOCKET_REQUIRED` for a subscription over
//! HTTP answered in JSON (one carried by a stream, [`crate::media::Streamed`], runs), and the
//! persisted documents' own (see [`crate::persisted`]). The metrics are
//! `pulse_graphql_requests_total` and `pulse_graphql_request_duration_seconds`, labelled by
//! `operation` and `outcome`.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextExecute, NextPrepareRequest, NextRequest,
    NextSubscribe, NextValidation,
};
use async_graphql::parser::types::{ExecutableDocument, OperationType};
use async_graphql::{Request, Response, ServerError, ServerResult, ValidationResult};
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use metrics::{Counter, Histogram};

use crate::guard;
use crate::media::{HttpMethod, METHOD_NOT_ALLOWED, Streamed};
use crate::order::{self, SchemaTypes};
use crate::persisted::{DocumentStore, PersistedDocuments};
use crate::validated::{Validation, ValidationTally};

/// The code of errors async-graphql raised on a request of the client's, and of the client's
/// mistakes this pipeline refuses.
pub(crate) const CLIENT_QUERY_ERROR: &str = "BAD_USER_INPUT";
/// The code of a subscription sent over HTTP.
const WEBSOCKET_REQUIRED: &str = "WEBSOCKET_REQUIRED";

/// Longest error message sent to a client. Messages that echo client text (an operation or fragment
/// name, a value) are cut here, so a request cannot have its own bulk sent back.
pub const MAX_MESSAGE_BYTES: usize = 512;

/// Cuts `message` to at most [`MAX_MESSAGE_BYTES`] (on a character boundary), marking the cut.
pub fn shorten_message(message: &mut String) {
    if message.len() <= MAX_MESSAGE_BYTES {
        return;
    }
    let mut cut = MAX_MESSAGE_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message.truncate(cut);
    message.push('…');
}

/// Errors sent per response; one more error says how many were left out.
const MAX_ERRORS: usize = 20;

/// Errors raised by the schema's resolvers carry a code already. Those without one come from async-graphql
/// itself: a document that does not parse, does not validate, is too deep or too complex, or names
/// an operation it does not contain. All of those are the client's to fix.
///
/// A response also carries at most [`MAX_ERRORS`] errors, with messages cut to a bounded length: a
/// document can fail validation once per token (5,000 duplicate directives made a 1.3 MB answer),
/// and messages echo names and values the client sent.
fn with_codes(mut response: Response) -> Response {
    if response.errors.len() > MAX_ERRORS {
        let mut omitted = response.errors.split_off(MAX_ERRORS);
        ensure_code(&mut omitted[0]);
        response
            .errors
            .push(omitted_errors(&omitted[0], omitted.len()));
    }
    for error in &mut response.errors {
        ensure_code(error);
        shorten_message(&mut error.message);
    }
    response
}

/// The error standing for those past the cap. It carries the code of the first one left out, so a
/// client that acts on codes sees no code outside the documented set.
fn omitted_errors(first: &ServerError, omitted: usize) -> ServerError {
    let mut error = ServerError::new(format!("{omitted} more errors omitted"), None);
    let extensions = error.extensions.get_or_insert_with(Default::default);
    if let Some(code) = first.extensions.as_ref().and_then(|ext| ext.get("code")) {
        extensions.set("code", code.clone());
    }
    extensions.set("omitted", omitted);
    error
}

fn ensure_code(error: &mut ServerError) {
    let extensions = error.extensions.get_or_insert_with(Default::default);
    if extensions.get("code").is_none() {
        extensions.set("code", CLIENT_QUERY_ERROR);
    }
}

/// Distinct operation names kept as metric labels; names past this share the label `other`, so
/// clients cannot grow the metrics without bound by inventing names.
const MAX_OPERATION_LABELS: usize = 200;
/// Longest operation name kept as a label. Longer names share the label `other` too: every scrape
/// repeats a label once per series and bucket, so 200 names of 250 KB made each scrape 1.7 GB.
const MAX_OPERATION_LABEL_BYTES: usize = 64;

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
#[derive(Clone, Default)]
pub struct OperationMetrics {
    series: Arc<Mutex<HashMap<String, Arc<OperationSeries>>>>,
}

impl OperationMetrics {
    fn series_for(&self, name: &str) -> Arc<OperationSeries> {
        let mut series = self.series.lock().expect("metrics lock poisoned");
        if let Some(found) = series.get(name) {
            return found.clone();
        }
        let label =
            if series.len() < MAX_OPERATION_LABELS && name.len() <= MAX_OPERATION_LABEL_BYTES {
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

/// One request's metrics: the operation's series, known once it executes.
struct OperationMetricsStage {
    metrics: OperationMetrics,
    operation: Mutex<Option<Arc<OperationSeries>>>,
}

impl OperationMetricsStage {
    fn executing(&self, operation_name: Option<&str>) {
        let series = self
            .metrics
            .series_for(operation_name.unwrap_or("anonymous"));
        *self.operation.lock().expect("metrics lock poisoned") = Some(series);
    }

    fn record(&self, started: Instant, response: &Response) {
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
    }
}

/// Documents kept parsed; past this the cache starts over (the operations in use come back at once).
const MAX_CACHED_DOCUMENTS: usize = 512;
/// Longer documents are parsed every time, so the cache's memory stays bounded.
const MAX_CACHED_QUERY_BYTES: usize = 8 * 1024;

/// Refuses, with `BAD_USER_INPUT`, documents nested too deep to parse safely and documents too
/// large once their fragments are spread (see [`guard`]), and keeps the documents that passed
/// parsed, by query text. It refuses operations the transport cannot carry (a mutation over GET, a
/// subscription over HTTP), and puts every response's fields in selection order (see [`order`]).
///
/// It runs when the request is prepared, not in `parse_query`: the nesting scan must come before any
/// parse, and the expansion check before async-graphql's own post-parse checks, which run inside
/// `parse_query` and, like validation, walk every spread as if the fragment were written out.
///
/// The cache: clients send the same few operations again and again, and parsing was about a tenth
/// of the CPU of a `recordView` request; cloning a parsed document costs a fraction of that. Neither
/// check depends on the variables, so a cached document, which passed both, is not checked again.
/// async-graphql's own checks still run on every request, and its validation wherever the
/// variables could change its verdict (see [`crate::validated`]).
#[derive(Clone)]
pub struct DocumentGuard {
    /// Nodes the operations of one document may select once spreads are expanded.
    max_expanded: usize,
    types: Arc<SchemaTypes>,
    documents: Arc<Mutex<HashMap<String, Arc<GuardedDocument>>>>,
    validations: Arc<ValidationTally>,
}

/// A document that passed the guard, with what its validation may be reused for.
struct GuardedDocument {
    document: Arc<ExecutableDocument>,
    validation: Validation,
}

impl DocumentGuard {
    /// Allows a few times the complexity limit, which counts every field of a query at least once:
    /// queries that pass validation fit with room for their arguments and directives, and
    /// validating what fits stays cheap.
    pub fn new(
        max_complexity: usize,
        types: Arc<SchemaTypes>,
        validations: Arc<ValidationTally>,
    ) -> Self {
        Self {
            max_expanded: max_complexity.saturating_mul(4),
            types,
            documents: Arc::default(),
            validations,
        }
    }

    fn cached(&self, query: &str) -> Option<Arc<GuardedDocument>> {
        let documents = self.documents.lock().expect("cache lock poisoned");
        documents.get(query).cloned()
    }

    fn keep(&self, query: &str, document: &Arc<GuardedDocument>) {
        if query.len() > MAX_CACHED_QUERY_BYTES {
            return;
        }
        let mut documents = self.documents.lock().expect("cache lock poisoned");
        if documents.len() >= MAX_CACHED_DOCUMENTS {
            documents.clear();
        }
        documents.insert(query.to_owned(), document.clone());
    }

    /// The request's document, checked, probed for the response order, and kept.
    fn document(&self, request: &mut Request) -> ServerResult<Arc<GuardedDocument>> {
        if let Some(document) = self.cached(&request.query) {
            return Ok(document);
        }
        guard::check_nesting(&request.query).map_err(refused)?;
        let mut document = async_graphql::parser::parse_query(&request.query)?;
        guard::check_expansion(&document, self.max_expanded).map_err(refused)?;
        order::add_type_probes(&self.types, &mut document);
        let document = Arc::new(GuardedDocument {
            validation: Validation::of(&document),
            document: Arc::new(document),
        });
        self.keep(&request.query, &document);
        Ok(document)
    }
}

type Executed = (Arc<ExecutableDocument>, Option<String>);

fn in_selection_order(
    types: &SchemaTypes,
    executed: &Mutex<Option<Executed>>,
    mut response: Response,
) -> Response {
    let executed = executed.lock().expect("document lock poisoned");
    if let Some((document, operation)) = executed.as_ref() {
        order::order_response(types, document, operation.as_deref(), &mut response.data);
    }
    response
}

/// A document refused as a whole: no position in it is to blame.
fn refused(refusal: guard::Refusal) -> ServerError {
    whole_request(refusal.to_string(), CLIENT_QUERY_ERROR)
}

/// An error of the request as a whole, with no position to blame, and its code.
fn whole_request(message: impl Into<String>, code: &str) -> ServerError {
    let mut error = ServerError::new(message, None);
    error
        .extensions
        .get_or_insert_with(Default::default)
        .set("code", code);
    error
}

/// A mutation over GET, or a subscription over HTTP at all: the transport cannot carry it.
fn check_transport(
    request: &Request,
    document: &ExecutableDocument,
    websocket_url: &str,
) -> ServerResult<()> {
    let method = request
        .data
        .get(&TypeId::of::<HttpMethod>())
        .and_then(|method| method.downcast_ref::<HttpMethod>());
    let Some(method) = method else {
        return Ok(());
    };
    let Some(operation) = order::operation(document, request.operation_name.as_deref()) else {
        return Ok(());
    };
    let streamed = request.data.contains_key(&TypeId::of::<Streamed>());
    match (method, operation.node.ty) {
        (_, OperationType::Subscription) if streamed => Ok(()),
        (_, OperationType::Subscription) => Err(whole_request(
            format!(
                "subscriptions are served over a websocket at {websocket_url} (subprotocol graphql-transport-ws or graphql-ws), or over HTTP to a client that accepts `text/event-stream` or `multipart/mixed;subscriptionSpec=\"1.0\"`"
            ),
            WEBSOCKET_REQUIRED,
        )),
        (HttpMethod::Get, OperationType::Mutation) => Err(whole_request(
            "a mutation cannot be sent with GET; send it with POST",
            METHOD_NOT_ALLOWED,
        )),
        _ => Ok(()),
    }
}

/// A variable the operation declares non-null that the request leaves out (with no default) or
/// sends as null. The spec refuses such a request before it runs, naming the variable; async-graphql
/// runs it, and the first field reading the variable fails with "Variable id is not defined",
/// which misleads about a variable the document does declare.
fn unprovided_variable(document: &ExecutableDocument, request: &Request) -> Option<ServerError> {
    let operation = order::operation(document, request.operation_name.as_deref())?;
    operation
        .node
        .variable_definitions
        .iter()
        .find_map(|definition| {
            let variable = &definition.node;
            let value = request.variables.get(&variable.name.node);
            let message = match value {
                _ if variable.var_type.node.nullable => return None,
                None if variable.default_value.is_some() => return None,
                None => "was not provided",
                Some(async_graphql::Value::Null) => "must not be null",
                Some(_) => return None,
            };
            let mut error = whole_request(
                format!(
                    "Variable \"${}\" of required type \"{}\" {message}.",
                    variable.name.node, variable.var_type.node
                ),
                CLIENT_QUERY_ERROR,
            );
            error.locations = vec![definition.pos];
            Some(error)
        })
}

impl RequestStages {
    /// async-graphql's validation, or the verdict a cached document keeps, within the limits.
    async fn validate(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let reusable = self
            .reusable_validation
            .lock()
            .expect("validation lock poisoned")
            .take();
        let Some(guarded) = reusable else {
            return self.limits.check(next.run(ctx).await?);
        };
        if let Some(accepted) = guarded.validation.accepted() {
            self.guard.validations.count_skip();
            return self.limits.check(accepted);
        }
        let measured = next.run(ctx).await?;
        guarded.validation.accept(measured);
        self.limits.check(measured)
    }
}

/// The depth and complexity limits, checked on what validation measured so that a refusal names
/// the value it found and the limit it broke (async-graphql's own checks say only "too complex").
#[derive(Clone, Copy)]
pub struct QueryLimitsCheck {
    pub max_depth: usize,
    pub max_complexity: usize,
}

impl QueryLimitsCheck {
    fn check(&self, measured: ValidationResult) -> Result<ValidationResult, Vec<ServerError>> {
        let over = |what: &str, found: usize, limit: usize| {
            let message = format!("query {what} {found} exceeds the limit of {limit}");
            vec![whole_request(message, CLIENT_QUERY_ERROR)]
        };
        if measured.depth > self.max_depth {
            return Err(over("depth", measured.depth, self.max_depth));
        }
        if measured.complexity > self.max_complexity {
            return Err(over("complexity", measured.complexity, self.max_complexity));
        }
        Ok(measured)
    }
}

/// Every request's hooks, in one extension: error codes on every error, the depth and complexity
/// limits, per-operation metrics, persisted documents, and the document guard with its cache and
/// the response order. One extension, not one per concern, because async-graphql runs every
/// registered extension's per-field hook for every field it resolves, pass-through or not: five
/// extensions cost five boxed futures per field, a thousand for a feed page of 20 hydrated items.
///
/// The stages run in this order: the persisted document is looked up before the guard checks its
/// text, and error codes are added last, to whatever the other stages and the resolvers left.
pub struct RequestPipeline {
    pub limits: QueryLimitsCheck,
    pub metrics: OperationMetrics,
    pub documents: Arc<dyn DocumentStore>,
    pub guard: DocumentGuard,
    /// Where the server serves subscriptions, named in the refusal of one sent over HTTP.
    pub websocket_url: String,
}

impl ExtensionFactory for RequestPipeline {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(RequestStages {
            limits: self.limits,
            metrics: OperationMetricsStage {
                metrics: self.metrics.clone(),
                operation: Mutex::new(None),
            },
            persisted: PersistedDocuments::new(self.documents.clone()),
            guard: self.guard.clone(),
            executed: Arc::default(),
            reusable_validation: Mutex::new(None),
            unprovided: Mutex::new(None),
            websocket_url: self.websocket_url.clone(),
        })
    }
}

/// One request's pass through the [`RequestPipeline`].
struct RequestStages {
    limits: QueryLimitsCheck,
    metrics: OperationMetricsStage,
    persisted: PersistedDocuments,
    guard: DocumentGuard,
    /// The document and operation name of this request, for putting its answers in order.
    executed: Arc<Mutex<Option<Executed>>>,
    /// The request's document, when its variables cannot change the document's validation verdict.
    reusable_validation: Mutex<Option<Arc<GuardedDocument>>>,
    /// A required variable the request did not provide, reported once the document validated.
    unprovided: Mutex<Option<ServerError>>,
    websocket_url: String,
}

#[async_trait::async_trait]
impl Extension for RequestStages {
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> Response {
        let started = Instant::now();
        let response = next.run(ctx).await;
        let response = in_selection_order(&self.guard.types, &self.executed, response);
        self.persisted.after(&response).await;
        self.metrics.record(started, &response);
        with_codes(response)
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let (types, executed) = (self.guard.types.clone(), self.executed.clone());
        next.run(ctx, stream)
            .map(move |response| with_codes(in_selection_order(&types, &executed, response)))
            .boxed()
    }

    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        let mut request = self.persisted.prepare(request).await?;
        let guarded = self.guard.document(&mut request)?;
        let document = guarded.document.clone();
        check_transport(&request, &document, &self.websocket_url)?;
        *self.unprovided.lock().expect("variables lock poisoned") =
            unprovided_variable(&document, &request);
        if guarded
            .validation
            .reusable_for(request.operation_name.as_deref(), &request.variables)
        {
            *self
                .reusable_validation
                .lock()
                .expect("validation lock poisoned") = Some(guarded.clone());
        }
        request.set_parsed_query(ExecutableDocument::clone(&document));
        *self.executed.lock().expect("document lock poisoned") =
            Some((document, request.operation_name.clone()));
        next.run(ctx, request).await
    }

    async fn validation(
        &self,
        ctx: &ExtensionContext<'_>,
        next: NextValidation<'_>,
    ) -> Result<ValidationResult, Vec<ServerError>> {
        let verdict = match self.validate(ctx, next).await {
            // Variables are coerced after the document validates, as the spec orders it.
            Ok(measured) => match self
                .unprovided
                .lock()
                .expect("variables lock poisoned")
                .take()
            {
                Some(unprovided) => Err(vec![unprovided]),
                None => Ok(measured),
            },
            Err(errors) => Err(errors),
        };
        // A single-connection stream accepts an operation only once its document validated.
        if let Some(validated) = ctx.data_opt::<crate::stream::Validated>() {
            validated.tell(verdict.is_ok());
        }
        verdict
    }

    async fn execute(
        &self,
        ctx: &ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: NextExecute<'_>,
    ) -> Response {
        self.metrics.executing(operation_name);
        next.run(ctx, operation_name).await
    }
}

#[cfg(test)]
mod tests {
    use async_graphql::futures_util::Stream;
    use async_graphql::{Object, Schema, Subscription};

    use super::*;
    use crate::persisted::PersistedMode;

    struct Query;

    #[Object]
    impl Query {
        async fn value(&self) -> i32 {
            1
        }

        async fn nested(&self) -> Query {
            Query
        }
    }

    struct Mutation;

    #[Object]
    impl Mutation {
        async fn set(&self) -> bool {
            true
        }
    }

    struct Subscription;

    #[Subscription]
    impl Subscription {
        async fn ticks(&self) -> impl Stream<Item = i32> {
            futures_util::stream::iter([1])
        }
    }

    /// Persisted documents off: every request sends its document in full.
    struct NoDocuments;

    #[async_trait::async_trait]
    impl DocumentStore for NoDocuments {
        fn mode(&self) -> PersistedMode {
            PersistedMode::Off
        }

        async fn registered(&self, _: &str) -> async_graphql::Result<Option<String>> {
            Ok(None)
        }

        async fn register(&self, _: &str, _: &str) -> async_graphql::Result<()> {
            Ok(())
        }

        async fn trusted(&self, _: &str) -> async_graphql::Result<Option<Arc<str>>> {
            Ok(None)
        }
    }

    type TinySchema = Schema<Query, Mutation, Subscription>;

    fn schema() -> TinySchema {
        let sdl = Schema::new(Query, Mutation, Subscription).sdl();
        let types = Arc::new(SchemaTypes::from_sdl(&sdl).unwrap());
        Schema::build(Query, Mutation, Subscription)
            .extension(RequestPipeline {
                limits: QueryLimitsCheck {
                    max_depth: 4,
                    max_complexity: 100,
                },
                metrics: OperationMetrics::default(),
                documents: Arc::new(NoDocuments),
                guard: DocumentGuard::new(100, types, Arc::default()),
                websocket_url: "/somewhere/ws".to_owned(),
            })
            .finish()
    }

    fn code(error: &ServerError) -> String {
        let code = error.extensions.as_ref().and_then(|ext| ext.get("code"));
        code.map(ToString::to_string).unwrap_or_default()
    }

    #[tokio::test]
    async fn the_transport_a_request_came_by_decides_what_it_may_run() {
        let schema = schema();
        let over = |query: &str, method: HttpMethod| Request::new(query).data(method);

        let refused = schema
            .execute(over("mutation { set }", HttpMethod::Get))
            .await;
        assert_eq!(code(&refused.errors[0]), "\"METHOD_NOT_ALLOWED\"");
        let refused = schema
            .execute(over("subscription { ticks }", HttpMethod::Post))
            .await;
        assert_eq!(code(&refused.errors[0]), "\"WEBSOCKET_REQUIRED\"");
        assert!(refused.errors[0].message.contains("/somewhere/ws"));

        let posted = schema
            .execute(over("mutation { set }", HttpMethod::Post))
            .await;
        assert!(posted.errors.is_empty(), "{:?}", posted.errors);
        // Without a method the request came over a websocket, where a mutation runs too.
        let socket = schema.execute(Request::new("mutation { set }")).await;
        assert!(socket.errors.is_empty(), "{:?}", socket.errors);
    }

    #[tokio::test]
    async fn errors_are_capped_and_each_carries_a_code() {
        let unknown = (0..30).map(|n| format!("f{n}")).collect::<Vec<_>>();
        let response = schema()
            .execute(format!("{{ {} }}", unknown.join(" ")))
            .await;
        assert_eq!(response.errors.len(), MAX_ERRORS + 1);
        assert!(
            response
                .errors
                .iter()
                .all(|error| code(error) == "\"BAD_USER_INPUT\"")
        );
        let last = &response.errors[MAX_ERRORS];
        assert_eq!(last.message, "10 more errors omitted");
    }

    #[tokio::test]
    async fn a_query_past_the_depth_limit_is_refused_naming_both() {
        let response = schema()
            .execute("{ nested { nested { nested { nested { value } } } } }")
            .await;
        let error = &response.errors[0];
        assert_eq!(error.message, "query depth 5 exceeds the limit of 4");
        assert_eq!(code(error), "\"BAD_USER_INPUT\"");
        let response = schema().execute("{ nested { nested { value } } }").await;
        assert!(response.errors.is_empty(), "{:?}", response.errors);
    }

    #[tokio::test]
    async fn a_required_variable_left_out_is_refused_by_name() {
        let request = Request::new("query ($shown: Boolean!) { value @include(if: $shown) }");
        let response = schema().execute(request).await;
        assert_eq!(response.errors.len(), 1, "{:?}", response.errors);
        assert_eq!(
            response.errors[0].message,
            "Variable \"$shown\" of required type \"Boolean!\" was not provided."
        );
    }

    #[test]
    fn short_messages_are_left_alone() {
        let mut message = "x".repeat(MAX_MESSAGE_BYTES);
        shorten_message(&mut message);
        assert_eq!(message, "x".repeat(MAX_MESSAGE_BYTES));
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let mut message = "é".repeat(MAX_MESSAGE_BYTES);
        shorten_message(&mut message);
        assert!(message.len() <= MAX_MESSAGE_BYTES, "{}", message.len());
        assert!(message.ends_with("é…"), "{message}");
    }
}
