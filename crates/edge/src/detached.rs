//! Event streams that a websocket's driver runs itself between their events, so that an idle one
//! costs its source and a copy of its request, not an async-graphql stream.
//!
//! async-graphql keeps a running subscription in a stream of its own: its execution's state, the
//! field's stream, the operation's own copy of its document and environment, 9 KiB or so, held
//! for as long as the operation runs however rarely it sends. For an operation on one of
//! [`crate::websocket::Settings::detached`]'s fields, the driver gives the first execution a
//! [`Detach`] in its data. The field's resolver opens its source as it always does, hands it over
//! there and returns an empty stream: async-graphql resolves nothing and ends the execution, and
//! the driver, not the client, hears that end. From then on the driver polls the source. Each
//! item it yields is the data of one more execution of the same request, which async-graphql runs
//! like any other operation of the socket (the connection's data, the schema's extensions, the
//! same id), and whose resolver finds its event in that data and returns it alone; the driver
//! hands async-graphql the next item once that execution has ended, so the events keep their
//! order. What the client does not read waits in the connection's queue, within its send budget,
//! as any event does. The source's end is the operation's `complete`.
//!
//! A resolver that sees no [`Detach`] (an HTTP stream, a schema run without the driver) returns
//! its stream as before.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_graphql::{Data, Variables};
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;

use crate::counted::Counted;
use crate::websocket::DETACHED_OPERATIONS;

/// The events of a detached operation, each the data of the execution that resolves it.
pub type Source = BoxStream<'static, Data>;

/// In the data of a detachable operation's first execution: where its resolver hands the driver
/// its source.
#[derive(Default)]
pub struct Detach(Mutex<Option<Source>>);

impl Detach {
    /// Hands the driver `source`. The resolver then returns an empty stream: what it would have
    /// sent, the driver has each yielded item resolved by an execution of its own.
    pub fn hand_over(&self, source: Source) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(source);
    }

    fn take(&self) -> Option<Source> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// What the driver keeps of a request to run it again for each event.
struct Template {
    query: String,
    operation_name: Option<String>,
    variables: Variables,
    extensions: async_graphql::Extensions,
}

struct Operation {
    id: String,
    template: Template,
    /// Until the first execution ends: where its resolver hands over the source.
    slot: Option<Arc<Detach>>,
    source: Option<Source>,
    /// An execution of an event runs: the source waits until it ends.
    delivering: bool,
    /// In [`crate::websocket::DETACHED_OPERATIONS`] while the driver holds the source.
    _held: Option<Counted>,
}

/// A connection's detachable operations, by id. A connection rarely runs more than a few: a list
/// is searched faster than a map is hashed, and takes less.
#[derive(Default)]
pub(crate) struct Detached {
    operations: Vec<Operation>,
}

/// What a detached operation's source did.
pub(crate) enum Polled {
    /// An event: the data of the execution that resolves it, now running.
    Event(String, Box<async_graphql::Request>),
    /// The source ended, and with it the operation.
    Ended(String),
}

impl Detached {
    /// Notes that operation `id` of `request` may detach, and gives its first execution the
    /// [`Detach`] its resolver hands its source to.
    pub(crate) fn offer(&mut self, id: &str, request: &mut async_graphql::Request) {
        self.forget(id);
        let slot = Arc::new(Detach::default());
        request.data.insert(slot.clone());
        // Most connections run one: a first push would make room for four.
        self.operations.reserve_exact(1);
        self.operations.push(Operation {
            id: id.to_owned(),
            template: Template {
                query: request.query.clone(),
                operation_name: request.operation_name.clone(),
                variables: request.variables.clone(),
                extensions: request.extensions.clone(),
            },
            slot: Some(slot),
            source: None,
            delivering: false,
            _held: None,
        });
    }

    /// The first execution of operation `id` ended: whether its resolver handed over a source,
    /// which the driver polls from now on. If not, the operation ended with that execution.
    pub(crate) fn take_over(&mut self, id: &str) -> bool {
        let Some(index) = self.index(id) else {
            return false;
        };
        let operation = &mut self.operations[index];
        match operation.slot.take().and_then(|slot| slot.take()) {
            Some(source) => {
                operation.source = Some(source);
                operation._held = Some(Counted::new(metrics::gauge!(DETACHED_OPERATIONS)));
                true
            }
            None => {
                self.operations.swap_remove(index);
                false
            }
        }
    }

    /// The execution of operation `id`'s last event ended: its source may yield the next.
    pub(crate) fn delivered(&mut self, id: &str) {
        if let Some(index) = self.index(id) {
            self.operations[index].delivering = false;
        }
    }

    /// Drops operation `id`, its source with it.
    pub(crate) fn forget(&mut self, id: &str) {
        if let Some(index) = self.index(id) {
            self.operations.swap_remove(index);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }

    /// The next event or end of a source that waits for none of its executions.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Polled> {
        for index in 0..self.operations.len() {
            let operation = &mut self.operations[index];
            if operation.delivering {
                continue;
            }
            let Some(source) = &mut operation.source else {
                continue;
            };
            match source.poll_next_unpin(cx) {
                Poll::Pending => {}
                Poll::Ready(Some(data)) => {
                    operation.delivering = true;
                    let template = &operation.template;
                    let mut request = async_graphql::Request::new(template.query.clone());
                    request.operation_name = template.operation_name.clone();
                    request.variables = template.variables.clone();
                    request.extensions = template.extensions.clone();
                    request.data = data;
                    return Poll::Ready(Polled::Event(operation.id.clone(), Box::new(request)));
                }
                Poll::Ready(None) => {
                    let operation = self.operations.swap_remove(index);
                    return Poll::Ready(Polled::Ended(operation.id));
                }
            }
        }
        Poll::Pending
    }

    fn index(&self, id: &str) -> Option<usize> {
        self.operations
            .iter()
            .position(|operation| operation.id == id)
    }
}
