// The stock clients of the HTTP subscription transports against a real `pulse serve`, as an app
// would use them: graphql-sse's `createClient` in both of its modes (a stream per operation at
// /graphql/stream, and one reserved stream carrying every operation) and Apollo Client's
// `HttpLink`, which sends subscriptions as multipart HTTP. Each receives leaderboard snapshots
// (anonymous) and feed items (signed in, by the Authorization header), and is refused a bad token.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ApolloClient, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { createClient } from 'graphql-sse';

import { Pulse, unique, waitFor } from './harness.mjs';

let pulse;
let poll;

before(async () => {
  pulse = await Pulse.start();
  const data = await pulse.graphql('{ polls(first: 1) { nodes { id options { id } } } }');
  [poll] = data.polls.nodes;
  assert.ok(poll, 'the demo seed has a poll');
});

after(async () => {
  await pulse?.close();
});

const LEADERBOARD = `subscription($poll: ID!) {
  leaderboardChanged(pollId: $poll, first: 50) { version entries { option { id } score } }
}`;
const FEED = 'subscription { feedItemAdded { cursor node { title } } }';

/**
 * What an error says, whichever client raised it: a GraphQL error's code, a response's status, or
 * the message of an error thrown for either.
 */
function describeError(error) {
  return [
    error?.message,
    error?.extensions?.code,
    error?.response?.status,
    error?.statusCode,
    error?.errors?.map((inner) => inner?.extensions?.code),
  ]
    .flat()
    .filter((part) => part !== undefined && part !== null)
    .join(' ');
}

/** The option's score in a snapshot (0 when it is not on the board). */
function scoreOf(snapshot, option) {
  return snapshot.entries.find((entry) => entry.option.id === option)?.score ?? 0;
}

/** Waits for `check`, failing at once with the stream's first error instead of timing out. */
function until(what, stream, check) {
  return waitFor(what, () => {
    if (stream.errors.length > 0) throw new Error(`${what}: ${stream.errors.map(describeError).join('; ')}`);
    return check();
  });
}

/** A new voter casts one ballot for `option`; the server must count it. */
async function vote(option) {
  const voter = await pulse.signUp(unique('voter'));
  const data = await pulse.graphql(
    'mutation($poll: ID!, $option: ID!) { castVotes(input: { ballots: [{ pollId: $poll, optionId: $option }] }) { results { accepted reason } } }',
    { poll: poll.id, option },
    voter.token,
  );
  assert.equal(data.castVotes.results[0].accepted, true, JSON.stringify(data.castVotes.results[0]));
}

/** An author and a reader who follows them. */
async function authorAndFollower() {
  const author = await pulse.signUp(unique('author'));
  const reader = await pulse.signUp(unique('reader'));
  await pulse.graphql('mutation($id: ID!) { follow(userId: $id) { following } }', { id: author.id }, reader.token);
  return { author, reader };
}

/**
 * Publishes as `author` until `received` holds an item titled `title`: the follow reaches the
 * feed's fan-out through a background job, so the first articles may be published before it.
 */
async function publishUntilDelivered(author, title, feed) {
  const received = feed.received;
  await until(`the feed item "${title}"`, feed, async () => {
    if (received.some((item) => item.node.title === title)) return true;
    await pulse.graphql('mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id } }', { t: title }, author.token);
    await new Promise((ok) => setTimeout(ok, 300));
    return received.some((item) => item.node.title === title);
  });
}

/**
 * One transport as the tests drive it: `subscribe` starts an operation and returns
 * `{ received, errors, stop }`, filling `received` with each `data` payload's value of `field`
 * and `errors` with each GraphQL or transport error.
 */
function sseTransport(singleConnection) {
  return (token) => {
    const client = createClient({
      url: `${pulse.origin}/graphql/stream`,
      singleConnection,
      headers: token ? { authorization: `Bearer ${token}` } : {},
      retryAttempts: 0,
    });
    return {
      subscribe(query, variables, field) {
        const received = [];
        const errors = [];
        const stop = client.subscribe(
          { query, variables },
          {
            next: (result) => {
              if (result.errors) errors.push(...result.errors);
              if (result.data?.[field]) received.push(result.data[field]);
            },
            error: (error) => errors.push(error),
            complete: () => {},
          },
        );
        return { received, errors, stop };
      },
      dispose: () => client.dispose(),
    };
  };
}

function apolloTransport(token) {
  const client = new ApolloClient({
    link: new HttpLink({
      uri: `${pulse.origin}/graphql`,
      headers: token ? { authorization: `Bearer ${token}` } : {},
    }),
    cache: new InMemoryCache(),
  });
  return {
    subscribe(query, variables, field) {
      const received = [];
      const errors = [];
      const subscription = client.subscribe({ query: gql(query), variables }).subscribe({
        next: (result) => {
          if (result.error) errors.push(result.error);
          if (result.data?.[field]) received.push(result.data[field]);
        },
        error: (error) => errors.push(error),
      });
      return { received, errors, stop: () => subscription.unsubscribe() };
    },
    dispose: () => client.stop(),
  };
}

const transports = [
  ['graphql-sse, distinct connections', sseTransport(false)],
  ['graphql-sse, single connection', sseTransport(true)],
  ['Apollo Client multipart (HttpLink)', apolloTransport],
];

for (const [name, connect] of transports) {
  describe(name, () => {
    test('receives leaderboard snapshots, the first at once and then one after a vote', async () => {
      const client = connect(null);
      const [, option] = poll.options;
      const board = client.subscribe(LEADERBOARD, { poll: poll.id }, 'leaderboardChanged');
      try {
        await until('the first snapshot', board, () => board.received.length > 0);
        const first = board.received[0];
        await vote(option.id);
        await until('a snapshot with the vote', board, () =>
          board.received.some((snapshot) => scoreOf(snapshot, option.id) === scoreOf(first, option.id) + 1),
        );
        const versions = board.received.map((snapshot) => BigInt(snapshot.version));
        assert.deepEqual(versions, [...versions].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)), 'versions grow');
        assert.deepEqual(board.errors, []);
      } finally {
        board.stop();
        client.dispose();
      }
    });

    test("receives the signed-in reader's feed items, and only theirs", async () => {
      const { author, reader } = await authorAndFollower();
      const stranger = await pulse.signUp(unique('stranger'));
      const readerClient = connect(reader.token);
      const strangerClient = connect(stranger.token);
      const feed = readerClient.subscribe(FEED, {}, 'feedItemAdded');
      const strangerFeed = strangerClient.subscribe(FEED, {}, 'feedItemAdded');
      try {
        const title = unique('Live over HTTP');
        await publishUntilDelivered(author, title, feed);
        assert.ok(feed.received.every((item) => typeof item.cursor === 'string' && item.cursor.length > 0));
        assert.deepEqual(feed.errors, []);
        assert.deepEqual(strangerFeed.received, [], 'a reader who follows nobody gets nothing');
      } finally {
        feed.stop();
        strangerFeed.stop();
        readerClient.dispose();
        strangerClient.dispose();
      }
    });

    test('a bad token is refused and nothing is delivered', async () => {
      const client = connect('not-a-token');
      const feed = client.subscribe(FEED, {}, 'feedItemAdded');
      try {
        await waitFor('the refusal', () => feed.errors.length > 0);
        assert.deepEqual(feed.received, []);
        assert.match(feed.errors.map(describeError).join('\n'), /UNAUTHENTICATED|401/);
      } finally {
        feed.stop();
        client.dispose();
      }
    });
  });
}
