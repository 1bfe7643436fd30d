// The demo app and GraphiQL in headless Chromium, against a real `pulse serve` seeded by
// `pulse seed-demo`. Every scenario of issue 21's "must show" list is one test; screenshots of
// each page land in e2e/screenshots/.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  assertNoForeign,
  newContext,
  nextOperation,
  screenshot,
  signInThroughUi,
  startServerAndBrowser,
  stopServerAndBrowser,
  unique,
  waitFor,
} from './harness.mjs';

let pulse;
let browser;

before(async () => ({ pulse, browser } = await startServerAndBrowser()));
after(() => stopServerAndBrowser({ pulse, browser }));

const ADMIN = { handle: 'alice', password: 'pulse-demo-password' };

test('GraphiQL renders, runs a query and a subscription, from this server alone', async () => {
  const context = await newContext(browser, pulse, { viewport: { width: 1600, height: 900 } });
  const page = await context.newPage();
  // What a browser's address bar sends: GraphiQL, not a GraphQL answer.
  await page.goto('/graphql');
  const editor = page.locator('.graphiql-query-editor .monaco-editor').first();
  await editor.waitFor();
  const run = page.getByRole('button', { name: /Execute query/ });
  const result = page.locator('.result-window');
  // Monaco renders spaces as no-break spaces, and wraps long lines in a narrow pane.
  const resultShows = (text) => async () => (await result.innerText()).replace(/\s+/g, ' ').includes(text);

  // The explorer plugin lists the schema; the starting query runs as it is.
  await page.getByRole('button', { name: 'Show GraphiQL Explorer' }).click();
  await page.getByText('Explorer', { exact: true }).waitFor();
  await run.click();
  await waitFor('the query result in GraphiQL', resultShows('"handle": "dana"'));
  await screenshot(page, 'graphiql');

  await editor.click();
  await page.keyboard.press('ControlOrMeta+A');
  await page.keyboard.press('Delete');
  await page.keyboard.type('subscription Live { articlePublished { title } }');
  // GraphiQL picks the operation by name; its tab shows the name once it has read the new text.
  await page.locator('.graphiql-tab').filter({ hasText: 'Live' }).waitFor();
  await run.click();
  const writer = await pulse.signUp(unique('gql'));
  const title = unique('Live from GraphiQL');
  // The subscription may still be starting: publish until one arrives (each publish is new).
  await waitFor('the subscription result in GraphiQL', async () => {
    await pulse.graphql(
      'mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id } }',
      { t: title },
      writer.token,
    );
    return resultShows(title)();
  });
  assertNoForeign(assert, context);
  await context.close();
});

test('sign up, publish, and open the article twice: its view count moves once', async () => {
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await page.goto('/');
  await page.getByRole('link', { name: 'Sign in' }).click();
  const handle = unique('reader');
  await page.getByLabel('Handle').fill(handle);
  await page.getByLabel('Password').fill('a-long-password');
  await page.getByRole('button', { name: 'Sign up' }).click();
  await page.getByTestId('viewer').filter({ hasText: handle }).waitFor();
  await screenshot(page, 'articles');

  const title = unique('My first article');
  await page.getByLabel('Title').fill(title);
  await page.getByLabel('Body').fill('Written in the browser.');
  await page.getByRole('button', { name: 'Publish' }).click();
  const card = page.getByTestId('article-card').filter({ hasText: title });
  await card.waitFor();
  assert.equal(await card.getByTestId('view-count').textContent(), '0');

  await card.getByRole('link', { name: title }).click();
  const views = page.getByTestId('view-count');
  await views.filter({ hasText: /^1$/ }).waitFor();
  await screenshot(page, 'article');
  await page.getByRole('link', { name: '← Articles' }).click();
  // The second open records a view too, which Pulse answers as a duplicate: still 1.
  const secondView = nextOperation(page, 'RecordView');
  await page.getByTestId('article-card').filter({ hasText: title }).getByRole('link', { name: title }).click();
  assert.equal((await (await secondView).json()).data.recordView.counted, false);
  await views.filter({ hasText: /^1$/ }).waitFor();
  const stored = await pulse.graphql('{ articles(first: 50) { nodes { title viewCount } } }');
  assert.equal(stored.articles.nodes.find((node) => node.title === title).viewCount, 1);
  assertNoForeign(assert, context);
  await context.close();
});

