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

// A resumed feed replays at most this many items; past it the page must catch up by itself.
const REPLAY_LIMIT = 3;

before(async () => ({ pulse, browser } = await startServerAndBrowser({ PULSE_REPLAY_LIMIT: String(REPLAY_LIMIT) })));
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

/**
 * A browser context whose page socket goes through the test, which can cut it and keep it away:
 * `missWhileAway` cuts it, publishes `count` articles of `author` meanwhile, lets it back and
 * waits until `page` is live again; it returns their titles, oldest first.
 */
async function cuttableContext() {
  const context = await newContext(browser, pulse);
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
  const missWhileAway = async (page, author, count, prefix) => {
    const state = page.getByTestId('socket-state');
    away = true;
    await socket.close();
    await state.filter({ hasText: 'Reconnecting…' }).waitFor();
    const titles = [];
    for (let i = 0; i < count; i++) {
      titles.push(unique(prefix));
      await pulse.graphql(PUBLISH, { t: titles.at(-1) }, author.token);
    }
    away = false;
    await state.filter({ hasText: 'Live' }).waitFor({ timeout: 30_000 });
    return titles;
  };
  return { context, missWhileAway };
}

/**
 * A reader following an author, on the feed page of a cuttable context, once a first live item
 * has come (the follow has reached the fan-out, and the page holds a cursor) and been shown.
 */
async function feedWithALiveItem() {
  const author = await pulse.signUp(unique('writer'));
  const reader = await pulse.signUp(unique('reader'));
  await pulse.graphql('mutation($u: ID!) { follow(userId: $u) { following } }', { u: author.id }, reader.token);
  const { context, missWhileAway } = await cuttableContext();
  const page = await context.newPage();
  await signInThroughUi(page, reader);
  await page.goto('/#/feed');
  const banner = page.getByRole('button', { name: /new posts? — show/ });
  await waitFor('a first live item', async () => {
    await pulse.graphql(PUBLISH, { t: unique('Before') }, author.token);
    return banner.isVisible();
  });
  await banner.click();
  return { author, reader, context, page, banner, missWhileAway };
}

test('the feed gets what was published while its socket was away', async () => {
  const { author, reader, context, page, banner, missWhileAway } = await feedWithALiveItem();
  const shownBefore = await titlesShown(page);
  const [missed] = await missWhileAway(page, author, 1, 'Published while away');
  await banner.waitFor();
  // The missed post, and any first try above that reached the page after the banner was taken.
  const lacking = await feedTitlesLacking(reader, shownBefore);
  assert.ok(lacking.includes(missed));
  await bannerOffers(banner, lacking.length);
  await banner.click();
  await page.getByTestId('article-card').filter({ hasText: missed }).first().waitFor();
  assertNoForeign(assert, context);
  await context.close();
});

test('a feed that missed more than the server replays catches up by itself, without a gap', async () => {
  const { author, reader, context, page, banner, missWhileAway } = await feedWithALiveItem();
  const cards = page.getByTestId('article-card');
  const resync = page.getByText('RESYNC_REQUIRED');

  // More than the server replays, fewer than a page: offered as new posts, as a replay would be,
  // with whatever else the page lacks (a first try above that was published before the page
  // listened).
  const shownBefore = await titlesShown(page);
  const missed = await missWhileAway(page, author, REPLAY_LIMIT + 1, 'Missed');
  await banner.waitFor();
  const lacking = await feedTitlesLacking(reader, shownBefore);
  assert.ok(missed.every((title) => lacking.includes(title)));
  await bannerOffers(banner, lacking.length);
  await banner.click();
  for (const title of missed) await cards.filter({ hasText: title }).first().waitFor();
  assert.equal(await resync.count(), 0, 'the catch-up is not shown as an error');

  // More than a page (10): the list starts again from the newest, with nothing skipped between.
  const many = await missWhileAway(page, author, 12, 'Many');
  await waitFor('the list restarted from the newest post', async () => (await cards.first().innerText()).includes(many.at(-1)));
  const shown = await cards.allInnerTexts();
  for (const [i, title] of many.slice(-10).reverse().entries()) assert.ok(shown[i].includes(title), `card ${i}: ${title}`);
  assert.equal(await banner.count(), 0, 'nothing left to offer');
  assert.equal(await resync.count(), 0, 'the catch-up is not shown as an error');

  // And live items flow again after the catch-up.
  const after = unique('After');
  await pulse.graphql(PUBLISH, { t: after }, author.token);
  await banner.waitFor();
  await banner.click();
  await cards.filter({ hasText: after }).first().waitFor();
  assertNoForeign(assert, context);
  await context.close();
});

