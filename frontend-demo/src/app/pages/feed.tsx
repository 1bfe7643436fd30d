import type { CombinedError } from '@urql/core';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';

import { type FragmentOf, graphql, readFragment } from '../../lib/graphql';
import { ArticleCard, ArticleCardFields } from '../articleCard';
import { Card, ErrorNotice, FollowButton, Loading } from '../components';
import { useSession } from '../context';
import { useQuery, useSubscription } from '../hooks';

const Feed = graphql(
  `
  query Feed($after: String) {
    feed(first: 10, after: $after) {
      edges { cursor node { ...ArticleCardFields } }
      pageInfo { hasNextPage endCursor }
      regenerating
    }
  }
`,
  [ArticleCardFields],
);

const ItemAdded = graphql(
  `
  subscription ItemAdded($after: String) { feedItemAdded(after: $after) { cursor node { ...ArticleCardFields } } }
`,
  [ArticleCardFields],
);

/** Authors of recent articles, to follow from here: the API has no user directory. */
const Authors = graphql(`
  query Authors {
    articles(first: 50) { nodes { author { id handle followerCount viewerFollows } } }
  }
`);

type Item = FragmentOf<typeof ArticleCardFields>;
const idOf = (item: Item) => readFragment(ArticleCardFields, item).id;

export function FeedPage() {
  const { viewer } = useSession();
  if (!viewer) {
    return (
      <>
        <h1>Feed</h1>
        <p>
          The feed lists the articles of the people you follow. <a href="#/signin">Sign in</a> to see yours.
        </p>
      </>
    );
  }
  return <Timeline viewerId={viewer.id} />;
}

function Timeline({ viewerId }: { viewerId: string }) {
  const [after, setAfter] = useState<string | null>(null);
  const page = useQuery(Feed, { after });
  const [items, setItems] = useState<Item[]>([]);
  // Items announced live, held back until the reader asks for them so the list does not jump.
  const [fresh, setFresh] = useState<Item[]>([]);
  const connection = page.data?.feed;

  // The newest cursor the page holds, of the first page or of a live item: where the live items
  // resume after the socket was lost, so that what was published meanwhile still arrives.
  const newest = useRef<string | null>(null);
  useEffect(() => {
    const nodes = connection?.edges.map((edge) => edge.node);
    if (nodes) setItems((previous) => unique(after ? [...previous, ...nodes] : nodes));
    if (!after && !newest.current) newest.current = connection?.edges[0]?.cursor ?? null;
  }, [page.data]);

  // Subscribed again, after the newest cursor, each time the socket connects again (the client
  // would otherwise repeat the first subscription as it was sent), and after each catch-up below.
  const { api, connections } = useSession();
  const [catchUps, setCatchUps] = useState(0);
  const catchUpsInARow = useRef(0);
  const resume = useMemo(() => ({ after: newest.current }), [connections, catchUps]);
  const liveError = useSubscription(ItemAdded, resume, (data) => {
    catchUpsInARow.current = 0;
    newest.current = data.feedItemAdded.cursor;
    setFresh((previous) => unique([data.feedItemAdded.node, ...previous]));
  });

  // The server could not replay what the page missed (more than it replays, or the feed was
  // rebuilt): as its error says, read the newest page again and subscribe after its newest
  // cursor. What that page brings is offered as new posts when it meets the list; when it does
  // not, more was missed than a page holds, and the list starts again from the top rather than
  // keep a gap.
  const mustCatchUp = !!liveError?.graphQLErrors.some((error) => error.extensions?.code === 'RESYNC_REQUIRED');
  const [catchUpError, setCatchUpError] = useState<CombinedError | null>(null);
  useEffect(() => {
    if (!mustCatchUp) return;
    let current = true;
    // A feed being rebuilt answers every subscription with RESYNC_REQUIRED until it is done (its
    // pages' cursors hold no journal position meanwhile): catching up again at once would spin,
    // so each catch-up that no live item followed waits longer, up to 10 s.
    const wait = catchUpsInARow.current === 0 ? 0 : Math.min(10_000, 500 * 2 ** catchUpsInARow.current);
    catchUpsInARow.current += 1;
    const catchUp = async () => {
      const result = await api.client.query(Feed, { after: null }).toPromise();
      if (!current) return;
      setCatchUpError(result.error ?? null);
      const edges = result.data?.feed.edges;
      if (!edges) return;
      // An empty feed has no cursor to resume after: the subscription starts live.
      newest.current = edges[0]?.cursor ?? null;
      const nodes = edges.map((edge) => edge.node);
      const shown = new Set(items.map(idOf));
      if (items.length > 0 && result.data?.feed.pageInfo.hasNextPage && !nodes.some((node) => shown.has(idOf(node)))) {
        setFresh([]);
        setAfter(null);
        page.refetch();
      } else {
        setFresh((previous) => unique([...nodes, ...previous]));
      }
      setCatchUps((n) => n + 1);
    };
    const timer = setTimeout(() => void catchUp(), wait);
    return () => {
      current = false;
      clearTimeout(timer);
    };
  }, [liveError]);

  const unseen = fresh.filter((item) => !items.some((shown) => idOf(shown) === idOf(item)));
  const loadMore = () => {
    if (connection?.pageInfo.hasNextPage && !page.loading) setAfter(connection.pageInfo.endCursor);
  };
  const sentinel = useInfiniteScroll(loadMore);

  return (
    <>
      <h1>Feed</h1>
      {unseen.length > 0 && (
        <button
          type="button"
          class="banner"
          onClick={() => {
            setItems((previous) => unique([...unseen, ...previous]));
            setFresh([]);
            window.scrollTo({ top: 0 });
          }}
        >
          {unseen.length === 1 ? '1 new post' : `${unseen.length} new posts`} — show
        </button>
      )}
      {connection?.regenerating && (
        <p class="notice" role="status">
          Welcome back: your timeline is being rebuilt, so this page came straight from the database.
        </p>
      )}
      <ErrorNotice error={page.error ?? catchUpError ?? (mustCatchUp ? null : liveError)} />
      {items.map((item) => (
        <ArticleCard key={idOf(item)} article={item} />
      ))}
      {page.loading && <Loading what="your feed" />}
      {!page.loading && items.length === 0 && <p>Nothing here yet: follow someone below.</p>}
      {connection?.pageInfo.hasNextPage && (
        <button type="button" ref={sentinel} onClick={loadMore}>
          Older posts
        </button>
      )}
      {!page.loading && connection && !connection.pageInfo.hasNextPage && items.length > 0 && (
        <p class="muted">You are all caught up.</p>
      )}
      <People
        viewerId={viewerId}
        onChange={() => {
          // The followee's recent articles join the feed by a background job, shortly.
          setAfter(null);
          page.refetch();
        }}
      />
    </>
  );
}

