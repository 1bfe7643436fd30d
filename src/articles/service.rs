use std::collections::HashMap;

use anyhow::Context as _;
use pulse_kit::actor::Actor;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection,
    EntityTrait, QueryFilter, QueryOrder, QuerySelect, SqlErr, TransactionTrait,
};

use crate::db::retry_once;
use crate::entities::articles;
use crate::error::{AppError, AppResult};
use crate::feed::publications::Relay;
use crate::keys::ArticleKeys;
use crate::pagination::{Page, PageRequest, Position, Walk};
use crate::realtime::{Confirmations, Hub, HubSubscription, Replay, Resume, Sharding, resumable};
use crate::redis::Redis;
use crate::scripts::SCRIPTS;
use crate::text::{Controls, TextRule, Trim};

/// All articles (or one author's, through the `articles` query), newest first.
pub const NEWEST: Walk = Walk("articles:new");
/// One user's articles, newest first (the `User.articles` field).
pub const USER_ARTICLES: Walk = Walk("user-articles");

pub const MAX_TITLE_CHARS: usize = 200;
pub const MAX_BODY_CHARS: usize = 50_000;

/// A title as stored: trimmed, non-empty, bounded, free of control characters.
const TITLE: TextRule = TextRule {
    field: "title",
    noun: "a title",
    chars: 1..=MAX_TITLE_CHARS,
    unit: "characters",
    trim: Trim::Stored,
    controls: Controls::Refused,
};

/// A body as stored: exactly as sent, with something besides whitespace.
const BODY: TextRule = TextRule {
    field: "body",
    noun: "a body",
    chars: 1..=MAX_BODY_CHARS,
    unit: "characters",
    trim: Trim::Kept,
    controls: Controls::AllButNul,
};

fn parse_title(raw: &str) -> AppResult<String> {
    TITLE.parse(raw).map(str::to_owned)
}

fn parse_body(raw: &str) -> AppResult<String> {
    BODY.parse(raw).map(str::to_owned)
}

/// Validates and stores a new article (without announcing it or recording its feed publication):
/// `publish` wraps it in a transaction with the publication.
pub async fn insert_article(
    db: &impl ConnectionTrait,
    author_id: i64,
    title: &str,
    body: &str,
) -> AppResult<articles::Model> {
    let (title, body) = (parse_title(title)?, parse_body(body)?);
    let now = crate::db::now();
    articles::ActiveModel {
        author_id: Set(author_id),
        title: Set(title),
        body: Set(body),
        view_count: Set(0),
        like_count: Set(0),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    }
    .insert(db)
    .await
    .map_err(|err| match err.sql_err() {
        Some(SqlErr::ForeignKeyConstraintViolation(_)) => {
            AppError::Unauthenticated("the signed-in user no longer exists")
        }
        _ => err.into(),
    })
}

/// The fields an edit may change; `None` leaves a field as it is.
#[derive(Debug, Default)]
pub struct ArticleChanges {
    pub title: Option<String>,
    pub body: Option<String>,
}

#[derive(Clone)]
pub struct ArticleService {
    db: DatabaseConnection,
    redis: Redis,
    hub: Hub,
    feed_relay: Relay,
    /// Most articles a resumed `articlePublished` replays.
    replay_limit: u32,
}

/// The resync of an `articlePublished` whose journal Redis lost, and started again, under it.
const JOURNAL_RENEWED: &str = "the journal of publications was started again (the cache lost it), \
     so what was published meanwhile cannot be replayed: subscribe again without `after`, then \
     query `articles` and drop what the subscription also brings";

/// An announcement on the articles' channel: "epoch:position:" and the article as JSON.
fn announced(payload: &[u8]) -> anyhow::Result<(i64, i64, articles::Model)> {
    let mut parts = payload.splitn(3, |&byte| byte == b':');
    let mut number = || -> anyhow::Result<i64> {
        let part = parts.next().context("a part is missing")?;
        Ok(std::str::from_utf8(part)?.parse()?)
    };
    let (epoch, position) = (number()?, number()?);
    let article = serde_json::from_slice(parts.next().context("the article is missing")?)?;
    Ok((epoch, position, article))
}

/// The resync of an `articlePublished` whose client missed more than one replay carries, or whose
/// position the journal no longer holds.
const TOO_FAR_BEHIND: &str = "more articles were published since this position than a resumed \
     subscription replays (PULSE_REPLAY_LIMIT), or it is older than the journal of publications \
     holds: subscribe again without `after`, then query `articles` and drop what the \
     subscription also brings";

/// Tells live subscribers about a new article, journaled with its position (see
/// `lua/article_announce.lua`; an article journaled already is not announced again).
pub(crate) async fn announce(
    redis: &Redis,
    replay_limit: u32,
    article: &articles::Model,
) -> AppResult<()> {
    let payload = serde_json::to_vec(article).map_err(|err| AppError::Internal(err.to_string()))?;
    let mut conn = redis.conn.clone();
    SCRIPTS
        .article_announce
        .key(redis.keys.articles_journal())
        .arg(redis.keys.articles_published_channel())
        .arg(replay_limit)
        .arg(article.id)
        .arg(payload)
        .arg(redis.target.sharded_publish())
        .invoke_async::<i64>(&mut conn)
        .await?;
    Ok(())
}

