import { useState } from 'preact/hooks';

import { type FragmentOf, graphql, readFragment } from '../lib/graphql';
import { LikeButton, timeAgo } from './components';
import { useSubscription } from './hooks';

export const ArticleCardFields = graphql(`
  fragment ArticleCardFields on Article {
    id title createdAt
    author { id handle }
    viewCount likeCount commentCount viewerHasLiked
  }
`);

/** An article's counters, live: at once, then whenever a view, like or comment moves them. */
const StatsChanged = graphql(`
  subscription StatsChanged($id: ID!) {
    articleStatsChanged(articleId: $id) { viewCount likeCount commentCount }
  }
`);

export interface Counts {
  viewCount: number;
  likeCount: number;
  commentCount: number;
}

type LiveArticle = ReturnType<typeof useLiveArticle>;

/**
 * An article's counters and the viewer's like, kept live: `articleStatsChanged` sends them at once
 * and whenever a view, like or comment moves them; the viewer's own like and view answer at once.
 */
export function useLiveArticle(articleId: string, initial: Counts & { viewerHasLiked: boolean }) {
  const [counts, setCounts] = useState<Counts>(initial);
  const [liked, setLiked] = useState(initial.viewerHasLiked);
  useSubscription(StatsChanged, { id: articleId }, (data) => setCounts(data.articleStatsChanged));
  return {
    articleId,
    counts,
    liked,
    viewed: (viewCount: number) => setCounts((previous) => ({ ...previous, viewCount })),
    likeChanged: (nowLiked: boolean, likeCount: number) => {
      setLiked(nowLiked);
      setCounts((previous) => ({ ...previous, likeCount }));
    },
  };
}

/** Views, comments and likes, with the like button. */
export function LiveStats({ article }: { article: LiveArticle }) {
  return (
    <p class="stats">
      <span data-testid="view-count">{article.counts.viewCount}</span> views ·{' '}
      <span data-testid="comment-count">{article.counts.commentCount}</span> comments ·{' '}
      <LikeButton
        subjectId={article.articleId}
        liked={article.liked}
        count={article.counts.likeCount}
        onChange={article.likeChanged}
      />
    </p>
  );
}

export function ArticleCard({ article: data }: { article: FragmentOf<typeof ArticleCardFields> }) {
  const article = readFragment(ArticleCardFields, data);
  const live = useLiveArticle(article.id, article);
  return (
    <article class="article-card" data-testid="article-card" data-title={article.title}>
      <h3>
        <a href={`#/articles/${encodeURIComponent(article.id)}`}>{article.title}</a>
      </h3>
      <p class="muted">
        by <strong>{article.author.handle}</strong> · {timeAgo(article.createdAt)}
      </p>
      <LiveStats article={live} />
    </article>
  );
}