test('a like toggles, and the count moves in a second browser without a reload', async () => {
  const author = await pulse.signUp(unique('author'));
  const title = unique('Likeable');
  await pulse.graphql('mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id } }', { t: title }, author.token);
  const liker = await pulse.signUp(unique('liker'));

  const first = await newContext(browser, pulse);
  const second = await newContext(browser, pulse);
  const likerPage = await first.newPage();
  const watcherPage = await second.newPage();
  await signInThroughUi(likerPage, liker);
  await watcherPage.goto('/');
  const likerCard = likerPage.getByTestId('article-card').filter({ hasText: title });
  const watcherCount = watcherPage.getByTestId('article-card').filter({ hasText: title }).getByTestId('like-count');
  await watcherCount.filter({ hasText: /^0$/ }).waitFor();

  await likerCard.getByRole('button', { name: '♡ Like' }).click();
  await likerCard.getByRole('button', { name: '♥ Liked' }).waitFor();
  assert.equal(await likerCard.getByTestId('like-count').textContent(), '1');
  await watcherCount.filter({ hasText: /^1$/ }).waitFor();

  await likerCard.getByRole('button', { name: '♥ Liked' }).click();
  await likerCard.getByRole('button', { name: '♡ Like' }).waitFor();
  await watcherCount.filter({ hasText: /^0$/ }).waitFor();
  assertNoForeign(assert, first, second);
  await first.close();
  await second.close();
});

test('a vote in one browser moves the chart in another', async () => {
  const voter = await pulse.signUp(unique('voter'));
  const first = await newContext(browser, pulse);
  const second = await newContext(browser, pulse);
  const voterPage = await first.newPage();
  const watcherPage = await second.newPage();
  await signInThroughUi(voterPage, voter);
  await voterPage.goto('/#/polls');
  await watcherPage.goto('/#/polls');
  const option = 'Designing for the reconnect';
  const row = (page) => page.locator(`[data-testid="board-row"][data-option="${option}"]`);
  await row(watcherPage).waitFor();
  await row(voterPage).getByTestId('previous-period').filter({ hasText: /vs last day/ }).waitFor();
  await screenshot(voterPage, 'dashboard');
  await watcherPage.getByRole('radio', { name: 'All time' }).check();
  await voterPage.getByRole('radio', { name: 'All time' }).check();
  const before = Number(await row(watcherPage).getByTestId('score').textContent());
  await screenshot(watcherPage, 'leaderboard');

  await row(voterPage).getByRole('button', { name: `Vote for ${option}` }).click();
  await row(voterPage).getByText('Counted').waitFor();
  await row(watcherPage).getByTestId('score').filter({ hasText: String(before + 1) }).waitFor();

  // The poll allows 5 votes a minute per voter: the sixth says which rule refused it and when to retry.
  for (let i = 0; i < 5; i += 1) {
    const answered = nextOperation(voterPage, 'CastVote');
    await row(voterPage).getByRole('button', { name: `Vote for ${option}` }).click();
    await answered;
  }
  const refusal = row(voterPage).getByRole('alert');
  await refusal.filter({ hasText: /Not counted: RATE_LIMITED \(5 per minute per voter\); retry in \d+ s/ }).waitFor();
  await screenshot(voterPage, 'leaderboard-rate-limited');
  assertNoForeign(assert, first, second);
  await first.close();
  await second.close();
});