impl ArticleService {
    pub fn new(
        db: DatabaseConnection,
        redis: Redis,
        hub: Hub,
        feed_relay: Relay,
        replay_limit: u32,
    ) -> Self {
        Self {
            db,
            redis,
            hub,
            feed_relay,
            replay_limit,
        }
    }

    /// Publishes as the signed-in actor.
    #[tracing::instrument(skip_all)]
    pub async fn publish(
        &self,
        actor: &Actor,
        title: &str,
        body: &str,
    ) -> AppResult<articles::Model> {
        let author_id = actor.require_user()?;
        // The feed's fan-out event commits with the article (an outbox), so a publish while Redis
        // is unreachable still reaches feeds, and `articlePublished`, once it is back.
        let txn = self.db.begin().await?;
        let article = insert_article(&txn, author_id, title, body).await?;
        let publication = crate::feed::publications::record(&txn, &article).await?;
        crate::search::outbox::record(&txn, [article.id]).await?;
        txn.commit().await?;
        // Committed already: an announcement Redis does not take is the relay loop's to make.
        let announced = announce(&self.redis, self.replay_limit, &article)
            .await
            .inspect_err(|err| {
                metrics::counter!("pulse_article_announcements_deferred_total").increment(1);
                tracing::warn!(error = %err, article.id = article.id, "article published but not announced yet; the relay loop will");
            })
            .is_ok();
        self.feed_relay.relay_now(&publication, announced).await;
        Ok(article)
    }

    /// Articles as they are published (only `author`'s, if given), as their committed rows, in
    /// the order they were announced (the journal's; not always the order of ids, which commit out
    /// of order). With `after` (an article id: the last one the client has), first those announced
    /// after it, oldest first, then the new ones, each once; ends with `RESYNC_REQUIRED` when more
    /// were announced since than one replay carries, or the journal no longer holds `after`.
    pub async fn published(
        &self,
        after: Option<i64>,
        author: Option<i64>,
    ) -> AppResult<impl futures_util::Stream<Item = AppResult<articles::Model>> + use<>> {
        use futures_util::StreamExt as _;
        let mut conn = self.redis.conn.clone();
        let (epoch, newest, known): (i64, i64, i64) = SCRIPTS
            .journal_open
            .key(self.redis.keys.articles_journal())
            .arg(after.map(|id| id.to_string()).unwrap_or_default())
            .invoke_async(&mut conn)
            .await?;
        let start = match after {
            // Positions start at 1: 0 is an article the journal does not hold (any more).
            Some(_) if known == 0 => return Err(AppError::ResyncRequired(TOO_FAR_BEHIND)),
            Some(_) => known,
            None => newest,
        };
        let subscription: HubSubscription = self.hub.subscribe_as(
            self.redis.keys.articles_published_channel(),
            Sharding::Sharded,
        );
        let confirmations = Confirmations::new(vec![subscription.confirmations()]);
        let arrivals = subscription.filter_map(move |payload| async move {
            let (of, position, article) = announced(&payload)
                .inspect_err(
                    |err| tracing::warn!(error = %err, "ignoring a malformed article event"),
                )
                .ok()?;
            if of != epoch {
                return Some(Err(AppError::ResyncRequired(JOURNAL_RENEWED)));
            }
            let article =
                Some(article).filter(|article| author.is_none_or(|a| a == article.author_id));
            Some(Ok((position, article)))
        });
        let history = self.clone();
        let resume = Resume {
            after: Some(start),
            position: |(position, _): &(i64, Option<articles::Model>)| *position,
            replay: move |from| {
                let history = history.clone();
                async move { history.published_since(epoch, from, author).await }
            },
            buffer: self.replay_limit as usize,
            resync: || AppError::ResyncRequired(TOO_FAR_BEHIND),
        };
        Ok(
            resumable(arrivals, confirmations, resume).filter_map(|event| {
                std::future::ready(match event {
                    Ok((_, article)) => article.map(Ok),
                    Err(err) => Some(Err(err)),
                })
            }),
        )
    }

