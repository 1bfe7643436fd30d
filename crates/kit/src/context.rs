//! A resolver's reach into its request: the services (by type, from the registry the app builds),
//! the request's DataLoaders and who is asking.
//!
//! Loaders are made on first use, so a request that needs none (most mutations) pays for none;
//! within a request, every load of one kind is batched, and what was loaded is kept for the rest
//! of the request. "A request" is one operation, however it came ([`FreshLoaders`] gives each its
//! own): a websocket's operations do not share what an earlier one loaded, and each event of a
//! shared subscription (one whose data holds [`FreshEachEvent`]) is resolved with loaders that
//! remember nothing of the events before it. A long-lived subscription may instead load through
//! the process's shared loaders ([`Loaders::share`]), which every such request uses for a tenth of
//! a second before the next ones replace them.
//!
//! A loader gathers the keys asked for within a millisecond of the first one. On a loaded machine a
//! page's resolvers can take longer than that to run, and the batch splits; so resolvers that
//! return a list prefetch what the selected fields need with one `load_many` per kind (the lists of
//! articles and comments do), and the per-item fields then find it loaded.
//!
//! A domain registers a loader by implementing [`FromServices`] next to it; nothing here changes
//! when a domain arrives.

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::extensions::{
    Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest, NextSubscribe,
};
use async_graphql::futures_util::StreamExt as _;
use async_graphql::futures_util::stream::BoxStream;
use async_graphql::{Context, Request, Response, ServerResult};

use crate::actor::Actor;

/// The services of a schema, one of each type: the app registers every domain's, and a domain
/// reads the ones it names. Built once, before the schema; read-only after.
#[derive(Default)]
pub struct Registry {
    services: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
}

impl Registry {
    /// Adds `service`, replacing one of the same type.
    pub fn with<T: Send + Sync + 'static>(mut self, service: T) -> Self {
        self.services.insert(TypeId::of::<T>(), Box::new(service));
        self
    }

    /// The service of type `T`.
    ///
    /// # Panics
    /// When the app registered none: a wiring mistake, which the first request reaching a resolver
    /// that needs it shows.
    pub fn get<T: 'static>(&self) -> &T {
        self.services
            .get(&TypeId::of::<T>())
            .and_then(|service| service.downcast_ref::<T>())
            .unwrap_or_else(|| panic!("no {} is registered", type_name::<T>()))
    }
}

/// The service of type `T` of the schema the request runs on.
pub fn service<'a, T: 'static>(ctx: &Context<'a>) -> &'a T {
    ctx.data_unchecked::<Arc<Registry>>().get::<T>()
}

/// The request's DataLoaders.
pub fn loaders<'a>(ctx: &Context<'a>) -> &'a Loaders {
    ctx.data_unchecked::<Loaders>()
}

/// Who is asking, from where.
pub fn actor<'a>(ctx: &Context<'a>) -> &'a Actor {
    ctx.data_unchecked::<Actor>()
}

/// A loader made from the services, once per request that uses it.
pub trait FromServices: Send + Sync + 'static {
    fn from_services(services: &Registry) -> Self;
}

/// How long the process's shared loaders keep what they loaded: the oldest value an event of a
/// long-lived subscription can show, and the span whose events share one read of each thing.
pub const SHARED_LOADERS_FOR: Duration = Duration::from_millis(100);

/// Loaders by kind.
type Kinds = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;

/// One request's loaders, by kind. A clone shares them.
#[derive(Clone)]
pub struct Loaders {
    services: Arc<Registry>,
    shared: Arc<SharedLoaders>,
    /// The request's own; `None` once it loads through the shared ones.
    own: Arc<Mutex<Option<Kinds>>>,
}

impl Loaders {
    pub(crate) fn new(services: Arc<Registry>, shared: Arc<SharedLoaders>) -> Self {
        Self {
            services,
            shared,
            own: Arc::new(Mutex::new(Some(Kinds::new()))),
        }
    }

    /// Drops every loader and what it loaded: the next load reads afresh.
    pub fn forget(&self) {
        if let Some(kinds) = &mut *lock(&self.own) {
            kinds.clear();
        }
    }

    /// From now on, this request (every clone) loads through the process's shared loaders, and
    /// what it loaded itself is dropped. For a subscription that lives long and whose events each
    /// bring something new to resolve (a feed's items): what the events of all its subscribers
    /// share (an item's author) is read once per [`SHARED_LOADERS_FOR`], not once per subscriber,
    /// no value it shows is older than that, and an idle subscriber keeps no loader of its own.
    /// Not for a snapshot made because something changed: a value read just before the change
    /// may be served to it for a moment, and no later snapshot comes to correct it.
    pub fn share(&self) {
        lock(&self.own).take();
    }

    /// This request's loader of kind `L`, made on first use.
    pub fn get<L: FromServices>(&self) -> Arc<DataLoader<L, HashMapCache>> {
        let loader = match &mut *lock(&self.own) {
            Some(kinds) => self.loader_in::<L>(kinds),
            None => self.loader_in::<L>(&mut lock(&self.shared.current())),
        };
        loader
            .downcast::<DataLoader<L, HashMapCache>>()
            .expect("loaders are stored under their own type id")
    }

    fn loader_in<L: FromServices>(&self, kinds: &mut Kinds) -> Arc<dyn Any + Send + Sync> {
        kinds
            .entry(TypeId::of::<L>())
            .or_insert_with(|| {
                Arc::new(DataLoader::with_cache(
                    L::from_services(&self.services),
                    tokio::spawn,
                    HashMapCache::default(),
                ))
            })
            .clone()
    }
}

