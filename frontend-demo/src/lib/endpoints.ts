// The API lives on the page's own origin: `pulse serve` serves both, so no CORS is involved.
export const httpEndpoint = '/graphql';

export const wsEndpoint = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/graphql/ws`;

const TOKEN_KEY = 'pulse.token';

/** The session token the demo app keeps after signing in; GraphiQL reuses it for its headers. */
export function storedToken(): string | null {
  return localStorage.getItem(TOKEN_KEY);
}

export function storeToken(token: string | null): void {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
}
