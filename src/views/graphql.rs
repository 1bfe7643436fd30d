use async_graphql::{Context, Enum, ID, Object, SimpleObject};
use pulse_kit::ids;
use pulse_kit::{actor, loaders, service};

use super::loader::ViewCountLoader;
use super::service::{RankingWindow, SkipReason};
use crate::articles::ARTICLE;
use crate::articles::graphql::{Article, load_article, load_articles, prefetch_articles};
use crate::entities::articles;
use crate::error::{AppError, GqlResultExt};
use crate::likes::LikeService;
use crate::pagination::PageSize;
use crate::views::ViewService;

/// Most entries a ranking returns.
const MAX_RANKING_SIZE: i32 = 100;
const DEFAULT_RANKING_SIZE: i32 = 10;

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "ViewSkipReason")]
pub enum ViewSkipReasonGql {
    /// This viewer was already counted for this article within the window.
    Duplicate,
    /// The User-Agent is a known crawler.
    Crawler,
}

impl From<SkipReason> for ViewSkipReasonGql {
    fn from(reason: SkipReason) -> Self {
        match reason {
            SkipReason::Duplicate => Self::Duplicate,
            SkipReason::Crawler => Self::Crawler,
        }
    }
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum ArticleMetric {
    /// Views counted (ALL_TIME), or counted within the day or week.
    Views,
    /// Likes held now (ALL_TIME), or likes minus unlikes within the day or week.
    Likes,
}

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
#[graphql(name = "RankingWindow")]
pub enum RankingWindowGql {
    AllTime,
    /// Today, in the server's configured time zone.
    Day,
    /// This ISO week, in the server's configured time zone.
    Week,
}

impl From<RankingWindowGql> for RankingWindow {
    fn from(window: RankingWindowGql) -> Self {
        match window {
            RankingWindowGql::AllTime => Self::AllTime,
            RankingWindowGql::Day => Self::Day,
            RankingWindowGql::Week => Self::Week,
        }
    }
}

pub struct RecordViewPayload {
    counted: bool,
    skip_reason: Option<ViewSkipReasonGql>,
    view_count: i64,
    article_id: i64,
}

#[Object]
impl RecordViewPayload {
    async fn counted(&self) -> bool {
        self.counted
    }

    /// Why the view was not counted; null when it was.
    async fn skip_reason(&self) -> Option<ViewSkipReasonGql> {
        self.skip_reason
    }

    /// The article's views including this one, to show at once.
    async fn view_count(&self) -> i64 {
        self.view_count
    }

    /// The article itself; read from SQL only when selected, so a bare count stays off SQL.
    async fn article(&self, ctx: &Context<'_>) -> async_graphql::Result<Article> {
        load_article(ctx, self.article_id)
            .await?
            .ok_or(AppError::NotFound("article"))
            .gql()
    }
}

#[derive(SimpleObject)]
pub struct RankedArticle {
    /// 1-based position.
    rank: i32,
    score: f64,
    article: Article,
}

/// The views to show for an article row: its SQL count brought up to date from Redis.
pub async fn view_count(
    ctx: &Context<'_>,
    article: &articles::Model,
) -> async_graphql::Result<i64> {
    let loader = loaders(ctx).get::<ViewCountLoader>();
    let live = loader.load_one(article.id).await?.unwrap_or_default();
    Ok(live.total(article.view_count))
}

/// Loads the live view counts of `articles` in one batch; see [`pulse_kit::context`].
pub async fn prefetch_view_counts(
    ctx: &Context<'_>,
    articles: impl IntoIterator<Item = i64>,
) -> async_graphql::Result<()> {
    loaders(ctx)
        .get::<ViewCountLoader>()
        .load_many(articles)
        .await?;
    Ok(())
}

#[derive(Default)]
pub struct ViewsQuery;

#[Object]
impl ViewsQuery {
    /// Real-time ranking of articles.
    #[graphql(cache_control(max_age = 5))]
    async fn top_articles(
        &self,
        ctx: &Context<'_>,
        #[graphql(default_with = "ArticleMetric::Views")] by: ArticleMetric,
        #[graphql(default_with = "RankingWindowGql::AllTime")] window: RankingWindowGql,
        #[graphql(default = 10)] first: Option<i32>,
    ) -> async_graphql::Result<Vec<RankedArticle>> {
        let first = PageSize::parse(first.unwrap_or(DEFAULT_RANKING_SIZE), MAX_RANKING_SIZE)
            .gql()?
            .get();
        let ranked = match by {
            ArticleMetric::Views => service::<ViewService>(ctx).top(window.into(), first).await,
            ArticleMetric::Likes => service::<LikeService>(ctx).top(window.into(), first).await,
        }
        .gql()?;
        let mut found = load_articles(ctx, ranked.iter().map(|(article, _)| *article)).await?;
        let rows: Vec<&articles::Model> = found.values().map(|article| &article.0).collect();
        prefetch_articles(ctx, ctx.look_ahead().field("article"), &rows).await?;
        // An article deleted since it was ranked simply drops out.
        let present = ranked
            .into_iter()
            .filter_map(|(id, score)| Some((found.remove(&id)?, score)));
        Ok(present
            .enumerate()
            .map(|(index, (article, score))| RankedArticle {
                rank: index as i32 + 1,
                score,
                article,
            })
            .collect())
    }
}

#[derive(Default)]
pub struct ViewsMutation;

#[Object]
impl ViewsMutation {
    /// Anonymous allowed. Deduplicated per viewer within a window; crawlers are not counted.
    async fn record_view(
        &self,
        ctx: &Context<'_>,
        article_id: ID,
    ) -> async_graphql::Result<RecordViewPayload> {
        let article_id = ids::decode(&article_id, ARTICLE, "articleId").gql()?;
        let outcome = service::<ViewService>(ctx)
            .record(article_id, actor(ctx))
            .await
            .gql()?;
        Ok(RecordViewPayload {
            counted: outcome.counted,
            skip_reason: outcome.skip_reason.map(Into::into),
            view_count: outcome.view_count,
            article_id,
        })
    }
}
