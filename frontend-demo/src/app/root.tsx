import type { CombinedError } from '@urql/core';
import { useEffect, useMemo, useState } from 'preact/hooks';

import { createApi, type SocketState } from '../lib/api';
import { storedToken, storeToken } from '../lib/endpoints';
import { graphql } from '../lib/graphql';
import { ErrorNotice } from './components';
import { type Session, SessionContext, type Viewer } from './context';
import { AdminPage } from './pages/admin';
import { ArticlePage } from './pages/article';
import { ArticlesPage } from './pages/articles';
import { AuthPage } from './pages/auth';
import { FeedPage } from './pages/feed';
import { PollsPage } from './pages/polls';

const ViewerQuery = graphql(`
  query Viewer { viewer { id handle isAdmin } }
`);

/** Pages live in the URL's fragment (`#/feed`), so the server needs to know no routes. */
function useRoute(): string[] {
  const read = () => location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  const [route, setRoute] = useState(read);
  useEffect(() => {
    const changed = () => setRoute(read());
    addEventListener('hashchange', changed);
    return () => removeEventListener('hashchange', changed);
  }, []);
  return route;
}

export function Root() {
  const [token, setToken] = useState(storedToken);
  const [socket, setSocket] = useState<SocketState>('connecting');
  const [connections, setConnections] = useState(0);
  const api = useMemo(
    () =>
      createApi(token, (state) => {
        setSocket(state);
        if (state === 'live') setConnections((n) => n + 1);
      }),
    [token],
  );
  useEffect(() => () => api.dispose(), [api]);

  const [viewer, setViewer] = useState<{ for: string | null; viewer: Viewer | null } | null>(null);
  const [viewerError, setViewerError] = useState<CombinedError | null>(null);
  const [viewerAttempt, setViewerAttempt] = useState(0);
  useEffect(() => {
    let current = true;
    api.client
      .query(ViewerQuery, {})
      .toPromise()
      .then((result) => {
        if (!current) return;
        const code = result.error?.graphQLErrors[0]?.extensions?.code;
        if (code === 'UNAUTHENTICATED' && token) {
          // A token the server no longer accepts (expired, or another secret): start anonymous.
          storeToken(null);
          setToken(null);
          return;
        }
        setViewerError(result.error ?? null);
        // Unreachable is not anonymous: the pages wait for an answer, asked again when the
        // socket connects.
        if (!result.error?.networkError) setViewer({ for: token, viewer: result.data?.viewer ?? null });
      });
    return () => {
      current = false;
    };
  }, [api, viewerAttempt]);
  useEffect(() => {
    if (viewerError?.networkError) setViewerAttempt((n) => n + 1);
  }, [connections]);

  const session: Session = {
    api,
    viewer: viewer?.viewer ?? null,
    connections,
    signIn(next) {
      storeToken(next);
      setToken(next);
    },
    signOut() {
      storeToken(null);
      setToken(null);
    },
  };
  const route = useRoute();
  const ready = viewer !== null && viewer.for === token;

  return (
    <SessionContext.Provider value={session}>
      <a class="skip" href="#main" onClick={(e) => (e.preventDefault(), document.getElementById('main')?.focus())}>
        Skip to content
      </a>
      <header>
        <nav aria-label="Main">
          <a class="brand" href="#/">
            Pulse
          </a>
          <a href="#/" aria-current={route[0] === undefined || route[0] === 'articles' ? 'page' : undefined}>
            Articles
          </a>
          <a href="#/feed" aria-current={route[0] === 'feed' ? 'page' : undefined}>
            Feed
          </a>
          <a href="#/polls" aria-current={route[0] === 'polls' ? 'page' : undefined}>
            Leaderboards
          </a>
          {session.viewer?.isAdmin && (
            <a href="#/admin" aria-current={route[0] === 'admin' ? 'page' : undefined}>
              Admin
            </a>
          )}
          <a href="/graphql">GraphiQL</a>
        </nav>
        <div class="who">
          <span class={`socket ${socket}`} role="status" data-testid="socket-state">
            {socket === 'live' ? 'Live' : socket === 'connecting' ? 'Connecting…' : 'Reconnecting…'}
          </span>
          {session.viewer ? (
            <>
              <span data-testid="viewer">{session.viewer.handle}</span>
              <button type="button" class="secondary" onClick={session.signOut}>
                Sign out
              </button>
            </>
          ) : (
            <a href="#/signin">Sign in</a>
          )}
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        <ErrorNotice error={viewerError} />
        {ready ? <Page key={token ?? 'anonymous'} route={route} /> : <p class="muted">Loading…</p>}
      </main>
    </SessionContext.Provider>
  );
}

function Page({ route }: { route: string[] }) {
  const [name, id] = route;
  switch (name) {
    case undefined:
    case 'articles':
      return id ? <ArticlePage id={id} /> : <ArticlesPage />;
    case 'feed':
      return <FeedPage />;
    case 'polls':
      return <PollsPage id={id ?? null} />;
    case 'admin':
      return <AdminPage />;
    case 'signin':
      return <AuthPage />;
    default:
      return <p role="alert">There is no page at #/{route.join('/')}.</p>;
  }
}
