import { createContext } from 'preact';
import { useContext } from 'preact/hooks';

import type { Api } from '../lib/api';

export interface Viewer {
  id: string;
  handle: string;
  /** Null for users who may not see it; only the user themself can. */
  isAdmin: boolean | null;
}

export interface Session {
  api: Api;
  /** The signed-in user; null when anonymous. */
  viewer: Viewer | null;
  /**
   * How many times the live socket has connected. The server answering the socket again is the
   * page's sign that requests which failed on the network are worth another try.
   */
  connections: number;
  signIn(token: string): void;
  signOut(): void;
}

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error('useSession outside <SessionContext.Provider>');
  return session;
}