    /// The articles (of `author`, if given; the others as positions without a row) journaled
    /// after `position`, oldest first: the journal's list, whose rows SQL gives as the replay is
    /// taken; `Unreachable` when the journal is not of `epoch`, no longer reaches back, or holds
    /// more than the replay limit after it.
    async fn published_since(
        &self,
        epoch: i64,
        position: i64,
        author: Option<i64>,
    ) -> AppResult<Replay<(i64, Option<articles::Model>)>> {
        let mut conn = self.redis.conn.clone();
        let reply: Vec<i64> = SCRIPTS
            .journal_read
            .key(self.redis.keys.articles_journal())
            .arg(epoch)
            .arg(position)
            .arg(self.replay_limit)
            .invoke_async(&mut conn)
            .await?;
        let [1, through, ..] = reply[..] else {
            return Ok(Replay::Unreachable);
        };
        let entries: Vec<(i64, i64)> = reply[2..]
            .chunks_exact(2)
            .map(|pair| (pair[0], pair[1]))
            .collect();
        let db = self.db.clone();
        Ok(Replay::loaded(
            entries,
            through,
            move |chunk: Vec<(i64, i64)>| {
                let mut query = articles::Entity::find()
                    .filter(articles::Column::Id.is_in(chunk.iter().map(|&(id, _)| id)));
                if let Some(author) = author {
                    query = query.filter(articles::Column::AuthorId.eq(author));
                }
                let db = db.clone();
                async move {
                    let mut rows: HashMap<i64, articles::Model> =
                        retry_once(|| query.clone().all(&db))
                            .await?
                            .into_iter()
                            .map(|article| (article.id, article))
                            .collect();
                    Ok(chunk
                        .into_iter()
                        .map(|(id, position)| (position, rows.remove(&id)))
                        .collect())
                }
            },
        ))
    }

    /// Changes title and/or body. Only the author may; the counters are not written.
    #[tracing::instrument(skip_all, fields(article.id = id))]
    pub async fn edit(
        &self,
        actor: &Actor,
        id: i64,
        changes: ArticleChanges,
    ) -> AppResult<articles::Model> {
        let editor_id = actor.require_user()?;
        let title = changes.title.as_deref().map(parse_title).transpose()?;
        let body = changes.body.as_deref().map(parse_body).transpose()?;
        if title.is_none() && body.is_none() {
            return Err(AppError::bad_input(
                "input",
                "nothing to change: give a title or a body",
            ));
        }
        let article = self.get(id).await?.ok_or(AppError::NotFound("article"))?;
        if article.author_id != editor_id {
            return Err(AppError::Forbidden("only the author can edit an article"));
        }
        let mut update = articles::Entity::update_many()
            .col_expr(articles::Column::UpdatedAt, Expr::value(crate::db::now()))
            .filter(articles::Column::Id.eq(id))
            .filter(articles::Column::AuthorId.eq(editor_id));
        if let Some(title) = title {
            update = update.col_expr(articles::Column::Title, Expr::value(title));
        }
        if let Some(body) = body {
            update = update.col_expr(articles::Column::Body, Expr::value(body));
        }
        // Setting the same values twice leaves what setting them once does, and a second search
        // outbox row only makes the index read the article again: safe to retry.
        retry_once(|| async {
            let txn = self.db.begin().await?;
            update.clone().exec(&txn).await?;
            crate::search::outbox::record(&txn, [id]).await?;
            txn.commit().await
        })
        .await?;
        self.get(id).await?.ok_or(AppError::NotFound("article"))
    }

    pub async fn get(&self, id: i64) -> AppResult<Option<articles::Model>> {
        Ok(retry_once(|| articles::Entity::find_by_id(id).one(&self.db)).await?)
    }

    pub async fn by_ids(&self, ids: &[i64]) -> AppResult<Vec<articles::Model>> {
        let query =
            articles::Entity::find().filter(articles::Column::Id.is_in(ids.iter().copied()));
        Ok(retry_once(|| query.clone().all(&self.db)).await?)
    }

    /// Newest first, optionally by one author. Ids grow with publication, so "newest first" is a
    /// descending walk of the primary key and the cursor is the last id seen.
    pub async fn list(
        &self,
        page: PageRequest,
        author_id: Option<i64>,
    ) -> AppResult<Page<articles::Model>> {
        let mut query = articles::Entity::find().order_by_desc(articles::Column::Id);
        if let Some(after) = page.after {
            query = query.filter(articles::Column::Id.lt(after.id));
        }
        if let Some(author_id) = author_id {
            query = query.filter(articles::Column::AuthorId.eq(author_id));
        }
        let query = query.limit(page.fetch_limit());
        let rows = retry_once(|| query.clone().all(&self.db)).await?;
        Ok(Page::from_overfetch(rows, &page, |row| {
            Position::id(row.id)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_trimmed_and_bounded() {
        assert_eq!(parse_title("  Hello ").unwrap(), "Hello");
        assert!(parse_title("   ").is_err());
        assert!(parse_title(&"x".repeat(MAX_TITLE_CHARS + 1)).is_err());
        assert!(parse_title("bell\u{7}").is_err());
    }

    #[test]
    fn bodies_are_bounded() {
        assert!(parse_body("").is_err());
        assert!(parse_body(&"y".repeat(MAX_BODY_CHARS)).is_ok());
        assert!(parse_body(&"y".repeat(MAX_BODY_CHARS + 1)).is_err());
        assert!(parse_body("nul\0inside").is_err());
    }
}
