import { useEffect, useState } from 'preact/hooks';

import { type FragmentOf, graphql, readFragment, type ResultOf } from '../../lib/graphql';
import { LiveStats, useLiveArticle } from '../articleCard';
import { Card, ErrorNotice, FollowButton, LikeButton, Loading, timeAgo } from '../components';
import { useSession } from '../context';
import { useMutation, useQuery } from '../hooks';

const CommentFields = graphql(`
  fragment CommentFields on Comment {
    id body createdAt likeCount viewerHasLiked
    author { handle }
  }
`);

const ArticleQuery = graphql(
  `
  query Article($id: ID!) {
    article(id: $id) {
      id title body createdAt
      author { id handle followerCount viewerFollows }
      viewCount likeCount commentCount viewerHasLiked
      featuredComments(first: 3) { ...CommentFields }
    }
  }
`,
  [CommentFields],
);

const Comments = graphql(
  `
  query Comments($id: ID!, $after: String) {
    article(id: $id) {
      id
      comments(first: 10, after: $after) {
        edges { node { ...CommentFields } }
        pageInfo { hasNextPage endCursor }
      }
    }
  }
`,
  [CommentFields],
);

const RecordView = graphql(`
  mutation RecordView($id: ID!) { recordView(articleId: $id) { counted viewCount } }
`);

const AddComment = graphql(
  `
  mutation AddComment($id: ID!, $body: String!) { addComment(articleId: $id, body: $body) { ...CommentFields } }
`,
  [CommentFields],
);

export function ArticlePage({ id }: { id: string }) {
  const article = useQuery(ArticleQuery, { id });
  if (article.error) return <ErrorNotice error={article.error} />;
  if (!article.data) return <Loading what="the article" />;
  if (!article.data.article) return <p role="alert">No article has the id {id}.</p>;
  return <ArticleView key={id} article={article.data.article} />;
}

type ArticleData = NonNullable<ResultOf<typeof ArticleQuery>['article']>;

function ArticleView({ article }: { article: ArticleData }) {
  const { viewer } = useSession();
  const live = useLiveArticle(article.id, article);
  const [follows, setFollows] = useState(article.author.viewerFollows);
  const [recordView, viewState] = useMutation(RecordView);

  // Opening the article is one view; Pulse deduplicates a viewer's repeats within its window.
  useEffect(() => {
    recordView({ id: article.id }).then((data) => {
      if (data) live.viewed(data.recordView.viewCount);
    });
  }, [article.id]);

  return (
    <>
      <p>
        <a href="#/">← Articles</a>
      </p>
      <article class="card">
        <h1>{article.title}</h1>
        <p class="muted">
          by <strong>{article.author.handle}</strong> · {timeAgo(article.createdAt)} ·{' '}
          {viewer && viewer.id !== article.author.id && (
            <FollowButton
              userId={article.author.id}
              handle={article.author.handle}
              following={follows}
              onChange={setFollows}
            />
          )}
        </p>
        <p class="body">{article.body}</p>
        <LiveStats article={live} />
        <ErrorNotice error={viewState.error} />
      </article>
      {article.featuredComments.length > 0 && (
        <Card label="Featured comments">
          <h2>Featured comments</h2>
          {article.featuredComments.map((comment) => (
            <CommentView key={readFragment(CommentFields, comment).id} comment={comment} />
          ))}
        </Card>
      )}
      <CommentsSection articleId={article.id} />
    </>
  );
}

function CommentsSection({ articleId }: { articleId: string }) {
  const { viewer } = useSession();
  const [after, setAfter] = useState<string | null>(null);
  const page = useQuery(Comments, { id: articleId, after });
  const [items, setItems] = useState<FragmentOf<typeof CommentFields>[]>([]);
  const [addComment, adding] = useMutation(AddComment);
  const [body, setBody] = useState('');

  useEffect(() => {
    const nodes = page.data?.article?.comments.edges.map((edge) => edge.node);
    if (nodes) setItems((previous) => (after ? [...previous, ...nodes] : nodes));
  }, [page.data]);

  async function submit(event: Event) {
    event.preventDefault();
    const data = await addComment({ id: articleId, body });
    if (data) {
      setItems((previous) => [data.addComment, ...previous]);
      setBody('');
    }
  }

  const pageInfo = page.data?.article?.comments.pageInfo;
  return (
    <Card label="Comments">
      <h2>Comments</h2>
      {viewer && (
        <form onSubmit={submit} class="stack">
          <label>
            Your comment
            <textarea rows={2} value={body} onInput={(e) => setBody(e.currentTarget.value)} />
          </label>
          <ErrorNotice error={adding.error} />
          <button type="submit" disabled={adding.busy}>
            Comment
          </button>
        </form>
      )}
      <ErrorNotice error={page.error} />
      {items.map((comment) => (
        <CommentView key={readFragment(CommentFields, comment).id} comment={comment} />
      ))}
      {page.loading && <Loading what="comments" />}
      {!page.loading && items.length === 0 && <p class="muted">No comments yet.</p>}
      {pageInfo?.hasNextPage && (
        <button type="button" onClick={() => setAfter(pageInfo.endCursor)}>
          More comments
        </button>
      )}
    </Card>
  );
}

function CommentView({ comment: data }: { comment: FragmentOf<typeof CommentFields> }) {
  const comment = readFragment(CommentFields, data);
  const [liked, setLiked] = useState(comment.viewerHasLiked);
  const [count, setCount] = useState(comment.likeCount);
  return (
    <div class="comment">
      <p>{comment.body}</p>
      <p class="muted small">
        {comment.author.handle} · {timeAgo(comment.createdAt)} ·{' '}
        <LikeButton
          subjectId={comment.id}
          liked={liked}
          count={count}
          onChange={(nowLiked, likeCount) => {
            setLiked(nowLiked);
            setCount(likeCount);
          }}
        />
      </p>
    </div>
  );
}