/** Calls `onVisible` whenever the element it is attached to scrolls into view. */
function useInfiniteScroll(onVisible: () => void) {
  const [element, setElement] = useState<HTMLElement | null>(null);
  const callback = useRef(onVisible);
  callback.current = onVisible;
  useEffect(() => {
    if (!element) return;
    const observer = new IntersectionObserver((entries) => {
      if (entries.some((entry) => entry.isIntersecting)) callback.current();
    });
    observer.observe(element);
    return () => observer.disconnect();
  }, [element]);
  return setElement;
}

function unique(items: Item[]): Item[] {
  const seen = new Set<string>();
  return items.filter((item) => !seen.has(idOf(item)) && !!seen.add(idOf(item)));
}

function People({ viewerId, onChange }: { viewerId: string; onChange(): void }) {
  const authors = useQuery(Authors, {});
  const [overrides, setOverrides] = useState<Record<string, { following: boolean; followers: number }>>({});
  const people = new Map<string, { id: string; handle: string; followerCount: number; viewerFollows: boolean }>();
  for (const node of authors.data?.articles.nodes ?? []) {
    if (node.author.id !== viewerId) people.set(node.author.id, node.author);
  }
  return (
    <Card label="People">
      <h2>People</h2>
      <ErrorNotice error={authors.error} />
      <ul class="people">
        {[...people.values()].map((person) => {
          const state = overrides[person.id] ?? { following: person.viewerFollows, followers: person.followerCount };
          return (
            <li key={person.id}>
              <strong>{person.handle}</strong> <span class="muted">{state.followers} followers</span>{' '}
              <FollowButton
                userId={person.id}
                handle={person.handle}
                following={state.following}
                onChange={(following, followers) => {
                  setOverrides((previous) => ({ ...previous, [person.id]: { following, followers } }));
                  onChange();
                }}
              />
            </li>
          );
        })}
      </ul>
    </Card>
  );
}