test("a followed author's new post raises the feed banner", async () => {
  const author = await pulse.signUp(unique('writer'));
  await pulse.graphql('mutation { publishArticle(input: { title: "Hello, followers", body: "b" }) { id } }', {}, author.token);
  const reader = await pulse.signUp(unique('follower'));
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await signInThroughUi(page, reader);
  await page.goto('/#/feed');
  await page.getByRole('button', { name: `Follow ${author.handle}` }).click();
  await page.getByRole('button', { name: `Unfollow ${author.handle}` }).waitFor();

  const title = unique('Fresh post');
  // The follow reaches the feed's fan-out through a background job: publish until the banner
  // shows (each publish is a new article; the first ones may land before the follow does).
  const banner = page.getByRole('button', { name: /new posts? — show/ });
  await waitFor('the new-posts banner', async () => {
    await pulse.graphql('mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id } }', { t: title }, author.token);
    return banner.isVisible();
  });
  await screenshot(page, 'feed');
  await banner.click();
  await page.getByTestId('article-card').filter({ hasText: title }).first().waitFor();
  assertNoForeign(assert, context);
  await context.close();
});

test('an admin creates a poll that then accepts votes', async () => {
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await signInThroughUi(page, ADMIN);
  await page.getByRole('link', { name: 'Admin' }).click();
  const title = unique('Lunch');
  await page.getByLabel('Title').fill(title);
  await page.getByLabel('Option 1 label').fill('Noodles');
  await page.getByLabel('Option 2 label').fill('Salad');
  await page.getByRole('button', { name: 'Add an option' }).click();
  await page.getByLabel('Option 3 label').fill('Soup');
  await page.getByLabel('Bonus per vote').nth(2).fill('3');
  await page.getByLabel('Initial votes').first().fill('10');
  await screenshot(page, 'admin');
  await page.getByRole('button', { name: 'Create poll' }).click();
  await page.getByRole('status').filter({ hasText: `Created ${title}` }).waitFor();
  await page.getByRole('link', { name: title }).first().click();

  const soup = page.locator('[data-testid="board-row"][data-option="Soup"]');
  await soup.getByRole('button', { name: 'Vote for Soup' }).click();
  await soup.getByText('Counted').waitFor();
  await page.getByRole('radio', { name: 'All time' }).check();
  // DISPLAY counts Soup's bonus of 3; REAL counts the one vote.
  await page.locator('[data-testid="board-row"][data-option="Soup"] [data-testid="score"]').filter({ hasText: /^3$/ }).waitFor();
  await page.getByRole('radio', { name: 'Real votes' }).check();
  await page.locator('[data-testid="board-row"][data-option="Soup"] [data-testid="score"]').filter({ hasText: /^1$/ }).waitFor();

  // Closed, the poll takes no more votes.
  await page.getByRole('link', { name: 'Admin' }).click();
  await page.getByRole('button', { name: `Close ${title}` }).click();
  await page.getByRole('listitem').filter({ hasText: title }).getByText('closed').waitFor();
  await page.getByRole('link', { name: title }).click();
  await page.getByText(/^Closed ·/).waitFor();
  assert.equal(await soup.getByRole('button', { name: 'Vote for Soup' }).isDisabled(), true);
  assertNoForeign(assert, context);
  await context.close();
});

test('an API error is shown in words, with its code', async () => {
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await page.goto('/#/signin');
  await page.getByLabel('Handle').fill('alice');
  await page.getByLabel('Password').fill('not-the-password');
  await page.getByRole('button', { name: 'Sign in' }).click();
  const alert = page.getByRole('alert');
  await alert.filter({ hasText: 'UNAUTHENTICATED' }).waitFor();
  assert.match(await alert.textContent(), /handle or password/i);
  await screenshot(page, 'sign-in-error');
  assertNoForeign(assert, context);
  await context.close();
});

test('seed-demo gave every page something to show, and a second run adds nothing', async () => {
  assert.match(pulse.seedOutput, /29 users .* 12 articles, 36 comments, \d+ likes, \d+ views, \d+ follows, a poll with 96 votes/);
  const count = async () => (await pulse.graphql('{ polls(first: 50) { nodes { id } } user(handle: "maya") { followerCount articles(first: 50) { nodes { id } } } }'));
  const before = await count();
  assert.equal(before.user.followerCount, 25);
  assert.match(pulse.seed(), /the demo data is there already/);
  assert.deepEqual(await count(), before);
});
