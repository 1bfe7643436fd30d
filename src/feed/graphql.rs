use std::sync::{Arc, Mutex};

use async_graphql::connection::{Connection, ConnectionNameType, Edge, EdgeNameType, EmptyFields};
use async_graphql::{Context, Data, Object, OutputType, SimpleObject, Subscription};
use futures_util::stream::BoxStream;
use futures_util::{FutureExt as _, StreamExt as _};
use pulse_edge::detached::Detach;
use pulse_kit::connection::connection_complexity;
use pulse_kit::{actor, loaders, service};

use crate::articles::graphql::{Article, prefetch_articles};
use crate::error::GqlResultExt;
use crate::feed::FeedService;

pub struct FeedConnectionName;

impl ConnectionNameType for FeedConnectionName {
    fn type_name<T: OutputType>() -> String {
        "FeedConnection".into()
    }
}

pub struct FeedEdgeName;

impl EdgeNameType for FeedEdgeName {
    fn type_name<T: OutputType>() -> String {
        "FeedEdge".into()
    }
}

#[derive(SimpleObject)]
pub struct FeedFields {
    /// True while the timeline of a returning user is being rebuilt (the page came from SQL).
    regenerating: bool,
}

pub type FeedConnection =
    Connection<String, Article, FeedFields, EmptyFields, FeedConnectionName, FeedEdgeName>;
pub type FeedEdge = Edge<String, Article, EmptyFields, FeedEdgeName>;

#[derive(Default)]
pub struct FeedQuery;

#[Object]
impl FeedQuery {
    /// The viewer's follow timeline, newest first. Requires sign-in.
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    async fn feed(
        &self,
        ctx: &Context<'_>,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
    ) -> async_graphql::Result<FeedConnection> {
        let feed = &service::<FeedService>(ctx);
        let (viewer, request) = feed.parse_page(actor(ctx), first, after.as_deref()).gql()?;
        let result = feed.page(viewer, &request).await.gql()?;
        let rows: Vec<_> = result.page.edges.iter().map(|(_, row)| row).collect();
        prefetch_articles(ctx, ctx.look_ahead().field("edges").field("node"), &rows).await?;
        let mut connection = FeedConnection::with_additional_fields(
            false,
            result.page.has_next_page,
            FeedFields {
                regenerating: result.regenerating,
            },
        );
        connection.edges.extend(
            result
                .page
                .edges
                .into_iter()
                .map(|(cursor, row)| Edge::new(cursor.into_string(), Article(row))),
        );
        Ok(connection)
    }
}

#[derive(Default)]
pub struct FeedSubscription;

#[Subscription]
impl FeedSubscription {
    /// New items in the signed-in viewer's feed (token in the connection_init payload), in the
    /// order they were delivered to it (not always that of their ids: those commit out of order).
    /// With `after` (a cursor from `feed` or from an earlier item), first every item delivered
    /// since that cursor while the client was away, oldest first, then the new ones, each once.
    /// When those cannot be replayed (a cursor of another viewer, more missed than
    /// PULSE_REPLAY_LIMIT, or the feed's history was rebuilt since), or the live source lost items
    /// it cannot replay, the stream sends one error with `extensions.code` RESYNC_REQUIRED, then
    /// ends; the client queries `feed` again and subscribes with its newest cursor.
    async fn feed_item_added(
        &self,
        ctx: &Context<'_>,
        after: Option<String>,
    ) -> async_graphql::Result<BoxStream<'static, async_graphql::Result<FeedEdge>>> {
        // An execution of one event of a stream the websocket's driver took over.
        if let Some(delivered) = ctx.data_opt::<DeliveredItem>() {
            let item = delivered.take();
            return Ok(futures_util::stream::iter(item).boxed());
        }
        // Boxed: async-graphql keeps this resolver's future in the subscription's stream for as
        // long as it runs, and the start of a feed (its SQL and Redis reads) is the largest part.
        let live = service::<FeedService>(ctx)
            .live(actor(ctx), after.as_deref())
            .boxed()
            .await
            .gql()?;
        let edges = live.map(|item| {
            item.map(|(cursor, row)| Edge::new(cursor.into_string(), Article(row)))
                .gql()
        });
        // The items are resolved with the process's shared loaders: an item's reads of what its
        // followers share (its author) are made once, not once per follower, and none is older
        // than the shared loaders' span (a follower's own, kept for its life, showed an author's
        // follower count as it was at the first item).
        loaders(ctx).share();
        let Some(detach) = ctx.data_opt::<Arc<Detach>>() else {
            return Ok(edges.boxed());
        };
        // The driver resolves each item in an execution of its own, which brings the operation's
        // loaders: the shared ones, where loaders of the execution's own would read per follower.
        let loaders = loaders(ctx).clone();
        detach.hand_over(
            edges
                .map(move |item| {
                    let mut data = Data::default();
                    data.insert(DeliveredItem(Mutex::new(Some(item))));
                    data.insert(loaders.clone());
                    data
                })
                .boxed(),
        );
        Ok(futures_util::stream::empty().boxed())
    }
}

/// In the data of an execution of one feed item of a detached operation.
struct DeliveredItem(Mutex<Option<async_graphql::Result<FeedEdge>>>);

impl DeliveredItem {
    fn take(&self) -> Option<async_graphql::Result<FeedEdge>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}