/// The process's loaders for requests that [share](Loaders::share): made afresh once the current
/// ones are [`SHARED_LOADERS_FOR`] old, so that what they keep is never older and never more than
/// one span's loads.
#[derive(Default)]
pub(crate) struct SharedLoaders {
    current: Mutex<Option<(Instant, Arc<Mutex<Kinds>>)>>,
}

impl SharedLoaders {
    fn current(&self) -> Arc<Mutex<Kinds>> {
        let mut current = lock(&self.current);
        let now = Instant::now();
        match &*current {
            Some((made_at, kinds)) if now.duration_since(*made_at) < SHARED_LOADERS_FOR => {
                kinds.clone()
            }
            _ => current.insert((now, Arc::default())).1.clone(),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The schema extension that gives every operation its own [`Loaders`], in the request's data
/// (which async-graphql reads before a connection's). A connection's data holds no loaders: one
/// kept for a websocket's life answered a later query with what an earlier one read (a like count
/// from before the like), and grew with everything its subscriptions ever resolved.
///
/// An operation whose request already holds [`Loaders`] keeps them: an execution of one event of a
/// detached websocket subscription (`pulse_edge::detached`) brings its operation's, for the
/// reasons below.
///
/// A subscription whose data holds [`FreshEachEvent`] has its loaders forget what they loaded once
/// each event is resolved. One that [shares](Loaders::share) loads through the process's shared
/// loaders. Others keep theirs for their life. Forgetting would cost each subscriber a read per
/// event of what the events share (a feed item's author: 10,000 followers made the server's CPU
/// per message three times what it was); keeping shows a field of something that comes back event
/// after event (an author's follower count) as it was when first read.
pub struct FreshLoaders {
    services: Arc<Registry>,
    shared: Arc<SharedLoaders>,
}

impl FreshLoaders {
    pub fn new(services: Arc<Registry>) -> Self {
        Self {
            services,
            shared: Arc::default(),
        }
    }
}

impl ExtensionFactory for FreshLoaders {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(OperationLoaders(Loaders::new(
            self.services.clone(),
            self.shared.clone(),
        )))
    }
}

/// In a subscription's data: each of its events is resolved with loaders of its own. For an
/// operation resolved once for many subscribers (a group), where an event's reads are one per
/// group, not one per subscriber.
pub struct FreshEachEvent;

/// One operation's loaders, made with the operation's extensions.
struct OperationLoaders(Loaders);

#[async_trait::async_trait]
impl Extension for OperationLoaders {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        // An execution of one event of a detached subscription brings its operation's loaders.
        if !request.data.contains_key(&TypeId::of::<Loaders>()) {
            request.data.insert(self.0.clone());
        }
        next.run(ctx, request).await
    }

    fn subscribe<'s>(
        &self,
        ctx: &ExtensionContext<'_>,
        stream: BoxStream<'s, Response>,
        next: NextSubscribe<'_>,
    ) -> BoxStream<'s, Response> {
        let stream = next.run(ctx, stream);
        if ctx.data_opt::<FreshEachEvent>().is_none() {
            return stream;
        }
        let loaders = self.0.clone();
        stream.inspect(move |_| loaders.forget()).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Counter(u32);

    #[test]
    fn a_registered_service_is_found_by_its_type_and_the_last_of_a_type_wins() {
        let registry = Registry::default()
            .with(Counter(1))
            .with("a str")
            .with(Counter(2));
        assert_eq!(registry.get::<Counter>(), &Counter(2));
        assert_eq!(*registry.get::<&str>(), "a str");
    }

    #[test]
    #[should_panic(expected = "Counter is registered")]
    fn a_missing_service_names_its_type() {
        Registry::default().get::<Counter>();
    }

    /// A loader that counts its reads, in a registry of its own.
    struct Reads(Arc<std::sync::atomic::AtomicUsize>);

    struct Counting(Arc<std::sync::atomic::AtomicUsize>);

    impl FromServices for Counting {
        fn from_services(services: &Registry) -> Self {
            Self(services.get::<Reads>().0.clone())
        }
    }

    impl async_graphql::dataloader::Loader<i64> for Counting {
        type Value = i64;
        type Error = String;

        async fn load(&self, keys: &[i64]) -> Result<HashMap<i64, i64>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(keys.iter().map(|&key| (key, key * 10)).collect())
        }
    }

    #[tokio::test]
    async fn requests_that_share_read_once_per_span_and_the_others_for_themselves() {
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let read = || reads.load(std::sync::atomic::Ordering::SeqCst);
        let services = Arc::new(Registry::default().with(Reads(reads.clone())));
        let shared = Arc::new(SharedLoaders::default());
        let [first, second, own] = [(); 3].map(|()| Loaders::new(services.clone(), shared.clone()));
        first.share();
        // A clone is the same request: it shares too.
        second.clone().share();

        // Taken back to back, well within one span.
        let (from_first, from_second) = (first.get::<Counting>(), second.get::<Counting>());
        assert_eq!(from_first.load_one(7).await, Ok(Some(70)));
        assert_eq!(from_second.load_one(7).await, Ok(Some(70)));
        assert_eq!(read(), 1, "two requests sharing within one span read once");
        assert_eq!(own.get::<Counting>().load_one(7).await, Ok(Some(70)));
        assert_eq!(read(), 2, "a request of its own reads for itself");

        tokio::time::sleep(SHARED_LOADERS_FOR + Duration::from_millis(20)).await;
        assert_eq!(second.get::<Counting>().load_one(7).await, Ok(Some(70)));
        assert_eq!(read(), 3, "a span later, the shared loaders read afresh");
        assert_eq!(own.get::<Counting>().load_one(7).await, Ok(Some(70)));
        assert_eq!(read(), 3, "a request's own loaders keep what they read");
    }
}
