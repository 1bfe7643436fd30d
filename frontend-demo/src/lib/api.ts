// One urql client for queries and mutations over HTTP, and one graphql-ws client for
// subscriptions over /graphql/ws; both carry the session token. A new pair is made whenever the
// session changes, so a socket never outlives the identity it authenticated.
import { Client, CombinedError, fetchExchange, subscriptionExchange } from '@urql/core';
import { createClient as createWsClient, type Client as WsClient } from 'graphql-ws';

import { httpEndpoint, wsEndpoint } from './endpoints';

/** What the live socket is doing, for the status shown in the header. */
export type SocketState = 'connecting' | 'live' | 'reconnecting';

export interface Api {
  client: Client;
  ws: WsClient;
  dispose(): void;
}

export function createApi(token: string | null, onSocketState: (state: SocketState) => void): Api {
  let everConnected = false;
  let disposed = false;
  const report = (state: SocketState) => {
    if (!disposed) onSocketState(state);
  };
  const ws = createWsClient({
    url: wsEndpoint,
    // One socket for the page's life, opened at once: the header shows its state, and moving
    // between pages only adds and removes subscriptions on it.
    lazy: false,
    connectionParams: () => (token ? { token } : {}),
    // Reconnect for as long as the page is open: a server restart or a dropped network must heal
    // by itself. Backoff grows to at most 5 s, with jitter so clients do not return in step.
    retryAttempts: Infinity,
    shouldRetry: () => true,
    retryWait: (retries) =>
      new Promise((resolve) => setTimeout(resolve, Math.min(5000, 500 * 2 ** retries) + Math.random() * 300)),
    on: {
      connecting: () => report(everConnected ? 'reconnecting' : 'connecting'),
      connected: () => {
        everConnected = true;
        report('live');
      },
      closed: () => {
        if (everConnected) report('reconnecting');
      },
    },
  });
  const client = new Client({
    url: httpEndpoint,
    // Counters move all the time: always ask the server, never a cache.
    requestPolicy: 'network-only',
    preferGetMethod: false,
    fetchOptions: () => (token ? { headers: { Authorization: `Bearer ${token}` } } : {}),
    exchanges: [
      fetchExchange,
      subscriptionExchange({
        forwardSubscription: (request) => ({
          subscribe: (sink) => ({ unsubscribe: ws.subscribe({ ...request, query: request.query ?? '' }, sink) }),
        }),
      }),
    ],
  });
  return {
    client,
    ws,
    dispose: () => {
      disposed = true;
      void ws.dispose();
    },
  };
}

/** One error as a person should read it: the message, and the code a developer can look up. */
export interface ErrorLine {
  message: string;
  code: string | null;
}

export function errorLines(error: CombinedError | Error): ErrorLine[] {
  if (error instanceof CombinedError) {
    if (error.graphQLErrors.length > 0) {
      return error.graphQLErrors.map((e) => ({
        message: e.message,
        code: typeof e.extensions?.code === 'string' ? e.extensions.code : null,
      }));
    }
    if (error.networkError) return [{ message: `Network: ${error.networkError.message}`, code: null }];
  }
  return [{ message: error.message, code: null }];
}