test('the articles list gets what was published while its socket was away, and starts again past what the server replays', async () => {
  const author = await pulse.signUp(unique('writer'));
  const { context, missWhileAway } = await cuttableContext();
  const page = await context.newPage();
  await page.goto('/');
  const cards = page.getByTestId('article-card');
  const first = unique('Live before');
  await waitFor('a live article', async () => {
    await pulse.graphql(PUBLISH, { t: first }, author.token);
    return (await cards.filter({ hasText: first }).count()) > 0;
  });

  // A second page, so that a replay (which adds to the list) and a restart (which starts it
  // again at one page) tell themselves apart.
  await page.getByRole('button', { name: 'More articles' }).click();
  // Two pages of ten (the live article is one of them, or the eleventh): the count a first page
  // alone never reaches.
  await waitFor('a second page', async () => (await cards.count()) >= 20);
  const before = await cards.count();

  // Within what the server replays (its journal keeps REPLAY_LIMIT, the newest known among them):
  // each arrives, newest first, above what was there.
  const replayed = await missWhileAway(page, author, REPLAY_LIMIT - 1, 'Replayed');
  await waitFor('the missed articles', async () => (await cards.first().innerText()).includes(replayed.at(-1)));
  const shown = await cards.allInnerTexts();
  for (const [i, title] of [...replayed].reverse().entries()) assert.ok(shown[i].includes(title), `card ${i}: ${title}`);
  assert.ok(shown[replayed.length].includes(first), 'what was there stays below');
  assert.equal(shown.length, before + replayed.length, 'replayed into the list, not read again');

  // Past it: the list starts again from the top, with nothing skipped, and no error shown.
  const many = await missWhileAway(page, author, 12, 'Many');
  await waitFor('the list restarted from the newest article', async () => (await cards.first().innerText()).includes(many.at(-1)));
  const restarted = await cards.allInnerTexts();
  assert.equal(restarted.length, 10, 'one page again');
  for (const [i, title] of many.slice(-10).reverse().entries()) assert.ok(restarted[i].includes(title), `card ${i}: ${title}`);
  assert.equal(await page.getByText('RESYNC_REQUIRED').count(), 0, 'the restart is not shown as an error');
  const after = unique('Live after');
  await pulse.graphql(PUBLISH, { t: after }, author.token);
  await waitFor('live articles again', async () => (await cards.first().innerText()).includes(after));
  assertNoForeign(assert, context);
  await context.close();
});

/** Waits until the feed's banner offers `count` new posts (they may arrive one by one). */
async function bannerOffers(banner, count) {
  const offer = new RegExp(`^${count} new posts? —`);
  let text = '';
  await waitFor(`the banner to offer ${count} new posts`, async () => offer.test((text = await banner.innerText())), 10).catch(
    (error) => assert.fail(`${error.message}: it says "${text}"`),
  );
}

/** The titles of the article cards on `page`. */
async function titlesShown(page) {
  return new Set(await page.getByTestId('article-card').evaluateAll((cards) => cards.map((card) => card.dataset.title)));
}

/** The titles of `reader`'s newest feed page that are not in `shown`. */
async function feedTitlesLacking(reader, shown) {
  const { feed } = await pulse.graphql('{ feed(first: 10) { edges { node { title } } } }', {}, reader.token);
  return feed.edges.map((edge) => edge.node.title).filter((title) => !shown.has(title));
}

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
