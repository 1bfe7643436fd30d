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
  signIn(token: string): void;
  signOut(): void;
}

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error('useSession outside <SessionContext.Provider>');
  return session;
}
