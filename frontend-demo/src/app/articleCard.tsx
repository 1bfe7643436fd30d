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
export const StatsChanged = graphql(`
  subscription StatsChanged($id: ID!) {
    articleStatsChanged(articleId: $id) { viewCount likeCount commentCount }
  }
`);

export interface Counts {
  viewCount: number;
  likeCount: number;
  commentCount: number;
}

/** Counters that follow `articleStatsChanged` for as long as the component is mounted. */
export function useLiveCounts(articleId: string, initial: Counts) {
  const [counts, setCounts] = useState<Counts>(initial);
  useSubscription(StatsChanged, { id: articleId }, (data) => setCounts(data.articleStatsChanged));
  return [counts, setCounts] as const;
}

export function ArticleCard({ article: data }: { article: FragmentOf<typeof ArticleCardFields> }) {
  const article = readFragment(ArticleCardFields, data);
  const [counts, setCounts] = useLiveCounts(article.id, article);
  const [liked, setLiked] = useState(article.viewerHasLiked);
  return (
    <article class="article-card" data-testid="article-card" data-title={article.title}>
      <h3>
        <a href={`#/articles/${encodeURIComponent(article.id)}`}>{article.title}</a>
      </h3>
      <p class="muted">
        by <strong>{article.author.handle}</strong> · {timeAgo(article.createdAt)}
      </p>
      <p class="stats">
        <span data-testid="view-count">{counts.viewCount}</span> views ·{' '}
        <span data-testid="comment-count">{counts.commentCount}</span> comments ·{' '}
        <LikeButton
          subjectId={article.id}
          liked={liked}
          count={counts.likeCount}
          onChange={(nowLiked, likeCount) => {
            setLiked(nowLiked);
            setCounts((previous) => ({ ...previous, likeCount }));
          }}
        />
      </p>
    </article>
  );
}
