// GraphiQL 5, self-hosted: Monaco's workers are bundled by Vite (setup-workers/vite), fonts are
// inlined in GraphiQL's stylesheet, so nothing loads from another host.
import 'graphiql/setup-workers/vite';
import 'graphiql/style.css';
import '@graphiql/plugin-explorer/style.css';

import { explorerPlugin } from '@graphiql/plugin-explorer';
import { createGraphiQLFetcher } from '@graphiql/toolkit';
import { GraphiQL } from 'graphiql';
import { createElement } from 'react';
import { createRoot } from 'react-dom/client';

import { httpEndpoint, storedToken, wsEndpoint } from '../lib/endpoints';

// Subscriptions go over graphql-transport-ws; the toolkit sends the headers pane's JSON as the
// connection_init payload, where Pulse reads `{"Authorization": "Bearer …"}` as a token.
const fetcher = createGraphiQLFetcher({ url: httpEndpoint, subscriptionUrl: wsEndpoint });

const token = storedToken();

const defaultQuery = `# Pulse's GraphQL API. Signed in to the demo
# app at /? Its token is in the headers pane.
# Otherwise run signIn and put the token there:
# {"Authorization": "Bearer <token>"}

query Newest {
  articles(first: 5) {
    edges {
      node { title author { handle } viewCount likeCount }
    }
  }
}
`;

createRoot(document.getElementById('graphiql')!).render(
  createElement(GraphiQL, {
    fetcher,
    plugins: [explorerPlugin()],
    defaultQuery,
    defaultHeaders: token ? JSON.stringify({ Authorization: `Bearer ${token}` }, null, 2) : undefined,
  }),
);
