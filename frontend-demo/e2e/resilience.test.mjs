// A dropped socket says so and heals, a page that could not load heals with it, the feed misses
// nothing published meanwhile, and the app works by keyboard and at phone width. This file
// restarts its server, so it has one of its own.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  assertNoForeign,
  newContext,
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

const PUBLISH = 'mutation($t: String!) { publishArticle(input: { title: $t, body: "b" }) { id title } }';

/** An article of a new author, under a unique title: its id and title. */
async function publishArticle(title) {
  const author = await pulse.signUp(unique('author'));
  return (await pulse.graphql(PUBLISH, { t: unique(title) }, author.token)).publishArticle;
}

/** A new user likes `article` through the API; the page's live like count must show it. */
async function likedFromElsewhere(page, article) {
  const fan = await pulse.signUp(unique('fan'));
  await pulse.graphql('mutation($id: ID!) { like(subjectId: $id) { likeCount } }', { id: article.id }, fan.token);
  await page.getByTestId('like-count').filter({ hasText: /^1$/ }).waitFor();
}

test('a dropped socket shows "reconnecting", then recovers and carries live updates again', async () => {
  const article = await publishArticle('Survives restarts');
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await page.goto(`/#/articles/${encodeURIComponent(article.id)}`);
  const state = page.getByTestId('socket-state');
  await state.filter({ hasText: 'Live' }).waitFor();
  // "Live" is the socket's acknowledgement, which may come before the article and so before its
  // live counters' subscription: the count showing says the page is subscribed.
  const likes = page.getByTestId('like-count');
  await likes.filter({ hasText: /^0$/ }).waitFor();

  await pulse.stop();
  await state.filter({ hasText: 'Reconnecting…' }).waitFor();
  await screenshot(page, 'reconnecting');
  await pulse.serve();
  await state.filter({ hasText: 'Live' }).waitFor({ timeout: 30_000 });

  // The page's subscription was resumed on the new socket: a like from elsewhere shows up.
  await likedFromElsewhere(page, article);
  assertNoForeign(assert, context);
  await context.close();
});

test('a page opened while the server is away says why, then loads by itself once it is back', async () => {
  const article = await publishArticle('Opened while away');
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await page.goto('/');
  const state = page.getByTestId('socket-state');
  await state.filter({ hasText: 'Live' }).waitFor();
  await page.getByTestId('article-card').first().waitFor();

  await pulse.stop();
  await state.filter({ hasText: 'Reconnecting…' }).waitFor();
  // Moving within the loaded app while the server is down: the article's query fails on the network.
  await page.evaluate((id) => (location.hash = `#/articles/${encodeURIComponent(id)}`), article.id);
  const failure = page.getByRole('main').getByRole('alert');
  await failure.waitFor();
  assert.match(await failure.innerText(), /fetch|network/i);
  await screenshot(page, 'opened-while-away');

  await pulse.serve();
  await state.filter({ hasText: 'Live' }).waitFor({ timeout: 30_000 });
  await page.getByRole('heading', { level: 1, name: article.title }).waitFor();
  assert.equal(await failure.count(), 0, 'the network error stays on the page after it loaded');
  // Loaded late, it is live all the same.
  const likes = page.getByTestId('like-count');
  await likes.filter({ hasText: /^0$/ }).waitFor();
  await likedFromElsewhere(page, article);
  assertNoForeign(assert, context);
  await context.close();
});

test('the feed gets what was published while its socket was away', async () => {
  const author = await pulse.signUp(unique('writer'));
  const reader = await pulse.signUp(unique('reader'));
  await pulse.graphql('mutation($u: ID!) { follow(userId: $u) { following } }', { u: author.id }, reader.token);
  const context = await newContext(browser, pulse);
  // The page's socket goes through here, so that the test can cut it and keep it away.
  let away = false;
  let socket = null;
  await context.routeWebSocket(
    (url) => url.host === new URL(pulse.origin).host,
    (route) => {
      if (away) return route.close();
      socket = route;
      route.connectToServer();
    },
  );
  const page = await context.newPage();
  await signInThroughUi(page, reader);
  await page.goto('/#/feed');
  const state = page.getByTestId('socket-state');
  // A first live item: the follow has reached the fan-out, and the page holds a cursor.
  const banner = page.getByRole('button', { name: /new posts? — show/ });
  await waitFor('a first live item', async () => {
    await pulse.graphql(PUBLISH, { t: unique('Before') }, author.token);
    return banner.isVisible();
  });
  await banner.click();

  away = true;
  await socket.close();
  await state.filter({ hasText: 'Reconnecting…' }).waitFor();
  const missed = unique('Published while away');
  await pulse.graphql(PUBLISH, { t: missed }, author.token);
  away = false;
  await state.filter({ hasText: 'Live' }).waitFor({ timeout: 30_000 });
  await banner.waitFor();
  assert.match(await banner.innerText(), /^1 new post —/);
  await banner.click();
  await page.getByTestId('article-card').filter({ hasText: missed }).first().waitFor();
  assertNoForeign(assert, context);
  await context.close();
});

test('every page works at phone width (390 px) without sideways scrolling', async () => {
  const context = await newContext(browser, pulse, { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
  const page = await context.newPage();
  for (const [route, name] of [
    ['/', 'articles'],
    ['/#/feed', 'feed'],
    ['/#/polls', 'leaderboard'],
    ['/#/signin', 'sign-in'],
  ]) {
    await page.goto(route);
    await page.getByRole('main').getByRole('heading', { level: 1 }).waitFor();
    if (route === '/#/polls') await page.getByTestId('board-row').first().waitFor();
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 390, `${route} is ${width} px wide at a 390 px viewport`);
    await screenshot(page, `phone-${name}`);
  }
  assertNoForeign(assert, context);
  await context.close();
});

test('the app can be used with the keyboard alone', async () => {
  const context = await newContext(browser, pulse);
  const page = await context.newPage();
  await page.goto('/');
  await page.getByTestId('article-card').first().waitFor();
  // The first Tab reaches the skip link, which moves focus to the content.
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
  await page.keyboard.press('Enter');
  assert.equal(await page.evaluate(() => document.activeElement?.id), 'main');

  // From the top of a fresh load, Tab through the navigation to Leaderboards; Enter opens it.
  await page.reload();
  await page.getByTestId('article-card').first().waitFor();
  for (let presses = 0; presses < 20; presses += 1) {
    if ((await page.evaluate(() => document.activeElement?.textContent)) === 'Leaderboards') break;
    await page.keyboard.press('Tab');
  }
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Leaderboards');
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: 'Leaderboards' }).waitFor();

  // Every form control has an accessible name.
  for (const route of ['/#/signin', '/#/polls']) {
    await page.goto(route);
    await page.getByRole('main').getByRole('heading', { level: 1 }).waitFor();
    const unnamed = await page.evaluate(() =>
      [...document.querySelectorAll('input, select, textarea, button')]
        .filter((element) => !element.labels?.length && !element.getAttribute('aria-label') && !element.textContent?.trim())
        .map((element) => element.outerHTML),
    );
    assert.deepEqual(unnamed, [], `${route} has controls without a name`);
  }
  assertNoForeign(assert, context);
  await context.close();
});
