import { useEffect, useMemo, useRef, useState } from 'preact/hooks';

import { type FragmentOf, graphql, readFragment } from '../../lib/graphql';
import { ArticleCard, ArticleCardFields } from '../articleCard';
import { Card, ErrorNotice, Loading } from '../components';
import { useSession } from '../context';
import { useMutation, useQuery, useSubscription } from '../hooks';

const Articles = graphql(
  `
  query Articles($after: String) {
    articles(first: 10, after: $after) {
      edges { node { ...ArticleCardFields } }
      pageInfo { hasNextPage endCursor }
    }
  }
`,
  [ArticleCardFields],
);

const Published = graphql(
  `
  subscription Published($after: String) { articlePublished(after: $after) { ...ArticleCardFields } }
`,
  [ArticleCardFields],
);

const Publish = graphql(
  `
  mutation Publish($title: String!, $body: String!) {
    publishArticle(input: { title: $title, body: $body }) { ...ArticleCardFields }
  }
`,
  [ArticleCardFields],
);

type Item = FragmentOf<typeof ArticleCardFields>;

function idOf(item: Item): string {
  return readFragment(ArticleCardFields, item).id;
}

/** Newest first; new articles arrive live; "More" follows the connection's cursor. */
export function ArticlesPage() {
  const { viewer } = useSession();
  const [after, setAfter] = useState<string | null>(null);
  const page = useQuery(Articles, { after });
  const [items, setItems] = useState<Item[]>([]);

  // The newest article the list holds, of the first page or heard live: where the live ones
  // resume after the socket was lost, so that what was published meanwhile still arrives.
  const newest = useRef<string | null>(null);
  useEffect(() => {
    const nodes = page.data?.articles.edges.map((edge) => edge.node);
    if (nodes) setItems((previous) => merge(after ? previous : [], nodes));
    if (!after && !newest.current && nodes?.[0]) newest.current = idOf(nodes[0]);
  }, [page.data]);

  // Subscribed again, after the newest article, each time the socket connects again, and afresh
  // after a restart below.
  const { connections } = useSession();
  const [restarts, setRestarts] = useState(0);
  const live = useMemo(() => ({ after: newest.current }), [connections, restarts]);
  const liveError = useSubscription(Published, live, (data) => {
    newest.current = idOf(data.articlePublished);
    setItems((previous) => merge([data.articlePublished], previous));
  });
  // More was published meanwhile than the server replays: as its error says, subscribe again
  // without a position and read the first page again; the list starts again from the top.
  const mustRestart = !!liveError?.graphQLErrors.some((error) => error.extensions?.code === 'RESYNC_REQUIRED');
  useEffect(() => {
    if (!mustRestart) return;
    newest.current = null;
    setRestarts((n) => n + 1);
    setAfter(null);
    page.refetch();
  }, [liveError]);

  return (
    <>
      <h1>Articles</h1>
      {viewer && <PublishForm onPublished={(item) => setItems((previous) => merge([item], previous))} />}
      <ErrorNotice error={page.error ?? (mustRestart ? null : liveError)} />
      {items.map((item) => (
        <ArticleCard key={idOf(item)} article={item} />
      ))}
      {page.loading && <Loading what="articles" />}
      {!page.loading && items.length === 0 && <p>No articles yet.</p>}
      {page.data?.articles.pageInfo.hasNextPage && (
        <button type="button" onClick={() => setAfter(page.data!.articles.pageInfo.endCursor)}>
          More articles
        </button>
      )}
    </>
  );
}

/** Items in order, each once (a live arrival may also come with a page). */
function merge(first: Item[], second: Item[]): Item[] {
  const seen = new Set<string>();
  return [...first, ...second].filter((item) => {
    const id = idOf(item);
    if (seen.has(id)) return false;
    seen.add(id);
    return true;
  });
}

function PublishForm({ onPublished }: { onPublished(item: Item): void }) {
  const [publish, state] = useMutation(Publish);
  const [title, setTitle] = useState('');
  const [body, setBody] = useState('');
  async function submit(event: Event) {
    event.preventDefault();
    const data = await publish({ title, body });
    if (data) {
      onPublished(data.publishArticle);
      setTitle('');
      setBody('');
    }
  }
  return (
    <Card label="Publish an article">
      <form onSubmit={submit} class="stack">
        <h2>Publish</h2>
        <label>
          Title
          <input value={title} onInput={(e) => setTitle(e.currentTarget.value)} />
        </label>
        <label>
          Body
          <textarea rows={3} value={body} onInput={(e) => setBody(e.currentTarget.value)} />
        </label>
        <ErrorNotice error={state.error} />
        <button type="submit" disabled={state.busy}>
          Publish
        </button>
      </form>
    </Card>
  );
}
