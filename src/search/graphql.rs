use async_graphql::connection::PageInfo;
use async_graphql::{Context, Enum, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};
use pulse_kit::connection::connection_complexity;
use pulse_kit::ids;
use pulse_kit::service;

use super::index::Sort;
use super::query::SearchQuery;
use super::service::{SearchRequest, walk};
use crate::accounts::USER;
use crate::articles::graphql::{Article, load_articles, prefetch_articles};
use crate::error::{AppError, GqlResultExt};
use crate::pagination::PageRequest;
use crate::search::SearchService;

#[derive(Enum, Clone, Copy, PartialEq, Eq)]
pub enum ArticleSearchSort {
    /// Best match first (BM25 over title and body; the title weighs double).
    Relevance,
    /// Most viewed first, as of the last view flush.
    Views,
    /// Most liked first, as of the last likes archive batch.
    Likes,
    /// Most recently published first.
    Newest,
}

impl From<ArticleSearchSort> for Sort {
    fn from(sort: ArticleSearchSort) -> Self {
        match sort {
            ArticleSearchSort::Relevance => Sort::Relevance,
            ArticleSearchSort::Views => Sort::Views,
            ArticleSearchSort::Likes => Sort::Likes,
            ArticleSearchSort::Newest => Sort::Newest,
        }
    }
}

/// A hit: the article (with its live counts) and where the query matched it.
#[derive(SimpleObject)]
pub struct ArticleSearchEdge {
    cursor: String,
    node: Article,
    /// A fragment of the body around the best match, as HTML: the text escaped, matched words in
    /// `<b>`; empty when only the title matched.
    snippet: String,
    /// The title as HTML, matched words in `<b>`.
    highlighted_title: String,
}

#[derive(SimpleObject)]
pub struct ArticleSearchConnection {
    edges: Vec<ArticleSearchEdge>,
    page_info: PageInfo,
}

#[derive(Default)]
pub struct SearchQueryRoot;

#[Object]
impl SearchQueryRoot {
    /// Full text over titles and bodies (Chinese and English), from the embedded search index.
    /// `query` is plain text (at most 256 characters): words, and "quoted phrases"; all must
    /// match. The cursor pages one snapshot of the index while this server keeps it (see the
    /// README).
    #[graphql(complexity = "connection_complexity(child_complexity, first)")]
    #[allow(clippy::too_many_arguments)]
    async fn search_articles(
        &self,
        ctx: &Context<'_>,
        query: String,
        #[graphql(default = 20)] first: Option<i32>,
        after: Option<String>,
        #[graphql(default_with = "Some(ArticleSearchSort::Relevance)")] sort: Option<
            ArticleSearchSort,
        >,
        author_id: Option<ID>,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
    ) -> async_graphql::Result<ArticleSearchConnection> {
        let query = SearchQuery::parse(&query).gql()?;
        let author = author_id
            .map(|id| ids::decode(&id, USER, "authorId"))
            .transpose()
            .gql()?;
        if let (Some(since), Some(until)) = (since, until)
            && since > until
        {
            return Err(AppError::bad_input("until", "until is before since")).gql();
        }
        let sort = Sort::from(sort.unwrap_or(ArticleSearchSort::Relevance));
        let page = PageRequest::parse(walk(sort), first, after.as_deref()).gql()?;
        let hits = service::<SearchService>(ctx)
            .search(SearchRequest {
                query,
                sort,
                author,
                since,
                until,
                page,
            })
            .await
            .gql()?;
        let mut articles =
            load_articles(ctx, hits.edges.iter().map(|(_, hit)| hit.article_id)).await?;
        let rows: Vec<_> = articles.values().map(|article| &article.0).collect();
        prefetch_articles(ctx, ctx.look_ahead().field("edges").field("node"), &rows).await?;
        // A hit whose article was deleted since the index saw it is left out.
        let edges: Vec<ArticleSearchEdge> = hits
            .edges
            .into_iter()
            .filter_map(|(cursor, hit)| {
                Some(ArticleSearchEdge {
                    cursor: cursor.into_string(),
                    node: articles.remove(&hit.article_id)?,
                    snippet: hit.snippet,
                    highlighted_title: hit.title,
                })
            })
            .collect();
        Ok(ArticleSearchConnection {
            page_info: PageInfo {
                has_previous_page: false,
                has_next_page: hits.has_next_page,
                start_cursor: edges.first().map(|edge| edge.cursor.clone()),
                end_cursor: edges.last().map(|edge| edge.cursor.clone()),
            },
            edges,
        })
    }
}
