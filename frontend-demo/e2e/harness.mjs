// What every end-to-end test stands on: a real `pulse serve` of its own (its own data dir, SQLite
// file and Redis prefix, a free port), headless Chromium (Debian's, driven by playwright-core),
// and a guard that aborts and records every request to any other host.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const repository = resolve(here, '../..');

export const PULSE_BIN = process.env.PULSE_BIN ?? join(repository, 'target/debug/pulse');
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
export const SCREENSHOTS = process.env.E2E_SCREENSHOTS ?? join(here, 'screenshots');
const REDIS_URL = process.env.PULSE_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A free loopback port, so a restarted server can come back on the same address. */
async function freePort() {
  const server = createServer();
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  const { port } = server.address();
  await new Promise((ok) => server.close(ok));
  return port;
}

/** The environment for `pulse`, without the developer's own Pulse settings. */
function pulseEnv(settings) {
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([name]) => !(name.startsWith('PULSE_') || name === 'DATABASE_URL' || name === 'REDIS_URL')),
  );
  return { ...env, ...settings, RUST_LOG: process.env.RUST_LOG ?? 'warn' };
}

export class Pulse {
  /** A server of its own, with `settings` (environment variables) over the defaults below. */
  static async start(settings = {}) {
    const pulse = new Pulse();
    pulse.dataDir = mkdtempSync(join(tmpdir(), 'pulse-e2e-'));
    pulse.port = await freePort();
    pulse.env = pulseEnv({
      PULSE_DATA_DIR: pulse.dataDir,
      REDIS_URL,
      PULSE_REDIS_PREFIX: `e2e:${randomBytes(6).toString('hex')}:`,
      PULSE_LISTEN: `127.0.0.1:${pulse.port}`,
      PULSE_DEV: 'true',
      // Live counters and boards push at most this often: short, so tests wait little.
      PULSE_STATS_TICK: '200ms',
      PULSE_LEADERBOARD_TICK: '200ms',
      PULSE_JOB_POLL: '50ms',
      ...settings,
    });
    pulse.origin = `http://127.0.0.1:${pulse.port}`;
    pulse.seedOutput = pulse.seed();
    await pulse.serve();
    return pulse;
  }

  /** Runs `pulse seed-demo` on this server's data; returns what it printed. */
  seed() {
    const seeded = spawnSync(PULSE_BIN, ['seed-demo'], { env: this.env, encoding: 'utf8' });
    if (seeded.status !== 0) throw new Error(`pulse seed-demo failed: ${seeded.stderr}`);
    return seeded.stdout;
  }

  async serve() {
    this.logs = '';
    this.process = spawn(PULSE_BIN, ['serve'], { env: this.env, stdio: ['ignore', 'ignore', 'pipe'] });
    this.process.stderr.on('data', (chunk) => (this.logs += chunk));
    this.exited = new Promise((ok) => this.process.on('exit', ok));
    await waitFor(`pulse serve on ${this.origin}`, async () => {
      if (this.process.exitCode !== null) throw new Error(`pulse serve exited: ${this.logs}`);
      const ready = await fetch(`${this.origin}/readyz`).catch(() => null);
      return ready?.status === 200;
    });
  }

  /** Stops the server as SIGTERM does in production; `serve()` brings it back on the same port. */
  async stop() {
    this.process.kill('SIGTERM');
    await this.exited;
  }

  async close() {
    if (this.process.exitCode === null) await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  /** A GraphQL request straight to the API, as another client would send it. */
  async graphql(query, variables = {}, token = null) {
    const response = await fetch(`${this.origin}/graphql`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({ query, variables }),
    });
    const body = await response.json();
    if (body.errors) throw new Error(`${query}: ${JSON.stringify(body.errors)}`);
    return body.data;
  }

  async signUp(handle, password = 'e2e-password-1') {
    const data = await this.graphql(
      'mutation($h: String!, $p: String!) { signUp(handle: $h, password: $p) { token user { id } } }',
      { h: handle, p: password },
    );
    return { token: data.signUp.token, id: data.signUp.user.id, handle, password };
  }

  async signIn(handle, password) {
    const data = await this.graphql(
      'mutation($h: String!, $p: String!) { signIn(handle: $h, password: $p) { token user { id } } }',
      { h: handle, p: password },
    );
    return { token: data.signIn.token, id: data.signIn.user.id, handle, password };
  }
}

/** Polls `check` until it returns true, for up to `seconds`. */
export async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((ok) => setTimeout(ok, 100));
  }
}

export function unique(prefix) {
  return `${prefix}_${randomBytes(4).toString('hex')}`;
}

/** A seeded server and a browser for the tests of one file. */
export async function startServerAndBrowser(settings = {}) {
  return { pulse: await Pulse.start(settings), browser: await launchBrowser() };
}

export async function stopServerAndBrowser({ pulse, browser }) {
  await browser?.close();
  await pulse?.close();
}

export async function launchBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Without the background-networking switches Chromium keeps calling home, which the closed
    // network here refuses; the guard below would see none of it (it is the browser's, not a page's).
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

/**
 * A fresh browser context (its own storage: a second person) whose pages may talk to `pulse`
 * only. Anything else is aborted and recorded in `context.foreign`, which `assertNoForeign`
 * checks; page errors are kept in `context.pageErrors`.
 */
export async function newContext(browser, pulse, options = {}) {
  const context = await browser.newContext({
    baseURL: pulse.origin,
    viewport: { width: 1280, height: 900 },
    // Headless Chromium calls itself HeadlessChrome, which Pulse's crawler list rightly does not
    // count as a viewer; these tests stand in for people, so they say what a desktop Chrome says.
    userAgent: 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0.0.0 Safari/537.36',
    ...options,
  });
  const allowed = new URL(pulse.origin).host;
  context.foreign = [];
  context.pageErrors = [];
  await context.route(
    (url) => url.host !== allowed && url.protocol !== 'data:' && url.protocol !== 'blob:',
    (route) => {
      context.foreign.push(route.request().url());
      return route.abort('blockedbyclient');
    },
  );
  await context.routeWebSocket(
    (url) => url.host !== allowed,
    (socket) => {
      context.foreign.push(socket.url());
      return socket.close();
    },
  );
  context.on('page', (page) => page.on('pageerror', (error) => context.pageErrors.push(String(error))));
  return context;
}

export function assertNoForeign(assert, ...contexts) {
  for (const context of contexts) {
    assert.deepEqual(context.foreign, [], 'a page tried to reach another host');
    assert.deepEqual(context.pageErrors, [], 'a page threw');
  }
}

/** Resolves with the response to the next GraphQL operation named `operation`. */
export function nextOperation(page, operation) {
  return page.waitForResponse((response) => response.request().postData()?.includes(operation) ?? false);
}

export async function screenshot(page, name) {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

/** Signs in through the demo app's own form. */
export async function signInThroughUi(page, user) {
  await page.goto('/#/signin');
  await page.getByLabel('Handle').fill(user.handle);
  await page.getByLabel('Password').fill(user.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByTestId('viewer').filter({ hasText: user.handle }).waitFor();
}
