// Subscriptions over HTTP with the stock clients, against a real `pulse serve`: graphql-sse's
// `createClient` in both of its modes, and Apollo Client's HttpLink (multipart subscriptions),
// each receiving a leaderboard snapshot and, signed in, the items of its own feed.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { ApolloClient, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { createClient } from 'graphql-sse';

import { Pulse, unique } from './harness.mjs';

let pulse;

before(async () => {
  pulse = await Pulse.start();
});
after(() => pulse?.close());

const LEADERBOARD = 'subscription($p: ID!) { leaderboardChanged(pollId: $p, first: 3) { version entries { score } } }';
const FEED = 'subscription { feedItemAdded { node { id title } } }';

/** The seeded poll's id. */
async function seededPoll() {
  const data = await pulse.graphql('{ polls(first: 1) { edges { node { id } } } }');
  return data.polls.edges[0].node.id;
}

/** A reader following a fresh author, both signed up. */
async function readerOfAuthor() {
  const author = await pulse.signUp(unique('author'));
  const reader = await pulse.signUp(unique('reader'));
  await pulse.graphql('mutation($u: ID!) { follow(userId: $u) { __typename } }', { u: author.id }, reader.token);
  return { author, reader };
}

/** Publishes as `author` every half second until `arrived` resolves: the subscription may reach
 * the server's live source a moment after the client says it subscribed. */
async function publishUntil(author, title, arrived) {
  let done = false;
  const result = arrived.finally(() => (done = true));
  while (!done) {
    await pulse.graphql(
      'mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id } }',
      { t: title },
      author.token,
    );
    await Promise.race([result, new Promise((ok) => setTimeout(ok, 500))]);
  }
  return result;
}

/** The first result `subscribe(sink)` passes on, within 20 s. */
function first(subscribe) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no result within 20 s')), 20_000);
    const stop = subscribe({
      next: (result) => {
        clearTimeout(timer);
        stop();
        resolve(result);
      },
      error: (error) => {
        clearTimeout(timer);
        reject(error);
      },
      complete: () => {},
    });
  });
}

for (const singleConnection of [false, true]) {
  test(`graphql-sse (${singleConnection ? 'single connection' : 'distinct connections'}) receives a leaderboard snapshot and feed items, signed in`, async () => {
    const poll = await seededPoll();
    const anonymous = createClient({ url: `${pulse.origin}/graphql/stream`, singleConnection, retryAttempts: 0 });
    const snapshot = await first((sink) => anonymous.subscribe({ query: LEADERBOARD, variables: { p: poll } }, sink));
    assert.ok(snapshot.data.leaderboardChanged.entries.length > 0, JSON.stringify(snapshot));
    assert.ok(snapshot.data.leaderboardChanged.entries.length > 0);
    anonymous.dispose();

    const { author, reader } = await readerOfAuthor();
    const client = createClient({
      url: `${pulse.origin}/graphql/stream`,
      singleConnection,
      retryAttempts: 0,
      headers: { Authorization: `Bearer ${reader.token}` },
    });
    const title = unique('over sse');
    const item = await publishUntil(author, title, first((sink) => client.subscribe({ query: FEED }, sink)));
    assert.equal(item.data.feedItemAdded.node.title, title);
    client.dispose();
  });
}

test('Apollo Client (multipart subscriptions) receives a leaderboard snapshot and feed items, signed in', async () => {
  const poll = await seededPoll();
  const apollo = (token) =>
    new ApolloClient({
      link: new HttpLink({ uri: `${pulse.origin}/graphql`, headers: token ? { Authorization: `Bearer ${token}` } : {} }),
      cache: new InMemoryCache(),
    });
  const observe = (client, query, variables) => (sink) => {
    const subscription = client.subscribe({ query: gql(query), variables }).subscribe(sink);
    return () => subscription.unsubscribe();
  };
  const snapshot = await first(observe(apollo(null), LEADERBOARD, { p: poll }));
  assert.ok(snapshot.data.leaderboardChanged.entries.length > 0, JSON.stringify(snapshot));

  const { author, reader } = await readerOfAuthor();
  const title = unique('over multipart');
  const item = await publishUntil(author, title, first(observe(apollo(reader.token), FEED, {})));
  assert.equal(item.data.feedItemAdded.node.title, title);
});
